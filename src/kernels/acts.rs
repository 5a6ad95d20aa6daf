//! Activations quantized for the integer products: per row and block of `block` values (32, or 256
//! for k-quant matrices as ggml's Q8_K), `d = max|x| / 127` and `q = round(x / d)`, as llama.cpp does.
//! Formats with a minimum or an offset also need `Σ q` per 16 values, which [`Acts`] keeps beside
//! (ggml's `bsums`).

use super::aligned::AlignedBytes;
use super::unpacked::HALF;

/// `m` rows of `k` quantized activations. The fields are the kernels' own (visible inside
/// [`crate::kernels`] only): built by [`Acts::quantize`], their lengths always agree with `m`, `k` and
/// `block`, which the kernels' unchecked reads rely on.
pub struct Acts {
    pub(super) m: usize,
    pub(super) k: usize,
    /// Values per scale: 32 or 256.
    pub(super) block: usize,
    /// `q[r * k + i]`, from a 64-byte boundary (every row from a 32-byte one).
    pub(super) q: AlignedBytes<i8>,
    /// `d[r * (k / block) + b]`.
    pub(super) d: Vec<f32>,
    /// `sums[r * (k / 16) + h]`: `Σ q` over the 16 values `16h … 16h + 15`.
    pub(super) sums: Vec<i16>,
    /// `sums32[r * (k / 32) + j]`: `Σ q` over the 32 values `32j … 32j + 31` (what a k-quant
    /// group's minimum multiplies); empty for 32-wide blocks, whose kernels do not read it.
    pub(super) sums32: Vec<i16>,
    /// `scaled[r * (k / block) + b]`: `d · Σ q` over block `b` (what a 32-wide block's minimum
    /// multiplies).
    pub(super) scaled: Vec<f32>,
}

impl Acts {
    /// Rows, values per row, values per scale.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.m, self.k, self.block)
    }

    /// Quantizes `m` rows of `k` values (`x`, row-major) in blocks of `block`. Rows are independent,
    /// so large inputs (prefill, large batches) are split across the thread pool by rows: the same
    /// values as one thread. On one thread it was 8% of a 256-row Q4_K product's profile (README,
    /// speed).
    /// # Panics
    /// When `k` is not a whole number of blocks or `x` does not hold `m` rows of `k`: the lengths
    /// every kernel relies on come from here.
    pub fn quantize(x: &[f32], m: usize, k: usize, block: usize) -> Self {
        assert!(
            matches!(block, 32 | 256) && k.is_multiple_of(block) && x.len() == m * k,
            "Acts::quantize: {} values are not {m} rows of {k} in blocks of {block}",
            x.len()
        );
        let (kb, kh) = (k / block, k / HALF);
        let mut q = AlignedBytes::<i8>::zeroed(m * k);
        let mut d = vec![0f32; m * kb];
        let mut sums = vec![0i16; m * kh];
        let mut scaled = vec![0f32; m * kb];
        use rayon::prelude::*;
        x.par_chunks_exact(k)
            .zip(q.par_chunks_exact_mut(k))
            .zip(d.par_chunks_exact_mut(kb))
            .zip(sums.par_chunks_exact_mut(kh))
            .zip(scaled.par_chunks_exact_mut(kb))
            // Small inputs (a decoding step's few rows) stay on the calling thread.
            .with_min_len(PARALLEL_FROM.div_ceil(k))
            .for_each(|((((x, q), d), sums), scaled)| quantize_row(x, q, d, sums, scaled, block));
        // Only the k-quant kernels read them; a row's sums per 16 are an even count, so pairs never
        // straddle two rows. |Σ| ≤ 32 · 127: fits an i16.
        let sums32 = if block == 256 {
            sums.chunks_exact(2).map(|p| p[0] + p[1]).collect()
        } else {
            Vec::new()
        };
        Self {
            m,
            k,
            block,
            q,
            d,
            sums,
            sums32,
            scaled,
        }
    }

    /// Row `r`'s quantized values.
    #[inline(always)]
    pub fn row(&self, r: usize) -> &[i8] {
        &self.q[r * self.k..(r + 1) * self.k]
    }

    /// Row `r`'s block scales.
    #[inline(always)]
    pub fn scales(&self, r: usize) -> &[f32] {
        let kb = self.k / self.block;
        &self.d[r * kb..(r + 1) * kb]
    }

    /// Row `r`'s `d · Σ q` per block.
    #[inline(always)]
    pub fn row_scaled(&self, r: usize) -> &[f32] {
        let kb = self.k / self.block;
        &self.scaled[r * kb..(r + 1) * kb]
    }

    /// Row `r`'s sums per 32 values (256-wide blocks only).
    #[inline(always)]
    pub fn row_sums32(&self, r: usize) -> &[i16] {
        let kj = self.k / 32;
        &self.sums32[r * kj..(r + 1) * kj]
    }

    /// Row `r`'s sums per 16 values.
    #[inline(always)]
    pub fn row_sums(&self, r: usize) -> &[i16] {
        let kh = self.k / HALF;
        &self.sums[r * kh..(r + 1) * kh]
    }
}

