//! One sequence's attention over its cache through candle's operations: a decoding token's (all heads
//! at once) or a prefill's (one KV head's group at a time, in chunks of tokens).
//!
//! Why the chunks: a prefill's scores are `[g·t, n]` floats per KV head. At R1-Distill-Qwen-7B's
//! shapes and an 8,192-token prompt that is 1.9 GB per head with three more copies of its size alive
//! (scaled, masked, softmaxed), 7.5 GB at 16,384 tokens, 30 GB at 32,768; and past 4,294,967,295
//! elements (about 24,800 tokens there) candle's CUDA kernels, which count elements in 32 bits, cover
//! only part of the tensor without an error. Above [`PREFILL_SCORE_BYTES`] the tokens go in chunks,
//! each over the entries it can see (the cache's first `n − t + last` entries: the rest are masked for
//! every row of the chunk), which also skips part of the masked products (of `c` chunks, a share
//! `(c − 1)/c`). Below it, one chunk: the same operations, in the same order, as before chunks existed.
//! Chunks change the last bits of a long prompt's logits (the tests allow 1e-5 and ask for the same
//! evictions under every policy).

use super::Transformer;
use crate::model::matmul::matmul;
use candle_core::{DType, Tensor};

/// The most bytes of f32 scores one KV head's chunk of a prefill holds by default
/// ([`Transformer::set_prefill_score_bytes`]).
pub(super) const PREFILL_SCORE_BYTES: usize = 256 << 20;

/// Tokens per chunk of a prefill of `t` new tokens over `n` entries with `g` query heads per KV head:
/// all of them when their scores fit `bytes`, otherwise as many as fit (at least one).
pub(super) fn prefill_chunk(g: usize, t: usize, n: usize, bytes: usize) -> usize {
    let per_token = (g * n * std::mem::size_of::<f32>()).max(1);
    (bytes / per_token).clamp(1, t.max(1))
}

/// Which of a sequence's attention probabilities its policy reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum KeptProbs {
    None,
    /// Every query head's rows, `[kv_heads, g, t, n]`.
    Each,
    /// Summed over each KV head's group, `[kv_heads, 1, t, n]` (a `g`-th of the memory; a prefill's
    /// chunk by chunk).
    GroupSum,
}

