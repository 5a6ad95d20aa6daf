//! Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 rows repacked at load ([`crate::kernels::packed`]), read in place
//! four at a time, for any number of activation rows.
//!
//! Why it exists: the kernels that read a 32-weight row as the file lays it out ([`super::fused`],
//! [`super::gemm`]) put every block's product through the float step lane by lane: a conversion, a
//! multiply and a multiply-add for each weight row and activation row, besides the two integer
//! instructions of the product itself. On AVX2, where nothing else bounds a batch's step, that float
//! work was most of it (SmolLM2-135M at batch 8 on a Zen 3: 58% of a step's samples in those kernels).
//! Four repacked rows give each block's 32 products per row as one exact integer in a lane of its own,
//! so the float work (a conversion, a multiply and two multiply-adds) is done once per eight products,
//! and one activation vector serves four weight rows.
//!
//! Per block `b`, weight row and activation row, with `s = Σ q·xq` over the block (q the stored
//! value, 0–15 or 0–31, exact) and the activations' scale `dx` and scaled sum `xs = dx·Σ xq`
//! ([`Acts`]): `total = fma(m, xs, fma(s·d, dx, total))`, where `m` is the block's minimum (Q4_1,
//! Q5_1) or its offset times `d` (`−8·d` for Q4_0, `−16·d` for Q5_0); Q8_0's signed weights need no
//! offset: `total = fma(s·d, dx, total)`. Every batch size reads a
//! repacked group with this kernel, so a row's bits do not depend on its batch. They are not the bits
//! of the file's layout (`KVBENCH_REPACK=0`): the same integers, their float sums taken per block rather
//! than per lane.

use super::finish::{store_totals, Totals, KR, NW};
use super::loads::prefetch_lines;
use crate::kernels::acts::Acts;
use crate::kernels::format::BlockFormat;
use std::arch::x86_64::*;

/// Whether this kernel reads repacked rows of `format`.
pub fn takes(format: BlockFormat) -> bool {
    matches!(
        format,
        BlockFormat::Q4_0
            | BlockFormat::Q4_1
            | BlockFormat::Q5_0
            | BlockFormat::Q5_1
            | BlockFormat::Q8_0
    )
}

/// Products of the four repacked rows `group` (a format this kernel [`takes`]) with activation rows
/// `r0 .. r0 + rows` (1 ≤ rows ≤ [`KR`]) into `acc[w][i]`.
///
/// # Safety
/// AVX2, FMA and F16C; `group` holds four rows of `x.k` weights of `format` repacked by
/// [`crate::kernels::packed::pack`], and `x` the rows asked for, in 32-wide activation blocks.
pub unsafe fn dot_packed(
    format: BlockFormat,
    group: &[u8],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; KR]; NW],
) {
    #[cfg(test)]
    crate::kernels::ran::mark(crate::kernels::ran::Kernel::Avx2);
    debug_assert!(takes(format) && (1..=KR).contains(&rows));
    debug_assert_eq!(group.len(), NW * x.k / 32 * format.block_bytes());
    let g = group.as_ptr();
    // SAFETY: the caller's contract.
    unsafe {
        match format {
            BlockFormat::Q4_0 => by_rows::<Q4_0>(g, x, r0, rows, acc),
            BlockFormat::Q4_1 => by_rows::<Q4_1>(g, x, r0, rows, acc),
            BlockFormat::Q5_0 => by_rows::<Q5_0>(g, x, r0, rows, acc),
            BlockFormat::Q5_1 => by_rows::<Q5_1>(g, x, r0, rows, acc),
            BlockFormat::Q8_0 => by_rows::<Q8_0>(g, x, r0, rows, acc),
            _ => unreachable!("legacy_packed::takes is checked by the caller"),
        }
    }
}

/// # Safety
/// As [`quad`].
#[inline(always)]
unsafe fn by_rows<F: Layout>(
    g: *const u8,
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; KR]; NW],
) {
    unsafe {
        match rows {
            1 => quad::<F, 1>(g, x, r0, acc),
            2 => quad::<F, 2>(g, x, r0, acc),
            3 => quad::<F, 3>(g, x, r0, acc),
            _ => quad::<F, 4>(g, x, r0, acc),
        }
    }
}

