//! Sweeps end to end on the default model: a sweep killed with SIGKILL and resumed ends with the same
//! results as an uninterrupted one; shards running at once split the plan and merge back; a changed
//! config and a second process on one directory are refused; `report` writes tables and plots and
//! lists missing units.
//!
//! f32 weights make greedy decoding exact whatever the batch composition, so an interrupted run (whose
//! batches differ) must give the same tokens.

mod common;

use common::{kvbench, ok};
use kvbench::results::dir::read_samples;
use kvbench::results::sample::SampleRecord;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CONFIG: &str = r#"
name = "resume-test"
model = "smollm2-135m"
dataset = "builtin"
limit = 3
max_new_tokens = 24
weights = "f32"
batch_size = 1
fidelity = true
budgets = [0.5]

[[policy]]
name = "full"

[[policy]]
name = "streaming"
args = { buffer = 4, sinks = 2 }

[[policy]]
name = "rkv"
args = { buffer = 4, window = 4 }
"#;

fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvbench-sweep-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Results keyed by unit id, without the timing fields.
fn results(dir: &Path) -> BTreeMap<String, (String, usize, Option<String>, bool)> {
    let records: Vec<SampleRecord> = read_samples(dir).unwrap().records;
    let n = records.len();
    let map: BTreeMap<_, _> = records
        .into_iter()
        .map(|r| (r.unit, (r.output, r.tokens, r.extracted, r.correct)))
        .collect();
    assert_eq!(
        map.len(),
        n,
        "no unit is recorded twice in {}",
        dir.display()
    );
    map
}

fn complete_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.matches('\n').count())
        .unwrap_or(0)
}

