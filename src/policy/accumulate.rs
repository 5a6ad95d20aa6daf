//! The eviction an accumulating policy (H2O) makes, chosen where its scores live.
//!
//! Why it exists: a decoding batch on a device keeps H2O's accumulated attention in the cache
//! ([`crate::cache::LayerCache::has_scores`]) and needs, per sequence, layer and head, the one entry
//! the step evicts, with the host rule's exact ties ([`super::score::top_k`] keeping all but one:
//! the least score goes, the newest among equal ones, NaN below everything), so that only indices
//! come back to the host. Two reductions give it: the least score, then the largest index holding it.

use candle_core::{DType, Result, Tensor};

/// Per row of `scores` (`[rows, n]`, f32), the entry [`super::Accumulation`]'s rule evicts among the
/// first `old[r]` (`old`: `[rows, 1]`, u32): the least score, NaN counted below every number, the
/// largest index among equal scores. A row whose `old` is 0 gives 0 (it evicts nothing). `col` is
/// `0..n`, `[1, n]` u32 (kept by the caller: each is a copy to the device). `[rows]`, u32.
///
/// Scores are sums of probabilities (never −0.0, which `top_k`'s total order puts below +0.0 and
/// this comparison does not); an infinite score is compared as the host compares it.
pub fn least_scored(scores: &Tensor, old: &Tensor, col: &Tensor) -> Result<Tensor> {
    let (rows, n) = scores.dims2()?;
    let dev = scores.device();
    let shape = (rows, n);
    let col = col.broadcast_as(shape)?;
    let fill = |x: f32| Tensor::new(x, dev)?.broadcast_as(shape);
    let inside = col.broadcast_lt(old)?;
    // NaN is the only value not equal to itself: it becomes −∞, as `top_k` orders it.
    let scores = scores.to_dtype(DType::F32)?;
    let numbers = scores
        .eq(&scores)?
        .where_cond(&scores, &fill(f32::NEG_INFINITY)?)?;
    let candidates = inside.where_cond(&numbers, &fill(f32::INFINITY)?)?;
    let least = candidates.min_keepdim(1)?;
    let at_least = candidates.broadcast_eq(&least)?;
    let no = Tensor::zeros(shape, DType::U8, dev)?;
    let chosen = inside.where_cond(&at_least, &no)?;
    let none = Tensor::zeros(shape, DType::U32, dev)?;
    chosen.where_cond(&col, &none)?.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// What the host keeps, read as the one entry it leaves out of the first `old`.
    fn host_choice(row: &[f32], old: usize) -> u32 {
        let kept = crate::policy::score::top_k(&row[..old], old - 1);
        (0..old).find(|j| !kept.contains(j)).unwrap() as u32
    }

    #[test]
    fn the_device_evicts_what_the_host_rule_leaves_out() {
        let nan = f32::NAN;
        let inf = f32::INFINITY;
        // Ties (the newest goes), NaN (below all; the newest NaN goes), a tie past `old` that must
        // not count, an infinite score, a single candidate, the least at index 0.
        let rows: Vec<(Vec<f32>, usize)> = vec![
            (vec![0.5, 0.1, 0.3, 0.1, 0.9], 5),
            (vec![0.5, 0.1, 0.3, 0.1, 0.0], 4),
            (vec![0.5, nan, 0.3, nan, 0.0], 4),
            (vec![inf, 0.2, inf, 0.7, 0.1], 4),
            (vec![0.0, 0.2, 0.4, 0.6, 0.8], 5),
            (vec![0.3, 0.2, 0.1, 0.0, 0.0], 1),
            (vec![inf, inf, inf, 0.0, 0.0], 3),
            (vec![-inf, nan, 1.0, 0.0, 0.0], 3),
        ];
        let n = rows[0].0.len();
        let flat: Vec<f32> = rows.iter().flat_map(|(r, _)| r.clone()).collect();
        let olds: Vec<u32> = rows.iter().map(|&(_, o)| o as u32).collect();
        let dev = Device::Cpu;
        let scores = Tensor::from_vec(flat, (rows.len(), n), &dev).unwrap();
        let old = Tensor::from_vec(olds, (rows.len(), 1), &dev).unwrap();
        let col = Tensor::arange(0u32, n as u32, &dev)
            .unwrap()
            .reshape((1, n))
            .unwrap();
        let got = least_scored(&scores, &old, &col).unwrap();
        let got = got.to_vec1::<u32>().unwrap();
        let want: Vec<u32> = rows.iter().map(|(r, o)| host_choice(r, *o)).collect();
        assert_eq!(got, want);
        assert_eq!(want, [3, 3, 3, 1, 0, 0, 2, 1]);
        // Nothing to evict: 0.
        let none = Tensor::zeros((2, 1), DType::U32, &dev).unwrap();
        let got = least_scored(&scores.narrow(0, 0, 2).unwrap(), &none, &col).unwrap();
        assert_eq!(got.to_vec1::<u32>().unwrap(), [0, 0]);
    }
}
