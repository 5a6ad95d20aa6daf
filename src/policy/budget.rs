//! The budget rules every policy follows and every result reports.
//!
//! - A budget `B > 1` is a fixed number of entries per layer and KV head for the whole run, as R-KV
//!   and LazyEviction define it (the size after a compression; a policy may exceed it by its declared
//!   buffer between compressions).
//! - A budget `r ≤ 1` under the default rule, `ratio`, is the references' "budget ratio": the fixed
//!   budget `B = ⌈r × mean generation length of the full-cache run on the same problems⌉`, never below
//!   the policy's own always-kept set. It is resolved from the `full` records of the same study before
//!   the policy's units run ([`Budget::resolve`]), and every record stores `B` and the mean it came from.
//! - Under the rule `seen` (kvbench 0.2's rule, kept by name) `r ≤ 1` is a growing fraction: after a
//!   compression at most `⌈r × tokens seen so far⌉` entries. Its curves are not comparable with the
//!   papers'.
//!
//! - Under the rule `held` a budget `B > 1` is the number of entries a layer and KV head holds on
//!   average over the generation (time-averaged), so that policies with different holding patterns
//!   compare at equal memory: each policy translates it into its own nominal budget from its known
//!   pattern (a policy that compresses every `buffer` tokens holds between its nominal budget and that
//!   plus `buffer`, so its nominal budget is `B − buffer/2`; Kara, whose holding grows with the output,
//!   takes `ρ` from the full run's mean lengths), see [`crate::policy::PolicySpec`].
//!
//! Either way a policy never goes below its always-kept set (its observation window, its sink
//! tokens): that floor is part of the policy's declared bound, and so is its buffer. The engine checks
//! the bound after every step and fails loudly when a policy holds more.

use crate::error::{Error, Result};
use std::fmt;

/// The largest absolute budget: far beyond any context, small enough that bounds built on it (budget
/// plus buffer, times layers and heads) cannot overflow.
pub const MAX_ENTRIES: usize = 1 << 30;

/// How a budget at most 1 is read.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum BudgetRule {
    /// `B = ⌈r × the full run's mean generation length⌉`, fixed for the run (the papers' ratio).
    #[default]
    Ratio,
    /// At most `⌈r × tokens seen⌉` after each compression: the cache grows with the trace.
    Seen,
    /// `B` entries held per layer and KV head on average over the generation (equal memory).
    Held,
}

/// A KV budget as the user wrote it, or resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// Entries per layer and KV head, fixed for the run.
    Entries(usize),
    /// A ratio of the full run's mean generation length, not yet resolved into entries.
    Ratio(f64),
    /// A fraction of the tokens seen so far (rule `seen`).
    Seen(f64),
    /// Entries held on average (rule `held`), before the policy translates it to its own budget.
    Held(usize),
}

impl Budget {
    /// Reads a `--budget` value under `rule`.
    pub fn from_value(value: f64, rule: BudgetRule) -> Result<Self> {
        // One wording whether the value came from the flag or a config's list; a huge value in
        // scientific notation (1e300 has 301 digits in full).
        let bad = |reason: String| {
            let shown = if value.abs() >= 1e15 {
                format!("{value:e}")
            } else {
                value.to_string()
            };
            Err(Error::Input(format!(
                "budget {shown} (--budget, or `budgets` in a sweep config): {reason}"
            )))
        };
        if !value.is_finite() || value <= 0.0 {
            return bad("must be a positive number".into());
        }
        if value <= 1.0 {
            return match rule {
                BudgetRule::Ratio => Ok(Budget::Ratio(value)),
                BudgetRule::Seen => Ok(Budget::Seen(value)),
                BudgetRule::Held => bad(
                    "under --budget-rule held the budget is the number of entries held on average per layer and KV head (above 1)".into(),
                ),
            };
        }
        if value.fract() != 0.0 {
            return bad(
                "above 1 the budget is a whole number of entries per layer and KV head".into(),
            );
        }
        if value > MAX_ENTRIES as f64 {
            return bad(format!(
                "at most {MAX_ENTRIES} entries per layer and KV head"
            ));
        }
        Ok(match rule {
            BudgetRule::Held => Budget::Held(value as usize),
            _ => Budget::Entries(value as usize),
        })
    }

