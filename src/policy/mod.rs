//! KV-cache compression policies and their contract with the engine.
//!
//! A policy declares what it needs ([`Capabilities`]); the engine computes only that (no attention
//! probabilities, no query window, no per-query-head cache when nobody asks). After each layer has
//! attended over the uncompressed cache, the engine hands the policy an [`AttentionView`] and the
//! layer's cache, so a policy compresses *after* attention, as R-KV and LazyEviction do. A policy that
//! attends sparsely (RocketKV's stage 2) picks the entries each head attends to before attention.
//! State lives in the policy value, one per sequence, and [`Policy::reset`] clears it.
//!
//! Every policy declares the most entries it may hold ([`Policy::entry_limit`]), computed from the
//! budget rule of [`budget`] and never from the cache itself; the engine checks it after every step
//! and stops the run when a policy holds more (silent non-compression is this field's common bug).
//!
//! Policies are parsed first ([`PolicySpec`]: name, budget, `key=value` parameters, all checked before
//! a model loads) and built per sequence from the spec.

pub mod accumulate;
pub mod budget;
pub mod device_score;
mod h2o;
mod kara;
mod lazy;
pub mod params;
mod rocket;
pub mod score;
mod streaming;
#[cfg(test)]
mod tests;
mod window;

pub use budget::{Budget, BudgetRule};
pub use h2o::H2o;
pub use kara::Kara;
pub use lazy::{LazyEviction, Tracker};
pub use rocket::{RocketKv, Split as RocketBudgetSplit};
pub use streaming::StreamingLlm;
pub use window::{pyramid_schedule, WindowPolicy};

use crate::cache::LayerCache;
use crate::error::{Error, Result};
use candle_core::Tensor;
use params::Params;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a policy asks the engine to compute for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Attention probabilities of this step's queries over the cache, `[heads, group, t, n]`.
    pub attention_probs: bool,
    /// Keep a rolling window of the last `w` post-RoPE queries per layer (`0`: none).
    pub query_window: usize,
    /// Store keys and values once per query head (the GQA group replicated), so that each query head
    /// selects its own entries. Multiplies KV memory by the group size, as the references do.
    pub per_query_head: bool,
    /// The policy chooses, before attention at each decode step, which entries each head attends to
    /// ([`Policy::select_attention`]).
    pub sparse_attention: bool,
    /// Of `attention_probs`, only each cache head's sum over its query group is read: the engine
    /// may hand `[heads, 1, t, n]`, summed where the probabilities are (on a GPU the copy to the
    /// host is then a group's share of the bytes: a seventh at R1-Distill-Qwen-7B's shapes). The
    /// sum runs over the group in order from its first query head, as the policy's own must when
    /// it is handed the whole group, so that both give the same bits on the CPU.
    pub group_sum_probs: bool,
}

/// Where the sequence is when a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepInfo<'a> {
    /// Tokens the sequence has seen before this step (the logical position of its first new token).
    pub seen_before: usize,
    /// Tokens fed in this step (the prompt at prefill, one when decoding).
    pub tokens: &'a [u32],
    /// Generated tokens fed so far including this step's (0 during prefill).
    pub generated: usize,
    /// Prompt tokens of the sequence.
    pub prompt_len: usize,
    pub is_prefill: bool,
}

impl StepInfo<'_> {
    /// Tokens seen once this step is done.
    pub fn seen_after(&self) -> usize {
        self.seen_before + self.tokens.len()
    }
}

/// What one layer computed this step, as requested by [`Capabilities`].
pub struct AttentionView<'a> {
    pub layer: usize,
    /// This step's queries after RoPE, `[query_heads, t, head_dim]`.
    pub queries: &'a Tensor,
    /// The rolling window of recent queries after RoPE, `[query_heads, w', head_dim]` with `w' ≤ w`.
    pub query_window: Option<&'a Tensor>,
    /// Attention probabilities of this step's queries, `[cache_heads, group, t, n]`.
    pub probs: Option<&'a Tensor>,
    /// The scores of the compression this call makes, when the engine computed them for a batch at
    /// once on the device ([`Policy::score_request`]); `None`: the policy scores for itself.
    pub scores: Option<&'a WindowScores>,
    /// Set when the engine applied this step's attention to the scores the cache holds, by
    /// [`Policy::accumulation`]'s rule: under [`Accumulation::Sum`], per cache head, the entry that
    /// rule evicts (read only when the cache holds exactly one entry more than the rule keeps).
    /// `probs` is then `None`.
    pub accumulated: Option<&'a [u32]>,
}

