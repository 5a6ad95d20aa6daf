//! Any two rows of a report compared problem by problem (`kvbench report --pair rkv@256,streaming@256`),
//! not only a policy against the full cache: a reader who says "R-KV beats StreamingLLM at equal
//! memory" needs the paired difference, its interval, the discordant problems and an exact test.
//!
//! The comparison is [`super::paired::paired`] with the first row as the baseline; the test is the
//! exact (binomial) McNemar test on the problems only one side solved.

use super::paired::{paired, Interval};
use super::{activations_of, dataset_identity, is_full, kv_type_of};
use crate::error::{Error, Result};
use crate::results::sample::SampleRecord;
use std::collections::BTreeMap;

/// A row as `--pair` names it: `POLICY@BUDGET` (`full` alone), narrowed where a report has several
/// rows of one policy and budget by `+KEY=VALUE` (a parameter of the policy, as its description
/// shows it: `lazy+gqa=mean-prob@128`), `+kv=TYPE` (the cache's storage type: `full+kv=q8_0`) or
/// `+act=TYPE` (the activations' type: `full+act=bf16`).
#[derive(Debug, Clone, PartialEq)]
pub struct RowSelector {
    pub policy: String,
    pub budget: Option<f64>,
    /// `key=value` parameters the row's policy must have.
    pub args: Vec<String>,
    /// The cache's storage type, when named.
    pub kv: Option<String>,
    /// The activations' type, when named.
    pub act: Option<String>,
}

impl RowSelector {
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        let (head, budget) = match s.split_once('@') {
            Some((p, b)) => {
                let b: f64 = b.trim().parse().map_err(|_| {
                    Error::Input(format!(
                        "--pair {s}: the budget after '@' must be a number (POLICY@BUDGET)"
                    ))
                })?;
                (p.trim(), Some(b))
            }
            None => (s, None),
        };
        let mut parts = head.split('+').map(str::trim);
        let policy = parts.next().unwrap_or_default();
        if policy.is_empty() {
            return Err(Error::Input(format!(
                "--pair {s:?}: expected POLICY[+KEY=VALUE...]@BUDGET or full"
            )));
        }
        let (mut args, mut kv, mut act) = (Vec::new(), None, None);
        for part in parts {
            match part.split_once('=') {
                // Names in any case, as the flags take them (records hold them in lower case).
                Some(("kv", t)) if !t.trim().is_empty() => {
                    kv = Some(t.trim().to_ascii_lowercase())
                }
                Some(("act", t)) if !t.trim().is_empty() => {
                    act = Some(t.trim().to_ascii_lowercase())
                }
                Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
                    args.push(format!("{}={}", k.trim(), v.trim()))
                }
                _ => {
                    return Err(Error::Input(format!(
                        "--pair {s:?}: {part:?} is not KEY=VALUE (a policy parameter, kv=TYPE or act=TYPE)"
                    )))
                }
            }
        }
        Ok(RowSelector {
            // As records name it (`R-KV` is `rkv`); a name that is no policy matches no row.
            policy: crate::policy::canonical_name(policy)
                .map_or(policy, |n| n)
                .to_string(),
            budget,
            args,
            kv,
            act,
        })
    }

    fn matches(&self, r: &SampleRecord) -> bool {
        if self.kv.as_ref().is_some_and(|kv| *kv != kv_type_of(r))
            || self.act.as_ref().is_some_and(|a| *a != activations_of(r))
        {
            return false;
        }
        if self.policy == "full" {
            return is_full(r);
        }
        r.policy_name == self.policy
            && r.budget == self.budget
            && self
                .args
                .iter()
                .all(|a| r.policy.split_whitespace().any(|t| t == a))
    }
}

impl std::fmt::Display for RowSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.policy)?;
        for a in &self.args {
            write!(f, "+{a}")?;
        }
        if let Some(kv) = &self.kv {
            write!(f, "+kv={kv}")?;
        }
        if let Some(act) = &self.act {
            write!(f, "+act={act}")?;
        }
        if let Some(b) = self.budget {
            write!(f, "@{b}")?;
        }
        Ok(())
    }
}

