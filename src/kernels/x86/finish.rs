//! The finishing steps every x86 kernel shares: horizontal sums, the float step that turns a
//! super-block's exact integer sums into the running total, and where a call's activation rows and
//! results are. One copy of each, so that every kernel's float operations (and so its bits) are the
//! same however it splits the integer work.

use crate::kernels::acts::Acts;
use std::arch::x86_64::*;

/// Weight rows per call.
pub const NW: usize = 4;

/// Most activation rows one k-quant call multiplies.
pub const KR: usize = 4;

/// Where `_mm256_hadd_epi32` of two activation rows' sums (`i`, `i + 1`) puts each product: lanes 0–3
/// hold (i, w0), (i, w1), (i + 1, w0), (i + 1, w1), lanes 4–7 the same for weight rows 2 and 3. Maps a
/// lane to (activation row within the pair, weight row).
pub(crate) const fn pair_lanes(lane: usize) -> (usize, usize) {
    ((lane % 4) / 2, (lane / 4) * 2 + lane % 2)
}

/// Where a kernel call's activation rows are, found once per call: a slice's bounds checked (and the
/// division that finds them) inside the loop over super-blocks split it in pieces that LLVM then
/// scheduled badly (every activation load of a super-block hoisted above the checks, and spilled).
#[derive(Clone, Copy)]
pub(crate) struct RowsAt {
    /// The first row's quantized values (`k` apart from row to row).
    pub(crate) xq: *const i8,
    /// Its scales, one per 256 values (`kb` apart).
    pub(crate) xd: *const f32,
    /// Its sums per 16 values (`k / 16` apart).
    pub(crate) xs: *const i16,
    /// Its sums per 32 values (`k / 32` apart).
    pub(crate) xs32: *const i16,
    pub(crate) k: usize,
    pub(crate) kb: usize,
}

impl RowsAt {
    /// Row `r0` of `x` (256-wide activation blocks) and the rows after it.
    #[inline(always)]
    pub(crate) fn new(x: &Acts, r0: usize) -> Self {
        debug_assert_eq!(x.block, 256);
        Self {
            xq: x.rows_from(r0).as_ptr(),
            xd: x.scales_from(r0).as_ptr(),
            xs: x.sums_from(r0).as_ptr(),
            xs32: x.sums32_from(r0).as_ptr(),
            k: x.k,
            kb: x.k / 256,
        }
    }

    /// The rows from `rows` rows after these on.
    ///
    /// # Safety
    /// Those rows exist.
    #[inline(always)]
    pub(crate) unsafe fn skip(self, rows: usize) -> Self {
        unsafe {
            Self {
                xq: self.xq.add(rows * self.k),
                xd: self.xd.add(rows * self.kb),
                xs: self.xs.add(rows * (self.k / 16)),
                xs32: self.xs32.add(rows * (self.k / 32)),
                ..self
            }
        }
    }
}

/// Per-pair float sums of [`kquant`]'s activation rows (lanes in [`pair_lanes`]' order).
pub(crate) type Totals = [__m256; KR / 2];

/// The float step of super-block `b` for four interleaved rows (`d`, `dmin` and corrections `corr`)
/// and activation rows `r0 .. r0 + RR`, from the exact integer sums `isum[i]` (lanes `2w`, `2w + 1` of
/// row `i` belong to weight row `w`): [`super::finish::kquant_step`]'s operations, lane by lane. Shared
/// by every kernel on interleaved rows, so their bits are the same.
// `pair` picks two sums, two corrections, two scales and one total.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
/// `b` must lie within what `self` or the rows were built for: they are read without bounds checks.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
#[inline(always)]
pub(crate) unsafe fn finish_block<const RR: usize>(
    dv: __m256,
    dminv: __m256,
    corr: [__m256i; NW],
    b: usize,
    isum: &[__m256i; RR],
    x: &RowsAt,
    total: &mut Totals,
) {
    unsafe {
        let RowsAt { xd, xs, k, kb, .. } = *x;
        for pair in 0..RR.div_ceil(2) {
            let (i0, i1) = (2 * pair, (2 * pair + 1).min(RR - 1));
            let s = _mm256_hadd_epi32(isum[i0], isum[i1]);
            let (c0, c1) = (corr_sums(xs, k, b, i0, corr), corr_sums(xs, k, b, i1, corr));
            let c = _mm256_set_m128i(_mm_unpackhi_epi64(c0, c1), _mm_unpacklo_epi64(c0, c1));
            total[pair] = float_step(
                s,
                c,
                dv,
                dminv,
                (*xd.add(i0 * kb + b), *xd.add(i1 * kb + b)),
                total[pair],
            );
        }
    }
}

