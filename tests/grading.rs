//! Every case of `../shared/spec/grading-cases.jsonl` is a test. A user's clone has no `../shared`:
//! there the test says so and skips. CI (which runs with `CI=true` and `shared/` beside the clone) and
//! `KVBENCH_REQUIRE_SHARED=1` turn the skip into a failure (`KVBENCH_REQUIRE_SHARED=0` keeps it).

use kvbench::eval::grade::{equivalent, grade_output};
use std::path::PathBuf;

fn shared(rel: &str) -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared")
        .join(rel);
    if p.exists() {
        return Some(p);
    }
    if required() {
        panic!(
            "{} is missing (CI or KVBENCH_REQUIRE_SHARED is set)",
            p.display()
        );
    }
    eprintln!(
        "skipped: {} not found (a clone without ../shared)",
        p.display()
    );
    None
}

/// Whether a missing `../shared` fails the test: `KVBENCH_REQUIRE_SHARED` set to 1 (0 asks for the
/// skip; anything else is refused, as kvbench's own switches are), or `CI` set to anything but
/// nothing, `0` or `false` (CI services set `CI=true`).
fn required() -> bool {
    let ci = std::env::var("CI")
        .is_ok_and(|v| !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false"));
    match std::env::var("KVBENCH_REQUIRE_SHARED")
        .as_deref()
        .map(str::trim)
    {
        Err(_) => ci,
        Ok("1") => true,
        Ok("0") => false,
        Ok(v) => panic!("KVBENCH_REQUIRE_SHARED={v:?} must be 0 (skip) or 1 (fail)"),
    }
}

#[test]
fn every_grading_case_passes() {
    let Some(path) = shared("spec/grading-cases.jsonl") else {
        return;
    };
    let text = std::fs::read_to_string(&path).unwrap();
    let mut failures = Vec::new();
    let mut n = 0;
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let case: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("line {}: {e}", i + 1));
        let (kind, pred, gold, want) = (
            case["kind"].as_str().unwrap(),
            case["pred"].as_str().unwrap(),
            case["gold"].as_str().unwrap(),
            case["correct"].as_bool().unwrap(),
        );
        let got = match kind {
            // These outputs come from ordinary prompts; a `<think>` inside opens a block.
            "output" => grade_output(pred, gold, false).1.is_correct(),
            _ => equivalent(pred, gold),
        };
        n += 1;
        if got != want {
            failures.push(format!(
                "{} ({kind}): pred {pred:?} gold {gold:?}: expected {want}, got {got}",
                case["id"]
            ));
        }
    }
    assert!(n >= 70, "only {n} cases read");
    assert!(
        failures.is_empty(),
        "{} of {n} cases fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every gold answer equals itself; against every other gold answer of its dataset it is unequal
/// unless the two are really the same value. The equal cross-pairs are printed with their texts.
#[test]
fn gold_answers_against_themselves_and_each_other() {
    for name in ["math500", "aime24", "aime25", "amc23"] {
        let Some(path) = shared(&format!("datasets/{name}.jsonl")) else {
            return;
        };
        let golds: Vec<(String, String)> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (
                    v["id"].as_str().unwrap().to_string(),
                    v["answer"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let not_self: Vec<&String> = golds
            .iter()
            .filter(|(_, a)| !equivalent(a, a))
            .map(|(id, _)| id)
            .collect();
        assert!(
            not_self.is_empty(),
            "{name}: not equal to themselves: {not_self:?}"
        );
        let mut equal = Vec::new();
        for i in 0..golds.len() {
            for j in i + 1..golds.len() {
                let (a, b) = (&golds[i].1, &golds[j].1);
                // The grader is not symmetric by design (a prediction may drop a gold's base
                // subscript): a pair counts as equal when either direction accepts.
                if equivalent(a, b) || equivalent(b, a) {
                    equal.push(format!("{a:?} = {b:?}"));
                }
            }
        }
        let pairs = golds.len() * (golds.len() - 1) / 2;
        eprintln!("{name}: {} of {pairs} cross-pairs equal", equal.len());
        // Pairs that are not the same normalised string are listed with their reason to review.
        let mut other = Vec::new();
        for e in &equal {
            let (a, b) = e.split_once(" = ").unwrap();
            let (a, b): (String, String) = (
                serde_json::from_str(a).unwrap(),
                serde_json::from_str(b).unwrap(),
            );
            let (na, nb) = (
                kvbench::eval::grade::normalize(&a),
                kvbench::eval::grade::normalize(&b),
            );
            if na != nb {
                other.push(format!("{a:?} / {b:?}"));
            }
        }
        eprintln!(
            "{name}: {} equal pairs differ after normalisation: {}",
            other.len(),
            other.join("; ")
        );
        assert!(other.len() <= 10, "{name}: too many unexpected equal pairs");
    }
}