/// How the engine may keep a policy's per-entry scores in the cache and update them where the
/// attention is ([`Policy::accumulation`]). Each cache head's attention row is its query group's
/// sum (one query head's under per-query-head storage).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Accumulation {
    /// One score per entry (H2O): add the row times `norm`; then, when the cache holds `keep + 1`
    /// entries, evict per head the entry of least score among all but the `recent` newest (ties:
    /// the newest of them; NaN below everything), as [`score::top_k`] keeping the others would.
    Sum {
        norm: f32,
        keep: usize,
        recent: usize,
    },
    /// Two per entry (LazyEviction's `TS`, `MRI`; f32, exact integers below 2²⁴ steps): where the
    /// row over `group` is at least `alpha`, `MRI ← max(MRI, t − TS)` and `TS ← t`; a new entry
    /// starts at (`start`, 0). The policy decides its evictions from them on the host.
    Recurrence {
        group: usize,
        alpha: f32,
        t: u32,
        start: u32,
    },
}

impl Accumulation {
    /// Scores per entry.
    pub fn width(&self) -> usize {
        match self {
            Accumulation::Sum { .. } => 1,
            Accumulation::Recurrence { .. } => 2,
        }
    }

    /// Whether two sequences' rules can be applied by one set of operations: the same kind, norm,
    /// group and threshold (the step counters and budgets are per row).
    pub fn batches_with(&self, other: &Accumulation) -> bool {
        match (self, other) {
            (Accumulation::Sum { norm: a, .. }, Accumulation::Sum { norm: b, .. }) => a == b,
            (
                Accumulation::Recurrence {
                    group: g, alpha: a, ..
                },
                Accumulation::Recurrence {
                    group: h, alpha: b, ..
                },
            ) => g == h && a == b,
            _ => false,
        }
    }
}

/// What an observation-window compression scores ([`device_score::window_scores`] and, for R-KV,
/// [`device_score::redundancy`]): two sequences whose requests are equal, with caches of the same
/// length, can be scored by one set of device operations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreRequest {
    /// Candidates: the entries before the window's own.
    pub n_cand: usize,
    pub agg: params::GqaAgg,
    pub domain: params::SoftmaxDomain,
    pub reduce: params::QueryReduce,
    /// R-KV's cosine threshold: its redundancy is scored too.
    pub redundancy: Option<f32>,
}

/// A compression's scores as [`ScoreRequest`] asks them, one vector per cache head: the window score
/// of each candidate and (R-KV) the redundancy of each entry.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowScores {
    pub window: Vec<Vec<f32>>,
    pub redundancy: Option<Vec<Vec<f32>>>,
}

/// A KV-cache compression policy, one value per sequence.
pub trait Policy: Send {
    /// The name used on the command line.
    fn name(&self) -> &str;

    fn capabilities(&self) -> Capabilities;

    /// Clears all per-sequence state (counters, trackers) before a new sequence.
    fn reset(&mut self);

    /// Called for every layer after it attended over the uncompressed cache; may evict entries.
    fn after_attention(
        &mut self,
        step: &StepInfo<'_>,
        view: &AttentionView<'_>,
        cache: &mut LayerCache,
    ) -> candle_core::Result<()>;

    /// At a decode step, before attention: the entries each cache head attends to (`None`: all).
    /// `query` is this step's post-RoPE query, `[query_heads · head_dim]`. Only called when
    /// [`Capabilities::sparse_attention`] is declared.
    fn select_attention(
        &mut self,
        _step: &StepInfo<'_>,
        _layer: usize,
        _query: &[f32],
        _cache: &LayerCache,
    ) -> candle_core::Result<Option<Vec<Vec<usize>>>> {
        Ok(None)
    }