/// A repacked block of a format: the four rows' headers (each row's, [`Layout::HEADER`] bytes, one
/// after the other), then their weights.
trait Layout {
    /// Bytes of one row's header: `d`, then `m` (Q4_1, Q5_1), then 32 fifth bits (Q5_0, Q5_1).
    const HEADER: usize;
    /// Where the fifth bits start in a row's header (Q5_0, Q5_1).
    const FIFTH: Option<usize>;
    /// Bytes of a repacked block: the headers, then four rows' 32 nibbles (64 bytes).
    const BLOCK: usize = NW * Self::HEADER + 64;
    /// The four rows' `d` and, where the format has one, `m` (the minimum, or the offset times
    /// `d`), in the lanes of [`super::finish::pair_lanes`] (weight rows 0, 1, 0, 1, 2, 3, 2, 3).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `p` points at a repacked block's four headers.
    unsafe fn scales(p: *const u8) -> (__m256, Option<__m256>);

    /// The block's exact sums `Σ q·xq` for activation rows `0 .. RR` (`xq` their quantized
    /// activations, `k` apart; block `b`'s are `32 · b` in): weight row `w`'s in lanes `2w` and
    /// `2w + 1` of a row's vector. Nibble formats (this default): bytes 0–7 of each row (weights 0–7
    /// low, 16–23 high), then bytes 8–15 (8–15, 24–31), one vector each, the fifth bits added.
    ///
    /// # Safety
    /// The CPU must support AVX2; `p` points at a repacked block, and rows `0 .. RR` of `xq` hold
    /// block `b`.
    #[inline(always)]
    unsafe fn sums<const RR: usize>(
        p: *const u8,
        xq: *const i8,
        k: usize,
        b: usize,
    ) -> [__m256i; RR] {
        unsafe {
            let headers = NW * Self::HEADER;
            let low = _mm256_set1_epi8(0x0F);
            let c0 = _mm256_loadu_si256(p.add(headers) as *const __m256i);
            let c1 = _mm256_loadu_si256(p.add(headers + 32) as *const __m256i);
            let mut w = [
                _mm256_and_si256(c0, low),
                _mm256_and_si256(c1, low),
                _mm256_and_si256(_mm256_srli_epi16(c0, 4), low),
                _mm256_and_si256(_mm256_srli_epi16(c1, 4), low),
            ];
            if let Some(at) = Self::FIFTH {
                add_fifth_bits(&mut w, p, Self::HEADER, at);
            }
            // The four chunks' pairs (each at most 2 · 31 · 128) add up within 16 bits. (Loops, not
            // closures: a closure here would not inherit the calling kernel's target features.)
            let mut isum = [_mm256_setzero_si256(); RR];
            for (i, sum) in isum.iter_mut().enumerate() {
                let xb = xq.add(i * k + 32 * b);
                let mut s = _mm256_maddubs_epi16(w[0], broadcast8(xb));
                for (t, wt) in w.iter().enumerate().skip(1) {
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(*wt, broadcast8(xb.add(8 * t))));
                }
                *sum = _mm256_madd_epi16(s, _mm256_set1_epi16(1));
            }
            isum
        }
    }
}

struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;

impl Layout for Q4_0 {
    const HEADER: usize = 2;
    const FIFTH: Option<usize> = None;
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> (__m256, Option<__m256>) {
        unsafe {
            let d = d_only(p);
            (d, Some(_mm256_mul_ps(d, _mm256_set1_ps(-8.0))))
        }
    }
}

/// The four rows' `d` from headers that hold nothing else (Q4_0, Q8_0), in the lanes of
/// [`super::finish::pair_lanes`].
///
/// # Safety
/// The CPU must support AVX2 and F16C; `p .. p + 8` is readable.
#[inline(always)]
unsafe fn d_only(p: *const u8) -> __m256 {
    unsafe {
        // d0 … d3 (the upper lanes are not read).
        let h = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i)));
        _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 1, 0, 1, 2, 3, 2, 3))
    }
}

impl Layout for Q4_1 {
    const HEADER: usize = 4;
    const FIFTH: Option<usize> = None;
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> (__m256, Option<__m256>) {
        unsafe {
            // d0, m0, d1, m1, d2, m2, d3, m3.
            let h = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
            let d = _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 2, 0, 2, 4, 6, 4, 6));
            let m = _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(1, 3, 1, 3, 5, 7, 5, 7));
            (d, Some(m))
        }
    }
}

