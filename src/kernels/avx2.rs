//! The AVX2 kernels: one weight row's blocks decoded in registers and multiplied with up to four
//! activation rows while they sit there (weight-stationary), as ggml's `vec_dot` kernels do.
//!
//! Two loops serve every format, each generic over how a block is decoded:
//! - 32-weight formats ([`Legacy`]: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): per block, 32 weight bytes, a scale
//!   `d` and an additive term `m` per weight (Q4_1/Q5_1's minimum, or Q4_0/Q5_0's offset as `−8d`,
//!   `−16d`); activations in 32-wide blocks. Per block and row: `d·dx·Σ q·xq + m·dx·Σ xq`.
//! - k-quants ([`KQuant`]: Q4_K, Q5_K, Q6_K): per 256-weight super-block, eight groups of 32 unsigned
//!   weight bytes with integer scales per 16, summed in integers over the super-block as ggml does,
//!   then `d·dx·Σ − dmin·dx·Σ_h c_h·Σ xq_h`, where `c_h` is the sub-block minimum (Q4_K, Q5_K) or
//!   `32·sc_h` (Q6_K's offset); activations in 256-wide blocks (ggml's Q8_K).
//!
//! Every row is summed in the same order whatever its batch, so a sequence decodes to the same bits
//! alone or batched. The portable path ([`crate::kernels::dot::portable`]) is the reference they are
//! tested against.

use super::acts::Acts;
use super::format::f16_at;
use super::BlockFormat;
use std::arch::x86_64::*;

/// Products of one weight row (`w`, the file's blocks in `format`) with activation rows
/// `r0 .. r0 + rows` (1–4) into `acc[..rows]`.
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
    match format {
        BlockFormat::Q4_0 => legacy_rows::<Q4_0>(w, x, r0, rows, acc),
        BlockFormat::Q4_1 => legacy_rows::<Q4_1>(w, x, r0, rows, acc),
        BlockFormat::Q5_0 => legacy_rows::<Q5_0>(w, x, r0, rows, acc),
        BlockFormat::Q5_1 => legacy_rows::<Q5_1>(w, x, r0, rows, acc),
        BlockFormat::Q8_0 => legacy_rows::<Q8_0>(w, x, r0, rows, acc),
        BlockFormat::Q4K => kquant_rows::<Q4K>(w, x, r0, rows, acc),
        BlockFormat::Q5K => kquant_rows::<Q5K>(w, x, r0, rows, acc),
        BlockFormat::Q6K => kquant_rows::<Q6K>(w, x, r0, rows, acc),
    }
}

/// The sum of a vector's eight lanes.
#[inline(always)]
unsafe fn hsum(s: __m256) -> f32 {
    let v = _mm_add_ps(_mm256_extractf128_ps(s, 1), _mm256_castps256_ps128(s));
    let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)))
}

/// 32 weights from 16 bytes of nibbles at `p`: low nibbles are weights 0–15, high nibbles 16–31.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let raw = _mm_loadu_si128(p as *const __m128i);
    let low = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(raw, low);
    let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
    _mm256_set_m128i(hi, lo)
}

/// 0x10 in byte `i` where bit `i` of the 32 bits at `p` is set (Q5_0/Q5_1's fifth bits).
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    let bits = u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]);
    // byte i takes the source byte i / 8, then tests its bit i % 8
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// How a 32-weight block is decoded.
trait Legacy {
    const BYTES: usize;
    /// Signed weights (Q8_0) go through the sign trick; the others are 0…31 with an additive term.
    const SIGNED: bool;
    /// The block's 32 weights, its scale `d`, and the term `m` added to every weight.
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32);
}

struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;

impl Legacy for Q4_0 {
    const BYTES: usize = 18;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        let d = f16_at(std::slice::from_raw_parts(p, 2), 0);
        (nibbles(p.add(2)), d, -8.0 * d)
    }
}

impl Legacy for Q4_1 {
    const BYTES: usize = 20;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        let h = std::slice::from_raw_parts(p, 4);
        (nibbles(p.add(4)), f16_at(h, 0), f16_at(h, 2))
    }
}

impl Legacy for Q5_0 {
    const BYTES: usize = 22;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        let d = f16_at(std::slice::from_raw_parts(p, 2), 0);
        let q = _mm256_or_si256(nibbles(p.add(6)), fifth_bits(p.add(2)));
        (q, d, -16.0 * d)
    }
}

impl Legacy for Q5_1 {
    const BYTES: usize = 24;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        let h = std::slice::from_raw_parts(p, 4);
        let q = _mm256_or_si256(nibbles(p.add(8)), fifth_bits(p.add(4)));
        (q, f16_at(h, 0), f16_at(h, 2))
    }
}