    /// The scores `after_attention` would compute for a compression at this call of `layer`, whose
    /// cache holds `n` entries (this step's included) and whose queries come in groups of `group`
    /// per cache head; `None` when it would not compress or scores no window. A decoding batch on a
    /// device computes the equal requests of its sequences together and hands each its share
    /// ([`AttentionView::scores`]): one set of operations for the batch, not one per sequence.
    fn score_request(
        &self,
        _step: &StepInfo<'_>,
        _layer: usize,
        _n: usize,
        _group: usize,
    ) -> Option<ScoreRequest> {
        None
    }

    /// At a decoding step, whether the engine may accumulate this policy's attention into scores the
    /// cache holds, and choose its eviction there ([`Accumulation`]; the call then gets
    /// [`AttentionView::accumulated`] and no probabilities). `None`: the policy reads the
    /// probabilities itself.
    fn accumulation(&self, _step: &StepInfo<'_>) -> Option<Accumulation> {
        None
    }

    /// Hands layer `layer`'s per-entry scores over to the cache, keeping none: one vector per cache
    /// head (`heads`) of the first `n` entries' scores in storage order (an entry's
    /// [`Accumulation::width`] together; missing ones are zero), `n` counting this `step`'s new
    /// entry. Called before the engine first accumulates into the cache ([`Policy::accumulation`]).
    fn take_accumulated(
        &mut self,
        _step: &StepInfo<'_>,
        _layer: usize,
        _heads: usize,
        _n: usize,
    ) -> Vec<Vec<f32>> {
        Vec::new()
    }

    /// Bytes the last [`Policy::select_attention`] read to choose (chunk summaries and the like),
    /// besides the entries chosen: part of a sparse decode step's memory traffic.
    fn selection_bytes_read(&self) -> usize {
        0
    }

    /// The most entries layer `layer` may hold per head at the end of a step once `seen` tokens
    /// were fed, `prompt_len` of them the prompt (`None`: no bound). Derived from the budget rule,
    /// never from the cache.
    fn entry_limit(&self, layer: usize, seen: usize, prompt_len: usize) -> Option<usize>;

    /// Bytes of side state the policy holds now (scores, trackers, summaries, token ids), counted
    /// apart from the KV cache. The engine adds the query windows it keeps for the policy.
    fn state_bytes(&self) -> usize {
        0
    }

    /// An independent copy of this policy in its current state, for a copy of its sequence
    /// ([`crate::model::SeqState::fork`]); `None` when it cannot be copied.
    fn fork(&self) -> Option<Box<dyn Policy>> {
        None
    }
}

/// Heap bytes of nested vectors' elements (lengths, not capacities).
pub(crate) fn vec_bytes<T>(v: &[T]) -> usize {
    std::mem::size_of_val(v)
}

/// No compression: the baseline every report compares against.
#[derive(Debug, Default, Clone)]
pub struct Full;

impl Policy for Full {
    fn fork(&self) -> Option<Box<dyn Policy>> {
        Some(Box::new(self.clone()))
    }

    fn name(&self) -> &str {
        "full"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    fn reset(&mut self) {}

    fn after_attention(
        &mut self,
        _: &StepInfo<'_>,
        _: &AttentionView<'_>,
        _: &mut LayerCache,
    ) -> candle_core::Result<()> {
        Ok(())
    }

    fn entry_limit(&self, _: usize, _: usize, _: usize) -> Option<usize> {
        None
    }
}

/// Policy names accepted on the command line, with a one-line description each.
pub const POLICIES: &[(&str, &str)] = &[
    ("full", "no compression (the baseline)"),
    (
        "streaming",
        "StreamingLLM: 4 sink tokens + recent window, absolute positions kept",
    ),
    (
        "h2o",
        "Heavy-Hitter Oracle: accumulated attention, heavy hitters + recent",
    ),
    (
        "snapkv",
        "SnapKV: observation-window attention, decode-time as in R-KV (mode=prefill: original)",
    ),
    (
        "pyramidkv",
        "PyramidKV: SnapKV scores with linearly decreasing layer budgets (beta=20)",
    ),
    (
        "rkv",
        "R-KV: window importance + key redundancy (lambda=0.1)",
    ),
    (
        "lazy",
        "LazyEviction: recurrence tracking (TS, MRI), lagged eviction every W steps",
    ),
    (
        "rocket",
        "RocketKV: SnapKV++ on the prompt + hybrid sparse top-k attention at decode",
    ),
    (
        "kara",
        "Kara (INTERPRETATION of the abstract): sliding-window compression with Token2Chunk",
    ),
];

/// Names only, for messages.
pub fn policy_names() -> Vec<&'static str> {
    POLICIES.iter().map(|(n, _)| *n).collect()
}

