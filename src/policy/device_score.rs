//! The observation-window policies' scores computed with candle's operations where the keys live, for
//! caches off the CPU: the window attention score ([`super::score::window_scores`]) and R-KV's
//! redundancy ([`super::score::redundancy`]). Only the scores come back to the host, not the keys.
//!
//! The window score is a product of the window's queries with every key, a (masked) softmax per row
//! and sums over rows: on a GPU's host it needed the layer's keys copied out at every compression and
//! `g·w·n·d` multiply-adds per head there. Here it is one product and a few operations for all heads.
//!
//! The score is quadratic in the entries: at a compression of an 8K-token prompt about 17 GFLOP per
//! head and layer, which on a GPU's host took minutes a sequence while the GPU waited. Here the cosine
//! matrix is one product on the device and only the `n` scores come back. The semantics are the host
//! version's, step for step (diagonal zero, each row's most recent partner above the threshold or
//! column 0 zeroed, column means, softmax); the sums run in another order, so scores differ by
//! rounding. Caches on the CPU keep the host version.
//!
//! Both take several sequences at once (`[sequences, heads, …]`, or rows of heads): a decoding batch's
//! compressions of one step are scored together by the engine (`Policy::score_request`), a few
//! operations per chunk instead of a hundred per sequence and layer.

use super::params::{GqaAgg, QueryReduce, SoftmaxDomain};
use crate::model::matmul::matmul;
use candle_core::{DType, Result, Tensor, D};

/// Bytes of `f32` one chunk of a batched scoring may hold in its largest temporary (a `[rows, n, n]`
/// cosine matrix, or a window's `[sequences, heads, w, n]` logits): a batch is scored in chunks of
/// sequences or heads below it, so that a compression of 1,024 sequences at once needs a few
/// hundred MiB, not tens of GiB. One row is always taken, however large.
pub const CHUNK_BYTES: usize = 256 << 20;

/// The window attention score of every candidate (the first `n_cand` keys) of each KV head, as
/// [`super::score::window_scores`] computes it from [`super::score::GroupLogits`] (the first vector of
/// its result: one per KV head; under [`GqaAgg::PerQueryHead`], where the cache stores keys per query
/// head, the group is one head). `queries`: the window, `[query_heads, w, d]`; `keys`: `[heads, n, d]`
/// as cached. `None` when a window row would see no key (its softmax is empty on the host; here it
/// would be undefined): the caller scores on the host then.
pub fn window_scores(
    queries: &Tensor,
    keys: &Tensor,
    n_cand: usize,
    agg: GqaAgg,
    domain: SoftmaxDomain,
    reduce: QueryReduce,
) -> Result<Option<Vec<Vec<f32>>>> {
    let scores = window_scores_batch(
        &queries.unsqueeze(0)?,
        keys,
        n_cand,
        agg,
        domain,
        reduce,
        CHUNK_BYTES,
    )?;
    Ok(scores.map(|mut s| s.swap_remove(0)))
}

