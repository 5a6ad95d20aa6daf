//! The contract between the engine and a KV-cache compression policy.
//!
//! A policy declares what it needs ([`Capabilities`]); the engine computes only that (no attention
//! probabilities, no query window when nobody asks). After each layer has attended over the
//! uncompressed cache, the engine hands the policy an [`AttentionView`] and the layer's cache, so a
//! policy compresses *after* attention, as R-KV and LazyEviction do. State lives in the policy value,
//! one per sequence, and [`Policy::reset`] clears it between sequences.

use crate::cache::LayerCache;
use candle_core::{Result, Tensor};

/// What a policy asks the engine to compute for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Attention probabilities of this step's queries over the cache, `[kv_heads, group, t, n]`.
    pub attention_probs: bool,
    /// Keep a rolling window of the last `w` post-RoPE queries per layer (`0`: none).
    pub query_window: usize,
    /// The policy can run inside a batched decode.
    pub batch: bool,
}

/// Where the sequence is when a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepInfo {
    /// Tokens the sequence has seen before this step (the logical position of its first new token).
    pub seen_before: usize,
    /// Tokens fed in this step (the prompt length at prefill, 1 when decoding).
    pub new_tokens: usize,
    /// Generated tokens fed so far including this step's (0 during prefill).
    pub generated: usize,
    pub is_prefill: bool,
}

/// What one layer computed this step, as requested by [`Capabilities`].
pub struct AttentionView<'a> {
    pub layer: usize,
    /// This step's queries after RoPE, `[heads, t, head_dim]`.
    pub queries: &'a Tensor,
    /// The rolling window of recent queries after RoPE, `[heads, w', head_dim]` with `w' ≤ w`.
    pub query_window: Option<&'a Tensor>,
    /// Attention probabilities of this step's queries, `[kv_heads, group, t, n]`.
    pub probs: Option<&'a Tensor>,
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
        step: &StepInfo,
        view: &AttentionView<'_>,
        cache: &mut LayerCache,
    ) -> Result<()>;
}

/// No compression: the baseline every report compares against.
#[derive(Debug, Default, Clone)]
pub struct Full;

impl Policy for Full {
    fn name(&self) -> &str {
        "full"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            batch: true,
            ..Default::default()
        }
    }

    fn reset(&mut self) {}

    fn after_attention(
        &mut self,
        _: &StepInfo,
        _: &AttentionView<'_>,
        _: &mut LayerCache,
    ) -> Result<()> {
        Ok(())
    }
}

/// Policy names accepted on the command line.
pub const POLICY_NAMES: &[&str] = &["full"];

/// Builds a policy by name. `budget`: at most 1 is a fraction of the tokens seen, above 1 an absolute
/// number of entries per layer and KV head.
pub fn build(name: &str, budget: f64) -> crate::Result<Box<dyn Policy>> {
    if !budget.is_finite() || budget <= 0.0 {
        return Err(crate::Error::Input(format!(
            "--budget must be a positive number, got {budget}"
        )));
    }
    match name {
        "full" => Ok(Box::new(Full)),
        other => Err(crate::Error::Input(format!(
            "unknown policy '{other}' (--policy); available: {}",
            POLICY_NAMES.join(", ")
        ))),
    }
}