impl Transformer {
    /// Attention of `q` (`[kv_heads, g·t, d]`, each KV head's group of query heads, `t` new tokens
    /// each) over `keys` and `values` (`[kv_heads, n, d]`, the last `t` entries the new tokens'),
    /// returning the output `[kv_heads, g·t, d]` and the probabilities `kept` asks for (f32).
    pub(super) fn attend_dense(
        &self,
        q: &Tensor,
        keys: &Tensor,
        values: &Tensor,
        (g, t): (usize, usize),
        kept: KeptProbs,
    ) -> candle_core::Result<(Tensor, Option<Tensor>)> {
        let (hkv, _, d) = q.dims3()?;
        let n = keys.dim(1)?;
        // The probabilities a policy reads are one tensor whatever the chunks: off the CPU, refused
        // past the kernels' element count rather than covered in part.
        let rows_kept = match kept {
            KeptProbs::GroupSum => 1,
            _ => g,
        };
        let probs_elements = [hkv, rows_kept, t, n]
            .iter()
            .try_fold(1usize, |a, &x| a.checked_mul(x));
        if kept != KeptProbs::None
            && !self.device.is_cpu()
            && probs_elements.is_none_or(|e| e > crate::cache::pool::KERNEL_ELEMENTS)
        {
            candle_core::bail!(
                "attention: the probabilities of {t} new tokens over {n} entries ({hkv} KV heads × {rows_kept} rows) \
                 that this policy reads pass the {} elements candle's CUDA kernels count; use a shorter prompt",
                crate::cache::pool::KERNEL_ELEMENTS
            );
        }
        // One token, or off the CPU's own path a prefill whose scores for every head fit the bound
        // one head's chunk has: all heads in one set of operations, the same per head as below (on
        // a GPU a prefill's attention was seven launches per KV head and layer: at a batch of short
        // prompts prefilled together, thousands a pass).
        let all_heads = t == 1
            || ((!self.device.is_cpu() || self.generic_attention)
                && [hkv, g, t, n, std::mem::size_of::<f32>()]
                    .iter()
                    .try_fold(1usize, |a, &x| a.checked_mul(x))
                    .is_some_and(|bytes| bytes <= self.prefill_score_bytes));
        if all_heads {
            let probs = self.softmax_scores(q, keys, t, Some(&mut None))?;
            let y = matmul(&probs.to_dtype(values.dtype())?, values)?;
            let probs = match kept {
                KeptProbs::None => None,
                KeptProbs::Each => Some(probs.reshape((hkv, g, t, n))?),
                KeptProbs::GroupSum => Some(super::probs_for_policy(
                    probs.reshape((hkv, g, t, n))?,
                    true,
                )?),
            };
            return Ok((y, probs));
        }
        // Several new tokens (a prefill): one KV head's group at a time, in chunks of tokens. A
        // head's scores are `[g·t, n]` floats, and all heads' at once (with the scaled, masked and
        // softmaxed copies alive together) were most of SmolLM2's transient memory at a 512-token
        // prompt on the CPU. Each head's rows go through the same operations, so the same bits.
        let m = prefill_chunk(g, t, n, self.prefill_score_bytes);
        let mut ys = Vec::with_capacity(t.div_ceil(m));
        let mut all_probs = Vec::new();
        for first in (0..t).step_by(m) {
            let rows = m.min(t - first);
            // The entries this chunk's tokens see: all but the new ones after its last.
            let seen = n - (t - first - rows);
            // Built when first needed, once for every head: on the CPU's own path the mask is
            // applied inside `ops::scaled_causal_softmax` instead.
            let mut mask: Option<Tensor> = None;
            let mut heads_y = Vec::with_capacity(hkv);
            let mut heads_p = Vec::new();
            for h in 0..hkv {
                let q_h = q.narrow(0, h, 1)?;
                let q_h = match rows == t {
                    true => q_h,
                    false => q_h
                        .reshape((g, t, d))?
                        .narrow(1, first, rows)?
                        .contiguous()?
                        .reshape((1, g * rows, d))?,
                };
                let (k_h, v_h) = (
                    keys.narrow(0, h, 1)?.narrow(1, 0, seen)?,
                    values.narrow(0, h, 1)?.narrow(1, 0, seen)?,
                );
                let probs = self.softmax_scores(&q_h, &k_h, rows, Some(&mut mask))?;
                heads_y.push(matmul(&probs.to_dtype(v_h.dtype())?, &v_h)?); // [1, g·rows, d]
                if kept != KeptProbs::None {
                    // Entries past `seen` are masked for every row of the chunk: probability 0.
                    let probs = match seen < n {
                        true => Tensor::cat(
                            &[
                                &probs,
                                &Tensor::zeros(
                                    (1, g * rows, n - seen),
                                    DType::F32,
                                    probs.device(),
                                )?,
                            ],
                            2,
                        )?,
                        false => probs,
                    }
                    .reshape((1, g, rows, n))?;
                    heads_p.push(match kept {
                        KeptProbs::GroupSum if g > 1 => probs.sum_keepdim(1)?,
                        _ => probs,
                    });
                }
            }
            ys.push(Tensor::cat(&heads_y, 0)?); // [hkv, g·rows, d] (one part: that part itself)
            if kept != KeptProbs::None {
                all_probs.push(Tensor::cat(&heads_p, 0)?); // [hkv, g or 1, rows, n]
            }
        }
        let y = match ys.len() {
            1 => ys.swap_remove(0),
            _ => {
                let parts: Vec<Tensor> = ys
                    .into_iter()
                    .map(|y| y.reshape((hkv, g, y.dim(1)? / g, d)))
                    .collect::<candle_core::Result<_>>()?;
                Tensor::cat(&parts, 2)?.reshape((hkv, g * t, d))?
            }
        };
        let probs = match kept {
            KeptProbs::None => None,
            _ => Some(Tensor::cat(&all_probs, 2)?),
        };
        Ok((y, probs))
    }

