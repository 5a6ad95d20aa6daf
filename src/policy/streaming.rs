//! StreamingLLM (Xiao et al. 2024): keep the first `sinks` entries (attention sinks) and the most
//! recent ones; nothing is scored.
//!
//! Positions: kvbench keeps every entry's absolute position (keys are cached after RoPE), as the
//! compression-benchmark ports do. The original re-applies RoPE with positions inside the cache; that
//! variant is not offered. Trigger: `every-n` (default, the R-KV repository's cadence: every `buffer`
//! generated tokens, and at prefill) or `every-step` (the original: trim to the budget after every step).

use super::params::{Params, Trigger};
use super::{AttentionView, Budget, Capabilities, Policy, StepInfo};
use crate::cache::LayerCache;
use crate::error::Result;

#[derive(Debug, Clone)]
pub struct Config {
    budget: Budget,
    sinks: usize,
    buffer: usize,
    trigger: Trigger,
}

impl Config {
    pub fn parse(p: &mut Params, budget: Budget) -> Result<Self> {
        let sinks = p.get("sinks", 4usize)?;
        let trigger = p.get("trigger", Trigger::EveryN)?;
        let buffer = p.positive("buffer", 128)?;
        Ok(Self {
            budget,
            sinks,
            buffer,
            trigger,
        })
    }

    /// Entries held above the budget between compressions at most (the buffer, or none when it
    /// trims every step): a held budget's nominal budget is the held one minus half of it.
    pub fn slack(&self) -> usize {
        match self.trigger {
            Trigger::EveryStep => 0,
            Trigger::EveryN => self.buffer,
        }
    }

    /// The fewest entries kept: the sinks plus one recent entry.
    pub fn floor(&self) -> usize {
        self.sinks + 1
    }

    /// Entries kept after a trim: the budget, never fewer than the sinks plus one recent entry.
    fn keep(&self, seen: usize) -> usize {
        self.budget.entries(seen).max(self.sinks + 1)
    }
}

#[derive(Clone)]
pub struct StreamingLlm {
    config: Config,
}

impl StreamingLlm {
    pub fn new(config: Config) -> Self {
        Self { config }
    }
}

impl Policy for StreamingLlm {
    fn fork(&self) -> Option<Box<dyn Policy>> {
        Some(Box::new(self.clone()))
    }

    fn name(&self) -> &str {
        "streaming"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ..Default::default()
        }
    }

    fn reset(&mut self) {}

    fn after_attention(
        &mut self,
        step: &StepInfo<'_>,
        _view: &AttentionView<'_>,
        cache: &mut LayerCache,
    ) -> candle_core::Result<()> {
        let c = &self.config;
        let due = match c.trigger {
            Trigger::EveryStep => true,
            Trigger::EveryN => step.is_prefill || step.generated.is_multiple_of(c.buffer),
        };
        let keep = c.keep(step.seen_after());
        let n = cache.len();
        if !due || n <= keep {
            return Ok(());
        }
        // Storage stays positional, so the sinks are the first entries and the recent ones the last.
        let kept: Vec<usize> = (0..c.sinks).chain(n - (keep - c.sinks)..n).collect();
        cache.gather(&vec![kept; cache.kv_heads()])
    }

    fn entry_limit(&self, _layer: usize, seen: usize, _prompt_len: usize) -> Option<usize> {
        let slack = match self.config.trigger {
            Trigger::EveryStep => 0,
            Trigger::EveryN => self.config.buffer,
        };
        Some(self.config.keep(seen) + slack)
    }
}
