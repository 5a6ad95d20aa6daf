//! AVX2 kernels for a few activation rows (decoding): each weight block is decoded in registers and
//! multiplied with up to four rows while it sits there, with no pass through memory, as ggml's
//! `vec_dot` kernels do. For more rows the driver decodes a row once per tile instead
//! (`crate::kernels::avx2`), which pays from about 16 rows on (measured: see the README's speed section).
//!
//! Each kernel asks for the weights [`crate::kernels::dispatch::prefetch_distance`] bytes ahead of the block it
//! decodes: on the Intel Xeon this project's machine has been, the hardware prefetcher alone left a
//! decoding step waiting on memory (measured in the README's speed section).
//!
//! The arithmetic is the tiled kernels' exactly (the same integer sums, the same float operations in the
//! same order), so a row's output does not depend on which kernel its batch size chose: a sequence
//! decodes to the same bits alone or in any batch.

use super::finish::{hsum, hsum_epi32, kquant_step};
use super::loads::{f16_last, f16_one, f16_two, fifth_bits, nibbles};
use crate::kernels::acts::Acts;
use crate::kernels::format::BlockFormat;
use std::arch::x86_64::*;

/// Products of one weight row (`w`, the file's blocks in `format`) with activation rows
/// `r0 .. r0 + rows` (1–4) into `acc[..rows]`, each block decoded in registers.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `w` must hold whole blocks for `x.k` weights and `x` the
/// rows asked for, quantized in the format's activation block (32, or 256 for k-quants).
pub unsafe fn dot_rows(
    format: BlockFormat,
    w: &[u8],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [f32; 4],
) {
    unsafe {
        #[cfg(test)]
        crate::kernels::ran::mark(crate::kernels::ran::Kernel::Avx2);
        let mut out = [[0f32; 4]];
        dot_rows_w::<1>(format, [w.as_ptr()], x, r0, rows, &mut out);
        *acc = out[0];
    }
}

/// [`dot_rows`] for two weight rows of the same format at once (`acc[c]` for row `w[c]`): for the
/// 32-weight formats each activation vector loaded serves both, and the per-call costs are paid once. Every row's arithmetic is
/// [`dot_rows`]'s, so its bits do not depend on its neighbour.
///
/// # Safety
/// As [`dot_rows`], for both rows.
pub unsafe fn dot_rows2(
    format: BlockFormat,
    w: [&[u8]; 2],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; 4]; 2],
) {
    unsafe {
        #[cfg(test)]
        crate::kernels::ran::mark(crate::kernels::ran::Kernel::Avx2);
        if format.is_k_quant() {
            // Two k-quant rows at once run out of registers (measured 14% slower): one at a time.
            for c in 0..2 {
                dot_rows(format, w[c], x, r0, rows, &mut acc[c]);
            }
            return;
        }
        dot_rows_w::<2>(format, [w[0].as_ptr(), w[1].as_ptr()], x, r0, rows, acc);
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `w` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
unsafe fn dot_rows_w<const W: usize>(
    format: BlockFormat,
    w: [*const u8; W],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; 4]; W],
) {
    unsafe {
        with_kquant!(format, F => kquant_rows::<F, W>(w, x, r0, rows, acc), _ => {
            with_legacy!(format, F => legacy_rows::<F, W>(w, x, r0, rows, acc), _ => unreachable!())
        })
    }
}

/// How a 32-weight block is decoded.
pub(crate) trait Legacy {
    const BYTES: usize;
    /// Signed weights (Q8_0) go through the sign trick; the others are 0…31 with an additive term.
    const SIGNED: bool;
    /// The block's 32 weights, its scale `d`, and the term `m` added to every weight.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    /// `p` must point at weight bytes of the layout this function decodes, every byte it reads readable.
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32);
}

pub(crate) struct Q4_0;
pub(crate) struct Q4_1;
pub(crate) struct Q5_0;
pub(crate) struct Q5_1;
pub(crate) struct Q8_0;

impl Legacy for Q4_0 {
    const BYTES: usize = 18;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        unsafe {
            let d = f16_one(p);
            (nibbles(p.add(2)), d, -8.0 * d)
        }
    }
}

impl Legacy for Q4_1 {
    const BYTES: usize = 20;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        unsafe {
            let (d, m) = f16_two(p);
            (nibbles(p.add(4)), d, m)
        }
    }
}

impl Legacy for Q5_0 {
    const BYTES: usize = 22;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        unsafe {
            let d = f16_one(p);
            let q = _mm256_or_si256(nibbles(p.add(6)), fifth_bits(p.add(2)));
            (q, d, -16.0 * d)
        }
    }
}