/// `total + dx · (d · s − dmin · c)` on lanes in [`pair_lanes`]' order: the exact integer sums `s` and
/// corrections `c` of two activation rows (scales `dx`) against four weight rows (`d`, `dmin`). The
/// one float step of every kernel on interleaved rows, so that their bits are the same.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[inline(always)]
pub(crate) unsafe fn float_step(
    s: __m256i,
    c: __m256i,
    d: __m256,
    dmin: __m256,
    (dx0, dx1): (f32, f32),
    total: __m256,
) -> __m256 {
    unsafe {
        let dx = _mm256_setr_ps(dx0, dx0, dx1, dx1, dx0, dx0, dx1, dx1);
        let v = _mm256_fmsub_ps(
            _mm256_cvtepi32_ps(s),
            d,
            _mm256_mul_ps(_mm256_cvtepi32_ps(c), dmin),
        );
        _mm256_fmadd_ps(v, dx, total)
    }
}

/// Writes the first `RR` activation rows' sums of `total` into `acc[w][i]`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[inline(always)]
pub(crate) unsafe fn store_totals<const RR: usize, const N: usize>(
    total: &[__m256],
    acc: &mut [[f32; N]; NW],
) {
    unsafe {
        for (pair, t) in total.iter().take(RR.div_ceil(2)).enumerate() {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), *t);
            for (lane, v) in lanes.iter().enumerate() {
                let (i, w) = pair_lanes(lane);
                if 2 * pair + i < RR {
                    acc[w][2 * pair + i] = *v;
                }
            }
        }
    }
}

/// For activation row `i` and super-block `b`: `Σ_h corr[w][h] · Σ xq_h` for the four weight rows, in
/// lanes 0–3 (exact integers).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
/// `xs` must point at activation rows that hold every entry the arguments index.
#[inline(always)]
pub(crate) unsafe fn corr_sums(
    xs: *const i16,
    k: usize,
    b: usize,
    i: usize,
    corr: [__m256i; NW],
) -> __m128i {
    unsafe {
        let sums = _mm256_loadu_si256(xs.add(i * (k / 16) + 16 * b) as *const __m256i);
        let m = [
            _mm256_madd_epi16(sums, corr[0]),
            _mm256_madd_epi16(sums, corr[1]),
            _mm256_madd_epi16(sums, corr[2]),
            _mm256_madd_epi16(sums, corr[3]),
        ];
        let t = _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]));
        _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1))
    }
}

/// The sum of a vector's eight lanes.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[inline(always)]
pub(crate) unsafe fn hsum(s: __m256) -> f32 {
    unsafe {
        let v = _mm_add_ps(_mm256_extractf128_ps(s, 1), _mm256_castps256_ps128(s));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)))
    }
}

/// The float part of a k-quant product, per super-block, the same in every kernel: `s` the integer
/// sum of scaled products, `c` the integer sum that the minimum (or offset) multiplies, `dx` the
/// activations' scale. Every kernel reduces to these exact integers first, so however it splits the
/// work among lanes, a row's float operations (and so its bits) are these.
#[inline(always)]
pub(crate) fn kquant_step(s: i32, c: i32, d: f32, dmin: f32, dx: f32, total: f32) -> f32 {
    (s as f32).mul_add(d, -(c as f32 * dmin)).mul_add(dx, total)
}

/// The sum of a vector's eight 32-bit integer lanes (exact: no product here comes near overflow).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[inline(always)]
pub(crate) unsafe fn hsum_epi32(v: __m256i) -> i32 {
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }
}
