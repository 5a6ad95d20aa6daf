//! A weight-stationary Q8_0 matrix product for decoding: `y = x Wᵀ` with `x` of a few rows (1–32
//! sequences of a batch) and `W` quantized to 8 bits in blocks of 32 with one f32 scale per block.
//!
//! Why it exists: candle's Q8_0 product handles each activation row on its own and spends most of a
//! batched decode step in its thread pool's barrier (measured with `perf`: 38% in `BarrierGuard::drop`,
//! 25% in `vec_dot`), so batch 8 was barely faster than batch 1. Here each 32-byte weight block is loaded
//! once and multiplied with the matching block of every activation row while it sits in registers.
//! Activations are quantized per row and block to i8 as llama.cpp does (`d = max|x| / 127`).
//!
//! The AVX2 path is chosen at run time; the portable path computes the same integer dot products and
//! is what the AVX2 path is tested against. Only CPU tensors use this; other devices keep candle's ops.

use rayon::prelude::*;

/// Elements per quantization block.
pub const BLOCK: usize = 32;

/// A `[n, k]` matrix in Q8_0: per block of 32 weights, one f32 scale and 32 signed bytes.
#[derive(Debug, Clone)]
pub struct Q8Matrix {
    n: usize,
    k: usize,
    /// `scales[j * kb + b]`: the scale of block `b` of row `j`.
    scales: Vec<f32>,
    /// `quants[j * k + i]`: the quantized weight.
    quants: Vec<i8>,
}

/// Quantizes `x` (`rows × k`, row-major) block-wise into scales and bytes.
pub(crate) fn quantize_blocks(x: &[f32], k: usize, scales: &mut Vec<f32>, quants: &mut Vec<i8>) {
    scales.clear();
    quants.clear();
    for block in x.chunks_exact(BLOCK) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        scales.push(d);
        quants.extend(block.iter().map(|v| (v * id).round() as i8));
    }
    debug_assert_eq!(quants.len() % k, 0);
}

impl Q8Matrix {
    /// Quantizes a row-major `[n, k]` f32 matrix; `k` must be a multiple of 32.
    pub fn quantize(w: &[f32], n: usize, k: usize) -> Self {
        assert!(
            k.is_multiple_of(BLOCK) && w.len() == n * k,
            "Q8Matrix::quantize: bad shape"
        );
        let (mut scales, mut quants) = (Vec::new(), Vec::new());
        quantize_blocks(w, k, &mut scales, &mut quants);
        Self {
            n,
            k,
            scales,
            quants,
        }
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn bytes(&self) -> usize {
        self.scales.len() * 4 + self.quants.len()
    }

    /// `x`: `m × k` row-major; returns `m × n` row-major.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        assert_eq!(x.len(), m * self.k, "Q8Matrix::matmul: bad input length");
        let (mut xs, mut xq) = (Vec::new(), Vec::new());
        quantize_blocks(x, self.k, &mut xs, &mut xq);
        let kb = self.k / BLOCK;
        let avx2 = has_avx2();
        column_parallel(self.n, m, |j, r, rows, acc| {
            let wq = &self.quants[j * self.k..(j + 1) * self.k];
            let ws = &self.scales[j * kb..(j + 1) * kb];
            let (xq, xs) = (&xq[r * self.k..], &xs[r * kb..]);
            if avx2 {
                // SAFETY: AVX2 was detected at run time; slices are in bounds by construction.
                unsafe { avx2::dot_rows(wq, ws, xq, xs, self.k, rows, acc) };
            } else {
                portable_dot_rows(wq, ws, xq, xs, self.k, rows, acc);
            }
        })
    }
}