impl Legacy for Q5_1 {
    const BYTES: usize = 24;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        unsafe {
            let (d, m) = f16_two(p);
            let q = _mm256_or_si256(nibbles(p.add(8)), fifth_bits(p.add(4)));
            (q, d, m)
        }
    }
}

impl Legacy for Q8_0 {
    const BYTES: usize = 34;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        unsafe {
            let d = f16_one(p);
            (_mm256_loadu_si256(p.add(2) as *const __m256i), d, 0.0)
        }
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `w` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
unsafe fn legacy_rows<F: Legacy, const W: usize>(
    w: [*const u8; W],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; 4]; W],
) {
    unsafe {
        match rows {
            1 => legacy::<F, 1, W>(w, x, r0, acc),
            2 => legacy::<F, 2, W>(w, x, r0, acc),
            3 => legacy::<F, 3, W>(w, x, r0, acc),
            _ => legacy::<F, 4, W>(w, x, r0, acc),
        }
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `w` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy<F: Legacy, const R: usize, const W: usize>(
    w: [*const u8; W],
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; 4]; W],
) {
    unsafe {
        debug_assert_eq!(x.block, 32);
        let kb = x.k / 32;
        let ones = _mm256_set1_epi16(1);
        let mut xq = [std::ptr::null::<i8>(); R];
        let mut xd = [std::ptr::null::<f32>(); R];
        let mut xs = [std::ptr::null::<f32>(); R];
        for i in 0..R {
            xq[i] = x.rows_from(r0 + i).as_ptr();
            xd[i] = x.scales_from(r0 + i).as_ptr();
            xs[i] = x.scaled_from(r0 + i).as_ptr();
        }
        let mut total = [[_mm256_setzero_ps(); R]; W];
        let mut extra = [[0f32; R]; W];
        let dist = crate::kernels::dispatch::prefetch_distance();
        for b in 0..kb {
            if dist > 0 {
                // The block `dist` bytes ahead (a hint; see the k-quant kernel).
                for row in w {
                    super::loads::prefetch_lines(row.wrapping_add(b * F::BYTES + dist), 1);
                }
            }
            for c in 0..W {
                let (q, d, m) = F::load(w[c].add(b * F::BYTES));
                let aq = if F::SIGNED { _mm256_sign_epi8(q, q) } else { q };
                let dv = _mm256_set1_ps(d);
                for i in 0..R {
                    let xv = _mm256_loadu_si256(xq[i].add(b * 32) as *const __m256i);
                    // |pair| ≤ 2·128·127 (signed) or 2·31·127: no saturation.
                    let pairs = if F::SIGNED {
                        _mm256_maddubs_epi16(aq, _mm256_sign_epi8(xv, q))
                    } else {
                        _mm256_maddubs_epi16(q, xv)
                    };
                    let sum = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones)), dv);
                    total[c][i] =
                        _mm256_fmadd_ps(sum, _mm256_broadcast_ss(&*xd[i].add(b)), total[c][i]);
                    if !F::SIGNED {
                        extra[c][i] = m.mul_add(*xs[i].add(b), extra[c][i]);
                    }
                }
            }
        }
        for c in 0..W {
            for i in 0..R {
                acc[c][i] = hsum(total[c][i]) + extra[c][i];
            }
        }
    }
}

/// A k-quant super-block's header, decoded once into registers.
#[derive(Clone, Copy)]
pub(super) struct Header {
    pub(super) d: f32,
    pub(super) dmin: f32,
    /// Q4_K/Q5_K: the eight sub-block scales as 16-bit lanes, in both halves; Q6_K: the sixteen
    /// per-16 scales.
    pub(super) scales: __m256i,
    /// Q4_K/Q5_K: the eight sub-block minima as 16-bit lanes (Q6_K: unused).
    mins: __m128i,
}

