//! Teacher-forced fidelity: the full-cache model generates a sequence, and a second copy of the
//! sequence under policy P is fed the same tokens in lockstep (one batched forward pass per step), so
//! that at every position P's next-token distribution can be compared with full's on the same prefix.
//!
//! Per step: KL(full ‖ P), whether P's top-1 token is full's top-1, and the rank under P of the token
//! full produced. The first position where the top-1 tokens differ is where a greedy P would leave
//! full's output when running free: until then both have the same prefix, so free-running greedy
//! decoding under P reproduces full's tokens exactly up to that step.

use super::{Sampler, SamplingParams};
use crate::error::Result;
use crate::metrics::divergence::{argmax, kl_from_logits, rank_of};
use crate::model::{SeqInput, Transformer};
use crate::policy::{Full, Policy};
use serde::{Deserialize, Serialize};

/// Fidelity of one sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fidelity {
    /// Positions compared (full's output tokens, including the one after prefill).
    pub steps: usize,
    pub mean_kl: f64,
    pub top1_agreement: f64,
    /// Mean rank under P of the token full produced (0: P's top-1).
    pub mean_rank: f64,
    /// First output position where P's top-1 differs from full's; none if it never does.
    pub first_divergence: Option<usize>,
    /// Mean KL and agreement over consecutive spans of `bucket` positions, for plots by position.
    pub bucket: usize,
    pub kl_by_position: Vec<f64>,
    pub agreement_by_position: Vec<f64>,
}

/// Fidelity of several sequences, pooled over their steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pooled {
    pub sequences: usize,
    pub steps: usize,
    pub mean_kl: f64,
    pub top1_agreement: f64,
    pub mean_rank: f64,
    /// Median over sequences of the first divergence (a sequence that never diverges counts its
    /// length), and how many never diverged.
    pub first_divergence_median: Option<f64>,
    pub never_diverged: usize,
}

impl Pooled {
    pub fn of(all: &[&Fidelity]) -> Option<Pooled> {
        let steps: usize = all.iter().map(|f| f.steps).sum();
        if steps == 0 {
            return None;
        }
        let pooled = |g: &dyn Fn(&Fidelity) -> f64| {
            all.iter().map(|f| g(f) * f.steps as f64).sum::<f64>() / steps as f64
        };
        let divergences: Vec<f64> = all
            .iter()
            .map(|f| f.first_divergence.unwrap_or(f.steps) as f64)
            .collect();
        Some(Pooled {
            sequences: all.len(),
            steps,
            mean_kl: pooled(&|f| f.mean_kl),
            top1_agreement: pooled(&|f| f.top1_agreement),
            mean_rank: pooled(&|f| f.mean_rank),
            first_divergence_median: crate::metrics::median(&divergences),
            never_diverged: all.iter().filter(|f| f.first_divergence.is_none()).count(),
        })
    }
}

/// Runs full and `policy` in lockstep on `prompt` for up to `max_new` tokens of full's output
/// (sampled with `sampling`; stopping at an `eos` token). The policy's cache stores entries as
/// `kv_type` (`None`: the model's type).
#[allow(clippy::too_many_arguments)]
pub fn teacher_forced(
    model: &Transformer,
    prompt: &[u32],
    policy: Box<dyn Policy>,
    kv_type: Option<crate::cache::KvType>,
    sampling: SamplingParams,
    max_new: usize,
    eos: &[u32],
    bucket: usize,
) -> Result<Fidelity> {
    // The reference: the full cache in the exact type, whatever the compared run stores.
    let mut full = model.new_state_with(Box::new(Full), crate::cache::KvType::F32)?;
    let mut other = model.new_state_with(policy, kv_type.unwrap_or(model.kv_type()))?;
    let mut sampler = Sampler::new(sampling);
    let last_row = |t: candle_core::Tensor| -> Result<Vec<f32>> { Ok(crate::host_copy::flat(&t)?) };
    let mut p = last_row(model.forward(&mut [SeqInput {
        tokens: prompt,
        state: &mut full,
    }])?)?;
    let mut q = last_row(model.forward(&mut [SeqInput {
        tokens: prompt,
        state: &mut other,
    }])?)?;
    let (mut kls, mut agree, mut ranks) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..max_new {
        let token = sampler.sample(&p)?;
        kls.push(kl_from_logits(&p, &q));
        agree.push(argmax(&p) == argmax(&q));
        ranks.push(rank_of(&q, token));
        if eos.contains(&token) || kls.len() == max_new {
            break;
        }
        let logits = model.forward(&mut [
            SeqInput {
                tokens: &[token],
                state: &mut full,
            },
            SeqInput {
                tokens: &[token],
                state: &mut other,
            },
        ])?;
        let logits = crate::host_copy::rows::<f32>(&logits)?;
        let mut rows = logits.into_iter();
        p = rows.next().unwrap_or_default();
        q = rows.next().unwrap_or_default();
    }
    Ok(summarize(&kls, &agree, &ranks, bucket.max(1)))
}

/// The summary of per-step values.
pub fn summarize(kls: &[f64], agree: &[bool], ranks: &[usize], bucket: usize) -> Fidelity {
    let n = kls.len().max(1) as f64;
    let chunks_kl = kls
        .chunks(bucket)
        .map(|c| c.iter().sum::<f64>() / c.len() as f64)
        .collect();
    let chunks_agree = agree
        .chunks(bucket)
        .map(|c| c.iter().filter(|&&a| a).count() as f64 / c.len() as f64)
        .collect();
    Fidelity {
        steps: kls.len(),
        mean_kl: kls.iter().sum::<f64>() / n,
        top1_agreement: agree.iter().filter(|&&a| a).count() as f64 / n,
        mean_rank: ranks.iter().sum::<usize>() as f64 / n,
        first_divergence: agree.iter().position(|&a| !a),
        bucket,
        kl_by_position: chunks_kl,
        agreement_by_position: chunks_agree,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn summary_of_known_steps() {
        let f = super::summarize(
            &[0.0, 0.0, 0.3, 0.1],
            &[true, true, false, true],
            &[0, 0, 2, 0],
            2,
        );
        assert_eq!(f.steps, 4);
        assert!((f.mean_kl - 0.1).abs() < 1e-12);
        assert_eq!(f.top1_agreement, 0.75);
        assert_eq!(f.mean_rank, 0.5);
        assert_eq!(f.first_divergence, Some(2));
        assert_eq!(f.kl_by_position.len(), 2);
        assert!((f.kl_by_position[1] - 0.2).abs() < 1e-12);
        assert_eq!(f.agreement_by_position, vec![1.0, 0.5]);
    }
}