/// Runs `y = x Wᵀ` for an `n`-row weight and `m` activation rows: output columns are split into
/// parallel tasks, and `dot(j, r, rows, acc)` fills `acc[..rows]` with the products of weight row `j`
/// and activation rows `r..r + rows` (at most 4), so each weight row is read once per 4 activation rows.
/// Returns `m × n` row-major. Shared by the Q8_0 and Q4_1 kernels.
pub(crate) fn column_parallel(
    n: usize,
    m: usize,
    dot: impl Fn(usize, usize, usize, &mut [f32; 4]) + Sync,
) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    const COLS: usize = 64;
    let out_ptr = SendPtr(out.as_mut_ptr());
    (0..n.div_ceil(COLS)).into_par_iter().for_each(|task| {
        let out_ptr = &out_ptr;
        for j in task * COLS..((task + 1) * COLS).min(n) {
            let mut r = 0;
            while r < m {
                let rows = (m - r).min(4);
                let mut acc = [0f32; 4];
                dot(j, r, rows, &mut acc);
                for (i, a) in acc.iter().take(rows).enumerate() {
                    // SAFETY: (r + i, j) is inside `out`, and column j belongs to this task only.
                    unsafe { *out_ptr.0.add((r + i) * n + j) = *a };
                }
                r += rows;
            }
        }
    });
    out
}

struct SendPtr(*mut f32);
// SAFETY: tasks write disjoint columns of the output through this pointer.
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

