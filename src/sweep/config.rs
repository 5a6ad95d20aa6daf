//! A sweep's TOML configuration: a name, the model ([`ModelFlags`]) and study options (the same keys
//! as `kvbench run`'s flags, see [`StudyOptions`]), the budgets, the budget rule and the policies with
//! their parameters. Unknown keys are refused with their name and line. Every policy is parsed once,
//! when the config is built, and its table carries the parsed [`PolicySpec`]s: nothing downstream
//! re-reads text.

use super::options::StudyOptions;
use crate::device::DeviceSpec;
use crate::error::{Error, Result};
use crate::flags::{ModelFlags, PolicyFlags};
use crate::policy::{BudgetRule, PolicySpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// A sweep: a name, the model, the study options, the budgets and the policies.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepConfig {
    /// Names the results directory (`results/NAME` unless `out` is given).
    pub name: String,
    #[serde(flatten)]
    pub model: ModelFlags,
    #[serde(flatten)]
    pub options: StudyOptions,
    /// How budgets at most 1 are read, for every policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_rule: Option<BudgetRule>,
    /// Budgets of every compressing policy that gives none of its own.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<f64>,
    /// Cache storage types crossed with every (policy, budget): the grid's third axis. Empty: the
    /// model's type (`kv_type`) alone.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kv_types: Vec<crate::cache::KvType>,
    #[serde(rename = "policy")]
    policies: Vec<PolicyEntry>,
}

/// The line (from 1) of the top-level key of `text` that `message` is about, as toml and serde name
/// it (a bad value's key path at the end, ``… in `device` ``): what an error of a part of the file
/// loses when the file is cut into parts. `None` for a key inside a table (`policy.budgets`, a field
/// of a `[[policy]]`), whose line the top-level table does not give. An unknown top-level key never
/// reaches a part: [`unknown_key`] names it, with its line.
fn line_of_named_key(text: &str, message: &str) -> Option<usize> {
    let (_, path) = message.rsplit_once(" in `")?;
    line_of_key(text, path.strip_suffix('`')?)
}

/// The line (from 1) of the top-level key `key` of `text`; `None` for an array of tables.
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    let keys: BTreeMap<String, toml::Spanned<toml::Value>> = toml::from_str(text).ok()?;
    let value = keys.get(key)?;
    if let toml::Value::Array(items) = value.get_ref() {
        if items.iter().any(toml::Value::is_table) {
            return None;
        }
    }
    Some(text.get(..value.span().start)?.matches('\n').count() + 1)
}

/// The keys a config has besides the model's ([`ModelFlags::KEYS`]) and the study options'
/// ([`StudyOptions::KEYS`]): [`Head`]'s.
const HEAD_KEYS: [&str; 5] = ["name", "budgets", "budget_rule", "kv_types", "policy"];

/// The error for a top-level key that no part of a config takes: its line where the file gives
/// one, the nearest key a config does take (a misspelling, as clap suggests a flag: Jaro
/// similarity above 0.7), and every key. Each part refusing it by itself listed its own keys only,
/// as if they were all.
fn unknown_key(text: &str, key: &str) -> String {
    let all: Vec<&str> = HEAD_KEYS
        .iter()
        .chain(&ModelFlags::KEYS)
        .chain(&StudyOptions::KEYS)
        .copied()
        .collect();
    let nearest = all
        .iter()
        .map(|k| (strsim::jaro(key, k), *k))
        .filter(|&(score, _)| score > 0.7)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| format!(" (did you mean `{k}`?)"))
        .unwrap_or_default();
    let line = line_of_key(text, key)
        .map(|l| format!("line {l}: "))
        .unwrap_or_default();
    let names = all
        .iter()
        .map(|k| match *k {
            "policy" => "[[policy]]".to_string(),
            k => k.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!("{line}unknown key `{key}`{nearest}; a sweep config's top-level keys are {names}")
}

/// The keys a config has besides the model's and the study options.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Head {
    name: String,
    #[serde(default)]
    budgets: Vec<f64>,
    #[serde(default, deserialize_with = "crate::flags::any_case")]
    budget_rule: Option<BudgetRule>,
    #[serde(default)]
    kv_types: Option<Vec<crate::cache::KvType>>,
    #[serde(rename = "policy", default)]
    policies: Vec<PolicyEntry>,
}

/// One `[[policy]]` table as written, with the (policy, budget)s it stands for, parsed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyEntry {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budgets: Option<Vec<f64>>,
    /// Parameters, as `--policy-arg` takes them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub args: BTreeMap<String, toml::Value>,
    /// One spec per budget, parsed when the config was built.
    #[serde(skip)]
    specs: Vec<PolicySpec>,
}