impl Layout for Q5_0 {
    const HEADER: usize = 6;
    const FIFTH: Option<usize> = Some(2);
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> (__m256, Option<__m256>) {
        unsafe {
            let d = f16_pairs(p, Self::HEADER, 0);
            (d, Some(_mm256_mul_ps(d, _mm256_set1_ps(-16.0))))
        }
    }
}

impl Layout for Q5_1 {
    const HEADER: usize = 8;
    const FIFTH: Option<usize> = Some(4);
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> (__m256, Option<__m256>) {
        unsafe {
            (
                f16_pairs(p, Self::HEADER, 0),
                Some(f16_pairs(p, Self::HEADER, 2)),
            )
        }
    }
}

/// Q8_0: each row's header is its `d` (as Q4_0's), then its 32 signed bytes as four chunks, bytes
/// `8t … 8t + 7` of the four rows in the block's vector `t`. The products go through the sign trick
/// (`maddubs(|w|, x·sign(w))`), each chunk's pairs widened on their own: two chunks' could reach
/// 2 · 2 · 128 · 127, past 16 bits. No offset: the weights are signed.
impl Layout for Q8_0 {
    const HEADER: usize = 2;
    const FIFTH: Option<usize> = None;
    const BLOCK: usize = NW * Self::HEADER + 128;
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> (__m256, Option<__m256>) {
        unsafe { (d_only(p), None) }
    }

    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn sums<const RR: usize>(
        p: *const u8,
        xq: *const i8,
        k: usize,
        b: usize,
    ) -> [__m256i; RR] {
        unsafe {
            let headers = NW * Self::HEADER;
            let (mut w, mut aw) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
            for t in 0..4 {
                w[t] = _mm256_loadu_si256(p.add(headers + 32 * t) as *const __m256i);
                aw[t] = _mm256_sign_epi8(w[t], w[t]);
            }
            let mut isum = [_mm256_setzero_si256(); RR];
            for (i, sum) in isum.iter_mut().enumerate() {
                let xb = xq.add(i * k + 32 * b);
                let mut chunks = [_mm256_setzero_si256(); 4];
                for t in 0..4 {
                    let xs = _mm256_sign_epi8(broadcast8(xb.add(8 * t)), w[t]);
                    // |pair| ≤ 2 · 128 · 127: no saturation.
                    chunks[t] =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(aw[t], xs), _mm256_set1_epi16(1));
                }
                let s = _mm256_add_epi32(chunks[0], chunks[1]);
                *sum = _mm256_add_epi32(s, _mm256_add_epi32(chunks[2], chunks[3]));
            }
            isum
        }
    }
}

/// The f16 at `at` of each of four headers `header` bytes apart, in the lanes of
/// [`super::finish::pair_lanes`].
///
/// # Safety
/// The CPU must support AVX2 and F16C; the four values are readable.
#[inline(always)]
unsafe fn f16_pairs(p: *const u8, header: usize, at: usize) -> __m256 {
    unsafe {
        let h = |w: usize| std::ptr::read_unaligned(p.add(header * w + at) as *const i16);
        let (h0, h1, h2, h3) = (h(0), h(1), h(2), h(3));
        _mm256_cvtph_ps(_mm_setr_epi16(h0, h1, h0, h1, h2, h3, h2, h3))
    }
}

/// Adds the fifth bits (0x10) to the four nibble vectors `w` (weights 0–7, 8–15, 16–23, 24–31 of each
/// row): weight `8v + j` of row `r` takes bit `8v + j` of the row's 32 bits, byte `v`'s bit `j`.
///
/// # Safety
/// The CPU must support AVX2; the four rows' bits at `p + header · r + at` are readable.
#[inline(always)]
unsafe fn add_fifth_bits(w: &mut [__m256i; 4], p: *const u8, header: usize, at: usize) {
    unsafe {
        let h = |r: usize| std::ptr::read_unaligned(p.add(header * r + at) as *const i32);
        let (h0, h1, h2, h3) = (h(0), h(1), h(2), h(3));
        // Both 128-bit halves hold the four rows' bits; rows 0 and 1 are read in the low half, 2 and 3
        // in the high one (a byte shuffle stays within its half).
        let bits = _mm256_setr_epi32(h0, h1, h2, h3, h0, h1, h2, h3);
        let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let five = _mm256_set1_epi8(0x10);
        const EVERY: i64 = 0x0101_0101_0101_0101;
        for (v, wv) in w.iter_mut().enumerate() {
            let v = v as i64;
            // Row r's eight bytes take byte v of its bits: byte 4r + v of the half holding it.
            let spread = _mm256_shuffle_epi8(
                bits,
                _mm256_set_epi64x(
                    EVERY * (12 + v),
                    EVERY * (8 + v),
                    EVERY * (4 + v),
                    EVERY * v,
                ),
            );
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
            *wv = _mm256_or_si256(*wv, _mm256_and_si256(set, five));
        }
    }
}

