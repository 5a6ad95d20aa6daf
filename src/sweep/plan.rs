//! Parse, plan, execute: a sweep config expands into work units with stable content-hash ids before
//! anything runs, so that a rerun recognises the units it already finished and shards split the same
//! list the same way.

use crate::error::{Error, Result};
use crate::eval::Problem;
use crate::policy::PolicySpec;
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// The most work units one sweep plans (each costs a few hundred bytes before anything runs, and
/// far more to run): a study beyond it is several configs.
pub const MAX_UNITS: usize = 2_000_000;

/// Decoding settings shared by every unit of a sweep.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Decoding {
    pub temperature: f32,
    pub top_p: f32,
    pub max_new_tokens: usize,
    pub seed: u64,
    pub prompt: crate::eval::prompt::PromptVariant,
    /// How weights are held: it changes the arithmetic, so it is part of every unit's identity.
    pub weights: crate::model::weights::WeightFormat,
}

/// One (policy, budget, problem, sample).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkUnit {
    /// 16 hex digits of the sha256 of everything that determines the unit's result.
    pub id: String,
    /// Index into [`Plan::specs`].
    pub policy: usize,
    /// Index into [`Plan::problems`].
    pub problem: usize,
    pub sample: usize,
    pub seed: u64,
}

/// Every unit of a sweep, in a fixed order: policy, then problem, then sample.
#[derive(Debug, Clone)]
pub struct Plan {
    pub specs: Vec<PolicySpec>,
    pub problems: Vec<Problem>,
    pub decoding: Decoding,
    pub samples: usize,
    pub units: Vec<WorkUnit>,
}