/// The policy a name stands for, as kvbench names it (and records it): whatever its case, hyphens,
/// underscores or spaces (`R-KV`, `SnapKV`, `H2O`), and the papers' own names (`StreamingLLM`, `LazyEviction`,
/// `RocketKV`). `None` for a name that is no policy.
pub fn canonical_name(name: &str) -> Option<&'static str> {
    let key = crate::name_key(name);
    let key = match key.as_str() {
        "streamingllm" => "streaming",
        "lazyeviction" => "lazy",
        "rocketkv" => "rocket",
        other => other,
    };
    POLICIES.iter().map(|(n, _)| *n).find(|n| *n == key)
}

/// The error for a name that is no policy.
fn unknown_policy(name: &str) -> Error {
    Error::Input(format!(
        "unknown policy '{name}' (--policy, or a [[policy]] table's `name` in a sweep config); available: {}",
        policy_names().join(", ")
    ))
}

/// What building a policy needs to know about the model and the run.
#[derive(Debug, Clone)]
pub struct BuildContext {
    pub num_layers: usize,
    pub head_dim: usize,
    pub max_new_tokens: usize,
    /// The model is of the Qwen family (LazyEviction's threshold default differs).
    pub qwen: bool,
    /// `delimiters[id]`: token `id` ends a phrase (newline or punctuation); Kara's chunk boundaries.
    pub delimiters: Option<Arc<Vec<bool>>>,
}

/// A parsed, validated policy configuration, built into one policy value per sequence.
#[derive(Debug, Clone)]
enum Config {
    Full,
    Streaming(streaming::Config),
    H2o(h2o::Config),
    Window(window::Config),
    Lazy(lazy::Config),
    Rocket(rocket::Config),
    Kara(kara::Config),
}

/// A policy as the user named it: name, budget and parameters, checked at parse time. A ratio budget
/// (see [`budget`]) is resolved against the full run's mean generation length before the policy is
/// built ([`PolicySpec::resolve`]).
#[derive(Debug, Clone)]
pub struct PolicySpec {
    name: String,
    /// The budget as written (its value and rule identify the spec).
    requested: Budget,
    /// The number written (the full cache's budget is ignored, but recorded as written).
    written_budget: f64,
    /// The budget the policy runs with: `requested`, or its resolution.
    effective: Budget,
    /// The full run's mean generation length a resolution used.
    full_mean_tokens: Option<f64>,
    args: BTreeMap<String, String>,
    config: Config,
    /// Every parameter with its resolved value (defaults included).
    resolved: BTreeMap<String, String>,
    /// The cache's storage type for this spec's units, where a sweep's `kv_types` grid sets one other
    /// than the model's (`None`: the model's type).
    kv_type: Option<crate::cache::KvType>,
}

fn parse_config(
    name: &str,
    budget: Budget,
    args: BTreeMap<String, String>,
) -> Result<(Config, BTreeMap<String, String>)> {
    let mut p = Params::new(name, args);
    let config = match name {
        "full" => Config::Full,
        "streaming" => Config::Streaming(streaming::Config::parse(&mut p, budget)?),
        "h2o" => Config::H2o(h2o::Config::parse(&mut p, budget)?),
        "snapkv" | "pyramidkv" | "rkv" => {
            Config::Window(window::Config::parse(name, &mut p, budget)?)
        }
        "lazy" => Config::Lazy(lazy::Config::parse(&mut p, budget)?),
        "rocket" => Config::Rocket(rocket::Config::parse(&mut p, budget)?),
        "kara" => Config::Kara(kara::Config::parse(&mut p, budget)?),
        other => return Err(unknown_policy(other)),
    };
    Ok((config, p.finish()?))
}

