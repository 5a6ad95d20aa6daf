//! A sweep's TOML configuration: model, data, prompt and decoding, the policies with their parameters
//! and budgets. Unknown keys are refused with their name, and every policy is parsed (and so checked)
//! before anything runs.

use crate::error::{Error, Result};
use crate::eval::prompt::{DecodingPreset, PromptVariant};
use crate::policy::PolicySpec;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepConfig {
    /// Names the results directory (`results/NAME` unless `out` is given).
    pub name: String,
    #[serde(default = "default_model")]
    pub model: String,
    /// `builtin`, `math500`, `aime24`, `aime25`, `amc23`.
    #[serde(default = "default_dataset")]
    pub dataset: String,
    /// A JSON Lines file instead of the dataset's resolution (relative to the config file).
    pub data: Option<PathBuf>,
    #[serde(default)]
    pub ids: Vec<String>,
    pub shuffle_seed: Option<u64>,
    pub limit: Option<usize>,
    #[serde(default = "default_prompt")]
    pub prompt: PromptVariant,
    #[serde(default = "default_preset")]
    pub preset: DecodingPreset,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub max_new_tokens: Option<usize>,
    #[serde(default = "default_samples")]
    pub samples: usize,
    #[serde(default)]
    pub seed: u64,
    /// Budgets of every compressing policy that gives none of its own.
    #[serde(default)]
    pub budgets: Vec<f64>,
    pub out: Option<PathBuf>,
    #[serde(rename = "policy", default)]
    pub policies: Vec<PolicyEntry>,
}

/// One `[[policy]]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyEntry {
    pub name: String,
    pub budgets: Option<Vec<f64>>,
    /// Parameters, as `--policy-arg` takes them.
    #[serde(default)]
    pub args: BTreeMap<String, toml::Value>,
}

fn default_model() -> String {
    crate::model::resolve::DEFAULT_MODEL.to_string()
}
fn default_dataset() -> String {
    "builtin".into()
}
fn default_prompt() -> PromptVariant {
    PromptVariant::R1
}
fn default_preset() -> DecodingPreset {
    DecodingPreset::Greedy
}
fn default_samples() -> usize {
    1
}

impl SweepConfig {
    /// Reads and checks a config file; errors name the file (and the key, from the TOML parser).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let mut c: SweepConfig =
            toml::from_str(&text).map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
        if let Some(d) = &c.data {
            if d.is_relative() {
                c.data = Some(path.parent().unwrap_or(Path::new(".")).join(d));
            }
        }
        c.policy_specs()
            .map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
        if c.samples == 0 || c.max_new_tokens == Some(0) {
            return Err(Error::Input(format!(
                "{}: samples and max_new_tokens must be at least 1",
                path.display()
            )));
        }
        Ok(c)
    }

    /// Every (policy, budget) of the sweep, parsed and checked. `full` runs once, without a budget.
    pub fn policy_specs(&self) -> Result<Vec<PolicySpec>> {
        if self.policies.is_empty() {
            return Err(Error::Input("no [[policy]] tables".into()));
        }
        let mut out = Vec::new();
        for p in &self.policies {
            let args: BTreeMap<String, String> = p
                .args
                .iter()
                .map(|(k, v)| {
                    let v = match v {
                        toml::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    (k.clone(), v)
                })
                .collect();
            let budgets = if p.name == "full" {
                vec![1.0]
            } else {
                p.budgets.clone().unwrap_or_else(|| self.budgets.clone())
            };
            if budgets.is_empty() {
                return Err(Error::Input(format!(
                    "policy '{}' has no budgets (give `budgets` in its table or at the top)",
                    p.name
                )));
            }
            for b in budgets {
                out.push(PolicySpec::new(&p.name, b, args.clone())?);
            }
        }
        Ok(out)
    }
}
