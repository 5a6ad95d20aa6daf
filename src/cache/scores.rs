//! Per-entry scores a policy keeps in the cache, beside the entries they score.
//!
//! Why it exists: H2O accumulates, for every entry, the attention it received, and evicts the least
//! at every step. Held by the policy on the host, a decoding batch on a GPU copied every layer's
//! attention row of every sequence to the host at every step (at R1-Distill-Qwen-7B's shapes and
//! B = 1,024, about 460 KB a sequence and step; LazyEviction's `TS` and `MRI` likewise). Held here,
//! in a buffer laid out as the keys are (`[kv_heads, capacity, width]`, f32: one score an entry for
//! H2O, two for LazyEviction), the scores are updated where the probabilities are, grown, pooled
//! and gathered with the entries by the same operations, and only what a decision needs travels
//! ([`crate::policy::Policy::accumulation`]). A policy that decides on the host takes them back
//! ([`LayerCache::take_scores`]). The bytes are the policy's side state, not the cache's
//! ([`LayerCache::score_bytes`]).

use super::LayerCache;
use candle_core::{DType, Result, Tensor};

impl LayerCache {
    /// Whether the cache holds its policy's per-entry scores.
    pub fn has_scores(&self) -> bool {
        self.scores.is_some()
    }

    /// Scores per entry and head (1 for H2O's sum; 0 when the cache holds none).
    pub fn score_width(&self) -> usize {
        self.scores.as_ref().map_or(0, |s| s.dim(2).unwrap_or(0))
    }

    /// Bytes of the per-entry scores held (f32 each; zero when none).
    pub fn score_bytes(&self) -> usize {
        self.kv_heads * self.len * self.score_width() * 4
    }

    /// The scores of every head's entries, `[kv_heads][len · width]` (an entry's `width` together),
    /// copied to the host (an error when the cache holds none).
    pub fn read_scores(&self) -> Result<Vec<Vec<f32>>> {
        self.assert_settled();
        let Some(s) = &self.scores else {
            candle_core::bail!("read_scores: the cache holds no scores");
        };
        let held = s.narrow(1, 0, self.len)?.flatten_from(1)?;
        crate::host_copy::rows::<f32>(&held.to_dtype(DType::F32)?)
    }

    /// The scores, taken back by a policy that keeps them itself from now on (`None`: the cache
    /// held none); the cache then holds none.
    pub fn take_scores(&mut self) -> Result<Option<Vec<Vec<f32>>>> {
        if self.scores.is_none() {
            return Ok(None);
        }
        let scores = self.read_scores()?;
        self.scores = None;
        Ok(Some(scores))
    }

    /// Writes `acc` (per head, at most `len · width` scores, an entry's together; the rest zero)
    /// into the scores buffer, which must exist.
    pub(super) fn write_scores(&self, acc: &[Vec<f32>]) -> Result<()> {
        let Some(s) = &self.scores else {
            candle_core::bail!("write_scores: the cache holds no scores buffer");
        };
        let row = self.len * s.dim(2)?;
        if row == 0 {
            return Ok(());
        }
        if acc.len() > self.kv_heads || acc.iter().any(|a| a.len() > row) {
            candle_core::bail!(
                "write_scores: {} heads of up to {} scores for {} heads of {row}",
                acc.len(),
                acc.iter().map(Vec::len).max().unwrap_or(0),
                self.kv_heads,
            );
        }
        let mut flat = vec![0f32; self.kv_heads * row];
        for (to, a) in flat.chunks_exact_mut(row).zip(acc) {
            to[..a.len()].copy_from_slice(a);
        }
        let rows = Tensor::from_vec(flat, (self.kv_heads, self.len, s.dim(2)?), s.device())?;
        s.slice_set(&rows, 1, 0)
    }

    /// Zeroes the scores of entries `from..from + t` (new entries), when the cache holds scores.
    pub(super) fn zero_scores(&self, from: usize, t: usize) -> Result<()> {
        match &self.scores {
            Some(s) => s.slice_set(
                &Tensor::zeros((self.kv_heads, t, s.dim(2)?), DType::F32, s.device())?,
                1,
                from,
            ),
            None => Ok(()),
        }
    }
}