/// Two rows compared over their shared problems: `b` against `a`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PairRow {
    pub model: String,
    pub dataset: String,
    pub a: String,
    pub b: String,
    pub problems: usize,
    pub pass_a: f64,
    pub pass_b: f64,
    /// `b`'s pass@1 minus `a`'s, with its 95% paired bootstrap interval.
    pub delta: Option<Interval>,
    /// Problems only `a` solved (a higher pass@1), and only `b`.
    pub only_a: usize,
    pub only_b: usize,
    /// Exact two-sided McNemar p on those discordant problems.
    pub mcnemar_p: f64,
}

/// A pair as one CSV line (the interval's bounds as their own columns).
#[derive(serde::Serialize)]
pub struct FlatPair<'a> {
    pub model: &'a str,
    pub dataset: &'a str,
    pub a: &'a str,
    pub b: &'a str,
    pub problems: usize,
    pub pass_a: f64,
    pub pass_b: f64,
    pub delta: Option<f64>,
    pub delta_lo: Option<f64>,
    pub delta_hi: Option<f64>,
    pub only_a: usize,
    pub only_b: usize,
    pub mcnemar_p: f64,
}

impl<'a> From<&'a PairRow> for FlatPair<'a> {
    fn from(r: &'a PairRow) -> Self {
        FlatPair {
            model: &r.model,
            dataset: &r.dataset,
            a: &r.a,
            b: &r.b,
            problems: r.problems,
            pass_a: r.pass_a,
            pass_b: r.pass_b,
            delta: r.delta.map(|i| i.estimate),
            delta_lo: r.delta.map(|i| i.lo),
            delta_hi: r.delta.map(|i| i.hi),
            only_a: r.only_a,
            only_b: r.only_b,
            mcnemar_p: r.mcnemar_p,
        }
    }
}

/// The exact two-sided McNemar test: the probability, with `b + c` discordant problems each going
/// either way with probability 1/2, of a split at least as uneven as `b : c`.
pub fn mcnemar_exact(b: usize, c: usize) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let k = b.min(c);
    // Sum of C(n, i) / 2^n for i ≤ k, in logarithms (n may be in the thousands).
    let ln_choose = |i: usize| -> f64 {
        (1..=i)
            .map(|j| ((n - i + j) as f64).ln() - (j as f64).ln())
            .sum()
    };
    let tail: f64 = (0..=k)
        .map(|i| (ln_choose(i) - n as f64 * std::f64::consts::LN_2).exp())
        .sum();
    (2.0 * tail).min(1.0)
}

/// The records of each side of a pair.
type Sides<'a> = (Vec<&'a SampleRecord>, Vec<&'a SampleRecord>);

/// Compares every pair of selected rows, per model and dataset that has both; a selector that matches
/// no record, or two rows of different parameters, is an error naming it.
pub fn compare(
    records: &[SampleRecord],
    pairs: &[(RowSelector, RowSelector)],
) -> Result<Vec<PairRow>> {
    let mut out = Vec::new();
    for (a, b) in pairs {
        // Per (model, dataset): the records of each side.
        let mut sides: BTreeMap<(String, String), Sides<'_>> = BTreeMap::new();
        for r in records {
            let key = (r.model.clone(), dataset_identity(&r.dataset));
            if a.matches(r) {
                sides.entry(key.clone()).or_default().0.push(r);
            }
            if b.matches(r) {
                sides.entry(key).or_default().1.push(r);
            }
        }
        for sel in [a, b] {
            if !records.iter().any(|r| sel.matches(r)) {
                return Err(Error::Input(format!(
                    "--pair {sel}: no records of that policy and budget (rows: {})",
                    row_names(records).join(", ")
                )));
            }
        }
        for ((model, dataset), (ra, rb)) in sides {
            if ra.is_empty() || rb.is_empty() {
                continue;
            }
            for (sel, rs) in [(a, &ra), (b, &rb)] {
                let mut configs: Vec<String> = rs
                    .iter()
                    .map(|r| {
                        let kv = match kv_type_of(r).as_str() {
                            "f32" => String::new(),
                            kv => format!(" (kv={kv})"),
                        };
                        let act = match activations_of(r).as_str() {
                            "f32" => String::new(),
                            a => format!(" (act={a})"),
                        };
                        format!("{}{kv}{act}", r.policy)
                    })
                    .collect();
                configs.sort_unstable();
                configs.dedup();
                if configs.len() > 1 {
                    return Err(Error::Input(format!(
                        "--pair {sel}: {} rows of different parameters match (narrow it with \
                         +KEY=VALUE, +kv=TYPE or +act=TYPE): {}",
                        configs.len(),
                        configs.join(" | ")
                    )));
                }
            }
            // A pair is a comparison of accuracy, which random weights do not have.
            if ra.iter().chain(&rb).any(|r| r.random_weights) {
                return Err(Error::Input(format!(
                    "--pair {a},{b}: {model} has random weights (a `random:NAME` model): its rows \
                     measure speed and memory only and carry no accuracy to compare"
                )));
            }
            let p = paired(&ra, &rb);
            out.push(PairRow {
                model,
                dataset,
                a: a.to_string(),
                b: b.to_string(),
                problems: p.problems,
                pass_a: p.full_pass,
                pass_b: p.pass,
                delta: p.delta_pass,
                only_a: p.only_full,
                only_b: p.only_policy,
                mcnemar_p: mcnemar_exact(p.only_full, p.only_policy),
            });
        }
    }
    Ok(out)
}