/// Hex sha256 of a JSON value's canonical text (keys sorted, as serde_json writes maps of a
/// `json!` object).
pub fn content_id(v: &serde_json::Value) -> String {
    let digest = Sha256::digest(v.to_string().as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

impl Plan {
    /// Expands policies × problems × samples. `model_id` and `dataset_sha256` identify the inputs.
    pub fn new(
        mut specs: Vec<PolicySpec>,
        problems: Vec<Problem>,
        samples: usize,
        decoding: Decoding,
        model_id: &str,
        dataset_sha256: &str,
    ) -> Result<Self> {
        // Counted before anything is allocated for them.
        let count = specs
            .len()
            .checked_mul(problems.len())
            .and_then(|n| n.checked_mul(samples))
            .filter(|&n| n <= MAX_UNITS)
            .ok_or_else(|| {
                Error::Input(format!(
                    "{} (policy, budget) pairs × {} problems × {} samples is more than {MAX_UNITS} \
                     work units, the most one sweep plans: split the study into several configs",
                    specs.len(),
                    problems.len(),
                    samples
                ))
            })?;
        // `full` first: ratio budgets are resolved from its records before the policies run.
        specs.sort_by_key(|s| s.name() != "full");
        let mut units = Vec::with_capacity(count);
        for (pi, spec) in specs.iter().enumerate() {
            for (qi, problem) in problems.iter().enumerate() {
                for s in 0..samples {
                    // The seed depends on the problem and sample only, so every policy sees the same
                    // sampling stream for the same sample.
                    // (Wrapping: any base seed is allowed, and u64::MAX + 1 is seed 0.)
                    let seed = decoding.seed.wrapping_add((qi * samples + s) as u64);
                    let mut what = serde_json::json!({
                        "kvbench": env!("CARGO_PKG_VERSION"),
                        "model": model_id,
                        "dataset": dataset_sha256,
                        "problem": problem.id,
                        "sample": s,
                        "seed": seed,
                        "policy": spec.describe(),
                        "decoding": decoding,
                    });
                    // A cache type of its own (a `kv_types` grid) is part of the unit; the model's type
                    // is in the config hash already, so units without one keep their ids.
                    if let Some(kv) = spec.kv_type() {
                        what["kv_type"] = kv.to_string().into();
                    }
                    let id = content_id(&what);
                    units.push(WorkUnit {
                        id,
                        policy: pi,
                        problem: qi,
                        sample: s,
                        seed,
                    });
                }
            }
        }
        Ok(Self {
            specs,
            problems,
            decoding,
            samples,
            units,
        })
    }

    /// Units of the (policy, budget) at `policy`, in plan order.
    pub fn units_of(&self, policy: usize) -> impl Iterator<Item = &WorkUnit> {
        self.units.iter().filter(move |u| u.policy == policy)
    }

    /// The index of the `full` spec whose cache is stored as `kv` (`None`: the model's type): the
    /// baseline that specs of that type resolve their ratio budgets from.
    pub fn full_index_for(&self, kv: Option<crate::cache::KvType>) -> Option<usize> {
        self.specs
            .iter()
            .position(|s| s.name() == "full" && s.kv_type() == kv)
    }

    /// Whether some spec waits for the full run's mean generation length.
    pub fn needs_full_mean(&self) -> bool {
        self.specs.iter().any(PolicySpec::needs_full_mean)
    }

    /// The mean generation length of the plan's `full` units of cache type `kv`, from `tokens` (unit id →
    /// tokens of a finished full unit); an error says how many are missing and how to run them.
    pub fn full_mean_tokens(
        &self,
        tokens: &HashMap<String, usize>,
        kv: Option<crate::cache::KvType>,
    ) -> Result<f64> {
        let Some(full) = self.full_index_for(kv) else {
            return Err(Error::Input(
                "a budget at most 1 (and any Kara budget, ρ = B over it) is resolved from the full run's mean generation length, and this study has no `full` policy: add it (a [[policy]] named full; `run` without --no-baseline), give absolute budgets (entries, above 1), or use budget_rule = \"seen\"".into(),
            ));
        };
        let units: Vec<&WorkUnit> = self.units_of(full).collect();
        let have: Vec<usize> = units
            .iter()
            .filter_map(|u| tokens.get(&u.id).copied())
            .collect();
        if have.len() < units.len() {
            return Err(Error::Input(format!(
                "ratio budgets are resolved from the full run's mean generation length, and {} of the {} full units have not finished (they failed or have not run yet): run them first (`kvbench sweep CONFIG --phase full`, or the same command without --shard), then the policies",
                units.len() - have.len(),
                units.len()
            )));
        }
        Ok(have.iter().sum::<usize>() as f64 / have.len().max(1) as f64)
    }

    /// Upper bound of tokens generated (every unit running to its limit).
    pub fn max_tokens(&self) -> usize {
        self.units
            .len()
            .saturating_mul(self.decoding.max_new_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(seed: u64, budgets: &[f64]) -> Plan {
        let specs = budgets
            .iter()
            .map(|&b| PolicySpec::new("rkv", b, Default::default()).unwrap())
            .chain(std::iter::once(
                PolicySpec::new("full", 1.0, Default::default()).unwrap(),
            ))
            .collect();
        let problems = crate::eval::builtin::problems(3, 1);
        let decoding = Decoding {
            temperature: 0.0,
            top_p: 1.0,
            max_new_tokens: 64,
            seed,
            prompt: crate::eval::prompt::PromptVariant::R1,
            weights: Default::default(),
        };
        Plan::new(specs, problems, 2, decoding, "model", "data").unwrap()
    }

    #[test]
    fn ids_are_stable_unique_and_content_dependent() {
        let a = plan(0, &[0.1, 0.2]);
        assert_eq!(a.units.len(), 3 * 3 * 2);
        assert_eq!(a.max_tokens(), 18 * 64);
        let b = plan(0, &[0.1, 0.2]);
        assert_eq!(a.units, b.units, "same config, same ids");
        let mut ids: Vec<&str> = a.units.iter().map(|u| u.id.as_str()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), a.units.len(), "ids are unique");
        // Removing a budget keeps the other units' ids.
        let c = plan(0, &[0.2]);
        assert!(c.units.iter().all(|u| a.units.iter().any(|v| v.id == u.id)));
        // Another seed changes every id.
        let d = plan(1, &[0.1, 0.2]);
        assert!(d.units.iter().all(|u| a.units.iter().all(|v| v.id != u.id)));
    }
}