/// Whether the fast (AVX2) path runs on this CPU; without it candle's kernels are used instead.
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX2.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Dot products of one weight row with up to 4 activation rows (`rows`), portable.
fn portable_dot_rows(
    wq: &[i8],
    ws: &[f32],
    xq: &[i8],
    xs: &[f32],
    k: usize,
    rows: usize,
    acc: &mut [f32; 4],
) {
    let kb = k / BLOCK;
    for (i, a) in acc.iter_mut().take(rows).enumerate() {
        let mut total = 0f32;
        for b in 0..kb {
            let w = &wq[b * BLOCK..(b + 1) * BLOCK];
            let x = &xq[i * k + b * BLOCK..i * k + (b + 1) * BLOCK];
            let dot: i32 = w.iter().zip(x).map(|(&a, &b)| a as i32 * b as i32).sum();
            total += ws[b] * xs[i * kb + b] * dot as f32;
        }
        *a = total;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::BLOCK;
    use std::arch::x86_64::*;

    /// The contribution of one weight block (`w`, with `aw = |w|` and scale `dw`) times the matching
    /// activation block (32 bytes at `x`, scale `dx`) to an accumulator.
    #[inline(always)]
    unsafe fn block_dot(
        w: __m256i,
        aw: __m256i,
        dw: f32,
        x: *const i8,
        dx: f32,
        sum: __m256,
    ) -> __m256 {
        let x = _mm256_loadu_si256(x as *const __m256i);
        // each x takes w's sign, so maddubs(|w|, ±x) = w·x pairwise
        let pairs = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
        let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(quads), _mm256_set1_ps(dw * dx), sum)
    }

    /// AVX2 version of [`super::portable_dot_rows`]. Rows go through in pairs, each weight block loaded
    /// once per pair; every row is summed in the same order whatever its batch, so a sequence decodes
    /// to the same bits alone or batched.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `xq`/`xs` must hold `rows` rows of `k` values / `k/32` scales.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_rows(
        wq: &[i8],
        ws: &[f32],
        xq: &[i8],
        xs: &[f32],
        k: usize,
        rows: usize,
        acc: &mut [f32; 4],
    ) {
        let kb = k / BLOCK;
        let mut first = 0;
        while first < rows {
            let pair = (rows - first).min(2);
            let mut out = [0f32; 2];
            dot_rows_split(
                wq,
                ws,
                &xq[first * k..],
                &xs[first * kb..],
                k,
                pair,
                &mut out,
            );
            acc[first..first + pair].copy_from_slice(&out[..pair]);
            first += pair;
        }
    }

    /// The sum of a vector's eight lanes.
    #[inline(always)]
    pub(crate) unsafe fn hsum(s: __m256) -> f32 {
        let v = _mm_add_ps(_mm256_extractf128_ps(s, 1), _mm256_castps256_ps128(s));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)))
    }

    /// One or two rows: even and odd blocks feed separate accumulators so consecutive FMAs do not wait
    /// on each other.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_rows_split(
        wq: &[i8],
        ws: &[f32],
        xq: &[i8],
        xs: &[f32],
        k: usize,
        rows: usize,
        acc: &mut [f32; 2],
    ) {
        let kb = k / BLOCK;
        let mut even = [_mm256_setzero_ps(); 2];
        let mut odd = [_mm256_setzero_ps(); 2];
        let mut b = 0;
        while b + 1 < kb {
            let w0 = _mm256_loadu_si256(wq.as_ptr().add(b * BLOCK) as *const __m256i);
            let w1 = _mm256_loadu_si256(wq.as_ptr().add((b + 1) * BLOCK) as *const __m256i);
            let (a0, a1) = (_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(w1, w1));
            let (d0, d1) = (*ws.get_unchecked(b), *ws.get_unchecked(b + 1));
            for (i, (e, o)) in even.iter_mut().zip(odd.iter_mut()).enumerate().take(rows) {
                let x = xq.as_ptr().add(i * k + b * BLOCK);
                *e = block_dot(w0, a0, d0, x, *xs.get_unchecked(i * kb + b), *e);
                *o = block_dot(
                    w1,
                    a1,
                    d1,
                    x.add(BLOCK),
                    *xs.get_unchecked(i * kb + b + 1),
                    *o,
                );
            }
            b += 2;
        }
        if b < kb {
            let w0 = _mm256_loadu_si256(wq.as_ptr().add(b * BLOCK) as *const __m256i);
            let a0 = _mm256_sign_epi8(w0, w0);
            let d0 = *ws.get_unchecked(b);
            for (i, e) in even.iter_mut().enumerate().take(rows) {
                let x = xq.as_ptr().add(i * k + b * BLOCK);
                *e = block_dot(w0, a0, d0, x, *xs.get_unchecked(i * kb + b), *e);
            }
        }
        for ((a, e), o) in acc.iter_mut().zip(even).zip(odd).take(rows) {
            *a = hsum(_mm256_add_ps(e, o));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// `len` values uniform in [-1, 1) from `seed`.
    pub(crate) fn random(len: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    /// Block scale `max|v| / 127` of the block holding element `i` of a row.
    fn scale_of(row: &[f32], i: usize) -> f32 {
        let b = i / BLOCK * BLOCK;
        row[b..b + BLOCK].iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0
    }

    #[test]
    fn matches_f32_product_within_the_quantization_bound() {
        let (n, k) = (70, 96);
        let w = random(n * k, 1);
        let q = Q8Matrix::quantize(&w, n, k);
        for m in [1, 3, 4, 9] {
            let x = random(m * k, 2 + m as u64);
            let y = q.matmul(&x, m);
            for r in 0..m {
                let xr = &x[r * k..(r + 1) * k];
                for j in 0..n {
                    let wj = &w[j * k..(j + 1) * k];
                    let exact: f32 = (0..k).map(|i| xr[i] * wj[i]).sum();
                    // Rounding moves each value by at most half its block scale.
                    let bound: f32 = (0..k)
                        .map(|i| {
                            let (ex, ew) = (scale_of(xr, i) / 2.0, scale_of(wj, i) / 2.0);
                            xr[i].abs() * ew + wj[i].abs() * ex + ex * ew
                        })
                        .sum();
                    let got = y[r * n + j];
                    assert!(
                        (got - exact).abs() <= bound * 1.001 + 1e-5,
                        "m={m} r={r} j={j}: {got} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }

    #[test]
    fn simd_and_portable_paths_agree() {
        let k = 128;
        let w = random(k, 5);
        let x = random(4 * k, 6);
        let q = Q8Matrix::quantize(&w, 1, k);
        let (mut xs, mut xq) = (Vec::new(), Vec::new());
        quantize_blocks(&x, k, &mut xs, &mut xq);
        let mut a = [0f32; 4];
        portable_dot_rows(&q.quants, &q.scales, &xq, &xs, k, 4, &mut a);
        if has_avx2() {
            let mut b = [0f32; 4];
            // SAFETY: AVX2 detected just above.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                avx2::dot_rows(&q.quants, &q.scales, &xq, &xs, k, 4, &mut b)
            };
            for (p, s) in a.iter().zip(&b) {
                assert!((p - s).abs() <= 1e-4 * p.abs().max(1.0), "{p} vs {s}");
            }
        }
    }

    #[test]
    fn a_row_is_independent_of_its_batch() {
        let (n, k) = (33, 64);
        let q = Q8Matrix::quantize(&random(n * k, 7), n, k);
        let x = random(5 * k, 8);
        let all = q.matmul(&x, 5);
        let one = q.matmul(&x[2 * k..3 * k], 1);
        assert_eq!(&all[2 * n..3 * n], &one[..]);
    }
}