/// [`window_scores`] of several sequences at once, each with its own window and keys of the same
/// shape: `queries` `[sequences, query_heads, w, d]`, `keys` `[sequences·heads, n, d]` (each
/// sequence's heads in turn; a view of a pool will do, it is read chunk by chunk); returns
/// `[sequences][heads][n_cand]`. A few operations per chunk of sequences (at most `chunk_bytes` of
/// logits or of f32 keys each) and one copy to the host, where one sequence at a time took a dozen
/// operations and a wait for the device each.
pub fn window_scores_batch(
    queries: &Tensor,
    keys: &Tensor,
    n_cand: usize,
    agg: GqaAgg,
    domain: SoftmaxDomain,
    reduce: QueryReduce,
    chunk_bytes: usize,
) -> Result<Option<Vec<Vec<Vec<f32>>>>> {
    let (b, hq, w, d) = queries.dims4()?;
    let (rows, n, _) = keys.dims3()?;
    let heads = rows / b.max(1);
    let g = hq / heads.max(1);
    if n_cand == 0 || b == 0 {
        return Ok(Some(vec![vec![Vec::new(); heads]; b]));
    }
    // What each window query's softmax sees: the candidates, or every key up to its own position.
    let visible: Vec<usize> = (0..w)
        .map(|i| match domain {
            SoftmaxDomain::Candidates => n_cand,
            SoftmaxDomain::AllCausal => (n + i + 1).saturating_sub(w).min(n),
        })
        .collect();
    if visible.contains(&0) {
        return Ok(None);
    }
    let dev = keys.device();
    let mask: Vec<f32> = visible
        .iter()
        .flat_map(|&v| (0..n).map(move |j| if j < v { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    let mask = Tensor::from_vec(mask, (w, n), dev)?;
    let scale = 1.0 / (d as f32).sqrt();
    let per_sequence = (hq * w * n).max(heads * n * d) * std::mem::size_of::<f32>();
    let chunk = (chunk_bytes / per_sequence.max(1)).clamp(1, b);
    let mut parts = Vec::with_capacity(b.div_ceil(chunk));
    for first in (0..b).step_by(chunk) {
        let c = chunk.min(b - first);
        let q = queries
            .narrow(0, first, c)?
            .to_dtype(DType::F32)?
            .contiguous()?
            .reshape((c * heads, g * w, d))?;
        let k = keys
            .narrow(0, first * heads, c * heads)?
            .to_dtype(DType::F32)?
            .contiguous()?
            .reshape((c * heads, n, d))?;
        let z = (matmul(&q, &k.t()?)? * scale as f64)?.reshape((c * heads, g, w, n))?;
        // Rows `[c·heads, groups, w, n]` to softmax: the group's maximum logit, its first head's, or all.
        let z = match agg {
            GqaAgg::MaxLogit => z.max_keepdim(1)?,
            GqaAgg::PerQueryHead => z.narrow(1, 0, 1)?,
            GqaAgg::SumProb | GqaAgg::MeanProb => z,
        };
        let probs = candle_nn::ops::softmax_last_dim(&z.broadcast_add(&mask)?.contiguous()?)?
            .narrow(3, 0, n_cand)?;
        let per_row = match reduce {
            QueryReduce::Sum => probs.sum(2)?,
            QueryReduce::Mean => (probs.sum(2)? / w as f64)?,
        }; // [c·heads, groups, n_cand]
        parts.push(match agg {
            GqaAgg::MeanProb => (per_row.sum(1)? / g as f64)?,
            _ => per_row.sum(1)?,
        });
    }
    let rows = crate::host_copy::rows::<f32>(&Tensor::cat(&parts, 0)?)?;
    Ok(Some(rows.chunks(heads).map(<[_]>::to_vec).collect()))
}

/// The redundancy score of every entry of each row of `keys`, `[rows, n, d]` (a sequence's heads, or
/// several sequences' heads one after another; post-RoPE, as cached); returns `[rows][n]`. Rows go
/// through in chunks whose `[rows, n, n]` cosine matrix stays within [`CHUNK_BYTES`]; past 8,192
/// entries, where one row's matrix would not, one row at a time and its matrix in tiles of its rows
/// (so that no temporary passes the bound, nor the 2³² elements candle's CUDA kernels count, which
/// one matrix does past 65,535 entries). The scores come back in one copy (one wait for the device).
pub fn redundancy(keys: &Tensor, threshold: f32) -> Result<Vec<Vec<f32>>> {
    redundancy_chunked(keys, threshold, CHUNK_BYTES)
}

/// [`redundancy`] with the chunks' bound given.
///
/// The cosine matrix `S` is the only `[rows, n, n]` tensor written (tile by tile where it is too
/// large), and it is read twice: once compared with the threshold (each row's partner: the largest
/// column above it, 0 when there is none), once for those partners' values. The column sums come from
/// the keys instead: `Σ_i S[i,j]` is `k̂_j·Σ_i k̂_i`, less the diagonal `k̂_j·k̂_j` the host version
/// never counts and the partners' values it zeroes (added back per column, tile by tile). Masking,
/// zeroing and summing the matrix itself made about a dozen passes over it, at a compression of a
/// thousand 1,152-entry caches about 9 TB of memory traffic by arithmetic, more than the product's.
fn redundancy_chunked(keys: &Tensor, threshold: f32, chunk_bytes: usize) -> Result<Vec<Vec<f32>>> {
    let (rows_total, n, _) = keys.dims3()?;
    let dev = keys.device();
    if n == 0 || rows_total == 0 {
        return Ok(vec![Vec::new(); rows_total]);
    }
    let index = Tensor::arange(0u32, n as u32, dev)?;
    // What an entry is compared with: the threshold, except on the diagonal, which the host version
    // holds at 0 (never computed): above a negative threshold, never above any other. For the rows
    // `first..first + r` of the matrix, `[r, n]`.
    let on_diagonal = if 0.0 > threshold {
        f32::NEG_INFINITY
    } else {
        f32::INFINITY
    };
    let bound = |first: usize, r: usize| -> Result<Tensor> {
        let rows = index
            .narrow(0, first, r)?
            .reshape((r, 1))?
            .broadcast_as((r, n))?;
        let cols = index.reshape((1, n))?.broadcast_as((r, n))?;
        let scalar = |x: f32| Tensor::new(&[[x]], dev)?.broadcast_as((r, n));
        rows.eq(&cols)?
            .where_cond(&scalar(on_diagonal)?, &scalar(threshold)?)
    };
    // Key rows per chunk and matrix rows per tile: whole matrices while one fits the bound, else one
    // key row at a time in tiles of matrix rows.
    let matrix_bytes = n * n * std::mem::size_of::<f32>();
    let (chunk, tile) = match matrix_bytes <= chunk_bytes {
        true => ((chunk_bytes / matrix_bytes).clamp(1, rows_total), n),
        false => (
            1,
            (chunk_bytes / (n * std::mem::size_of::<f32>())).clamp(1, n),
        ),
    };
    let whole = match tile == n {
        true => Some(bound(0, n)?),
        false => None,
    };
    let mut scores = Vec::with_capacity(rows_total.div_ceil(chunk));
    for first in (0..rows_total).step_by(chunk) {
        let c = chunk.min(rows_total - first);
        let k = keys
            .narrow(0, first, c)?
            .to_dtype(DType::F32)?
            .contiguous()?; // [c, n, d]
        let norm = (k.sqr()?.sum_keepdim(D::Minus1)?.sqrt()? + 1e-8)?;
        let unit = k.broadcast_div(&norm)?.contiguous()?;
        let unit_t = unit.transpose(1, 2)?.contiguous()?; // [c, d, n]
        let mut zeroed_per_col = Tensor::zeros((c, n), DType::F32, dev)?;
        for i0 in (0..n).step_by(tile) {
            let r = tile.min(n - i0);
            let bound = match &whole {
                Some(b) => b.clone(),
                None => bound(i0, r)?,
            };
            // The cosines of rows `i0..i0 + r`, `[c, r, n]`; each row's partner, `[c, r, 1]`: the
            // largest column above its bound, 0 when there is none.
            let s = matmul(&unit.narrow(1, i0, r)?, &unit_t)?;
            let shape = (c, r, n);
            let partner = s
                .broadcast_gt(&bound)?
                .where_cond(
                    &index.reshape((1, 1, n))?.broadcast_as(shape)?,
                    &Tensor::zeros((1, 1, 1), DType::U32, dev)?.broadcast_as(shape)?,
                )?
                .max_keepdim(D::Minus1)?;
            // The partners' values, zeroed (0 already) where a row's partner is its own diagonal.
            let own = index.narrow(0, i0, r)?.reshape((1, r, 1))?;
            let zeroed = partner.broadcast_eq(&own)?.where_cond(
                &Tensor::zeros((c, r, 1), DType::F32, dev)?,
                &s.gather(&partner, 2)?,
            )?;
            zeroed_per_col =
                zeroed_per_col.scatter_add(&partner.squeeze(2)?, &zeroed.squeeze(2)?, 1)?;
        }
        // Column sums of the cosines off the diagonal, less what was zeroed: the column means.
        let total = unit.sum_keepdim(1)?.transpose(1, 2)?.contiguous()?; // [c, d, 1]
        let sums = (matmul(&unit, &total)? - unit.sqr()?.sum_keepdim(D::Minus1)?)?.squeeze(2)?;
        let col = ((sums - zeroed_per_col)? / n as f64)?;
        scores.push(candle_nn::ops::softmax_last_dim(&col)?);
    }
    crate::host_copy::rows::<f32>(&Tensor::cat(&scores, 0)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::score;
    use crate::policy::tests::random;
    use candle_core::Device;

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol, "entry {i}: {x} against {y}");
        }
    }

    /// Every aggregation, softmax domain and reduction, with groups of two query heads and of one,
    /// gives the host's scores: one vector per KV head over the candidates.
    #[test]
    fn window_scores_are_the_host_s_under_every_variant() {
        use crate::policy::params::{GqaAgg, QueryReduce, SoftmaxDomain};
        let (heads, w, n, d) = (3, 4, 40, 16);
        for g in [1, 2] {
            let hq = heads * g;
            // Logits of a few units, so that the softmaxes are far from uniform.
            let q: Vec<f32> = random(hq * w * d, 11).iter().map(|x| 8.0 * x).collect();
            let k = random(heads * n * d, 12);
            let qt = Tensor::from_vec(q.clone(), (hq, w, d), &Device::Cpu).unwrap();
            let kt = Tensor::from_vec(k.clone(), (heads, n, d), &Device::Cpu).unwrap();
            for agg in [
                GqaAgg::MaxLogit,
                GqaAgg::SumProb,
                GqaAgg::MeanProb,
                GqaAgg::PerQueryHead,
            ] {
                for domain in [SoftmaxDomain::Candidates, SoftmaxDomain::AllCausal] {
                    for reduce in [QueryReduce::Mean, QueryReduce::Sum] {
                        let n_cand = n - w;
                        let got = window_scores(&qt, &kt, n_cand, agg, domain, reduce)
                            .unwrap()
                            .expect("every row sees a key");
                        for h in 0..heads {
                            let z = score::GroupLogits::compute(
                                &q[h * g * w * d..(h + 1) * g * w * d],
                                &k[h * n * d..(h + 1) * n * d],
                                g,
                                d,
                                1.0 / (d as f32).sqrt(),
                            );
                            let host = score::window_scores(&z, n_cand, agg, domain, reduce);
                            close(&got[h], &host[0], 1e-6);
                        }
                    }
                }
            }
        }
        // A window query that would see no key: left to the host.
        let qt = Tensor::zeros((1, 4, 2), DType::F32, &Device::Cpu).unwrap();
        let kt = Tensor::zeros((1, 2, 2), DType::F32, &Device::Cpu).unwrap();
        let none = window_scores(
            &qt,
            &kt,
            1,
            GqaAgg::SumProb,
            SoftmaxDomain::AllCausal,
            QueryReduce::Mean,
        )
        .unwrap();
        assert!(none.is_none());
    }

    #[test]
    fn the_spec_example_scores_as_on_the_host() {
        // Spec §8.2's keys, at both thresholds of the host test.
        let r = 0.5f32.sqrt();
        let keys = vec![
            1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, r, r, 0.0,
        ];
        let t = Tensor::from_vec(keys.clone(), (1, 5, 3), &Device::Cpu).unwrap();
        for threshold in [0.5, 0.8] {
            let got = redundancy(&t, threshold).unwrap();
            close(&got[0], &score::redundancy(&keys, 3, threshold), 1e-6);
        }
        close(
            &redundancy(&t, 0.5).unwrap()[0],
            &[0.2434, 0.1993, 0.2113, 0.1730, 0.1730],
            1e-4,
        );
    }

    #[test]
    fn random_keys_with_near_duplicates_score_as_on_the_host() {
        // Two heads of 96 keys of 32 values; every fourth key a near copy of an earlier one, so rows
        // have partners above the threshold, some of them the most recent of several.
        // Five heads, so that chunks of two rows leave one over.
        let (heads, n, d) = (5, 96, 32);
        let noise = random(heads * n * d, 7);
        let mut keys = vec![0f32; heads * n * d];
        for h in 0..heads {
            for i in 0..n {
                for j in 0..d {
                    let at = (h * n + i) * d + j;
                    keys[at] = if i % 4 == 3 {
                        keys[(h * n + i / 2) * d + j] + 0.05 * noise[at]
                    } else {
                        noise[at]
                    };
                }
            }
        }
        let t = Tensor::from_vec(keys.clone(), (heads, n, d), &Device::Cpu).unwrap();
        for (threshold, chunk) in [
            (0.3, CHUNK_BYTES),
            (0.9, CHUNK_BYTES),
            (0.3, 2 * n * n * 4),
            (0.9, n * n * 4),
            // One row's matrix in tiles: of seven rows (the last of five), of one row.
            (0.3, 7 * n * 4),
            (0.9, 1),
            // Every row's partner its own (zero) diagonal or the last column below it; none at all.
            (-0.2, CHUNK_BYTES),
            (-0.2, 7 * n * 4),
            (1.5, 2 * n * n * 4),
            (1.5, 7 * n * 4),
        ] {
            let got = redundancy_chunked(&t, threshold, chunk).unwrap();
            assert_eq!(got.len(), heads);
            for h in 0..heads {
                let host = score::redundancy(&keys[h * n * d..(h + 1) * n * d], d, threshold);
                close(&got[h], &host, 1e-6);
                // The scores must tell entries apart, or the comparison proves little.
                let spread = host.iter().fold(0f32, |m, &x| m.max(x))
                    - host.iter().fold(1f32, |m, &x| m.min(x));
                assert!(spread > 1e-4, "head {h}: scores too flat ({spread})");
            }
        }
    }

    /// Several sequences' windows scored at once, in one chunk or one sequence per chunk, give each
    /// sequence the scores it gets alone.
    #[test]
    fn a_batch_of_windows_scores_as_each_sequence_alone() {
        use crate::policy::params::{GqaAgg, QueryReduce, SoftmaxDomain};
        let (b, heads, g, w, n, d) = (3, 2, 3, 4, 30, 8);
        let q: Vec<f32> = random(b * heads * g * w * d, 21)
            .iter()
            .map(|x| 6.0 * x)
            .collect();
        let k = random(b * heads * n * d, 22);
        let qt = Tensor::from_vec(q, (b, heads * g, w, d), &Device::Cpu).unwrap();
        let kt = Tensor::from_vec(k, (b * heads, n, d), &Device::Cpu).unwrap();
        for agg in [GqaAgg::MaxLogit, GqaAgg::SumProb, GqaAgg::MeanProb] {
            for domain in [SoftmaxDomain::Candidates, SoftmaxDomain::AllCausal] {
                for chunk in [CHUNK_BYTES, 1] {
                    let reduce = QueryReduce::Mean;
                    let all = window_scores_batch(&qt, &kt, n - w, agg, domain, reduce, chunk)
                        .unwrap()
                        .expect("every row sees a key");
                    assert_eq!(all.len(), b);
                    for (i, got) in all.iter().enumerate() {
                        let qi = qt.get(i).unwrap();
                        let ki = kt.narrow(0, i * heads, heads).unwrap();
                        let alone = window_scores(&qi, &ki, n - w, agg, domain, reduce)
                            .unwrap()
                            .unwrap();
                        assert_eq!(got.len(), heads);
                        for h in 0..heads {
                            close(&got[h], &alone[h], 1e-6);
                        }
                    }
                }
            }
        }
    }
}