/// How a 256-weight k-quant super-block is decoded.
pub(super) trait KQuant {
    const BYTES: usize;
    /// The largest weight value as stored (unsigned): what bounds the kernels' integer sums.
    const TOP: u8;
    /// Whether scales change every 16 weights (Q6_K) rather than every 32.
    const BY_16: bool;
    /// Where the super-block's header (scales, `d`, `dmin`) starts, and its length; the rest, from
    /// `DATA`, is 32-byte segments of weights (the regions [`super::packed`] repacks by).
    const HEADER: usize;
    const HEADER_LEN: usize;
    const DATA: usize;
    /// What multiplies each 16 activations' sum (`c_h`, 16 lanes), for the interleaved kernel.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn corr_lanes(h: &Header) -> __m256i;
    /// The super-block's `d`, `dmin` and integer scales, from its header bytes at `h`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    /// `h` must point at weight bytes of the layout this function decodes, every byte it reads readable.
    unsafe fn header_at(h: *const u8) -> Header;
    /// Group `g`'s scales as the product's 16-bit lanes: 0–7 for its weights 0–15, 8–15 for 16–31.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn group_scales(h: &Header, g: usize) -> __m256i;
    /// The lane of [`Header::scales`] that scales half `h` (0, or 1 when `BY_16`) of group `g`.
    fn scale_lane(g: usize, h: usize) -> usize;
    /// `C = Σ_h c_h · Σ xq_h` over the sixteen activation sums `xs` (exact), what `dmin` multiplies.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    /// `xs` must point at activation rows that hold every entry the arguments index.
    unsafe fn corr(h: &Header, xs: *const i16) -> i32;
    /// Group `g`'s 32 weights, unsigned, from the weight segments, segment `s` at `data + stride · s`:
    /// byte by byte, so that on a repacked group (stride 128, [`super::packed`]) it gives a chunk of
    /// 8 weights of each of the four rows.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    /// `data` must point at weight bytes of the layout this function decodes, every byte it reads readable.
    unsafe fn group_in(data: *const u8, stride: usize, g: usize) -> __m256i;

    /// The header of the file's super-block at `p`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    /// `p` must point at weight bytes of the layout this function decodes, every byte it reads readable.
    #[inline(always)]
    unsafe fn header(p: *const u8) -> Header {
        unsafe { Self::header_at(p.add(Self::HEADER)) }
    }
    /// Group `g`'s 32 weights of the file's super-block at `p`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    /// `p` must point at weight bytes of the layout this function decodes, every byte it reads readable.
    #[inline(always)]
    unsafe fn group(p: *const u8, g: usize) -> __m256i {
        unsafe { Self::group_in(p.add(Self::DATA), 32, g) }
    }
}

pub(super) struct Q4K;
pub(super) struct Q5K;
pub(super) struct Q6K;

/// Q4_K/Q5_K's header: the 6-bit scales and minima of eight 32-weight sub-blocks, unpacked from their
/// 12 bytes with whole-word masks (the layout of ggml's `get_scale_min_k4`: sub-blocks 0–3 in the low
/// six bits of bytes 0–3 and 4–7, sub-blocks 4–7 in the nibbles of bytes 8–11 with their top two bits
/// in the top bits of bytes 0–7). [`crate::kernels::kquants::scale_min`] is the same, one sub-block at a time.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `p` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
unsafe fn k45_header(p: *const u8) -> Header {
    unsafe {
        let h = std::slice::from_raw_parts(p, 16);
        let word =
            |i: usize| u32::from_le_bytes([h[4 + 4 * i], h[5 + 4 * i], h[6 + 4 * i], h[7 + 4 * i]]);
        let (u0, u1, u2) = (word(0), word(1), word(2));
        const LOW6: u32 = 0x3f3f_3f3f;
        const LOW4: u32 = 0x0f0f_0f0f;
        const LOW2: u32 = 0x0303_0303;
        let sc_lo = u0 & LOW6;
        let sc_hi = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
        let mn_lo = u1 & LOW6;
        let mn_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
        let sc = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, sc_hi as i32, sc_lo as i32));
        let (d, dmin) = f16_two(p);
        Header {
            d,
            dmin,
            scales: _mm256_set_m128i(sc, sc),
            mins: _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, mn_hi as i32, mn_lo as i32)),
        }
    }
}

/// Q4_K/Q5_K: sub-block `g`'s scale in all sixteen lanes.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline(always)]
unsafe fn k45_group_scales(h: &Header, g: usize) -> __m256i {
    unsafe {
        let pick = (((2 * g + 1) << 8) | (2 * g)) as i16;
        _mm256_shuffle_epi8(h.scales, _mm256_set1_epi16(pick))
    }
}

/// Q4_K/Q5_K: `Σ_j min_j · (Σ xq over sub-block j)`, the activation sums taken in pairs.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `xs` must point at activation rows that hold every entry the arguments index.
#[inline(always)]
unsafe fn k45_corr(h: &Header, xs: *const i16) -> i32 {
    unsafe {
        let sums = _mm256_loadu_si256(xs as *const __m256i);
        // |pair| ≤ 32 · 127: fits an i16.
        let pairs = _mm_hadd_epi16(
            _mm256_castsi256_si128(sums),
            _mm256_extracti128_si256(sums, 1),
        );
        let m = _mm_madd_epi16(h.mins, pairs);
        let m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0b01_00_11_10));
        _mm_cvtsi128_si32(_mm_add_epi32(m, _mm_shuffle_epi32(m, 0b10_11_00_01)))
    }
}

