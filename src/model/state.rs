//! Everything one sequence carries between forward passes: its cache, its policy, its query windows
//! and how many tokens it has seen. The model itself is immutable and shared by every sequence.

use crate::cache::KvCache;
use crate::model::config::ModelConfig;
use crate::policy::{Capabilities, Policy, StepInfo};
use candle_core::{Device, Result, Tensor};

/// The per-sequence state the forward pass reads and updates.
pub struct SeqState {
    pub cache: KvCache,
    pub policy: Box<dyn Policy>,
    pub caps: Capabilities,
    /// Per layer: the last `caps.query_window` post-RoPE queries, `[heads, w', head_dim]`.
    pub query_windows: Vec<Option<Tensor>>,
    /// Per layer: the batch's windows this one is a view of, when a decoding batch extended them at
    /// once (`None` once this sequence's window is its own again).
    pub window_batches: Vec<Option<WindowBatch>>,
    /// Tokens fed so far (prompt + generated): the logical position of the next token.
    pub seen: usize,
    /// Generated tokens fed so far.
    pub generated: usize,
    /// Prompt tokens (set by the first forward).
    pub prompt_len: usize,
    /// Time spent inside policy hooks.
    pub policy_time: std::time::Duration,
    /// Bytes of keys and values (and of a sparse policy's selection data) decode steps read for
    /// attention: every entry, or only the ones a sparse policy chose.
    pub decode_bytes_read: u64,
    /// Compression events with the positions kept, when tracing is on.
    pub trace: Option<Vec<TraceEvent>>,
}

/// The query windows of one layer of a decoding batch held in one tensor, `[sequences, heads, w',
/// head_dim]`: each member's window is a view of its slot. Windows are replaced each step, never
/// written in place, so views and copies may share it.
#[derive(Debug, Clone)]
pub struct WindowBatch {
    /// Which batch tensor (ids are never reused in a process).
    pub id: u64,
    pub slot: usize,
    pub slots: usize,
    pub windows: Tensor,
}

/// One layer's compression event: what each head kept.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TraceEvent {
    /// Generated tokens fed when the event happened (0: at prefill).
    pub generated: usize,
    /// Tokens seen once the step finished.
    pub seen: usize,
    pub layer: usize,
    /// Cache head (a KV head, or a query head under per-query-head storage).
    pub head: usize,
    /// Original positions of the entries kept, in storage order.
    pub kept: Vec<u32>,
}

impl SeqState {
    /// Bytes of the policy's side state: its own (scores, trackers, summaries), the query windows
    /// the engine keeps for it and the scores it keeps in the cache ([`KvCache::score_bytes`]). The
    /// keys and values are not included.
    pub fn side_state_bytes(&self) -> usize {
        let windows: usize = self
            .query_windows
            .iter()
            .flatten()
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum();
        self.policy.state_bytes() + windows + self.cache.score_bytes()
    }

    pub fn new(
        config: &ModelConfig,
        mut policy: Box<dyn Policy>,
        kv_type: crate::cache::KvType,
        device: &Device,
    ) -> Result<Self> {
        policy.reset();
        let caps = policy.capabilities();
        if caps.sparse_attention && caps.attention_probs {
            candle_core::bail!(
                "policy '{}' asks for attention probabilities and sparse attention at once; the engine offers one or the other",
                policy.name()
            );
        }
        // Per-query-head policies get keys and values stored once per query head.
        let cache_heads = if caps.per_query_head {
            config.num_heads
        } else {
            config.num_kv_heads
        };
        Ok(Self {
            cache: KvCache::new(
                config.num_layers,
                cache_heads,
                config.head_dim,
                kv_type,
                device,
            )?,
            policy,
            caps,
            query_windows: vec![None; config.num_layers],
            window_batches: vec![None; config.num_layers],
            seen: 0,
            generated: 0,
            prompt_len: 0,
            policy_time: std::time::Duration::ZERO,
            decode_bytes_read: 0,
            trace: None,
        })
    }
}

impl SeqState {
    /// An independent copy of this sequence as it stands (its cache copied, its policy forked), or
    /// `None` when the policy cannot be forked. The copy continues exactly as the original would.
    pub fn fork(&self) -> Result<Option<SeqState>> {
        let Some(policy) = self.policy.fork() else {
            return Ok(None);
        };
        Ok(Some(SeqState {
            cache: self.cache.deep_copy()?,
            policy,
            caps: self.caps,
            // Windows are replaced, never written in place: sharing their tensors is safe.
            query_windows: self.query_windows.clone(),
            window_batches: self.window_batches.clone(),
            seen: self.seen,
            generated: self.generated,
            prompt_len: self.prompt_len,
            policy_time: self.policy_time,
            decode_bytes_read: self.decode_bytes_read,
            trace: self.trace.clone(),
        }))
    }

    /// Counts what one decode step's attention over layer `l` reads: every entry's key and value,
    /// or those of `subset` plus what the policy read to choose them.
    pub(crate) fn count_decode_read(&mut self, l: usize, subset: Option<&[Vec<usize>]>) {
        let layer = self.cache.layer(l);
        let per_head_entry = layer.bytes() / (layer.len().max(1) * layer.kv_heads().max(1));
        let bytes = match subset {
            Some(sub) => {
                sub.iter().map(Vec::len).sum::<usize>() * per_head_entry
                    + self.policy.selection_bytes_read()
            }
            None => layer.bytes(),
        };
        self.decode_bytes_read += bytes as u64;
    }

    /// Asks the policy which entries each head of layer `l` attends to this step (timed as policy
    /// work).
    pub(crate) fn select_attention(
        &mut self,
        step: &StepInfo<'_>,
        l: usize,
        query: &[f32],
    ) -> Result<Option<Vec<Vec<usize>>>> {
        let started = std::time::Instant::now();
        let subset = self
            .policy
            .select_attention(step, l, query, self.cache.layer(l))?;
        self.policy_time += started.elapsed();
        if let Some(sub) = &subset {
            let (heads, n) = (self.cache.layer(l).kv_heads(), self.cache.layer(l).len());
            if sub.len() != heads || sub.iter().flatten().any(|&j| j >= n) {
                candle_core::bail!(
                    "policy '{}' selected entries outside layer {l}'s cache",
                    self.policy.name()
                );
            }
        }
        Ok(subset)
    }

    /// Records layer `l`'s compression event in the trace.
    pub(crate) fn record_event(&mut self, step: &StepInfo<'_>, l: usize) {
        let layer = self.cache.layer(l);
        let events: Vec<TraceEvent> = (0..layer.kv_heads())
            .map(|h| TraceEvent {
                generated: step.generated,
                seen: step.seen_after(),
                layer: l,
                head: h,
                kept: layer.positions(h).to_vec(),
            })
            .collect();
        if let Some(trace) = &mut self.trace {
            trace.extend(events);
        }
    }

    /// Fails when the policy holds more entries than it declared (budget plus buffer): compression
    /// that silently does not happen must stop the run.
    pub(crate) fn check_entry_limits(&self) -> crate::Result<()> {
        for l in 0..self.cache.num_layers() {
            let Some(limit) = self.policy.entry_limit(l, self.seen, self.prompt_len) else {
                continue;
            };
            let held = self.cache.layer(l).len();
            if held > limit {
                return Err(crate::Error::Policy {
                    policy: self.policy.name().to_string(),
                    reason: format!(
                        "layer {l} holds {held} entries per head after {} tokens, above its declared bound of {limit} (budget plus buffer)",
                        self.seen
                    ),
                });
            }
        }
        Ok(())
    }
}