    /// `softmax(q kᵀ · scale + mask)` in f32 whatever the activations (16-bit ones are widened here, as
    /// transformers' attention does before its softmax), `[heads, g·rows, n]`: `rows` new tokens per
    /// query head, the last `rows` of the `n` entries (causally masked when more than one; `mask`
    /// holds that mask once built, for the next head).
    fn softmax_scores(
        &self,
        q: &Tensor,
        keys: &Tensor,
        rows: usize,
        mask: Option<&mut Option<Tensor>>,
    ) -> candle_core::Result<Tensor> {
        let scale = 1.0 / (keys.dim(2)? as f64).sqrt();
        let raw = matmul(q, &keys.t()?)?.to_dtype(DType::F32)?;
        // On the CPU (not when it runs the path a GPU takes, which the tests check there) in one
        // pass, the same bits.
        if rows > 1 && self.device.is_cpu() && !self.generic_attention {
            if let Some(probs) = crate::model::ops::scaled_causal_softmax(&raw, scale as f32, rows)
            {
                return probs;
            }
        }
        let scores = (raw * scale)?;
        let scores = match (rows > 1, mask) {
            (true, Some(mask)) => {
                let (heads, gr, n) = scores.dims3()?;
                let mask = match mask {
                    Some(mask) => mask,
                    none => none.insert(crate::model::ops::causal_mask(rows, n, &self.device)?),
                };
                scores
                    .reshape((heads, gr / rows, rows, n))?
                    .broadcast_add(mask)?
                    .reshape((heads, gr, n))?
            }
            (true, None) => candle_core::bail!("attention: {rows} new tokens need a causal mask"),
            (false, _) => scores,
        };
        candle_nn::ops::softmax_last_dim(&scores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefill_is_one_chunk_while_its_scores_fit_and_chunks_past_it() {
        // 7 query heads per KV head over 1,000 entries: 28,000 bytes of scores a token.
        assert_eq!(prefill_chunk(7, 1000, 1000, 28_000_000), 1000);
        assert_eq!(prefill_chunk(7, 1000, 1000, 27_999_999), 999);
        assert_eq!(prefill_chunk(7, 1000, 1000, 1), 1);
        // At R1-Distill-Qwen-7B's shapes and 32,768 tokens, chunks stay far below 2³² elements.
        let m = prefill_chunk(7, 32_768, 32_768, PREFILL_SCORE_BYTES);
        assert!(m >= 1 && 7 * m * 32_768 <= PREFILL_SCORE_BYTES / 4);
    }

    fn random(shape: (usize, usize, usize), seed: u64) -> Tensor {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let n = shape.0 * shape.1 * shape.2;
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
        Tensor::from_vec(v, shape, &candle_core::Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        assert_eq!(a.dims(), b.dims());
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    /// Each query head's probabilities, the group's sums of them, in one pass and in chunks of
    /// tokens, on the CPU's path and the one a GPU takes: the same output, the sums those of the rows.
    #[test]
    fn kept_probabilities_are_each_head_s_or_their_group_s_sum_in_chunks_or_not() {
        let (hkv, g, t, past, d) = (2, 3, 9, 4, 8);
        let n = past + t;
        let q = random((hkv, g * t, d), 1);
        let (k, v) = (random((hkv, n, d), 2), random((hkv, n, d), 3));
        for generic in [false, true] {
            let mut m = crate::model::Model::load("random:tiny@4", &Default::default()).unwrap();
            m.transformer.set_generic_attention(generic);
            let tr = &mut m.transformer;
            let (y, each) = tr
                .attend_dense(&q, &k, &v, (g, t), KeptProbs::Each)
                .unwrap();
            let each = each.unwrap();
            assert_eq!(each.dims(), [hkv, g, t, n]);
            // A row's probabilities sum to one; a token sees its own entry and those before it.
            let rows = each
                .sum(3)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert!(rows.iter().all(|r| (r - 1.0).abs() < 1e-5), "{rows:?}");
            let last = each
                .narrow(2, 0, 1)
                .unwrap()
                .narrow(3, past + 1, t - 1)
                .unwrap();
            assert_eq!(
                last.abs()
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap(),
                0.0
            );
            let summed = each.sum_keepdim(1).unwrap();
            // Every head at once (off the CPU's own path, while all heads' scores fit), one head's
            // whole prompt at a time (the same bits), chunks of two tokens, of one.
            for bytes in [usize::MAX, g * t * n * 4, g * n * 4 * 2, 1] {
                tr.set_prefill_score_bytes(bytes);
                let (y2, group) = tr
                    .attend_dense(&q, &k, &v, (g, t), KeptProbs::GroupSum)
                    .unwrap();
                let (y3, each3) = tr
                    .attend_dense(&q, &k, &v, (g, t), KeptProbs::Each)
                    .unwrap();
                let tol = if bytes >= g * t * n * 4 { 0.0 } else { 1e-6 };
                assert!(
                    max_diff(&y, &y2) <= tol && max_diff(&y, &y3) <= tol,
                    "{bytes}"
                );
                assert!(max_diff(&summed, &group.unwrap()) <= tol, "{bytes}");
                assert!(max_diff(&each, &each3.unwrap()) <= tol, "{bytes}");
            }
            let (_, none) = tr
                .attend_dense(&q, &k, &v, (g, t), KeptProbs::None)
                .unwrap();
            assert!(none.is_none());
            // One token (a decoding step): all heads at once, the same sums.
            let q1 = random((hkv, g, d), 4);
            let (y1, each1) = tr
                .attend_dense(&q1, &k, &v, (g, 1), KeptProbs::Each)
                .unwrap();
            let (y2, group1) = tr
                .attend_dense(&q1, &k, &v, (g, 1), KeptProbs::GroupSum)
                .unwrap();
            let (each1, group1) = (each1.unwrap(), group1.unwrap());
            assert_eq!(each1.dims(), [hkv, g, 1, n]);
            assert_eq!(group1.dims(), [hkv, 1, 1, n]);
            assert_eq!(max_diff(&y1, &y2), 0.0);
            assert_eq!(max_diff(&each1.sum_keepdim(1).unwrap(), &group1), 0.0);
        }
    }
}