/// Group `g` of Q4_K/Q5_K's nibbles at `qs` (segments `stride` apart): segment `g / 2`, low nibbles
/// for even `g`, high for odd.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `qs` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
unsafe fn k45_nibbles(qs: *const u8, stride: usize, g: usize) -> __m256i {
    unsafe {
        let raw = _mm256_loadu_si256(qs.add(stride * (g / 2)) as *const __m256i);
        let raw = if g.is_multiple_of(2) {
            raw
        } else {
            _mm256_srli_epi16(raw, 4)
        };
        _mm256_and_si256(raw, _mm256_set1_epi8(0x0F))
    }
}

/// What Q4_K and Q5_K share: the header, its scales and minima (they differ only in the fifth bit).
macro_rules! k45_shared {
    () => {
        const BY_16: bool = false;
        const HEADER: usize = 0;
        const HEADER_LEN: usize = 16;
        const DATA: usize = 16;
        #[inline(always)]
        fn scale_lane(g: usize, _: usize) -> usize {
            g
        }
        /// # Safety
        /// The CPU must support AVX2, FMA and F16C.
        #[inline(always)]
        unsafe fn corr_lanes(h: &Header) -> __m256i {
            unsafe {
                _mm256_set_m128i(
                    _mm_unpackhi_epi16(h.mins, h.mins),
                    _mm_unpacklo_epi16(h.mins, h.mins),
                )
            }
        }
        /// # Safety
        /// The CPU must support AVX2, FMA and F16C.
        /// `h` must point at weight bytes of the layout this function decodes, every byte it reads readable.
        #[inline(always)]
        unsafe fn header_at(h: *const u8) -> Header {
            unsafe { k45_header(h) }
        }
        /// # Safety
        /// The CPU must support AVX2, FMA and F16C.
        #[inline(always)]
        unsafe fn group_scales(h: &Header, g: usize) -> __m256i {
            unsafe { k45_group_scales(h, g) }
        }
        /// # Safety
        /// The CPU must support AVX2, FMA and F16C.
        /// `xs` must point at activation rows that hold every entry the arguments index.
        #[inline(always)]
        unsafe fn corr(h: &Header, xs: *const i16) -> i32 {
            unsafe { k45_corr(h, xs) }
        }
    };
}

impl KQuant for Q4K {
    const BYTES: usize = 144;
    const TOP: u8 = 15;
    k45_shared!();
    #[inline(always)]
    unsafe fn group_in(data: *const u8, stride: usize, g: usize) -> __m256i {
        unsafe { k45_nibbles(data, stride, g) }
    }
}

impl KQuant for Q5K {
    const BYTES: usize = 176;
    const TOP: u8 = 31;
    k45_shared!();
    #[inline(always)]
    unsafe fn group_in(data: *const u8, stride: usize, g: usize) -> __m256i {
        unsafe {
            // Segment 0 holds the fifth bits, the nibbles follow.
            let qh = _mm256_loadu_si256(data as *const __m256i);
            let bit = _mm256_and_si256(
                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(g as i32)),
                _mm256_set1_epi8(1),
            );
            _mm256_or_si256(
                k45_nibbles(data.add(stride), stride, g),
                _mm256_slli_epi16(bit, 4),
            )
        }
    }
}

