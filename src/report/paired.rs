//! A row compared with the `full` row of the same model and data, problem by problem: a difference
//! in accuracy between two runs on 50 problems can be noise, and a reader needs to know which. Each
//! problem is its own pair (the same prompt, with and without compression), so the comparison is a
//! paired one: Δ pass@1 and the relative change in output length, each with a 95% paired bootstrap
//! interval (problems resampled with replacement, both sides together), and the counts of problems
//! only one side solved.
//!
//! The bootstrap is seeded ([`BOOTSTRAP_SEED`]) and runs over the problems in sorted id order, so a
//! report of the same records prints the same intervals on every machine.

use crate::results::sample::SampleRecord;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

/// Resamples per interval.
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;
/// The seed of every interval's resampling.
pub const BOOTSTRAP_SEED: u64 = 0x006b_7662_656e_6368; // "kvbench"

/// An estimate and its 95% percentile bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Interval {
    pub estimate: f64,
    pub lo: f64,
    pub hi: f64,
}

impl Interval {
    /// Whether the interval contains 0: the data do not show a difference.
    pub fn contains_zero(&self) -> bool {
        self.lo <= 0.0 && self.hi >= 0.0
    }
}

/// A row and the full row compared over the problems both have. Per problem, pass@1 is the mean
/// over its samples and tokens the mean output length.
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    pub problems: usize,
    pub full_pass: f64,
    pub pass: f64,
    pub full_tokens: f64,
    pub tokens: f64,
    /// pass@1 minus full's (a fraction), with its interval; None without shared problems.
    pub delta_pass: Option<Interval>,
    /// Mean tokens over full's, minus one, with its interval; None when full's mean is 0.
    pub tokens_change: Option<Interval>,
    /// Problems where full's pass@1 is higher, and where this row's is (with one sample a problem:
    /// the problems only full solved, and only this row solved).
    pub only_full: usize,
    pub only_policy: usize,
}

/// Per problem: (correct samples, tokens, samples).
fn per_problem<'a>(rs: &[&'a SampleRecord]) -> HashMap<&'a str, (f64, f64, usize)> {
    let mut m: HashMap<&str, (f64, f64, usize)> = HashMap::new();
    for r in rs {
        let e = m.entry(r.problem_id.as_str()).or_default();
        e.0 += f64::from(u8::from(r.correct));
        e.1 += r.tokens as f64;
        e.2 += 1;
    }
    m
}

/// Compares `mine` with `full` over the problem ids both have.
pub fn paired(full: &[&SampleRecord], mine: &[&SampleRecord]) -> Paired {
    let (f, m) = (per_problem(full), per_problem(mine));
    let mut shared: Vec<&str> = m.keys().filter(|k| f.contains_key(*k)).copied().collect();
    shared.sort_unstable();
    // Per shared problem: (full pass, pass, full tokens, tokens).
    let pairs: Vec<[f64; 4]> = shared
        .iter()
        .map(|k| {
            let (a, b) = (f[k], m[k]);
            [
                a.0 / a.2 as f64,
                b.0 / b.2 as f64,
                a.1 / a.2 as f64,
                b.1 / b.2 as f64,
            ]
        })
        .collect();
    let n = pairs.len().max(1) as f64;
    let mean = |i: usize| pairs.iter().map(|p| p[i]).sum::<f64>() / n;
    let (full_pass, pass, full_tokens, tokens) = (mean(0), mean(1), mean(2), mean(3));
    let delta = |idx: &mut dyn Iterator<Item = usize>| {
        let (mut d, mut k) = (0.0, 0usize);
        for i in idx {
            d += pairs[i][1] - pairs[i][0];
            k += 1;
        }
        d / k.max(1) as f64
    };
    let change = |idx: &mut dyn Iterator<Item = usize>| {
        let (mut a, mut b) = (0.0, 0.0);
        for i in idx {
            a += pairs[i][2];
            b += pairs[i][3];
        }
        // A resample whose full outputs are all empty has no ratio; count it as no change.
        if a > 0.0 {
            b / a - 1.0
        } else {
            0.0
        }
    };
    Paired {
        problems: pairs.len(),
        full_pass,
        pass,
        full_tokens,
        tokens,
        delta_pass: (!pairs.is_empty()).then(|| bootstrap(pairs.len(), &delta)),
        tokens_change: (!pairs.is_empty() && full_tokens > 0.0)
            .then(|| bootstrap(pairs.len(), &change)),
        only_full: pairs.iter().filter(|p| p[0] > p[1]).count(),
        only_policy: pairs.iter().filter(|p| p[1] > p[0]).count(),
    }
}

/// The statistic on all `n` pairs, and its 2.5th and 97.5th percentiles over seeded resamples of the
/// pairs (each resample: `n` indices drawn with replacement).
pub fn bootstrap(n: usize, stat: &dyn Fn(&mut dyn Iterator<Item = usize>) -> f64) -> Interval {
    let estimate = stat(&mut (0..n));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(BOOTSTRAP_SEED);
    let mut draws: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            let mut idx = (0..n).map(|_| rng.random_range(0..n));
            stat(&mut idx)
        })
        .collect();
    draws.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let i = (q * (draws.len() - 1) as f64).round() as usize;
        draws[i.min(draws.len() - 1)]
    };
    Interval {
        estimate,
        lo: at(0.025),
        hi: at(0.975),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_runs_give_a_zero_interval() {
        let i = bootstrap(20, &mean_of(&[0.0; 20]));
        assert_eq!((i.estimate, i.lo, i.hi), (0.0, 0.0, 0.0));
        assert!(i.contains_zero());
    }

    /// The mean of `values` over a resample's indices.
    fn mean_of(values: &[f64]) -> impl Fn(&mut dyn Iterator<Item = usize>) -> f64 + '_ {
        move |idx| {
            let (mut s, mut k) = (0.0, 0);
            for i in idx {
                s += values[i];
                k += 1;
            }
            s / k as f64
        }
    }

    #[test]
    fn a_consistent_loss_excludes_zero_and_a_single_flip_does_not() {
        // 40 problems: the policy loses 12 that full solved.
        let loss: Vec<f64> = (0..40).map(|i| if i < 12 { -1.0 } else { 0.0 }).collect();
        let i = bootstrap(40, &mean_of(&loss));
        assert!((i.estimate + 0.3).abs() < 1e-12);
        assert!(i.lo < -0.4 && i.hi < -0.15, "{i:?}");
        assert!(!i.contains_zero());
        // The same seed gives the same interval.
        assert_eq!(bootstrap(40, &mean_of(&loss)), i);
        // One problem in 40 changed: the interval reaches 0.
        let one: Vec<f64> = (0..40).map(|i| if i == 0 { -1.0 } else { 0.0 }).collect();
        assert!(bootstrap(40, &mean_of(&one)).contains_zero());
    }
}