impl PolicyEntry {
    /// The table a parsed spec stands for: its name, its one budget (none for a baseline added
    /// beside the policy of `run`), its parameters as written.
    pub fn of(spec: &PolicySpec, with_budget: bool) -> Self {
        PolicyEntry {
            name: spec.name().to_string(),
            budgets: with_budget.then(|| vec![spec.budget_as_written()]),
            args: spec
                .args()
                .iter()
                .map(|(k, v)| (k.clone(), toml::Value::String(v.clone())))
                .collect(),
            specs: vec![spec.clone()],
        }
    }

    /// The parsed (policy, budget)s of this table.
    pub fn specs(&self) -> &[PolicySpec] {
        &self.specs
    }
}

/// A policy table's parameters as `--policy-arg` gives them: strings as they are, other values as TOML
/// writes them.
fn arg_strings(args: &BTreeMap<String, toml::Value>) -> BTreeMap<String, String> {
    args.iter()
        .map(|(k, v)| {
            let v = match v {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), v)
        })
        .collect()
}

/// A sweep's name names its results directory (`results/NAME`): one plain file name, never a path.
fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name != "."
        && name != ".."
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+'));
    if ok {
        Ok(())
    } else {
        Err(Error::Input(format!(
            "name {name:?}: a sweep's name is its results directory's name: use letters, digits, '-', '_', '.' and '+' (not starting with '.'), at most 200 characters"
        )))
    }
}

/// What the command line changes in a config file: the model's flags and the study options field
/// by field; `--policy` replaces the policies (at `--budget`, else the file's budgets, with
/// `--policy-arg`); `--budget` alone gives the file's compressing policies new budgets;
/// `--budget-rule` changes the rule.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub model: ModelFlags,
    pub options: StudyOptions,
    pub policy: PolicyFlags,
}

impl SweepConfig {
    /// A config from its parts; every policy table is parsed here, once, and the whole is checked.
    pub fn new(
        name: String,
        model: ModelFlags,
        options: StudyOptions,
        budget_rule: Option<BudgetRule>,
        budgets: Vec<f64>,
        mut policies: Vec<PolicyEntry>,
    ) -> Result<Self> {
        check_name(&name)?;
        options.check().map_err(Error::Input)?;
        if policies.is_empty() {
            return Err(Error::Input("no [[policy]] tables".into()));
        }
        let rule = budget_rule.unwrap_or_default();
        let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
        for p in &mut policies {
            // As kvbench names it (`R-KV` is `rkv`); a name that is no policy fails below.
            if let Some(name) = crate::policy::canonical_name(&p.name) {
                p.name = name.to_string();
            }
            let args = arg_strings(&p.args);
            let list = if p.name == "full" {
                // Runs once at any budget ([`SweepConfig::warnings`] names a list of its own).
                vec![1.0]
            } else {
                p.budgets.clone().unwrap_or_else(|| budgets.clone())
            };
            if list.is_empty() {
                return Err(Error::Input(format!(
                    "policy '{}' has no budgets (give `budgets` in its table or at the top)",
                    p.name
                )));
            }
            p.specs.clear();
            for b in list {
                let spec = PolicySpec::with_rule(&p.name, b, rule, args.clone())?;
                // The same (policy, parameters, budget) twice would plan the same units twice.
                if !seen.insert(spec.describe()) {
                    return Err(Error::Input(format!(
                        "policy '{}' at budget {b} is listed twice (same parameters); remove one",
                        p.name
                    )));
                }
                p.specs.push(spec);
            }
        }
        Ok(SweepConfig {
            name,
            model,
            options,
            budget_rule,
            budgets,
            kv_types: Vec::new(),
            policies,
        })
    }

    /// A config of policies already parsed (`run`, `fidelity`, a sweep's policy flags): one table
    /// per spec.
    pub fn from_specs(
        name: String,
        model: ModelFlags,
        options: StudyOptions,
        budget_rule: Option<BudgetRule>,
        specs: &[PolicySpec],
    ) -> Result<Self> {
        let tables = specs.iter().map(|s| PolicyEntry::of(s, true)).collect();
        Self::from_tables(name, model, options, budget_rule, tables)
    }

    /// A config of tables built from parsed specs ([`PolicyEntry::of`]).
    pub fn from_tables(
        name: String,
        model: ModelFlags,
        options: StudyOptions,
        budget_rule: Option<BudgetRule>,
        policies: Vec<PolicyEntry>,
    ) -> Result<Self> {
        check_name(&name)?;
        options.check().map_err(Error::Input)?;
        if policies.is_empty() {
            return Err(Error::Input("no policy to run".into()));
        }
        Ok(SweepConfig {
            name,
            model,
            options,
            budget_rule,
            budgets: Vec::new(),
            kv_types: Vec::new(),
            policies,
        })
    }

