//! `--budget-rule held` (issue 40): B is the number of entries a layer and KV head holds on average
//! over the generation, each policy translating it into its own budget from its holding pattern, so
//! that policies compare at equal memory. Measured on outputs of a few hundred tokens (a random-weight
//! model decoding to the limit), every policy's time-averaged entries land within ±15% of B.

mod common;

use common::{kvbench, ok};

#[test]
fn held_budgets_land_within_fifteen_percent_of_b() {
    let dir = std::env::temp_dir().join(format!("kvbench-held-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("held.toml");
    let b = 160.0;
    let policies = [
        "streaming",
        "h2o",
        "snapkv",
        "rkv",
        "pyramidkv",
        "lazy",
        "kara",
    ];
    let mut text = format!(
        "name = \"held\"\nmodel = \"random:tiny\"\nlimit = 3\nprompt = \"plain\"\nmax_new_tokens = 384\nignore_eos = true\nbudget_rule = \"held\"\nbudgets = [{b}]\n[[policy]]\nname = \"full\"\n"
    );
    for p in policies {
        text.push_str(&format!("[[policy]]\nname = \"{p}\"\n"));
    }
    std::fs::write(&cfg, text).unwrap();
    let out = dir.join("results");
    ok(&kvbench(&[
        "sweep",
        cfg.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]));
    let records = kvbench::results::sample::read_records(&out.join("samples.jsonl")).unwrap();
    for p in policies {
        let held: Vec<f64> = records
            .iter()
            .filter(|r| r.policy_name == p)
            .map(|r| r.metrics.as_ref().unwrap().entries_mean)
            .collect();
        assert_eq!(held.len(), 3, "{p}");
        let mean = held.iter().sum::<f64>() / 3.0;
        assert!(
            (mean - b).abs() <= 0.15 * b,
            "{p}: {mean:.1} entries held on average, B = {b}"
        );
        let r = records.iter().find(|r| r.policy_name == p).unwrap();
        assert!(r.policy.contains("budget_rule=held"), "{}", r.policy);
    }
    // The full cache holds far more: the budget did bind.
    let full: f64 = records
        .iter()
        .filter(|r| r.policy_name == "full")
        .map(|r| r.metrics.as_ref().unwrap().entries_mean)
        .sum::<f64>()
        / 3.0;
    assert!(full > 1.4 * b, "full holds {full:.1}");
    let report = ok(&kvbench(&["report", out.to_str().unwrap(), "--no-plots"]));
    assert!(report.contains("held entries"), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn held_budgets_refuse_what_they_cannot_set() {
    for (args, want) in [
        (
            vec!["--policy", "rocket", "--budget", "128"],
            "RocketKV keeps every entry",
        ),
        (
            vec![
                "--policy",
                "snapkv",
                "--budget",
                "128",
                "--policy-arg",
                "mode=prefill",
            ],
            "mode=prefill",
        ),
        (
            vec!["--policy", "rkv", "--budget", "0.2"],
            "held on average",
        ),
    ] {
        let mut a = vec!["run", "--model", "random:tiny", "--budget-rule", "held"];
        a.extend(args);
        let out = kvbench(&a);
        assert_eq!(out.status.code(), Some(2), "{a:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{a:?}: {err}");
    }
}