#[test]
fn killed_sweep_resumes_to_the_same_results_and_shards_merge() {
    common::model(kvbench::model::weights::WeightFormat::Native); // fetched once, before timing
    let work = temp("work");
    let config = work.join("resume.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let cfg = config.to_str().unwrap();

    // Uninterrupted.
    let a = work.join("a");
    let text = ok(&kvbench(&["sweep", cfg, "--out", a.to_str().unwrap()]));
    assert!(text.contains("9 work units"), "{text}");
    let expected = results(&a);
    assert_eq!(expected.len(), 9);
    // Timings with known relations: alone in its batch, a sequence's share of the batch's decode time
    // is its own decode time; step-time percentiles are ordered; fidelity is measured for the six
    // compressing units only.
    let records = read_samples(&a).unwrap().records;
    // The ratio budget 0.5 is resolved from the full run's mean generation length, never below the
    // policy's floor (streaming: sinks + 1; rkv: its window), and every record says so.
    let full: Vec<usize> = records
        .iter()
        .filter(|r| r.policy_name == "full")
        .map(|r| r.tokens)
        .collect();
    let mean = full.iter().sum::<usize>() as f64 / full.len() as f64;
    for r in records.iter().filter(|r| r.policy_name != "full") {
        let floor = if r.policy_name == "streaming" { 3 } else { 4 };
        let want = ((0.5 * mean).ceil() as usize).max(floor);
        assert_eq!(r.full_mean_tokens, Some(mean), "{}", r.policy);
        assert_eq!(r.budget_entries, Some(want), "{}", r.policy);
    }
    for r in &records {
        let m = r.metrics.as_ref().unwrap();
        assert_eq!(m.batch, 1);
        assert!((m.decode_share_secs - m.decode_secs).abs() < 1e-9);
        if r.tokens > 1 {
            assert!(0.0 < m.tpot_p50_secs && m.tpot_p50_secs <= m.tpot_p90_secs);
        }
        assert!(m.prefill_secs > 0.0 && m.machine.contains("cores"));
        assert_eq!(
            r.fidelity.is_some(),
            r.policy_name != "full",
            "{}",
            r.policy
        );
    }

    // Killed with SIGKILL once two units are on disk, then resumed.
    let b = work.join("b");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["sweep", cfg, "--out", b.to_str().unwrap()])
        .env("RAYON_NUM_THREADS", "2")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let samples = b.join("samples.jsonl");
    let start = Instant::now();
    while complete_lines(&samples) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "no progress in 5 minutes"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the sweep ended before it was killed: {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let kept = complete_lines(&samples);
    assert!(
        (2..9).contains(&kept),
        "{kept} units finished before the kill"
    );
    // A kill in the middle of a write leaves half a line: make sure one is there.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&samples)
            .unwrap();
        f.write_all(b"{\"problem_id\":\"builtin-").unwrap();
    }
    // The report of the interrupted directory lists what is missing and how to run it.
    let report = ok(&kvbench(&["report", b.to_str().unwrap(), "--no-plots"]));
    assert!(
        report.contains(&format!("{} planned units have no result yet", 9 - kept)),
        "{report}"
    );
    assert!(report.contains("half-written line"), "{report}");
    assert!(
        report.contains(&format!(
            "kvbench sweep {}",
            b.join("config.toml").display()
        )),
        "{report}"
    );
    // Resume from the directory's own config.
    let resumed = kvbench(&[
        "sweep",
        b.join("config.toml").to_str().unwrap(),
        "--out",
        b.to_str().unwrap(),
    ]);
    let text = ok(&resumed);
    let err = String::from_utf8_lossy(&resumed.stderr);
    assert!(
        err.contains(&format!(
            "{kept} of 9 units already finished, {} to run",
            9 - kept
        )),
        "{err}"
    );
    assert!(err.contains("dropped a half-written last line"), "{err}");
    assert!(text.contains(&format!("{} units run", 9 - kept)), "{text}");
    assert_eq!(
        results(&b),
        expected,
        "resumed results equal uninterrupted ones"
    );
    // Nothing left to do: a third run runs nothing.
    let text = ok(&kvbench(&["sweep", cfg, "--out", b.to_str().unwrap()]));
    assert!(text.contains("0 units run"), "{text}");

    // Another configuration on the same directory is refused, and nothing is written.
    let before = std::fs::read(&samples).unwrap();
    let out = kvbench(&["sweep", cfg, "--out", b.to_str().unwrap(), "--seed", "7"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another configuration"), "{err}");
    assert_eq!(std::fs::read(&samples).unwrap(), before);

    // A second process on a directory in use is refused.
    let held = kvbench::results::dir::ResultsDir::open(&b, None).unwrap();
    let out = kvbench(&["sweep", cfg, "--out", b.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by another kvbench process"));
    drop(held);

    disk_full_then_resume(cfg, &work, &expected);

    // Two shards at once into one directory: disjoint, and together the whole plan. Their ratio
    // budgets need the full run: without it a shard refuses before running anything, naming how to
    // get it; with the full phase run first, the policies' shards run at once.
    let c = work.join("c");
    let early = kvbench(&[
        "sweep",
        cfg,
        "--out",
        c.to_str().unwrap(),
        "--shard",
        "1/2",
        "--phase",
        "policies",
    ]);
    assert_eq!(early.status.code(), Some(2));
    let err = String::from_utf8_lossy(&early.stderr);
    assert!(
        err.contains("full units have not finished") && err.contains("--phase full"),
        "{err}"
    );
    assert!(!c.exists(), "nothing ran and nothing was written");
    ok(&kvbench(&[
        "sweep",
        cfg,
        "--out",
        c.to_str().unwrap(),
        "--phase",
        "full",
    ]));
    let spawn = |shard: &str| {
        Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args([
                "sweep",
                cfg,
                "--out",
                c.to_str().unwrap(),
                "--shard",
                shard,
                "--phase",
                "policies",
            ])
            .env("RAYON_NUM_THREADS", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (s1, s2) = (spawn("1/2"), spawn("2/2"));
    ok(&s1.wait_with_output().unwrap());
    ok(&s2.wait_with_output().unwrap());
    assert!(c.join("samples.jsonl").exists(), "the full phase");
    assert!(c.join("samples.shard-1-of-2.jsonl").exists());
    assert!(c.join("samples.shard-2-of-2.jsonl").exists());
    assert_eq!(results(&c), expected, "merged shards equal one run");

    // The report merges the shards and writes the tables and plots.
    let text = ok(&kvbench(&["report", c.to_str().unwrap()]));
    assert!(text.contains("every planned unit has a result"), "{text}");
    assert!(text.contains("| full | - | 3 × 1 |"), "{text}");
    assert!(
        text.contains(&format!(
            "| streaming | 0.5 (B = {}, full mean",
            ((0.5 * mean).ceil() as usize).max(3)
        )),
        "{text}"
    );
    assert!(text.contains("KL from full"), "{text}");
    let out = c.join("report");
    for f in [
        "report.md",
        "report.csv",
        "report.json",
        "accuracy_vs_budget.svg",
        "accuracy_vs_budget.png",
        "delta_vs_budget.png",
        "accuracy_vs_memory.png",
        "throughput_vs_budget.png",
        "length_vs_budget.png",
        "fidelity_vs_position.png",
    ] {
        let len = std::fs::metadata(out.join(f)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 100, "{f} is written");
    }
    let csv = std::fs::read_to_string(out.join("report.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 3, "a header and three rows: {csv}");
    let heat_maps = std::fs::read_dir(&out)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.starts_with("keep_") && name.ends_with(".png")
        })
        .count();
    assert_eq!(heat_maps, 2, "one heat map per compressing policy");
    std::fs::remove_dir_all(&work).unwrap();
}

/// A disk that fills up mid-sweep (a file size limit: writes past it fail with EFBIG, as they would
/// with ENOSPC) stops the sweep with an error naming the file, leaves only whole records (and at most
/// a torn last line) and no temporary files; once there is room, the same command resumes and ends
/// with the records of an uninterrupted run.
fn disk_full_then_resume(
    cfg: &str,
    work: &Path,
    expected: &BTreeMap<String, (String, usize, Option<String>, bool)>,
) {
    let d = work.join("full-disk");
    // 24 blocks of 512 bytes: room for the config and the plan, and for a few records, not nine.
    let out = Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 24; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_kvbench"))
        .args(["sweep", cfg, "--out", d.to_str().unwrap()])
        .env("RAYON_NUM_THREADS", "2")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "the sweep cannot finish: {err}");
    assert!(
        err.contains("samples.jsonl") && err.contains("File too large"),
        "the error names the file and the cause: {err}"
    );
    let samples = d.join("samples.jsonl");
    let kept = complete_lines(&samples);
    assert!(
        (1..9).contains(&kept),
        "{kept} whole records before the limit"
    );
    let leftovers: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    // The whole records read back; the rest is at most a torn line.
    assert_eq!(read_samples(&d).unwrap().records.len(), kept);
    let text = ok(&kvbench(&["sweep", cfg, "--out", d.to_str().unwrap()]));
    assert!(text.contains(&format!("{} units run", 9 - kept)), "{text}");
    assert_eq!(&results(&d), expected, "resumed after a full disk");
}

#[test]
fn slurm_script_runs_every_shard_and_then_the_report() {
    let work = temp("slurm");
    let out = work.join("r");
    let text = ok(&kvbench(&[
        "sweep",
        "configs/smoke.toml",
        "--emit",
        "slurm",
        "--shards",
        "6",
        "--concurrency",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]));
    assert!(text.starts_with("#!/usr/bin/env bash"), "{text}");
    assert!(text.contains("#SBATCH --array=1-6%2"), "{text}");
    assert!(
        text.contains("--shard \"${SLURM_ARRAY_TASK_ID}/6\""),
        "{text}"
    );
    assert!(text.contains("--dependency=\"afterany:"), "{text}");
    // Ratio budgets: the full-cache array runs first, the policies' array after it succeeded.
    let full = text.find("--phase full").expect("a full phase");
    let policies = text.find("--phase policies").expect("a policies phase");
    assert!(full < policies && text.contains("afterok:"), "{text}");
    // The directory already holds the resolved config every task runs.
    assert!(out.join("config.toml").is_file() && out.join("sweep.json").is_file());
    std::fs::remove_dir_all(&work).unwrap();
}

const SMALL: &str = r#"
name = "extend-test"
model = "smollm2-135m"
dataset = "builtin"
limit = 2
max_new_tokens = 8
weights = "f32"
batch_size = 2
"#;

fn unit_ids(dir: &Path) -> Vec<String> {
    let m = kvbench::results::dir::read_manifest(dir).unwrap();
    let mut ids: Vec<String> = m.units.into_iter().map(|u| u.id).collect();
    ids.sort();
    ids
}

/// A sweep extended in place with more policies and budgets runs only the new units, keeps the old
/// ones, records the union (a config that resumes everything), and gives each unit the result it has
/// in a sweep of the larger config from scratch; a config that differs in anything but its grid is
/// still refused, and so is a directory of kvbench 0.4.0 whose config was edited.
#[test]
fn a_sweep_extended_with_policies_and_budgets_runs_only_the_new_units() {
    common::model(kvbench::model::weights::WeightFormat::Native);
    let work = temp("extend");
    let small = work.join("small.toml");
    let big = work.join("big.toml");
    std::fs::write(
        &small,
        format!("{SMALL}budgets = [4]\n[[policy]]\nname = \"full\"\n[[policy]]\nname = \"streaming\"\nargs = {{ buffer = 2, sinks = 1 }}\n"),
    )
    .unwrap();
    std::fs::write(
        &big,
        format!("{SMALL}budgets = [4, 6]\n[[policy]]\nname = \"full\"\n[[policy]]\nname = \"streaming\"\nargs = {{ buffer = 2, sinks = 1 }}\n[[policy]]\nname = \"h2o\"\n"),
    )
    .unwrap();
    let (small, big) = (small.to_str().unwrap(), big.to_str().unwrap());
    let d = work.join("d");
    let ds = d.to_str().unwrap();
    let text = ok(&kvbench(&["sweep", small, "--out", ds]));
    assert!(text.contains("4 units run"), "{text}");
    let before = results(&d);

    // Extended: 2 full + 2 × 2 streaming + 2 × 2 h2o planned, 6 of them new.
    let out = kvbench(&["sweep", big, "--out", ds]);
    let text = ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("extends the sweep there"), "{err}");
    assert!(
        err.contains("4 of 10 units already finished, 6 to run"),
        "{err}"
    );
    assert!(text.contains("6 units run"), "{text}");
    let after = results(&d);
    for (id, r) in &before {
        assert_eq!(after.get(id), Some(r), "unit {id} kept as it was");
    }
    assert_eq!(after.len(), 10);
    let ids = unit_ids(&d);
    assert_eq!(ids, after.keys().cloned().collect::<Vec<_>>());

    // The directory's config now plans the union: resuming from it, or from the smaller config,
    // runs nothing and leaves the plan as it is.
    let own = d.join("config.toml");
    let text = ok(&kvbench(&["sweep", own.to_str().unwrap(), "--out", ds]));
    assert!(text.contains("0 units run"), "{text}");
    let text = ok(&kvbench(&["sweep", small, "--out", ds]));
    assert!(text.contains("0 units run"), "{text}");
    assert_eq!(unit_ids(&d), ids);

    // From scratch, the larger config gives every unit the same id and result.
    let fresh = work.join("fresh");
    ok(&kvbench(&["sweep", big, "--out", fresh.to_str().unwrap()]));
    assert_eq!(results(&fresh), after);

    // Directories of the same settings report together; of other settings (here the length
    // limit), they are refused: their rows would pool outputs that are not comparable.
    let text = ok(&kvbench(&["report", ds, fresh.to_str().unwrap()]));
    assert!(text.contains("h2o"), "{text}");
    let shorter = work.join("shorter");
    ok(&kvbench(&[
        "sweep",
        small,
        "--out",
        shorter.to_str().unwrap(),
        "--max-new-tokens",
        "4",
    ]));
    let out = kvbench(&["report", ds, shorter.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("different settings") && err.contains("max_new_tokens 8 there, 4 here"),
        "{err}"
    );
    // A directory whose config no longer parses cannot be checked: the report says so rather
    // than pooling in silence.
    let shorter_config = shorter.join("config.toml");
    let kept = std::fs::read(&shorter_config).unwrap();
    std::fs::write(&shorter_config, "max_new_tokens = \n").unwrap();
    let text = ok(&kvbench(&["report", ds, shorter.to_str().unwrap()]));
    assert!(
        text.contains("config.toml: TOML parse error at line 1")
            && text.contains("are not checked against other directories'"),
        "{text}"
    );
    std::fs::write(&shorter_config, kept).unwrap();

    // Anything but the grid changed: refused, nothing written.
    let samples = std::fs::read(d.join("samples.jsonl")).unwrap();
    let config = std::fs::read(&own).unwrap();
    let out = kvbench(&["sweep", big, "--out", ds, "--max-new-tokens", "9"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another configuration"));
    assert_eq!(std::fs::read(d.join("samples.jsonl")).unwrap(), samples);
    assert_eq!(std::fs::read(&own).unwrap(), config);

    // A directory of kvbench 0.4.0 (no base hash in sweep.json) extends too, while its config is
    // the one it was bound to; edited, it is refused.
    let old = work.join("old");
    ok(&kvbench(&["sweep", small, "--out", old.to_str().unwrap()]));
    let strip = |dir: &Path| {
        let path = dir.join("sweep.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(v.as_object_mut().unwrap().remove("base_hash").is_some());
        std::fs::write(&path, v.to_string()).unwrap();
    };
    strip(&old);
    let edited = work.join("edited");
    std::fs::create_dir_all(&edited).unwrap();
    for f in ["sweep.json", "config.toml", "samples.jsonl"] {
        std::fs::copy(old.join(f), edited.join(f)).unwrap();
    }
    let text = ok(&kvbench(&["sweep", big, "--out", old.to_str().unwrap()]));
    assert!(text.contains("6 units run"), "{text}");
    assert_eq!(results(&old), after);
    let toml = std::fs::read_to_string(edited.join("config.toml")).unwrap();
    std::fs::write(
        edited.join("config.toml"),
        toml.replace("max_new_tokens = 8", "max_new_tokens = 7"),
    )
    .unwrap();
    let out = kvbench(&["sweep", big, "--out", edited.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another configuration"));
    let _ = std::fs::remove_dir_all(&work);
}

/// `kv_types` crosses every (policy, budget) with cache storage types: each type's units are its own
/// (their records name the type and hold its bytes), the model's own type keeps the ids a sweep
/// without the list gives, a ratio budget resolves from the full run of its own type, the report
/// keeps the types apart, and extending a sweep with a type runs only that type's units.
#[test]
fn a_kv_types_grid_runs_every_policy_in_every_storage_type() {
    common::model(kvbench::model::weights::WeightFormat::Native);
    let work = temp("kvtypes");
    let grid = "budgets = [0.5]\n[[policy]]\nname = \"full\"\n[[policy]]\nname = \"streaming\"\nargs = { buffer = 2, sinks = 1 }\n";
    let plain = work.join("plain.toml");
    let crossed = work.join("crossed.toml");
    std::fs::write(&plain, format!("{SMALL}{grid}")).unwrap();
    std::fs::write(
        &crossed,
        format!("{SMALL}kv_types = [\"f16\", \"q8_0/f16\"]\n{grid}"),
    )
    .unwrap();
    let d = work.join("d");
    let ds = d.to_str().unwrap();
    let text = ok(&kvbench(&["sweep", plain.to_str().unwrap(), "--out", ds]));
    assert!(text.contains("4 units run"), "{text}");
    let before = results(&d);

    // Extended by the grid's second type: only its 4 units run; the f16 (default) units stay.
    let out = kvbench(&["sweep", crossed.to_str().unwrap(), "--out", ds]);
    let text = ok(&out);
    assert!(text.contains("4 units run"), "{text}");
    let after = results(&d);
    assert_eq!(after.len(), 8);
    for (id, r) in &before {
        assert_eq!(after.get(id), Some(r), "unit {id} kept as it was");
    }
    let records: Vec<SampleRecord> = read_samples(&d).unwrap().records;
    let kv = |r: &SampleRecord| r.engine.as_ref().unwrap().kv_type.clone();
    for r in &records {
        let new = !before.contains_key(&r.unit);
        assert_eq!(kv(r), if new { "q8_0/f16" } else { "f16" }, "{}", r.unit);
        // SmolLM2: 30 layers × 3 KV heads × (Q8_0 keys, 2 blocks of 34 bytes + f16 values, 128 bytes).
        let per_token = if new {
            30 * 3 * (68 + 128)
        } else {
            30 * 3 * 2 * 128
        };
        if r.policy_name == "full" {
            let m = r.metrics.as_ref().unwrap();
            assert_eq!(m.kv_bytes_peak, m.entries_peak * per_token, "{}", r.unit);
        }
    }
    // Each type's ratio budget comes from its own full run's mean length.
    let mean = |t: &str| {
        let fulls: Vec<_> = records
            .iter()
            .filter(|r| r.policy_name == "full" && kv(r) == t)
            .collect();
        fulls.iter().map(|r| r.tokens).sum::<usize>() as f64 / fulls.len() as f64
    };
    for r in records.iter().filter(|r| r.policy_name == "streaming") {
        let expected = ((0.5 * mean(&kv(r))).ceil() as usize).max(3);
        assert_eq!(r.full_mean_tokens, Some(mean(&kv(r))), "{}", r.unit);
        assert_eq!(r.budget_entries, Some(expected), "{} {}", r.unit, kv(r));
    }
    let text = ok(&kvbench(&["report", ds]));
    assert!(text.contains("| KV type |"), "{text}");
    assert!(text.contains("| q8_0/f16 |"), "{text}");
    // Rows are compared with the full cache of the finest type there is (f16 here): the full
    // q8_0/f16 row too, so its Δ shows what its storage costs; the f16 full row is the reference.
    let full_row = |t: &str| {
        text.lines()
            .find(|l| l.starts_with("| full |") && l.contains(&format!("| {t} |")))
            .unwrap_or_else(|| panic!("no full {t} row: {text}"))
            .to_string()
    };
    assert!(full_row("q8_0/f16").contains(" ["), "{text}");
    assert!(!full_row("f16").contains(" ["), "{text}");
    // The accuracy-vs-memory plot has a point per full cache type and a line per (policy, type).
    let svg = std::fs::read_to_string(d.join("report").join("accuracy_vs_memory.svg")).unwrap();
    for label in [
        "full cache [f16]",
        "full cache [q8_0/f16]",
        "streaming [f16]",
        "streaming [q8_0/f16]",
    ] {
        assert!(svg.contains(label), "{label} missing from the plot");
    }
    // Resuming from the directory's own config (the union) runs nothing.
    let own = d.join("config.toml");
    let text = ok(&kvbench(&["sweep", own.to_str().unwrap(), "--out", ds]));
    assert!(text.contains("0 units run"), "{text}");

    // A type twice is refused, naming the key.
    let twice = work.join("twice.toml");
    std::fs::write(
        &twice,
        format!("{SMALL}kv_types = [\"q8_0\", \"q8_0\"]\n{grid}"),
    )
    .unwrap();
    let out = kvbench(&["sweep", twice.to_str().unwrap(), "--out", ds]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("kv_types lists q8_0 twice"));
    let _ = std::fs::remove_dir_all(&work);
}