impl KQuant for Q6K {
    const BYTES: usize = 210;
    const TOP: u8 = 63;
    const BY_16: bool = true;
    const HEADER: usize = 192;
    const HEADER_LEN: usize = 18;
    const DATA: usize = 0;
    #[inline(always)]
    fn scale_lane(g: usize, h: usize) -> usize {
        2 * g + h
    }
    #[inline(always)]
    unsafe fn corr_lanes(h: &Header) -> __m256i {
        unsafe {
            // The weights are q − 32: c_h = 32 · scale_h (|c_h| ≤ 4,096).
            _mm256_slli_epi16(h.scales, 5)
        }
    }
    #[inline(always)]
    unsafe fn header_at(h: *const u8) -> Header {
        unsafe {
            // Sixteen signed scales, then d.
            let d = f16_last(h.add(16));
            Header {
                d,
                dmin: d,
                scales: _mm256_cvtepi8_epi16(_mm_loadu_si128(h as *const __m128i)),
                mins: _mm_setzero_si128(),
            }
        }
    }
    #[inline(always)]
    unsafe fn group_scales(h: &Header, g: usize) -> __m256i {
        unsafe {
            // 32-bit lane g holds scales 2g and 2g + 1: spread it, then take the first for the low
            // half and the second for the high half.
            let both = _mm256_permutevar8x32_epi32(h.scales, _mm256_set1_epi32(g as i32));
            _mm256_shuffle_epi8(
                both,
                _mm256_set_epi64x(
                    0x0302_0302_0302_0302,
                    0x0302_0302_0302_0302,
                    0x0100_0100_0100_0100,
                    0x0100_0100_0100_0100,
                ),
            )
        }
    }
    #[inline(always)]
    unsafe fn corr(h: &Header, xs: *const i16) -> i32 {
        unsafe {
            // The weights are q − 32: c_h = 32 · scale_h.
            let sums = _mm256_loadu_si256(xs as *const __m256i);
            32 * super::finish::hsum_epi32(_mm256_madd_epi16(h.scales, sums))
        }
    }
    #[inline(always)]
    unsafe fn group_in(data: *const u8, stride: usize, g: usize) -> __m256i {
        unsafe {
            // Segments 0–3: low nibbles (two per 128 weights); 4–5: high bits (one per 128).
            let (half, t) = (g / 4, g % 4);
            let ql = _mm256_loadu_si256(data.add(stride * (2 * half + t % 2)) as *const __m256i);
            let qh = _mm256_loadu_si256(data.add(stride * (4 + half)) as *const __m256i);
            let low = _mm256_set1_epi8(0x0F);
            let lo = if t < 2 {
                _mm256_and_si256(ql, low)
            } else {
                _mm256_and_si256(_mm256_srli_epi16(ql, 4), low)
            };
            let hi = _mm256_and_si256(
                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t as i32)),
                _mm256_set1_epi8(3),
            );
            _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4))
        }
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `w` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
unsafe fn kquant_rows<F: KQuant, const W: usize>(
    w: [*const u8; W],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; 4]; W],
) {
    unsafe {
        match rows {
            1 => kquant::<F, 1, W>(w, x, r0, acc),
            2 => kquant::<F, 2, W>(w, x, r0, acc),
            3 => kquant::<F, 3, W>(w, x, r0, acc),
            _ => kquant::<F, 4, W>(w, x, r0, acc),
        }
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `w` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kquant<F: KQuant, const R: usize, const W: usize>(
    w: [*const u8; W],
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; 4]; W],
) {
    unsafe {
        debug_assert_eq!(x.block, 256);
        let kb = x.k / 256;
        let mut xq = [std::ptr::null::<i8>(); R];
        let mut xd = [std::ptr::null::<f32>(); R];
        let mut xs = [std::ptr::null::<i16>(); R];
        for i in 0..R {
            xq[i] = x.rows_from(r0 + i).as_ptr();
            xd[i] = x.scales_from(r0 + i).as_ptr();
            xs[i] = x.sums_from(r0 + i).as_ptr();
        }
        let mut total = [[0f32; R]; W];
        let dist = crate::kernels::dispatch::prefetch_distance();
        for b in 0..kb {
            let p: [*const u8; W] = std::array::from_fn(|c| w[c].add(b * F::BYTES));
            if dist > 0 {
                // The super-block `dist` bytes ahead, a line at a time (a hint: nothing is read; past
                // this row it is the next row's, which this task or a neighbour reads next).
                for row in p {
                    super::loads::prefetch_lines(row.wrapping_add(dist), F::BYTES);
                }
            }
            let hdr: [Header; W] = std::array::from_fn(|c| F::header(p[c]));
            let mut isum = [[_mm256_setzero_si256(); R]; W];
            for g in 0..8 {
                let xv: [__m256i; R] = std::array::from_fn(|i| {
                    _mm256_loadu_si256(xq[i].add(b * 256 + g * 32) as *const __m256i)
                });
                for c in 0..W {
                    let q = F::group(p[c], g);
                    let sv = F::group_scales(&hdr[c], g);
                    for i in 0..R {
                        // |pair| ≤ 2·63·127; times |scale| ≤ 128, over 8 groups: well inside i32.
                        let pairs = _mm256_maddubs_epi16(q, xv[i]);
                        isum[c][i] = _mm256_add_epi32(isum[c][i], _mm256_madd_epi16(pairs, sv));
                    }
                }
            }
            for c in 0..W {
                for i in 0..R {
                    let cs = F::corr(&hdr[c], xs[i].add(16 * b));
                    let s = hsum_epi32(isum[c][i]);
                    total[c][i] =
                        kquant_step(s, cs, hdr[c].d, hdr[c].dmin, *xd[i].add(b), total[c][i]);
                }
            }
        }
        for c in 0..W {
            acc[c][..R].copy_from_slice(&total[c]);
        }
    }
}