    /// Reads and checks a config file; errors name the file (and the key, from the TOML parser).
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_with(path, &Overrides::default())
    }

    /// Reads a config file and applies the command line's overrides before its policies are parsed.
    pub fn load_with(path: &Path, over: &Overrides) -> Result<Self> {
        let text = crate::files::read_text(path, crate::files::CONFIG_LIMIT)
            .map_err(|e| e.naming(path, format!("sweep config {}", path.display())))?;
        let bad = |e: String| Error::Input(format!("{}: {e}", path.display()));
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        // A part's error names its key, not its line (the parts are tables cut from the file): the
        // line is found again from the key.
        let bad_part = |e: toml::de::Error| {
            // One line: toml puts the key's path on a line of its own.
            let e = e.to_string().trim_end().replace('\n', " ");
            match line_of_named_key(&text, &e) {
                Some(line) => bad(format!("line {line}: {e}")),
                None => bad(e),
            }
        };
        // Split the sweep's own keys and the model's from the study options; each part refuses keys
        // it does not know.
        let mut take = |keys: &[&str]| {
            let mut part = toml::Table::new();
            for key in keys {
                if let Some(v) = table.remove(*key) {
                    part.insert(key.to_string(), v);
                }
            }
            part
        };
        let head = take(&HEAD_KEYS);
        let model = take(&ModelFlags::KEYS);
        // A key no part takes, named before any part is read (a misspelt `name` would be missed
        // as absent first).
        if let Some(key) = table
            .keys()
            .find(|k| !StudyOptions::KEYS.contains(&k.as_str()))
        {
            return Err(bad(unknown_key(&text, key)));
        }
        let head: Head = head.try_into().map_err(bad_part)?;
        let model: ModelFlags = model.try_into().map_err(bad_part)?;
        let mut options: StudyOptions = table.try_into().map_err(bad_part)?;
        if let Some(d) = &options.data {
            if d.is_relative() {
                options.data = Some(path.parent().unwrap_or(Path::new(".")).join(d));
            }
        }
        // The file's model name, checked here so that a bad one is named with the file and key (a
        // name given by `--model` is checked where it is resolved, and named there).
        if over.model.model.is_none() {
            if let Some(name) = &model.model {
                crate::loading::resolve::check_name(name)
                    .map_err(|e| bad(format!("`model`: {e}")))?;
            }
        }
        let model = model.overridden_by(&over.model);
        let options = options.overridden_by(&over.options);
        let budget_rule = over.policy.budget_rule.or(head.budget_rule);
        // An empty list would quietly mean the model's type alone, as no list does: say so instead.
        if head.kv_types.as_ref().is_some_and(Vec::is_empty) {
            return Err(bad(
                "kv_types is empty: list the KV cache types to cross with the policies, or leave \
                 the key out for the model's own (kv_type)"
                    .into(),
            ));
        }
        let head_kv_types = head.kv_types.clone().unwrap_or_default();
        let flags = &over.policy;
        let built = if !flags.policy.is_empty() {
            // Policies named on the command line replace the file's, at the flags' budgets or else
            // the file's own.
            let mut flags = flags.clone();
            if flags.budget.is_empty() {
                flags.budget = head.budgets.clone();
            }
            let specs = flags.grid(&[], budget_rule.unwrap_or_default())?;
            Self::from_specs(head.name, model, options, budget_rule, &specs)
        } else {
            if !flags.policy_args.is_empty() {
                return Err(bad(
                    "--policy-arg on a sweep goes with --policy (the policies it parameterises)"
                        .into(),
                ));
            }
            // `--budget` alone: the file's policies, every compressing one at the flags' budgets.
            let (budgets, mut policies) = (head.budgets, head.policies);
            let budgets = if flags.budget.is_empty() {
                budgets
            } else {
                for p in policies.iter_mut().filter(|p| p.name != "full") {
                    p.budgets = None;
                }
                flags.budget.clone()
            };
            Self::new(head.name, model, options, budget_rule, budgets, policies)
        };
        built
            .and_then(|c| c.with_kv_types(head_kv_types))
            .map_err(|e| match e {
                Error::Input(m) => bad(m),
                other => other,
            })
    }

    /// The policy tables as written, each with its parsed specs.
    pub fn policies(&self) -> &[PolicyEntry] {
        &self.policies
    }

    pub fn budget_rule(&self) -> BudgetRule {
        self.budget_rule.unwrap_or_default()
    }

    /// The hash a results directory records: everything that decides the results (all but the
    /// output directory, the batch size, the data file's path and which GPU), with the identities
    /// (content hashes) of the model and data files.
    pub fn hash(&self, model_id: &str, dataset_id: &str) -> String {
        let mut c = self.clone();
        c.options.out = None;
        c.options.batch_size = None;
        c.options.data = None;
        c.model.device = None;
        // The device's default storage writes no key: naming it changes nothing.
        if c.model.kv_type == Some(crate::cache::KvType::default_for(self.model.device())) {
            c.model.kv_type = None;
        }
        if c.model.activations == Some(crate::model::Activations::default()) {
            c.model.activations = None;
        }
        let mut config = serde_json::to_value(&c).unwrap_or_default();
        // The device's kind decides the numbers; which GPU of a node does not (shards of one sweep
        // run on several). The CPU is the default and writes no key, as before devices existed.
        if let (Some(obj), DeviceSpec::Cuda(_)) = (config.as_object_mut(), self.model.device()) {
            obj.insert("device".into(), "cuda".into());
        }
        super::plan::content_id(&serde_json::json!({
            "config": config,
            "model": model_id,
            "dataset": dataset_id,
            "kvbench": env!("CARGO_PKG_VERSION"),
        }))
    }

    /// The hash of everything but the grid (the policies and budgets): configs with one base hash
    /// give the (policy, budget)s they share the same unit ids, so one results directory can hold
    /// them all (a sweep extended with more policies or budgets, see [`SweepConfig::extended_by`]).
    pub fn base_hash(&self, model_id: &str, dataset_id: &str) -> String {
        let mut c = self.clone();
        c.policies.clear();
        c.budgets.clear();
        c.kv_types.clear();
        c.hash(model_id, dataset_id)
    }

    /// This config's grid with `other`'s added: the (policy, parameters, budget)s of both, this
    /// config's first, each once. The options are `other`'s (the configs are expected to share a
    /// base hash). Budgets every table shares stay at the top, so a config extended by a superset of
    /// itself is that superset, and extending is idempotent.
    pub fn extended_by(&self, other: &SweepConfig) -> Result<SweepConfig> {
        let mut tables: Vec<PolicyEntry> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for cfg in [self, other] {
            for p in &cfg.policies {
                let full = p.name == "full";
                for spec in &p.specs {
                    if !seen.insert(spec.describe()) {
                        continue;
                    }
                    let i = match tables
                        .iter()
                        .position(|t| t.name == p.name && t.args == p.args)
                    {
                        Some(i) => i,
                        None => {
                            tables.push(PolicyEntry {
                                name: p.name.clone(),
                                budgets: (!full).then(Vec::new),
                                args: p.args.clone(),
                                specs: Vec::new(),
                            });
                            tables.len() - 1
                        }
                    };
                    if let Some(list) = tables[i].budgets.as_mut() {
                        list.push(spec.budget().value());
                    }
                }
            }
        }
        let mut top: Vec<f64> = Vec::new();
        for b in tables.iter().filter(|t| t.name != "full") {
            for &v in b.budgets.iter().flatten() {
                if !top.contains(&v) {
                    top.push(v);
                }
            }
        }
        let same_set = |b: &[f64]| b.len() == top.len() && b.iter().all(|v| top.contains(v));
        for t in &mut tables {
            if t.name == "full" || t.budgets.as_deref().is_some_and(same_set) {
                t.budgets = None;
            }
        }
        let mut kv_types = self.kv_types.clone();
        for kv in &other.kv_types {
            if !kv_types.contains(kv) {
                kv_types.push(*kv);
            }
        }
        SweepConfig::new(
            other.name.clone(),
            other.model.clone(),
            other.options.clone(),
            other.budget_rule,
            top,
            tables,
        )?
        .with_kv_types(kv_types)
    }

    /// This config with `kv_types` as its grid's cache types (each once; an empty list: the model's
    /// type alone).
    pub fn with_kv_types(mut self, kv_types: Vec<crate::cache::KvType>) -> Result<Self> {
        for (i, kv) in kv_types.iter().enumerate() {
            if kv_types[..i].contains(kv) {
                return Err(Error::Input(format!(
                    "kv_types lists {kv} twice; remove one"
                )));
            }
        }
        self.kv_types = kv_types;
        Ok(self)
    }

    /// The config as TOML, for the results directory.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# not representable as TOML: {e}\n"))
    }

    /// What the config says that the sweep does not do: a `full` table's own budgets (it keeps
    /// every entry and runs once). For the command to print; reading the config again (`report`)
    /// says nothing.
    pub fn warnings(&self) -> Vec<String> {
        self.policies
            .iter()
            .filter(|p| p.name == "full")
            .filter_map(|p| p.budgets.as_ref())
            .filter(|b| b.iter().any(|&x| x != 1.0))
            .map(|b| {
                format!("[[policy]] 'full' keeps every entry and runs once: its budgets {b:?} are ignored")
            })
            .collect()
    }

    /// Every (policy, budget) of the sweep, parsed when the config was built. `full` runs once,
    /// without a budget.
    pub fn policy_specs(&self) -> Vec<PolicySpec> {
        let specs = self.policies.iter().flat_map(|p| p.specs.iter().cloned());
        if self.kv_types.is_empty() {
            return specs.collect();
        }
        // Crossed with the cache types: the model's own type keeps the spec as it is (its units keep
        // their ids), every other type is the spec's own.
        let model_type = self.model.kv_type();
        specs
            .flat_map(|spec| {
                self.kv_types
                    .iter()
                    .map(move |&kv| spec.clone().with_kv_type((kv != model_type).then_some(kv)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` loaded as a config file. Each call writes a file of its own: tests run in parallel, and
    /// two writing the same text to one path could each read the other's half-written file.
    fn config(text: &str) -> SweepConfig {
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("kvbench-config-{}-{call}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let config = SweepConfig::load(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        config
    }

    const HEAD: &str = "name = \"s\"\nmodel = \"smollm2-135m\"\ndataset = \"builtin\"\n";

    /// A bad key of each part of a file (the sweep's own, the model's, the study options') and an
    /// unknown one: the error names the key and its line, though each part is read from a table cut
    /// from the file.
    #[test]
    fn a_bad_or_unknown_key_is_named_with_its_line() {
        let path = std::env::temp_dir().join(format!("kvbench-badkey-{}.toml", std::process::id()));
        for (line, key) in [
            ("budgets = \"many\"", "budgets"),
            ("device = 5", "device"),
            ("max_new_tokens = \"long\"", "max_new_tokens"),
            ("policies = [\"rkv\"]", "policies"),
        ] {
            // The bad line is the fifth: after the head and a comment.
            let text = format!("{HEAD}# a comment\n{line}\n[[policy]]\nname = \"full\"\n");
            std::fs::write(&path, &text).unwrap();
            let e = SweepConfig::load(&path).unwrap_err().to_string();
            assert!(e.contains("line 5: "), "{line}: {e}");
            assert!(e.contains(&format!("`{key}`")), "{line}: {e}");
        }
        // A key the file does not have, or one inside a policy's table (whose error also names
        // keys the file has at the top, `name` among them): no line rather than a wrong one.
        for (text, says) in [
            (
                "model = \"smollm2-135m\"\n".to_string(),
                "missing field `name`",
            ),
            (
                format!("{HEAD}[[policy]]\nname = \"full\"\n[[policy]]\nnam = \"rkv\"\n"),
                "unknown field `nam`",
            ),
            (
                format!("{HEAD}limit = 3\nbudgets = [64]\n[[policy]]\nname = \"rkv\"\nlimit = 4\n"),
                "unknown field `limit`",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = SweepConfig::load(&path).unwrap_err().to_string();
            assert!(e.contains(says) && !e.contains("line"), "{e}");
        }
        let _ = std::fs::remove_file(&path);
    }

    /// An unknown top-level key is refused as no part's, with its line, the key it was likely meant
    /// as, and every part's keys: read by one part alone, it was said to expect only that part's.
    /// Checked before the parts are read, so a misspelt required key is not reported missing.
    #[test]
    fn an_unknown_key_names_the_nearest_and_every_key() {
        let path =
            std::env::temp_dir().join(format!("kvbench-unknown-{}.toml", std::process::id()));
        for (text, line, meant) in [
            (format!("{HEAD}budgetz = [64]\n"), Some(4), Some("budgets")),
            (
                format!("{HEAD}kv_tipe = \"f32\"\n"),
                Some(4),
                Some("kv_type"),
            ),
            (
                format!("{HEAD}max_tokens = 5\n"),
                Some(4),
                Some("max_new_tokens"),
            ),
            (
                format!("{HEAD}[polcy]\nname = \"rkv\"\n"),
                None,
                Some("policy"),
            ),
            (
                "nmae = \"s\"\nbudgets = [64]\n".to_string(),
                Some(1),
                Some("name"),
            ),
            (format!("{HEAD}zzzz = 1\n"), Some(4), None),
        ] {
            let text = format!("{text}[[policy]]\nname = \"full\"\n");
            std::fs::write(&path, &text).unwrap();
            let e = SweepConfig::load(&path).unwrap_err().to_string();
            let key = text.lines().find(|l| !HEAD.contains(*l)).unwrap();
            let key = key.trim_matches(['[', ']']).split(' ').next().unwrap();
            assert!(e.contains(&format!("unknown key `{key}`")), "{e}");
            if let Some(line) = line {
                assert!(e.contains(&format!("line {line}: ")), "{e}");
            }
            match meant {
                Some(k) => assert!(e.contains(&format!("(did you mean `{k}`?)")), "{e}"),
                None => assert!(!e.contains("did you mean"), "{e}"),
            }
            for k in [
                "name",
                "budgets",
                "[[policy]]",
                "model",
                "kv_type",
                "dataset",
                "out",
            ] {
                assert!(
                    e.contains(&format!(" {k},")) || e.ends_with(&format!(" {k}")),
                    "{k}: {e}"
                );
            }
        }
        let _ = std::fs::remove_file(&path);
    }

    /// Names in a config read in any case, as their flags read them, and give the same config (and
    /// hash) as kvbench's own spelling; a name that is none is still refused with its line.
    #[test]
    fn names_in_any_case_are_the_same_config() {
        let keys = "preset = \"{}\"\nweights = \"{}\"\nbudget_rule = \"{}\"\nactivations = \"{}\"\nprompt = \"{}\"\nchat_template = \"{}\"\nbudgets = [64]\n[[policy]]\nname = \"{}\"\n[[policy]]\nname = \"{}\"\n";
        let fill = |v: [&str; 8]| {
            v.iter()
                .fold(keys.to_string(), |t, x| t.replacen("{}", x, 1))
        };
        let ours = config(&format!(
            "{HEAD}{}",
            fill([
                "r1",
                "q8",
                "held",
                "f32",
                "plain",
                "chatml",
                "rkv",
                "streaming"
            ])
        ));
        let theirs = config(&format!(
            "{HEAD}{}",
            fill([
                "R1",
                "Q8",
                "Held",
                "F32",
                "PLAIN",
                "ChatML",
                "R-KV",
                "StreamingLLM"
            ])
        ));
        assert_eq!(ours, theirs);
        assert_eq!(ours.hash("m", "d"), theirs.hash("m", "d"));
        let path =
            std::env::temp_dir().join(format!("kvbench-anycase-{}.toml", std::process::id()));
        std::fs::write(
            &path,
            format!("{HEAD}preset = \"R2\"\n[[policy]]\nname = \"full\"\n"),
        )
        .unwrap();
        let e = SweepConfig::load(&path).unwrap_err().to_string();
        let _ = std::fs::remove_file(&path);
        assert!(
            e.contains("line 4: ") && e.contains("`R2`") && e.contains("`greedy`"),
            "{e}"
        );
    }

    #[test]
    fn a_full_table_s_own_budgets_are_warned_of_and_run_once() {
        let c = config(&format!(
            "{HEAD}budgets = [64]\n[[policy]]\nname = \"full\"\nbudgets = [0.1, 0.5]\n[[policy]]\nname = \"rkv\"\n"
        ));
        let w = c.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("'full'") && w[0].contains("[0.1, 0.5]"),
            "{w:?}"
        );
        assert_eq!(
            c.policy_specs()
                .iter()
                .filter(|s| s.name() == "full")
                .count(),
            1
        );
        for quiet in ["", "budgets = [1.0]\n"] {
            let c = config(&format!(
                "{HEAD}budgets = [64]\n[[policy]]\nname = \"full\"\n{quiet}[[policy]]\nname = \"rkv\"\n"
            ));
            assert!(c.warnings().is_empty(), "{quiet:?}");
        }
    }

    #[test]
    fn extending_by_a_superset_gives_the_superset_and_is_idempotent() {
        let small = config(&format!(
            "{HEAD}budgets = [64, 128]\n[[policy]]\nname = \"full\"\n[[policy]]\nname = \"rkv\"\n"
        ));
        let big = config(&format!(
            "{HEAD}budgets = [64, 128, 256]\n[[policy]]\nname = \"full\"\n[[policy]]\nname = \"rkv\"\n[[policy]]\nname = \"h2o\"\n"
        ));
        let merged = small.extended_by(&big).unwrap();
        assert_eq!(merged, big);
        assert_eq!(merged.hash("m", "d"), big.hash("m", "d"));
        assert_eq!(merged.extended_by(&small).unwrap(), merged);
        assert_eq!(small.base_hash("m", "d"), big.base_hash("m", "d"));
        assert_ne!(small.hash("m", "d"), big.hash("m", "d"));
    }

    #[test]
    fn extending_keeps_every_policy_budget_once_and_per_table_budgets_where_they_differ() {
        let a = config(&format!(
            "{HEAD}budgets = [64]\n[[policy]]\nname = \"full\"\n[[policy]]\nname = \"rkv\"\nargs = {{ buffer = 8 }}\n"
        ));
        let b = config(&format!(
            "{HEAD}budgets = [128]\n[[policy]]\nname = \"full\"\n[[policy]]\nname = \"streaming\"\n[[policy]]\nname = \"rkv\"\nargs = {{ buffer = 8 }}\nbudgets = [64, 256]\n"
        ));
        let m = a.extended_by(&b).unwrap();
        let described: Vec<String> = m.policy_specs().iter().map(|s| s.describe()).collect();
        let expect = |c: &SweepConfig| -> Vec<String> {
            c.policy_specs().iter().map(|s| s.describe()).collect()
        };
        for d in expect(&a).iter().chain(expect(&b).iter()) {
            assert_eq!(
                described.iter().filter(|x| *x == d).count(),
                1,
                "{d} in {described:?}"
            );
        }
        assert_eq!(described.len(), 4, "{described:?}"); // full, rkv 64/256, streaming 128
                                                         // rkv's budgets differ from streaming's: it keeps its own list; the top holds the union.
        let rkv = m.policies().iter().find(|p| p.name == "rkv").unwrap();
        assert_eq!(rkv.budgets, Some(vec![64.0, 256.0]));
        assert_eq!(m.budgets, vec![64.0, 256.0, 128.0]);
    }

    #[test]
    fn policy_flags_on_a_sweep_replace_its_policies_or_its_budgets() {
        let dir = std::env::temp_dir().join(format!("kvbench-over-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(
            &path,
            format!("{HEAD}budgets = [64, 128]\n[[policy]]\nname = \"full\"\n[[policy]]\nname = \"rkv\"\nargs = {{ buffer = 8 }}\n"),
        )
        .unwrap();
        let load = |f: PolicyFlags| {
            SweepConfig::load_with(
                &path,
                &Overrides {
                    policy: f,
                    ..Default::default()
                },
            )
        };
        let names = |c: &SweepConfig| -> Vec<String> {
            c.policy_specs()
                .iter()
                .map(|s| format!("{}@{}", s.name(), s.budget_as_written()))
                .collect()
        };
        // --budget alone: the file's policies (and their parameters) at the new budgets.
        let c = load(PolicyFlags {
            budget: vec![32.0],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(names(&c), ["full@1", "rkv@32"]);
        assert_eq!(c.policy_specs()[1].resolved()["buffer"], "8");
        // --policy: those policies, at the file's budgets when no --budget is given.
        let c = load(PolicyFlags {
            policy: vec!["h2o".into()],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(names(&c), ["h2o@64", "h2o@128"]);
        // --policy-arg alone names no policy to take it.
        let e = load(PolicyFlags {
            policy_args: vec!["buffer=4".into()],
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("--policy-arg"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_hash_sees_the_device_kind_but_not_which_gpu() {
        let cpu = config(&format!(
            "{HEAD}budgets = [64]\n[[policy]]\nname = \"rkv\"\n"
        ));
        let explicit = config(&format!(
            "{HEAD}device = \"cpu\"\nbudgets = [64]\n[[policy]]\nname = \"rkv\"\n"
        ));
        let gpu = |n: usize| {
            config(&format!(
                "{HEAD}device = \"cuda:{n}\"\nbudgets = [64]\n[[policy]]\nname = \"rkv\"\n"
            ))
        };
        assert_eq!(cpu.hash("m", "d"), explicit.hash("m", "d"));
        assert_eq!(gpu(0).hash("m", "d"), gpu(3).hash("m", "d"));
        assert_ne!(cpu.hash("m", "d"), gpu(0).hash("m", "d"));
    }

    #[test]
    fn the_hash_sees_a_cache_type_other_than_the_default_and_the_base_hash_too() {
        let with = |line: &str| {
            config(&format!(
                "{HEAD}{line}budgets = [64]\n[[policy]]\nname = \"rkv\"\n"
            ))
        };
        let (none, f32, f16) = (
            with(""),
            with("kv_type = \"f32\"\n"),
            with("kv_type = \"f16\"\n"),
        );
        // f16 is the CPU's default: naming it is the same study; f32 is another.
        assert_eq!(none.hash("m", "d"), f16.hash("m", "d"));
        assert_ne!(none.hash("m", "d"), f32.hash("m", "d"));
        // Unit ids come from the base hash: an f32 directory's units are not f16's.
        assert_ne!(none.base_hash("m", "d"), f32.base_hash("m", "d"));
        assert_eq!(none.base_hash("m", "d"), f16.base_hash("m", "d"));
        let dir = std::env::temp_dir().join(format!("kvbench-kvtype-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.toml");
        let text = format!("{HEAD}kv_type = \"q3\"\nbudgets = [64]\n[[policy]]\nname = \"rkv\"\n");
        std::fs::write(&path, text).unwrap();
        let e = SweepConfig::load(&path).unwrap_err().to_string();
        assert!(e.contains("kv_type") || e.contains("q3"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_bad_model_name_in_the_file_is_named_with_the_file_and_key_unless_a_flag_replaces_it() {
        let dir = std::env::temp_dir().join(format!("kvbench-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.toml");
        for (model, says) in [
            ("random:tiny@zz", "seed"),
            ("random:nope", "no random model"),
            ("./no-such.gguf", "cannot resolve"),
        ] {
            let text = format!(
                "name = \"s\"\nmodel = \"{model}\"\nbudgets = [64]\n[[policy]]\nname = \"rkv\"\n"
            );
            std::fs::write(&path, text).unwrap();
            let e = SweepConfig::load(&path).unwrap_err();
            assert!(e.is_input_error(), "{e}");
            let e = e.to_string();
            assert!(
                e.starts_with(&format!("{}: `model`: ", path.display())),
                "{e}"
            );
            assert!(e.contains(model) && e.contains(says), "{e}");
            let over = Overrides {
                model: ModelFlags {
                    model: Some("smollm2-135m".into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            let cfg = SweepConfig::load_with(&path, &over).unwrap();
            assert_eq!(cfg.model.model(), "smollm2-135m");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_hash_sees_activations_other_than_f32_and_a_bad_value_is_named() {
        let with = |line: &str| {
            config(&format!(
                "{HEAD}{line}budgets = [64]\n[[policy]]\nname = \"rkv\"\n"
            ))
        };
        let (none, f32, weights) = (
            with(""),
            with("activations = \"f32\"\n"),
            with("activations = \"weights\"\n"),
        );
        // f32 is the default: naming it is the same study (and the hash of studies before the key).
        assert_eq!(none.hash("m", "d"), f32.hash("m", "d"));
        assert_ne!(none.hash("m", "d"), weights.hash("m", "d"));
        assert_ne!(none.base_hash("m", "d"), weights.base_hash("m", "d"));
        // A flag overrides the file's key.
        let over = Overrides {
            model: ModelFlags {
                activations: Some(crate::model::Activations::F32),
                ..Default::default()
            },
            ..Default::default()
        };
        let path =
            std::env::temp_dir().join(format!("kvbench-activations-{}.toml", std::process::id()));
        std::fs::write(
            &path,
            format!(
                "{HEAD}activations = \"weights\"\nbudgets = [64]\n[[policy]]\nname = \"rkv\"\n"
            ),
        )
        .unwrap();
        let cfg = SweepConfig::load_with(&path, &over).unwrap();
        assert_eq!(cfg.hash("m", "d"), none.hash("m", "d"));
        std::fs::write(
            &path,
            format!("{HEAD}activations = \"bf16\"\nbudgets = [64]\n[[policy]]\nname = \"rkv\"\n"),
        )
        .unwrap();
        let e = SweepConfig::load(&path).unwrap_err().to_string();
        let _ = std::fs::remove_file(&path);
        assert!(e.contains("activations") && e.contains("bf16"), "{e}");
        assert!(e.contains("kvbench-activations"), "names the file: {e}");
    }

    #[test]
    fn the_base_hash_still_sees_every_setting_but_the_grid() {
        let a = config(&format!(
            "{HEAD}budgets = [64]\n[[policy]]\nname = \"rkv\"\n"
        ));
        let b = config(&format!(
            "{HEAD}max_new_tokens = 99\nbudgets = [64]\n[[policy]]\nname = \"rkv\"\n"
        ));
        assert_ne!(a.base_hash("m", "d"), b.base_hash("m", "d"));
        assert_ne!(a.base_hash("m", "d"), a.base_hash("m2", "d"));
    }

    #[test]
    fn an_empty_kv_types_list_is_refused_by_its_key_and_a_full_one_crosses_the_grid() {
        let text = format!("{HEAD}kv_types = []\nbudgets = [64]\n[[policy]]\nname = \"rkv\"\n");
        let path = std::env::temp_dir().join(format!(
            "kvbench-empty-kv-types-{}.toml",
            std::process::id()
        ));
        std::fs::write(&path, text).unwrap();
        let err = SweepConfig::load(&path).unwrap_err().to_string();
        let _ = std::fs::remove_file(&path);
        assert!(err.contains("kv_types is empty"), "{err}");
        assert!(
            err.contains("kvbench-empty-kv-types"),
            "names the file: {err}"
        );
        let crossed = config(&format!(
            "{HEAD}kv_types = [\"f16\", \"q8_0\"]\nbudgets = [64]\n[[policy]]\nname = \"rkv\"\n"
        ));
        assert_eq!(crossed.policy_specs().len(), 2);
    }
}