/// Eight activation bytes at `p` in every 64-bit lane.
///
/// # Safety
/// The CPU must support AVX2; `p .. p + 8` is readable.
#[inline(always)]
unsafe fn broadcast8(p: *const i8) -> __m256i {
    unsafe { _mm256_set1_epi64x(std::ptr::read_unaligned(p as *const i64)) }
}

/// `v[i0]` in lanes 0, 1, 4, 5 and `v[i1]` in lanes 2, 3, 6, 7 (two activation rows' values of one
/// block, in the lanes of [`super::finish::pair_lanes`]), `v` holding each row's `kb` values in turn.
///
/// # Safety
/// The CPU must support AVX2; both values are readable.
#[inline(always)]
unsafe fn pair_of(v: *const f32, (i0, i1): (usize, usize), kb: usize, b: usize) -> __m256 {
    unsafe {
        _mm256_blend_ps::<0b1100_1100>(
            _mm256_broadcast_ss(&*v.add(i0 * kb + b)),
            _mm256_broadcast_ss(&*v.add(i1 * kb + b)),
        )
    }
}

/// Block `b`'s float steps for activation rows `0 .. RR` (their exact sums `isum`, lanes `2w` and
/// `2w + 1` of weight row `w`), two rows a vector: `total = fma(s·d, dx, total)`, then, with an
/// `offset` (`m` and the rows' scaled sums `xs`), `total = fma(m, xs, total)`; `xd` the rows' scales,
/// `kb` apart.
///
/// # Safety
/// The CPU must support AVX2 and FMA; rows `0 .. RR` of `xd` (and `xs`) hold block `b`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn float_steps<const RR: usize>(
    isum: &[__m256i; RR],
    d: __m256,
    offset: Option<(__m256, *const f32)>,
    (xd, kb, b): (*const f32, usize, usize),
    total: &mut Totals,
) {
    unsafe {
        for pair in 0..RR.div_ceil(2) {
            let rows = (2 * pair, (2 * pair + 1).min(RR - 1));
            let s = _mm256_cvtepi32_ps(_mm256_hadd_epi32(isum[rows.0], isum[rows.1]));
            let t = _mm256_fmadd_ps(_mm256_mul_ps(s, d), pair_of(xd, rows, kb, b), total[pair]);
            total[pair] = match offset {
                Some((m, xs)) => _mm256_fmadd_ps(m, pair_of(xs, rows, kb, b), t),
                None => t,
            };
        }
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C; `g` points at four repacked rows of `x.k` weights of
/// `F`'s format and `x` holds rows `r0 .. r0 + RR` in 32-wide blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quad<F: Layout, const RR: usize>(
    g: *const u8,
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; KR]; NW],
) {
    unsafe {
        let (k, kb) = (x.k, x.k / 32);
        let xq = x.rows_from(r0).as_ptr();
        let xd = x.scales_from(r0).as_ptr();
        let xs = x.scaled_from(r0).as_ptr();
        // The group is one stream, four rows' bytes per block: the rows' distance four times over.
        let dist = crate::kernels::dispatch::prefetch_distance() * NW;
        let mut total: Totals = [_mm256_setzero_ps(); KR / 2];
        for b in 0..kb {
            let p = g.add(b * F::BLOCK);
            if dist > 0 {
                prefetch_lines(p.wrapping_add(dist), F::BLOCK);
            }
            let (dv, mv) = F::scales(p);
            let isum = F::sums::<RR>(p, xq, k, b);
            float_steps(&isum, dv, mv.map(|m| (m, xs)), (xd, kb, b), &mut total);
        }
        store_totals::<RR, KR>(&total, acc);
    }
}