/// Every row's selector, for the error that lists them (with `+kv=TYPE` and `+act=TYPE` when the
/// records hold several storage or activations' types).
fn row_names(records: &[SampleRecord]) -> Vec<String> {
    let varies = |of: fn(&SampleRecord) -> String| {
        let first = records.first().map(of);
        records.iter().any(|r| Some(of(r)) != first)
    };
    let (typed, acted) = (varies(kv_type_of), varies(activations_of));
    let mut names: Vec<String> = records
        .iter()
        .map(|r| {
            let mut kv = match typed {
                true => format!("+kv={}", kv_type_of(r)),
                false => String::new(),
            };
            if acted {
                kv.push_str(&format!("+act={}", activations_of(r)));
            }
            match (is_full(r), r.budget) {
                (true, _) | (false, None) => format!("full{kv}"),
                (false, Some(b)) => format!("{}{kv}@{b}", r.policy_name),
            }
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The pairs as a Markdown table with a line on how to read it.
pub fn markdown(rows: &[PairRow]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| A | B | problems | pass@1 A % | pass@1 B % | Δ B − A, points [95% CI] | only A / only B | McNemar p |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let delta = r.delta.map_or("-".to_string(), |i| {
            format!(
                "{:+.1} [{:+.1}, {:+.1}]{}",
                100.0 * i.estimate,
                100.0 * i.lo,
                100.0 * i.hi,
                if i.contains_zero() { " ≈" } else { "" }
            )
        });
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} | {:.1} | {delta} | {} / {} | {:.3} |",
            crate::error::cell(&r.a),
            crate::error::cell(&r.b),
            r.problems,
            100.0 * r.pass_a,
            100.0 * r.pass_b,
            r.only_a,
            r.only_b,
            r.mcnemar_p
        );
    }
    let _ = writeln!(
        s,
        "\nΔ over the problems both rows have, paired by problem, with a 95% paired bootstrap interval (10,000 seeded resamples); ≈: the interval contains 0. McNemar: exact two-sided binomial test on the problems only one side solved."
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcnemar_matches_the_binomial_tail() {
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        // 0 of 5 discordant one way: 2 · 0.5^5.
        assert!((mcnemar_exact(0, 5) - 0.0625).abs() < 1e-12);
        // 1 vs 9: 2 · (1 + 10) / 1024.
        assert!((mcnemar_exact(1, 9) - 22.0 / 1024.0).abs() < 1e-12);
        assert_eq!(mcnemar_exact(4, 4), 1.0);
        assert!(mcnemar_exact(0, 2000) < 1e-300 || mcnemar_exact(0, 2000) == 0.0);
        assert!((mcnemar_exact(7, 3) - mcnemar_exact(3, 7)).abs() < 1e-15);
    }

    #[test]
    fn two_policies_pair_over_their_shared_problems() {
        use crate::report::tests::record;
        let mut rs = Vec::new();
        // 6 problems: A solves 0-3, B solves 2-5; problem 5 only in B's records... and A's too.
        for i in 0..6 {
            let p = format!("p{i}");
            rs.push(record("rkv", &p, i < 4, 10, false));
            rs.push(record("streaming", &p, i >= 2, 10, false));
        }
        rs.push(record("full", "p0", true, 10, false));
        let sel = |s: &str| RowSelector::parse(s).unwrap();
        let rows = compare(&rs, &[(sel("rkv@64"), sel("streaming@64"))]).unwrap();
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!((r.problems, r.only_a, r.only_b), (6, 2, 2));
        assert_eq!(r.delta.unwrap().estimate, 0.0);
        assert_eq!(r.mcnemar_p, 1.0);
        // The papers' names and any case select the same rows.
        let named = compare(&rs, &[(sel("R-KV@64"), sel("StreamingLLM@64"))]).unwrap();
        assert_eq!((named[0].only_a, named[0].only_b), (2, 2));
        let e = compare(&rs, &[(sel("rkv@64"), sel("h2o@64"))]).unwrap_err();
        assert!(e.to_string().contains("h2o@64") && e.to_string().contains("rkv@64"));
    }

    #[test]
    fn rows_of_one_policy_and_budget_are_told_apart_by_parameters_and_cache_type() {
        use crate::report::tests::record;
        let mut rs = Vec::new();
        for i in 0..4 {
            let p = format!("p{i}");
            rs.push(record("lazy gqa=per-query-head", &p, true, 10, false));
            rs.push(record("lazy gqa=mean-prob", &p, i < 1, 10, false));
            let mut q8 = record("lazy gqa=mean-prob", &p, false, 10, false);
            q8.engine = Some(crate::results::sample::Engine {
                kv_type: "q8_0".into(),
                ..crate::results::sample::Engine::current(
                    "cpu",
                    "Auto".into(),
                    1,
                    crate::cache::KvType::Q8_0,
                    candle_core::DType::F32,
                )
            });
            rs.push(q8);
        }
        for r in &mut rs {
            r.policy_name = "lazy".into();
        }
        let sel = |s: &str| RowSelector::parse(s).unwrap();
        // Ambiguous: three rows are lazy@64.
        let e = compare(&rs, &[(sel("lazy@64"), sel("lazy+gqa=mean-prob@64"))]).unwrap_err();
        assert!(e.to_string().contains("+KEY=VALUE"), "{e}");
        let rows = compare(
            &rs,
            &[(
                sel("lazy+gqa=per-query-head@64"),
                sel("lazy+gqa=mean-prob+kv=f32@64"),
            )],
        )
        .unwrap();
        assert_eq!((rows[0].only_a, rows[0].only_b), (3, 0));
        let rows = compare(
            &rs,
            &[(
                sel("lazy+gqa=mean-prob+kv=F32@64"),
                sel("LazyEviction+kv=Q8_0@64"),
            )],
        )
        .unwrap();
        assert_eq!((rows[0].pass_a, rows[0].pass_b), (0.25, 0.0));
        // A selector that matches nothing lists the rows with their types.
        let e = compare(&rs, &[(sel("lazy+kv=f16@64"), sel("lazy+kv=q8_0@64"))]).unwrap_err();
        assert!(e.to_string().contains("lazy+kv=q8_0@64"), "{e}");
        // The report keeps the storage types apart and says which is which.
        let summary = crate::report::summarize(&rs);
        assert_eq!(summary.rows.len(), 3);
        let table = crate::report::table::markdown(&summary);
        assert!(
            table.contains("KV type") && table.contains("q8_0"),
            "{table}"
        );
    }

    #[test]
    fn selectors_parse_and_bad_ones_name_the_flag() {
        assert_eq!(
            RowSelector::parse("rkv@256").unwrap(),
            RowSelector {
                policy: "rkv".into(),
                budget: Some(256.0),
                args: vec![],
                kv: None,
                act: None,
            }
        );
        let narrow = RowSelector::parse("lazy + gqa=mean-prob +kv=q8_0 +act=bf16@128").unwrap();
        assert_eq!(narrow.args, vec!["gqa=mean-prob".to_string()]);
        assert_eq!(narrow.kv.as_deref(), Some("q8_0"));
        assert_eq!(narrow.act.as_deref(), Some("bf16"));
        assert_eq!(
            narrow.to_string(),
            "lazy+gqa=mean-prob+kv=q8_0+act=bf16@128"
        );
        assert!(RowSelector::parse("lazy+gqa@128").is_err());
        assert_eq!(RowSelector::parse("full").unwrap().budget, None);
        assert!(RowSelector::parse("rkv@x")
            .unwrap_err()
            .to_string()
            .contains("--pair"));
        assert!(RowSelector::parse("@64").is_err());
    }
}
