//! Scoring primitives shared by the policies, on plain f32 slices (spec §0.3).
//!
//! The observation-window attention score is where implementations differ silently (GQA aggregation,
//! softmax domain, query reduction, pooling), so each variant is an explicit argument here and the
//! policies pass what their reference does. Top-k is deterministic: score descending, index ascending
//! on ties, NaN last.

use super::params::{GqaAgg, Pool, PoolKind, QueryReduce, SoftmaxDomain};

/// Logits `z[r][i][j]` of the `w` window queries of the `g` query heads of one KV head over that
/// head's `n` keys (the last `w` keys are the window's own).
pub struct GroupLogits {
    pub z: Vec<f32>,
    pub g: usize,
    pub w: usize,
    pub n: usize,
}

impl GroupLogits {
    /// `queries`: `[g][w][d]`; `keys`: `[n][d]`.
    pub fn compute(queries: &[f32], keys: &[f32], g: usize, d: usize, scale: f32) -> Self {
        let w = queries.len() / (g * d);
        let n = keys.len() / d;
        let mut z = Vec::with_capacity(g * w * n);
        for q in queries.chunks_exact(d) {
            z.extend(keys.chunks_exact(d).map(|k| dot(q, k) * scale));
        }
        Self { z, g, w, n }
    }

    fn row(&self, r: usize, i: usize) -> &[f32] {
        &self.z[(r * self.w + i) * self.n..(r * self.w + i + 1) * self.n]
    }
}

/// Dot product with eight independent accumulators (vectorises under AVX2).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::dispatch::has_avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above).
        return unsafe { dot_avx2(a, b) };
    }
    dot_body(a, b)
}

/// [`dot`] compiled for AVX2: its eight sums in one register (the same operations, so the same bits).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_body(a, b)
}

/// [`dot`]'s operations, inlined into a caller compiled for the instructions it runs on (decoding
/// attention: the same operations, so the same bits as [`dot`] on every path).
#[inline(always)]
pub(crate) fn dot_body(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    lanes_and_tail(&acc, ta, tb)
}