impl Legacy for Q8_0 {
    const BYTES: usize = 34;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        let d = f16_at(std::slice::from_raw_parts(p, 2), 0);
        (_mm256_loadu_si256(p.add(2) as *const __m256i), d, 0.0)
    }
}

#[inline(always)]
unsafe fn legacy_rows<F: Legacy>(w: &[u8], x: &Acts, r0: usize, rows: usize, acc: &mut [f32; 4]) {
    match rows {
        1 => legacy::<F, 1>(w, x, r0, acc),
        2 => legacy::<F, 2>(w, x, r0, acc),
        3 => legacy::<F, 3>(w, x, r0, acc),
        _ => legacy::<F, 4>(w, x, r0, acc),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy<F: Legacy, const R: usize>(w: &[u8], x: &Acts, r0: usize, acc: &mut [f32; 4]) {
    debug_assert_eq!(x.block, 32);
    let kb = x.k / 32;
    let ones = _mm256_set1_epi16(1);
    let mut xq = [std::ptr::null::<i8>(); R];
    let mut xd = [std::ptr::null::<f32>(); R];
    let mut xs = [std::ptr::null::<f32>(); R];
    for i in 0..R {
        xq[i] = x.row(r0 + i).as_ptr();
        xd[i] = x.scales(r0 + i).as_ptr();
        xs[i] = x.row_scaled(r0 + i).as_ptr();
    }
    let mut total = [_mm256_setzero_ps(); R];
    let mut extra = [0f32; R];
    let wp = w.as_ptr();
    for b in 0..kb {
        let (q, d, m) = F::load(wp.add(b * F::BYTES));
        let aq = if F::SIGNED { _mm256_sign_epi8(q, q) } else { q };
        for i in 0..R {
            let xv = _mm256_loadu_si256(xq[i].add(b * 32) as *const __m256i);
            // |pair| ≤ 2·128·127 (signed) or 2·31·127: no saturation.
            let pairs = if F::SIGNED {
                _mm256_maddubs_epi16(aq, _mm256_sign_epi8(xv, q))
            } else {
                _mm256_maddubs_epi16(q, xv)
            };
            let dx = *xd[i].add(b);
            let sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            total[i] = _mm256_fmadd_ps(sum, _mm256_set1_ps(d * dx), total[i]);
            if !F::SIGNED {
                extra[i] = m.mul_add(*xs[i].add(b), extra[i]);
            }
        }
    }
    for i in 0..R {
        acc[i] = hsum(total[i]) + extra[i];
    }
}

/// How a 256-weight k-quant super-block is decoded.
trait KQuant {
    const BYTES: usize;
    /// The super-block's `d` and `dmin`; `scales[h]`, the integer scale of weights `16h … 16h + 15`;
    /// `corr[h]`, what multiplies their activation sum (subtracted, times `dmin`).
    unsafe fn header(p: *const u8, scales: &mut [i16; 16], corr: &mut [i16; 16]) -> (f32, f32);
    /// Group `g`'s 32 weights, unsigned.
    unsafe fn group(p: *const u8, g: usize) -> __m256i;
}

struct Q4K;
struct Q5K;
struct Q6K;

/// Q4_K/Q5_K's header: 6-bit scales and minima of eight 32-weight sub-blocks (ggml's
/// `get_scale_min_k4`), each spread over its two halves.
#[inline(always)]
unsafe fn k45_header(p: *const u8, scales: &mut [i16; 16], corr: &mut [i16; 16]) -> (f32, f32) {
    let h = std::slice::from_raw_parts(p, 16);
    let s = &h[4..16];
    for j in 0..8 {
        let (sc, m) = if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            (
                (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
                (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
            )
        };
        scales[2 * j] = sc as i16;
        scales[2 * j + 1] = sc as i16;
        corr[2 * j] = m as i16;
        corr[2 * j + 1] = m as i16;
    }
    (f16_at(h, 0), f16_at(h, 2))
}

/// Group `g` of Q4_K/Q5_K's nibbles at `qs`: chunk `g / 2`, low nibbles for even `g`, high for odd.
#[inline(always)]
unsafe fn k45_nibbles(qs: *const u8, g: usize) -> __m256i {
    let raw = _mm256_loadu_si256(qs.add(32 * (g / 2)) as *const __m256i);
    let raw = if g.is_multiple_of(2) {
        raw
    } else {
        _mm256_srli_epi16(raw, 4)
    };
    _mm256_and_si256(raw, _mm256_set1_epi8(0x0F))
}

impl KQuant for Q4K {
    const BYTES: usize = 144;
    #[inline(always)]
    unsafe fn header(p: *const u8, scales: &mut [i16; 16], corr: &mut [i16; 16]) -> (f32, f32) {
        k45_header(p, scales, corr)
    }
    #[inline(always)]
    unsafe fn group(p: *const u8, g: usize) -> __m256i {
        k45_nibbles(p.add(16), g)
    }
}

impl KQuant for Q5K {
    const BYTES: usize = 176;
    #[inline(always)]
    unsafe fn header(p: *const u8, scales: &mut [i16; 16], corr: &mut [i16; 16]) -> (f32, f32) {
        k45_header(p, scales, corr)
    }
    #[inline(always)]
    unsafe fn group(p: *const u8, g: usize) -> __m256i {
        let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
        let bit = _mm256_and_si256(
            _mm256_srl_epi16(qh, _mm_cvtsi32_si128(g as i32)),
            _mm256_set1_epi8(1),
        );
        _mm256_or_si256(k45_nibbles(p.add(48), g), _mm256_slli_epi16(bit, 4))
    }
}

impl KQuant for Q6K {
    const BYTES: usize = 210;
    #[inline(always)]
    unsafe fn header(p: *const u8, scales: &mut [i16; 16], corr: &mut [i16; 16]) -> (f32, f32) {
        let b = std::slice::from_raw_parts(p, 210);
        for h in 0..16 {
            let sc = b[192 + h] as i8 as i16;
            scales[h] = sc;
            corr[h] = 32 * sc; // the weights are q − 32
        }
        let d = f16_at(b, 208);
        (d, d)
    }
    #[inline(always)]
    unsafe fn group(p: *const u8, g: usize) -> __m256i {
        let (half, t) = (g / 4, g % 4);
        let ql = _mm256_loadu_si256(p.add(64 * half + 32 * (t % 2)) as *const __m256i);
        let qh = _mm256_loadu_si256(p.add(128 + 32 * half) as *const __m256i);
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

#[inline(always)]
unsafe fn kquant_rows<F: KQuant>(w: &[u8], x: &Acts, r0: usize, rows: usize, acc: &mut [f32; 4]) {
    match rows {
        1 => kquant::<F, 1>(w, x, r0, acc),
        2 => kquant::<F, 2>(w, x, r0, acc),
        3 => kquant::<F, 3>(w, x, r0, acc),
        _ => kquant::<F, 4>(w, x, r0, acc),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kquant<F: KQuant, const R: usize>(w: &[u8], x: &Acts, r0: usize, acc: &mut [f32; 4]) {
    debug_assert_eq!(x.block, 256);
    let kb = x.k / 256;
    let mut xq = [std::ptr::null::<i8>(); R];
    let mut xd = [std::ptr::null::<f32>(); R];
    let mut xs = [std::ptr::null::<i16>(); R];
    for i in 0..R {
        xq[i] = x.row(r0 + i).as_ptr();
        xd[i] = x.scales(r0 + i).as_ptr();
        xs[i] = x.row_sums(r0 + i).as_ptr();
    }
    let mut total = [_mm256_setzero_ps(); R];
    let (mut scales, mut corr) = ([0i16; 16], [0i16; 16]);
    let wp = w.as_ptr();
    for b in 0..kb {
        let p = wp.add(b * F::BYTES);
        let (d, dmin) = F::header(p, &mut scales, &mut corr);
        let mut isum = [_mm256_setzero_si256(); R];
        for g in 0..8 {
            let q = F::group(p, g);
            let sv = _mm256_set_m128i(
                _mm_set1_epi16(scales[2 * g + 1]),
                _mm_set1_epi16(scales[2 * g]),
            );
            for i in 0..R {
                let xv = _mm256_loadu_si256(xq[i].add(b * 256 + g * 32) as *const __m256i);
                // |pair| ≤ 2·63·127; times |scale| ≤ 128, over 8 groups: well inside i32.
                let pairs = _mm256_maddubs_epi16(q, xv);
                isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(pairs, sv));
            }
        }
        let cv = _mm256_loadu_si256(corr.as_ptr() as *const __m256i);
        for i in 0..R {
            let sums = _mm256_loadu_si256(xs[i].add(16 * b) as *const __m256i);
            let c = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums, cv));
            let dx = *xd[i].add(b);
            total[i] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(isum[i]),
                _mm256_set1_ps(d * dx),
                total[i],
            );
            total[i] = _mm256_fnmadd_ps(c, _mm256_set1_ps(dmin * dx), total[i]);
        }
    }
    for i in 0..R {
        acc[i] = hsum(total[i]);
    }
}
