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
    /// probabilities, as they also do under `KVBENCH_HOST_SCORES=1` (kvbench before, to measure the
    /// difference on a GPU, which the check does).
    pub(super) fn batch_accumulation(
        batch: &[SeqInput<'_>],
        steps: &[StepInfo],
    ) -> Option<Vec<Accumulation>> {
        static HOST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *HOST.get_or_init(|| crate::switches::HOST_SCORES.is_on()) {
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
    /// device; none under [`Accumulation::Recurrence`], whose policy decides on the host). A
    /// sequence whose cache holds no scores yet hands its policy's over first.
    pub(super) fn accumulate_pooled(
        &self,
        l: usize,
        probs: &Tensor,
        lens: &[usize],
        rules: &[Accumulation],
        (batch, steps): (&mut [SeqInput<'_>], &[StepInfo]),
    ) -> candle_core::Result<Option<Tensor>> {
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
        let inputs = self.accumulate_inputs(lens, heads, rules, n)?;
        scores.scatter_set(&inputs.at, &inputs.first, 1)?;
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
                accumulate::least_scored(&updated, &inputs.old, &inputs.col).map(Some)
            }
            Accumulation::Recurrence { group, alpha, .. } => {
                let dev = &self.device;
                // The group's mean, divided as the host divides (not multiplied by an inverse).
                let mean = sums.broadcast_div(&Tensor::new(group as f32, dev)?)?;
                let important = mean.broadcast_ge(&Tensor::new(alpha, dev)?)?;
                let t = inputs.t.broadcast_as((rows, n))?;
                let ts = held.narrow(2, 0, 1)?.squeeze(2)?;
                let mri = held.narrow(2, 1, 1)?.squeeze(2)?;
                let gap = (&t - &ts)?;
                let mri = important.where_cond(&mri.maximum(&gap)?, &mri)?;
                let ts = important.where_cond(&t.contiguous()?, &ts)?;
                scores.slice_set(&Tensor::stack(&[ts, mri], 2)?, 1, 0)?;
                Ok(None)
            }
        }
    }

    /// The tensors a step's rules give, kept from layer to layer while the rules, lengths and heads
    /// are the same (each is a copy to the device): per row of the pool, its new entry's slot and
    /// first scores (`[rows, 1, width]` each), and under [`Accumulation::Sum`] the entries its eviction may
    /// take (`[rows, 1]`: all but the recent ones when the cache holds more than it keeps, else
    /// none) and the columns `0..n` (`[1, n]`), under [`Accumulation::Recurrence`] its step `t`
    /// (`[rows, 1]`).
    fn accumulate_inputs(
        &self,
        lens: &[usize],
        heads: usize,
        rules: &[Accumulation],
        n: usize,
    ) -> candle_core::Result<StepTensors> {
        let mut memo = self
            .accumulate_inputs
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let same = |m: &&Inputs| m.lens == lens && m.heads == heads && m.rules == rules && m.n == n;
        if let Some(m) = memo.as_ref().filter(same) {
            return Ok(m.tensors.clone());
        }
        let rows = lens.len() * heads;
        let per_row = |f: &dyn Fn(usize, &Accumulation) -> Vec<f32>| -> Vec<f32> {
            (0..rows)
                .flat_map(|r| f(lens[r / heads] + 1, &rules[r / heads]))
                .collect()
        };
        let dev = &self.device;
        let width = rules.first().map_or(1, Accumulation::width);
        let first = per_row(&|_, rule| match *rule {
            Accumulation::Sum { .. } => vec![0.0],
            Accumulation::Recurrence { start, .. } => vec![start as f32, 0.0],
        });
        // Exact in f32: entry counts and steps below 2²⁴ (`Accumulation::Recurrence`'s bound).
        let second = per_row(&|held, rule| match *rule {
            Accumulation::Sum { keep, recent, .. } if held > keep => vec![(held - recent) as f32],
            Accumulation::Sum { .. } => vec![0.0],
            Accumulation::Recurrence { t, .. } => vec![t as f32],
        });
        let second = Tensor::from_vec(second, (rows, 1), dev)?;
        let at: Vec<u32> = (0..rows * width)
            .map(|k| lens[k / (width * heads)] as u32)
            .collect();
        let tensors = StepTensors {
            at: Tensor::from_vec(at, (rows, 1, width), dev)?,
            first: Tensor::from_vec(first, (rows, 1, width), dev)?,
            old: second.to_dtype(DType::U32)?,
            t: second,
            col: Tensor::arange(0u32, n as u32, dev)?.reshape((1, n))?,
        };
        *memo = Some(Inputs {
            lens: lens.to_vec(),
            heads,
            rules: rules.to_vec(),
            n,
            tensors: tensors.clone(),
        });
        Ok(tensors)
    }
}

/// [`Transformer::accumulate_inputs`]'s last tensors and what they were built for.
pub(super) struct Inputs {
    lens: Vec<usize>,
    heads: usize,
    rules: Vec<Accumulation>,
    n: usize,
    tensors: StepTensors,
}

/// A step's tensors of [`Transformer::accumulate_inputs`]: `old` and `t` are one per row (u32 and
/// f32), read by `Sum` and `Recurrence` respectively.
#[derive(Clone)]
struct StepTensors {
    at: Tensor,
    first: Tensor,
    old: Tensor,
    t: Tensor,
    col: Tensor,
}