impl PolicySpec {
    /// Parses a policy from its name, `--budget` value (under the default rule, `ratio`) and
    /// `key=value` parameters.
    pub fn new(name: &str, budget: f64, args: BTreeMap<String, String>) -> Result<Self> {
        Self::with_rule(name, budget, BudgetRule::default(), args)
    }

    /// Parses a policy whose budget at most 1 is read under `rule`.
    pub fn with_rule(
        name: &str,
        budget: f64,
        rule: BudgetRule,
        args: BTreeMap<String, String>,
    ) -> Result<Self> {
        let name = canonical_name(name).ok_or_else(|| unknown_policy(name))?;
        let written_budget = budget;
        // The full cache takes no budget: a value written for it is only checked to be a number.
        let rule = if name == "full" {
            BudgetRule::Ratio
        } else {
            rule
        };
        let budget = Budget::from_value(budget, rule)?;
        // The baseline has no budget: whatever (valid) value was written, it is the whole cache.
        let budget = if name == "full" {
            Budget::Seen(1.0)
        } else {
            budget
        };
        let (config, resolved) = parse_config(name, budget, args.clone())?;
        let spec = Self {
            name: name.to_string(),
            requested: budget,
            written_budget,
            effective: budget,
            full_mean_tokens: None,
            args,
            config,
            resolved,
            kv_type: None,
        };
        match budget {
            Budget::Held(b) => spec.held_to_nominal(b),
            _ => Ok(spec),
        }
    }

    /// Under `--budget-rule held`: the nominal budget with which this policy holds `b` entries on
    /// average. A policy that compresses every `slack` tokens holds between its nominal budget and
    /// that plus `slack`, `slack / 2` more than its nominal budget on average, so its nominal budget
    /// is `b − slack/2`; H2O holds exactly its budget. Kara waits for the full run's mean lengths
    /// ([`Self::resolve`]); a policy whose holding has no bound (RocketKV keeps every entry and saves
    /// reads; a window policy in `mode=prefill` keeps every generated entry) is refused.
    fn held_to_nominal(self, b: usize) -> Result<Self> {
        let refuse = |why: &str| {
            Err(Error::Input(format!(
                "policy '{}' at --budget {b} --budget-rule held: {why}",
                self.name
            )))
        };
        let slack = match &self.config {
            Config::Full | Config::Kara(_) => return Ok(self),
            Config::Streaming(c) => c.slack(),
            Config::H2o(_) => 0,
            Config::Lazy(c) => c.slack(),
            Config::Window(c) => match c.slack() {
                Some(s) => s,
                None => return refuse("mode=prefill keeps every generated entry, so what it holds grows with the output and no budget sets it"),
            },
            Config::Rocket(_) => return refuse("RocketKV keeps every entry (it saves attention reads, not memory), so what it holds is the full cache's"),
        };
        let nominal = b.saturating_sub(slack / 2).max(self.floor()).max(1);
        let effective = Budget::Entries(nominal);
        let (config, resolved) = parse_config(&self.name, effective, self.args.clone())?;
        Ok(Self {
            effective,
            config,
            resolved,
            ..self
        })
    }

    /// Parses `--policy-arg key=value` strings.
    pub fn from_args(name: &str, budget: f64, args: &[String]) -> Result<Self> {
        Self::new(name, budget, Params::parse_pairs(args)?)
    }