/// The end of a dot product: its eight lane sums added in order, plus the products of the values
/// past the last whole chunk of eight (`ta`, `tb`). One function for [`dot_body`] and [`dots_avx`],
/// so that both add in the same order.
#[inline(always)]
fn lanes_and_tail(acc: &[f32; 8], ta: &[f32], tb: &[f32]) -> f32 {
    let tail: f32 = ta.iter().zip(tb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// A key as [`dots_avx`] reads it, eight values a load: f32 rows as they are, 16-bit rows (`&[f16]`,
/// `&[bf16]`) converted in registers as they are loaded, so that a cache's key is never written out
/// as an f32 row first (the same values: both conversions are exact).
#[cfg(target_arch = "x86_64")]
pub(crate) trait KeyChunks: Copy {
    /// Values in the key.
    fn len(self) -> usize;
    /// Values `c..c + 8` as f32 lanes.
    ///
    /// # Safety
    /// `c + 8 <= self.len()`; the CPU must support AVX2, FMA and F16C, and the caller be compiled for
    /// them.
    unsafe fn eight(self, c: usize) -> std::arch::x86_64::__m256;
    /// Value `i` as f32.
    fn at(self, i: usize) -> f32;
}

#[cfg(target_arch = "x86_64")]
impl KeyChunks for &[f32] {
    #[inline(always)]
    fn len(self) -> usize {
        <[f32]>::len(self)
    }

    #[inline(always)]
    unsafe fn eight(self, c: usize) -> std::arch::x86_64::__m256 {
        debug_assert!(c + 8 <= self.len());
        // SAFETY: the caller's.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(self.as_ptr().add(c)) }
    }

    #[inline(always)]
    fn at(self, i: usize) -> f32 {
        self[i]
    }
}

#[cfg(target_arch = "x86_64")]
impl<T: crate::cache::rows::Half> KeyChunks for &[T] {
    #[inline(always)]
    fn len(self) -> usize {
        <[T]>::len(self)
    }

    #[inline(always)]
    unsafe fn eight(self, c: usize) -> std::arch::x86_64::__m256 {
        debug_assert!(c + 8 <= self.len());
        // SAFETY: the caller's.
        unsafe { T::eight(self.as_ptr().add(c)) }
    }

    #[inline(always)]
    fn at(self, i: usize) -> f32 {
        self[i].value()
    }
}

/// The dot products of `G` query rows (`queries`: `G` rows of `key.len()` values, one after the
/// other) with one key, each by [`dot_body`]'s operations in its order (eight lane sums over the
/// key's whole chunks of eight in turn, then added lane by lane, then the products past them): the
/// same bits. The chunks are the outer loop, each loaded into a register once for all `G` rows:
/// decoding attention scores a GQA group's query heads against each key, and loading the key again
/// for every row made loads, not arithmetic, the bound (`benches/attention.rs`). A 16-bit key is
/// converted chunk by chunk as it is loaded ([`KeyChunks`]).
///
/// Always inlined, and only into code compiled for AVX2 or more (decoding attention's AVX2 and
/// AVX-512 loops), so that its intrinsics compile to instructions in the caller's loop: a function of
/// its own, called per key and group, cost a call and a return through memory each.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C, and the caller be compiled for them.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn dots_avx<const G: usize, K: KeyChunks>(queries: &[f32], key: K) -> [f32; G] {
    use std::arch::x86_64::{_mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps};
    use std::arch::x86_64::{_mm256_setzero_ps, _mm256_storeu_ps};
    let d = key.len();
    let whole = d - d % 8;
    assert!(queries.len() >= G * d, "{G} query rows of {d}");
    let mut acc = [_mm256_setzero_ps(); G];
    for c in (0..whole).step_by(8) {
        // SAFETY: c + 8 <= d, and g·d + c + 8 <= G·d <= queries.len() (asserted above).
        let kc = unsafe { key.eight(c) };
        for (g, a) in acc.iter_mut().enumerate() {
            // SAFETY: as above.
            let qc = unsafe { _mm256_loadu_ps(queries.as_ptr().add(g * d + c)) };
            *a = _mm256_add_ps(*a, _mm256_mul_ps(qc, kc));
        }
    }
    // The values past the last whole chunk (none when `d` is a multiple of eight), as f32.
    let mut tail = [0f32; 8];
    for (t, i) in tail.iter_mut().zip(whole..d) {
        *t = key.at(i);
    }
    let tail = &tail[..d - whole];
    let mut out = [0f32; G];
    for (g, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
        let mut lanes = [0f32; 8];
        // SAFETY: eight lanes into eight f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *a) };
        *o = lanes_and_tail(&lanes, &queries[g * d + whole..(g + 1) * d], tail);
    }
    out
}

/// Softmax of `x` in place (an empty slice stays empty).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Softmax of one query row restricted to the domain, returning the probabilities of the first
/// `n_cand` keys. Window query `i` sits at key index `n - w + i`.
fn row_probs(row: &[f32], i: usize, w: usize, n_cand: usize, domain: SoftmaxDomain) -> Vec<f32> {
    let n = row.len();
    let visible = match domain {
        SoftmaxDomain::Candidates => n_cand,
        SoftmaxDomain::AllCausal => (n + i + 1).saturating_sub(w).min(n),
    };
    let mut p = row[..visible].to_vec();
    softmax(&mut p);
    p.resize(n_cand.max(visible), 0.0);
    p.truncate(n_cand);
    p
}

/// The window attention score of every candidate (the first `n_cand` keys), one vector per KV head,
/// or one per query head under [`GqaAgg::PerQueryHead`].
pub fn window_scores(
    z: &GroupLogits,
    n_cand: usize,
    agg: GqaAgg,
    domain: SoftmaxDomain,
    reduce: QueryReduce,
) -> Vec<Vec<f32>> {
    let reduce_rows = |rows: Vec<Vec<f32>>| -> Vec<f32> {
        let mut acc = vec![0f32; n_cand];
        let count = rows.len().max(1) as f32;
        for row in rows {
            acc.iter_mut().zip(row).for_each(|(a, p)| *a += p);
        }
        if reduce == QueryReduce::Mean {
            acc.iter_mut().for_each(|a| *a /= count);
        }
        acc
    };
    let head_probs = |r: usize| -> Vec<Vec<f32>> {
        (0..z.w)
            .map(|i| row_probs(z.row(r, i), i, z.w, n_cand, domain))
            .collect()
    };
    match agg {
        GqaAgg::MaxLogit => {
            let rows = (0..z.w)
                .map(|i| {
                    let mut m = z.row(0, i).to_vec();
                    for r in 1..z.g {
                        m.iter_mut()
                            .zip(z.row(r, i))
                            .for_each(|(a, &b)| *a = a.max(b));
                    }
                    row_probs(&m, i, z.w, n_cand, domain)
                })
                .collect();
            vec![reduce_rows(rows)]
        }
        GqaAgg::SumProb | GqaAgg::MeanProb => {
            let mut acc = vec![0f32; n_cand];
            for r in 0..z.g {
                acc.iter_mut()
                    .zip(reduce_rows(head_probs(r)))
                    .for_each(|(a, p)| *a += p);
            }
            if agg == GqaAgg::MeanProb {
                acc.iter_mut().for_each(|a| *a /= z.g as f32);
            }
            vec![acc]
        }
        GqaAgg::PerQueryHead => (0..z.g).map(|r| reduce_rows(head_probs(r))).collect(),
    }
}

/// 1-D pooling along the cache axis, stride 1, padding `kernel / 2` (spec §0.3.6).
pub fn pool(scores: &[f32], pool: Pool) -> Vec<f32> {
    let n = scores.len() as isize;
    let half = (pool.kernel / 2) as isize;
    (0..n)
        .map(|j| {
            let window = (j - half).max(0)..(j + half + 1).min(n);
            let vals = scores[window.start as usize..window.end as usize].iter();
            match pool.kind {
                PoolKind::None => scores[j as usize],
                PoolKind::Max => vals.copied().fold(f32::NEG_INFINITY, f32::max),
                // Zero padding is counted: always divide by the kernel width.
                PoolKind::Avg => vals.sum::<f32>() / pool.kernel as f32,
            }
        })
        .collect()
}

/// Indices of the `k` highest scores, by score descending then index ascending (NaN ranks last).
pub fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    let key = |i: usize| {
        let s = scores[i];
        if s.is_nan() {
            f32::NEG_INFINITY
        } else {
            s
        }
    };
    let cmp = |a: &usize, b: &usize| key(*b).total_cmp(&key(*a)).then(a.cmp(b));
    let k = k.min(idx.len());
    if k < idx.len() && k > 0 {
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
    } else {
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    idx
}

/// R-KV's redundancy score of every entry (spec §1(b)5): softmax over all `n` entries of the column
/// means of the key cosine matrix, with the diagonal and each row's most recent similar partner
/// (largest index with cosine above `threshold`, or column 0 when there is none) zeroed.
/// `keys`: `[n][d]`, post-RoPE as cached.
pub fn redundancy(keys: &[f32], d: usize, threshold: f32) -> Vec<f32> {
    let n = keys.len() / d;
    let unit: Vec<f32> = keys
        .chunks_exact(d)
        .flat_map(|k| {
            let norm = dot(k, k).sqrt() + 1e-8;
            k.iter().map(move |x| x / norm)
        })
        .collect();
    // The cosine matrix is symmetric: compute the upper triangle once.
    let mut s = vec![0f32; n * n];
    for i in 0..n {
        let ui = &unit[i * d..(i + 1) * d];
        for j in i + 1..n {
            let c = dot(ui, &unit[j * d..(j + 1) * d]);
            s[i * n + j] = c;
            s[j * n + i] = c;
        }
    }
    let mut col = vec![0f32; n];
    for i in 0..n {
        let row = &mut s[i * n..(i + 1) * n];
        let partner = (0..n).rev().find(|&j| row[j] > threshold).unwrap_or(0);
        row[partner] = 0.0;
        col.iter_mut().zip(row.iter()).for_each(|(c, &x)| *c += x);
    }
    col.iter_mut().for_each(|c| *c /= n as f32);
    softmax(&mut col);
    col
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
        }
    }

    /// Scoring up to eight query rows against a key at once gives each row [`dot_body`]'s bits, over
    /// lengths with and without a tail past the last eight values and values with signed zeros,
    /// infinities, NaN, subnormals and sums that overflow.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn grouped_dots_are_dot_body_bit_for_bit() {
        use rand::{Rng, SeedableRng};
        if !crate::kernels::dispatch::has_avx2() {
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let special = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
            -3e38,
            3e38,
        ];
        let value = |rng: &mut rand_chacha::ChaCha8Rng| match rng.random_range(0..10) {
            0 => special[rng.random_range(0..special.len())],
            _ => rng.random_range(-4.0f32..4.0),
        };
        #[target_feature(enable = "avx2,fma,f16c")]
        fn grouped<const G: usize, K: KeyChunks>(q: &[f32], k: K) -> [f32; G] {
            // SAFETY: compiled for AVX2, called only where the CPU has it.
            unsafe { dots_avx::<G, K>(q, k) }
        }
        fn check<const G: usize, K: KeyChunks>(q: &[f32], k: K, as_f32: &[f32]) {
            // SAFETY: the CPU has AVX2 (checked above).
            let got = unsafe { grouped::<G, K>(q, k) };
            let d = as_f32.len();
            for (g, x) in got.iter().enumerate() {
                let want = dot_body(&q[g * d..(g + 1) * d], as_f32);
                assert!(
                    x.to_bits() == want.to_bits() || (x.is_nan() && want.is_nan()),
                    "G {G}, row {g}, d {d}: {x} against {want}"
                );
            }
        }
        fn each_group<K: KeyChunks>(q: &[f32], k: K, as_f32: &[f32]) {
            check::<1, K>(q, k, as_f32);
            check::<2, K>(q, k, as_f32);
            check::<3, K>(q, k, as_f32);
            check::<4, K>(q, k, as_f32);
            check::<5, K>(q, k, as_f32);
            check::<6, K>(q, k, as_f32);
            check::<7, K>(q, k, as_f32);
            check::<8, K>(q, k, as_f32);
        }
        for round in 0..300 {
            let d = [1, 7, 8, 9, 20, 64, 67, 128][round % 8];
            let q: Vec<f32> = (0..8 * d).map(|_| value(&mut rng)).collect();
            let k: Vec<f32> = (0..d).map(|_| value(&mut rng)).collect();
            each_group(&q, k.as_slice(), &k);
            // A 16-bit key converted as it is loaded: the bits of its f32 row's products.
            let h: Vec<half::f16> = k.iter().map(|&x| half::f16::from_f32(x)).collect();
            let hk: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
            each_group(&q, h.as_slice(), &hk);
            let b: Vec<half::bf16> = k.iter().map(|&x| half::bf16::from_f32(x)).collect();
            let bk: Vec<f32> = b.iter().map(|x| x.to_f32()).collect();
            each_group(&q, b.as_slice(), &bk);
        }
    }

    /// Spec §8.1: GQA aggregation and softmax domain of the window score.
    #[test]
    fn gqa_aggregation_and_softmax_domain() {
        // g = 2 heads, one window query, three candidates + one window key; logits fed directly.
        let z = GroupLogits {
            z: vec![4.0, 0.0, 0.0, 5.0, 0.0, 3.0, 3.0, 0.0],
            g: 2,
            w: 1,
            n: 4,
        };
        let rkv = window_scores(
            &z,
            3,
            GqaAgg::MaxLogit,
            SoftmaxDomain::Candidates,
            QueryReduce::Mean,
        );
        close(&rkv[0], &[0.576, 0.212, 0.212], 1e-3);
        assert!((rkv[0].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(top_k(&rkv[0], 1), vec![0]);

        let rocket = window_scores(
            &z,
            3,
            GqaAgg::SumProb,
            SoftmaxDomain::AllCausal,
            QueryReduce::Sum,
        );
        close(&rocket[0], &[0.290, 0.481, 0.481], 1e-3);
        assert_eq!(top_k(&rocket[0], 1), vec![1], "tie goes to the lower index");
        let mass: f32 = rocket[0].iter().sum();
        assert!(mass <= (z.w * z.g) as f32);

        // Without the window key, SumProb agrees with MaxLogit on the winner.
        let no_window = GroupLogits {
            z: vec![4.0, 0.0, 0.0, 0.0, 3.0, 3.0],
            g: 2,
            w: 1,
            n: 3,
        };
        let s = window_scores(
            &no_window,
            3,
            GqaAgg::SumProb,
            SoftmaxDomain::Candidates,
            QueryReduce::Sum,
        );
        close(&s[0], &[0.989, 0.506, 0.506], 1e-3);
        assert_eq!(top_k(&s[0], 1), vec![0]);

        let per_head = window_scores(
            &z,
            3,
            GqaAgg::PerQueryHead,
            SoftmaxDomain::AllCausal,
            QueryReduce::Sum,
        );
        close(&per_head[0], &[0.266, 0.0049, 0.0049], 1e-3);
        close(&per_head[1], &[0.0237, 0.476, 0.476], 1e-3);
        assert_eq!(top_k(&per_head[0], 1), vec![0]);
        assert_eq!(top_k(&per_head[1], 1), vec![1]);
    }

    /// Spec §8.2: R-KV's redundancy term.
    #[test]
    fn rkv_redundancy() {
        let r = 0.5f32.sqrt();
        let keys = [
            1.0, 0.0, 0.0, // idx0 e1
            0.0, 1.0, 0.0, // idx1 e2
            1.0, 0.0, 0.0, // idx2 e1 again
            0.0, 0.0, 1.0, // idx3 e3
            r, r, 0.0, // idx4 (e1+e2)/√2, the window
        ];
        let got = redundancy(&keys, 3, 0.5);
        close(&got, &[0.2434, 0.1993, 0.2113, 0.1730, 0.1730], 1e-4);

        // With T = 0.8 the column means are [0, 0.1414, 0.1414, 0, 0.4243].
        let c = [0.0f32, 0.1414, 0.1414, 0.0, 0.4243];
        let mut want = c.to_vec();
        softmax(&mut want);
        close(&redundancy(&keys, 3, 0.8), &want, 1e-4);
    }

    #[test]
    fn pooling_edges() {
        let s = [1.0, 0.0, 0.0, 0.0, 2.0];
        assert_eq!(pool(&s, Pool::max(3)), vec![1.0, 1.0, 0.0, 2.0, 2.0]);
        let avg = pool(&s, "avg:3".parse().unwrap());
        close(
            &avg,
            &[1.0 / 3.0, 1.0 / 3.0, 0.0, 2.0 / 3.0, 2.0 / 3.0],
            1e-6,
        );
        assert_eq!(pool(&s, Pool::NONE), s.to_vec());
    }

    #[test]
    fn top_k_is_deterministic() {
        let s = [0.5, 0.9, 0.5, f32::NAN, 0.9, 0.1];
        assert_eq!(top_k(&s, 3), vec![1, 4, 0]);
        assert_eq!(top_k(&s, 6), vec![1, 4, 0, 2, 5, 3]);
        assert_eq!(top_k(&s, 0), Vec::<usize>::new());
        assert_eq!(top_k(&s, 10).len(), 6);
    }
}