/// Pointers for the kernels' unchecked reads, which step from a row into the rows after it: each is
/// derived from the buffer's tail starting at row `r` (a pointer taken from one row's slice may not
/// be advanced into the next rows).
impl Acts {
    /// Rows `r ..` of quantized values.
    #[inline(always)]
    pub fn rows_from(&self, r: usize) -> &[i8] {
        &self.q[r * self.k..]
    }

    /// Rows `r ..` of block scales.
    #[inline(always)]
    pub fn scales_from(&self, r: usize) -> &[f32] {
        &self.d[r * (self.k / self.block)..]
    }

    /// Rows `r ..` of `d · Σ q` per block.
    #[inline(always)]
    pub fn scaled_from(&self, r: usize) -> &[f32] {
        &self.scaled[r * (self.k / self.block)..]
    }

    /// Rows `r ..` of sums per 16 values.
    #[inline(always)]
    pub fn sums_from(&self, r: usize) -> &[i16] {
        &self.sums[r * (self.k / HALF)..]
    }

    /// Rows `r ..` of sums per 32 values (256-wide blocks only).
    #[inline(always)]
    pub fn sums32_from(&self, r: usize) -> &[i16] {
        &self.sums32[r * (self.k / 32)..]
    }
}

/// Values per task of [`Acts::quantize`] (below this, the hand-off costs more than it saves: a decoding
/// step's rows are a few thousand values and stay on one thread).
const PARALLEL_FROM: usize = 1 << 16;

/// One row: per block `d = max|x| / 127`, `q = round(x / d)`; per 16 values `Σ q`; per block
/// `d · Σ q`.
fn quantize_row(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    sums: &mut [i16],
    scaled: &mut [f32],
    block: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if super::dispatch::has_avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above).
        return unsafe { quantize_row_avx2(x, q, d, sums, scaled, block) };
    }
    quantize_row_body(x, q, d, sums, scaled, block)
}

/// [`quantize_row`] compiled for AVX2: the same operations (so the same bits) in 256-bit vectors,
/// and `round` as one instruction where the x86-64 baseline (SSE2) calls `roundf` per value.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_row_avx2(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    sums: &mut [i16],
    scaled: &mut [f32],
    block: usize,
) {
    quantize_row_body(x, q, d, sums, scaled, block)
}

#[inline(always)]
fn quantize_row_body(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    sums: &mut [i16],
    scaled: &mut [f32],
    block: usize,
) {
    for ((xb, qb), db) in x
        .chunks_exact(block)
        .zip(q.chunks_exact_mut(block))
        .zip(d.iter_mut())
    {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for (o, v) in qb.iter_mut().zip(xb) {
            *o = (v * inv).round() as i8;
        }
        *db = scale;
    }
    // |Σ| ≤ 16 · 127: fits an i16.
    for (s, qs) in sums.iter_mut().zip(q.chunks_exact(HALF)) {
        *s = qs.iter().map(|&v| v as i16).sum::<i16>();
    }
    let per_block = block / HALF;
    for ((o, s), d) in scaled
        .iter_mut()
        .zip(sums.chunks_exact(per_block))
        .zip(d.iter())
    {
        *o = d * s.iter().map(|&v| v as i32).sum::<i32>() as f32;
    }
}
