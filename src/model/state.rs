//! Everything one sequence carries between forward passes: its cache, its policy, its query windows
//! and how many tokens it has seen. The model itself is immutable and shared by every sequence.

use crate::cache::KvCache;
use crate::model::config::ModelConfig;
use crate::policy::{Capabilities, Policy};
use candle_core::{DType, Device, Result, Tensor};

/// The per-sequence state the forward pass reads and updates.
pub struct SeqState {
    pub cache: KvCache,
    pub policy: Box<dyn Policy>,
    pub caps: Capabilities,
    /// Per layer: the last `caps.query_window` post-RoPE queries, `[heads, w', head_dim]`.
    pub query_windows: Vec<Option<Tensor>>,
    /// Tokens fed so far (prompt + generated): the logical position of the next token.
    pub seen: usize,
    /// Generated tokens fed so far.
    pub generated: usize,
    /// Prompt tokens (set by the first forward).
    pub prompt_len: usize,
    /// Time spent inside policy hooks.
    pub policy_time: std::time::Duration,
}

impl SeqState {
    pub fn new(
        config: &ModelConfig,
        mut policy: Box<dyn Policy>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        policy.reset();
        let caps = policy.capabilities();
        Ok(Self {
            cache: KvCache::new(
                config.num_layers,
                config.num_kv_heads,
                config.head_dim,
                dtype,
                device,
            )?,
            policy,
            caps,
            query_windows: vec![None; config.num_layers],
            seen: 0,
            generated: 0,
            prompt_len: 0,
            policy_time: std::time::Duration::ZERO,
        })
    }
}
