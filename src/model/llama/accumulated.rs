//! A pooled decoding batch whose policies accumulate attention (H2O) keeps their scores in the
//! pool and chooses their evictions there: only the chosen entries' indices reach the host.
//!
//! Why it exists: such a policy reads every layer's attention row of every sequence at every step.
//! Copied to the host, that was each KV head's row of `n` probabilities per sequence and layer (at
//! R1-Distill-Qwen-7B's shapes, four KV heads and 28 layers at B = 1,024: about 460 KB a sequence
//! and step, through pageable memory), then added and ranked there. Here, per layer and for the
//! whole batch, the group-summed probabilities are added to the pool's scores (one operation), the
//! rule of [`crate::policy::Accumulation`] picks each head's eviction (a dozen operations,
//! [`crate::policy::accumulate::least_scored`]), and at the end of the step every layer's indices
//! come back in one copy (`[batch · kv_heads]` u32 a layer). The additions are the host's (f32,
//! elementwise, in the same order), so the scores and the choices are the same bits as the
//! policy's own on the host.

use super::{SeqInput, Transformer};
use crate::cache::pool;
use crate::policy::{accumulate, Accumulation, StepInfo};
use candle_core::{DType, Tensor};

impl Transformer {
    /// Every sequence's accumulation rule at this step, when all accumulate by rules one set of
    /// operations applies ([`Accumulation::batches_with`]); `None`: the policies read their
    /// probabilities, as they also do under `KVBENCH_HOST_SCORES` (any value: kvbench before, to
    /// measure the difference on a GPU, which the check does).
    pub(super) fn batch_accumulation(
        batch: &[SeqInput<'_>],
        steps: &[StepInfo],
    ) -> Option<Vec<Accumulation>> {
        static HOST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *HOST.get_or_init(|| std::env::var_os("KVBENCH_HOST_SCORES").is_some()) {
            return None;
        }
        let rules: Vec<Accumulation> = batch
            .iter()
            .zip(steps)
            .map(|(s, step)| s.state.policy.accumulation(step))
            .collect::<Option<_>>()?;
        let first = *rules.first()?;
        rules
            .iter()
            .all(|r| r.batches_with(&first))
            .then_some(rules)
    }

    /// Layer `l` of a pooled batch: applies `probs` (`[batch·heads, group, n]`, f32, padding zero)
    /// to the pool's scores under `rules` (each sequence's, all of one kind; `lens` its entries
    /// before this step's) and returns each row's eviction (`[batch·heads]` u32, still on the
    /// device; zero under [`Accumulation::Recurrence`], whose policy decides on the host). A
    /// sequence whose cache holds no scores yet hands its policy's over first.
    pub(super) fn accumulate_pooled(
        &self,
        l: usize,
        probs: &Tensor,
        lens: &[usize],
        rules: &[Accumulation],
        (batch, steps): (&mut [SeqInput<'_>], &[StepInfo]),
    ) -> candle_core::Result<Tensor> {
        let heads = Self::pool_heads(batch);
        let rows = batch.len() * heads;
        let n = probs.dim(2)?;
        let width = rules[0].width();
        let mut handed: Vec<Vec<Vec<f32>>> = batch
            .iter_mut()
            .zip(steps)
            .zip(lens)
            .map(
                |((s, step), &len)| match s.state.cache.layer(l).has_scores() {
                    true => Vec::new(),
                    false => s.state.policy.take_accumulated(step, l, heads, len + 1),
                },
            )
            .collect();
        let scores = pool::pooled_scores(&mut Self::layer_caches(batch, l), width, |i| {
            std::mem::take(&mut handed[i])
        })?;
        // This step's entries start from the rule's first scores (their slot may hold an evicted
        // entry's).
        let at = self.pool_inputs(lens, heads, true)?.at;
        let at = at.broadcast_as((rows, 1, width))?.contiguous()?;
        let first: Vec<f32> = (0..rows)
            .flat_map(|r| match rules[r / heads] {
                Accumulation::Sum { .. } => vec![0.0],
                Accumulation::Recurrence { start, .. } => vec![start as f32, 0.0],
            })
            .collect();
        let first = Tensor::from_vec(first, (rows, 1, width), &self.device)?;
        scores.scatter_set(&at, &first, 1)?;
        // Each head's row: its group's sum (a group of one is as it is).
        let sums = super::probs_for_policy(probs.clone(), true)?.reshape((rows, n))?;
        let held = scores.narrow(1, 0, n)?;
        match rules[0] {
            Accumulation::Sum { norm, .. } => {
                let sums = match norm == 1.0 {
                    true => sums,
                    false => (sums * f64::from(norm))?,
                };
                let updated = (held.squeeze(2)? + sums)?;
                scores.slice_set(&updated.unsqueeze(2)?, 1, 0)?;
                let (old, col) = self.accumulate_inputs(lens, heads, rules, n)?;
                accumulate::least_scored(&updated, &old, &col)
            }
            Accumulation::Recurrence { group, alpha, .. } => {
                let dev = &self.device;
                // The group's mean, divided as the host divides (not multiplied by an inverse).
                let mean = sums.broadcast_div(&Tensor::new(group as f32, dev)?)?;
                let important = mean.broadcast_ge(&Tensor::new(alpha, dev)?)?;
                let t: Vec<f32> = (0..rows)
                    .map(|r| match rules[r / heads] {
                        Accumulation::Recurrence { t, .. } => t as f32,
                        Accumulation::Sum { .. } => 0.0,
                    })
                    .collect();
                let t = Tensor::from_vec(t, (rows, 1), dev)?.broadcast_as((rows, n))?;
                let ts = held.narrow(2, 0, 1)?.squeeze(2)?;
                let mri = held.narrow(2, 1, 1)?.squeeze(2)?;
                let gap = (&t - &ts)?;
                let mri = important.where_cond(&mri.maximum(&gap)?, &mri)?;
                let ts = important.where_cond(&t.contiguous()?, &ts)?;
                scores.slice_set(&Tensor::stack(&[ts, mri], 2)?, 1, 0)?;
                Tensor::zeros(rows, DType::U32, dev)
            }
        }
    }

    /// The step's eviction candidates and columns, kept from layer to layer (each is a copy to the
    /// device): per row of the pool, the entries its eviction may take (`[rows, 1]`, [`Accumulation`]'s
    /// rule: all but the recent ones when the cache holds more than it keeps, else none), and the
    /// columns `0..n` (`[1, n]`).
    fn accumulate_inputs(
        &self,
        lens: &[usize],
        hkv: usize,
        rules: &[Accumulation],
        n: usize,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let old: Vec<u32> = (0..lens.len() * hkv)
            .map(|r| {
                let held = lens[r / hkv] + 1;
                match rules[r / hkv] {
                    Accumulation::Sum { keep, recent, .. } if held > keep => (held - recent) as u32,
                    _ => 0,
                }
            })
            .collect();
        let mut memo = self
            .accumulate_inputs
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(m) = memo.as_ref().filter(|m| m.old == old && m.n == n) {
            return Ok((m.old_t.clone(), m.col_t.clone()));
        }
        let dev = &self.device;
        let inputs = Inputs {
            old_t: Tensor::from_slice(&old, (old.len(), 1), dev)?,
            col_t: Tensor::arange(0u32, n as u32, dev)?.reshape((1, n))?,
            old,
            n,
        };
        let out = (inputs.old_t.clone(), inputs.col_t.clone());
        *memo = Some(inputs);
        Ok(out)
    }
}

/// [`Transformer::accumulate_inputs`]'s last tensors and the values they hold.
pub(super) struct Inputs {
    old: Vec<u32>,
    n: usize,
    old_t: Tensor,
    col_t: Tensor,
}