    /// Parses `--policy-arg key=value` strings, with a budget rule.
    pub fn from_args_with_rule(
        name: &str,
        budget: f64,
        rule: BudgetRule,
        args: &[String],
    ) -> Result<Self> {
        Self::with_rule(name, budget, rule, Params::parse_pairs(args)?)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The budget as written.
    pub fn budget(&self) -> Budget {
        self.requested
    }

    /// The `--budget` number the user wrote (the full cache's is whatever was written, unused).
    pub fn budget_as_written(&self) -> f64 {
        self.written_budget
    }

    /// The parameters as the user gave them (not their defaults).
    pub fn args(&self) -> &BTreeMap<String, String> {
        &self.args
    }

    /// The fixed entries per layer and KV head the policy runs with, once known (absolute budgets,
    /// resolved ratios; for Kara, whose native budget is a ratio, the absolute budget it was given).
    pub fn budget_entries(&self) -> Option<usize> {
        match (self.effective, self.requested) {
            (Budget::Entries(n), _) | (_, Budget::Entries(n)) => Some(n),
            _ => None,
        }
    }

    /// The full run's mean generation length the budget was resolved from.
    pub fn full_mean_tokens(&self) -> Option<f64> {
        self.full_mean_tokens
    }

    /// Whether the policy cannot be built before the full run's mean generation length is known: a
    /// ratio budget (the references' definition), or for Kara (whose own budget is its retention
    /// ratio ρ) an absolute one, read as `ρ = B / mean`.
    pub fn needs_full_mean(&self) -> bool {
        if self.full_mean_tokens.is_some() {
            return false;
        }
        match self.config {
            Config::Full => false,
            Config::Kara(_) => matches!(self.requested, Budget::Entries(_) | Budget::Held(_)),
            _ => self.requested.is_ratio(),
        }
    }

    /// What a user can give instead when the full run's mean length is not at hand (see
    /// [`Self::needs_full_mean`]): the remedy differs for Kara, whose absolute budget always needs it.
    pub fn full_mean_remedy(&self) -> String {
        match (&self.config, self.requested) {
            (Config::Kara(_), Budget::Entries(n)) => format!(
                "give Kara's retention ratio ρ directly as a budget at most 1 (ρ = {n} / the full run's mean generation length)"
            ),
            (Config::Kara(_), Budget::Held(_)) => "give Kara's retention ratio ρ directly as a budget at most 1 under --budget-rule ratio".to_string(),
            _ => "give an absolute budget (entries, above 1) or --budget-rule seen".to_string(),
        }
    }

    /// The fewest entries the policy keeps whatever its budget (its window, its sinks).
    fn floor(&self) -> usize {
        match &self.config {
            Config::Full | Config::Kara(_) => 1,
            Config::Streaming(c) => c.floor(),
            Config::H2o(_) => 1,
            Config::Window(c) => c.floor(),
            Config::Lazy(c) => c.floor(),
            Config::Rocket(c) => c.floor(),
        }
    }

    /// This spec with its budget resolved from the full run's mean generation length, and for
    /// Kara under `held` the mean prompt length too (the same spec when it needs none).
    pub fn resolve(&self, full_mean_tokens: f64, mean_prompt_tokens: f64) -> Result<Self> {
        if !self.needs_full_mean() {
            return Ok(self.clone());
        }
        if !(full_mean_tokens.is_finite() && full_mean_tokens > 0.0) {
            return Err(Error::Input(format!(
                "{}: the full run's mean generation length is {full_mean_tokens}, so budget {} cannot be resolved",
                self.name, self.requested
            )));
        }
        let budget = match (&self.config, self.requested) {
            (Config::Kara(_), Budget::Entries(n)) => {
                Budget::Ratio((n as f64 / full_mean_tokens).min(1.0))
            }
            // Kara holds the prompt, ρ of the compressed windows and the active window (half of
            // `window` on average): over a generation of G tokens, P + ρ·G/2 + window/2 on average.
            (Config::Kara(c), Budget::Held(n)) => {
                let held_history = n as f64 - mean_prompt_tokens - c.window() as f64 / 2.0;
                let rho = 2.0 * held_history / full_mean_tokens;
                Budget::Ratio(rho.clamp(1.0 / c.window() as f64, 1.0))
            }
            (_, b) => b.resolve(full_mean_tokens, self.floor()),
        };
        let (config, resolved) = parse_config(&self.name, budget, self.args.clone())?;
        Ok(Self {
            effective: budget,
            full_mean_tokens: Some(full_mean_tokens),
            config,
            resolved,
            ..self.clone()
        })
    }

    /// Every parameter and its value, defaults included.
    pub fn resolved(&self) -> &BTreeMap<String, String> {
        &self.resolved
    }

    /// `name budget=B key=value …`, for logs, reports and unit ids (the budget as written).
    pub fn describe(&self) -> String {
        if matches!(self.config, Config::Full) {
            return "full (no compression; the budget does not apply)".into();
        }
        let mut s = format!("{} budget={}", self.name, self.requested);
        for (k, v) in &self.resolved {
            s.push_str(&format!(" {k}={v}"));
        }
        s
    }

    /// [`Self::describe`] plus the resolution, when there was one.
    pub fn describe_resolved(&self) -> String {
        match (self.full_mean_tokens, &self.effective) {
            (Some(mean), Budget::Entries(b)) => {
                format!(
                    "{} (B = {b} from the full mean of {mean:.1} tokens)",
                    self.describe()
                )
            }
            (Some(mean), Budget::Ratio(rho)) => {
                format!(
                    "{} (ρ = {rho:.4} from the full mean of {mean:.1} tokens)",
                    self.describe()
                )
            }
            _ => self.describe(),
        }
    }

    /// This spec with its units' cache stored as `kv` (`None`: the model's type).
    pub fn with_kv_type(self, kv: Option<crate::cache::KvType>) -> Self {
        Self {
            kv_type: kv,
            ..self
        }
    }

    /// The cache type a sweep's `kv_types` grid gave this spec, if other than the model's.
    pub fn kv_type(&self) -> Option<crate::cache::KvType> {
        self.kv_type
    }

    /// [`Self::describe`], and the cache type when the spec has its own: the plan's and logs' label.
    pub fn describe_with_kv(&self) -> String {
        match self.kv_type {
            Some(kv) => format!("{} [KV cache {kv}]", self.describe()),
            None => self.describe(),
        }
    }

    /// Kara needs the tokenizer's delimiter table; other policies do not.
    pub fn needs_delimiters(&self) -> bool {
        matches!(self.config, Config::Kara(_))
    }

    /// A fresh policy value for one sequence; refused while the budget waits for the full run.
    pub fn build(&self, ctx: &BuildContext) -> Result<Box<dyn Policy>> {
        if self.needs_full_mean() {
            return Err(Error::Input(format!(
                "{}: budget {} is resolved from the full run's mean generation length (a ratio of it, or Kara's ρ = B over it) and was not resolved (run `full` on the same problems first, or {})",
                self.name,
                self.requested,
                self.full_mean_remedy()
            )));
        }
        Ok(match &self.config {
            Config::Full => Box::new(Full),
            Config::Streaming(c) => Box::new(StreamingLlm::new(c.clone())),
            Config::H2o(c) => Box::new(H2o::new(c.clone())),
            Config::Window(c) => Box::new(WindowPolicy::new(c.clone(), ctx)),
            Config::Lazy(c) => Box::new(LazyEviction::new(c.clone(), ctx)),
            Config::Rocket(c) => Box::new(RocketKv::new(c.clone(), ctx)),
            Config::Kara(c) => Box::new(Kara::new(c.clone(), ctx)),
        })
    }
}

/// Two specs are equal when they describe the same policy, parameters, (resolved) budget and cache type.
impl PartialEq for PolicySpec {
    fn eq(&self, other: &Self) -> bool {
        self.describe_resolved() == other.describe_resolved() && self.kv_type == other.kv_type
    }
}

/// Grows a per-layer state vector so that `layer` is a valid index.
pub(crate) fn layer_slot<T: Default>(v: &mut Vec<T>, layer: usize) -> &mut T {
    if v.len() <= layer {
        v.resize_with(layer + 1, T::default);
    }
    &mut v[layer]
}

/// Shape `(heads, group, t, n)` of attention probabilities.
pub(crate) type ProbShape = (usize, usize, usize, usize);

/// The attention probabilities of a view as host f32 values with their shape.
pub(crate) fn host_probs(
    view: &AttentionView<'_>,
    policy: &str,
) -> candle_core::Result<(ProbShape, Vec<f32>)> {
    let Some(probs) = view.probs else {
        candle_core::bail!("{policy}: the engine gave no attention probabilities");
    };
    Ok((probs.dims4()?, crate::host_copy::flat_f32(probs)?))
}