    /// Entries a policy may keep after compressing a sequence that has seen `seen` tokens. An
    /// unresolved ratio has no entry count: policies are built from resolved budgets only
    /// ([`crate::policy::PolicySpec::build`] refuses), so it answers the cap.
    pub fn entries(&self, seen: usize) -> usize {
        match *self {
            Budget::Seen(f) => ((f * seen as f64).ceil() as usize).min(MAX_ENTRIES),
            Budget::Entries(n) => n,
            Budget::Ratio(_) | Budget::Held(_) => MAX_ENTRIES,
        }
    }

    /// The fixed budget a ratio stands for, given the full run's mean generation length and the
    /// policy's floor (its always-kept entries). Other budgets are returned as they are.
    pub fn resolve(&self, full_mean_tokens: f64, floor: usize) -> Budget {
        match *self {
            Budget::Ratio(r) => {
                let b = (r * full_mean_tokens.max(0.0)).ceil() as usize;
                Budget::Entries(b.clamp(floor.max(1), MAX_ENTRIES))
            }
            other => other,
        }
    }

    /// Whether this budget waits for the full run's mean length.
    pub fn is_ratio(&self) -> bool {
        matches!(self, Budget::Ratio(_))
    }

    /// The `--budget` number as written.
    pub fn value(&self) -> f64 {
        match *self {
            Budget::Ratio(f) | Budget::Seen(f) => f,
            Budget::Entries(n) | Budget::Held(n) => n as f64,
        }
    }

    /// The rule in words, for reports.
    pub fn rule(&self) -> String {
        match *self {
            Budget::Seen(f) => format!(
                "seen {f}: at most ceil({f} × tokens seen) entries per layer and KV head after a compression, plus the policy's buffer (not comparable with the papers' budgets)"
            ),
            Budget::Ratio(r) => format!(
                "ratio {r}: B = ceil({r} × mean generation length of the full run on the same problems) entries per layer and KV head, fixed for the run"
            ),
            Budget::Entries(n) => format!(
                "absolute: at most {n} entries per layer and KV head after a compression, plus the policy's buffer"
            ),
            Budget::Held(n) => format!(
                "held {n}: {n} entries per layer and KV head held on average over the generation, each policy's nominal budget derived from its holding pattern"
            ),
        }
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Seen(v) => write!(f, "{v} budget_rule=seen"),
            Budget::Held(n) => write!(f, "{n} budget_rule=held"),
            other => write!(f, "{}", other.value()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_rounds_up_and_absolute_is_fixed() {
        let b = Budget::from_value(0.1, BudgetRule::Seen).unwrap();
        assert_eq!(b.entries(1000), 100);
        assert_eq!(b.entries(1001), 101);
        assert_eq!(b.entries(0), 0);
        assert_eq!(
            Budget::from_value(1.0, BudgetRule::Seen)
                .unwrap()
                .entries(37),
            37
        );
        let b = Budget::from_value(256.0, BudgetRule::Ratio).unwrap();
        assert_eq!(b, Budget::Entries(256));
        assert_eq!(b.entries(10_000), 256);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 2.5, 2e19, 1e308] {
            assert!(Budget::from_value(bad, BudgetRule::Ratio).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_ratio_resolves_from_the_full_mean_with_the_policy_floor() {
        let r = Budget::from_value(0.1, BudgetRule::Ratio).unwrap();
        assert!(r.is_ratio());
        assert_eq!(r.resolve(365.2, 8), Budget::Entries(37));
        assert_eq!(
            r.resolve(40.0, 8),
            Budget::Entries(8),
            "never below the floor"
        );
        assert_eq!(r.resolve(0.0, 0), Budget::Entries(1));
        // Absolute and seen budgets do not change.
        assert_eq!(Budget::Entries(64).resolve(1e9, 8), Budget::Entries(64));
        assert_eq!(Budget::Seen(0.5).resolve(10.0, 8), Budget::Seen(0.5));
    }
}
