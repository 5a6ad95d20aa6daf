//! The AVX2 kernels, weight-stationary as ggml's: a weight row's blocks are decoded once per tile of
//! activation rows ([`prepare`]: its values as bytes, its scales as the kernels use them; a row of 1,536
//! weights is 1.5 KiB and stays in L1), then multiplied with up to eight activation rows at a time,
//! every 32 weight bytes loaded once for all of them.
//!
//! Two kernels serve every format:
//! - 32-weight formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): per block, a scale `d` and a term `m` added to
//!   every weight (Q4_1/Q5_1's minimum, or Q4_0/Q5_0's offset as `−8d`, `−16d`); activations in 32-wide
//!   blocks. Per block and row: `d·dx·Σ q·xq + m·dx·Σ xq`. Q8_0's signed bytes take the sign trick.
//! - k-quants (Q4_K, Q5_K, Q6_K): per 256-weight super-block, eight groups of 32 unsigned bytes with
//!   integer scales per 16, summed in integers over the super-block as ggml does, then
//!   `(d·S − dmin·C)·dx` with `S = Σ sc·q·xq` and `C = Σ_h c_h·Σ xq_h`, where `c_h` is the sub-block
//!   minimum (Q4_K, Q5_K) or `32·sc_h` (Q6_K's offset); activations in 256-wide blocks (ggml's Q8_K).
//!   `S` and `C` are reduced to exact integers before any float operation (`kquant_step`), so
//!   kernels that split the work among lanes differently give the same bits.
//!
//! Every row is summed in the same order whatever its batch, so a sequence decodes to the same bits
//! alone or batched. The portable path ([`crate::kernels::portable::portable`]) is the reference they are
//! tested against.

use super::finish::{hsum, hsum_epi32, kquant_step};
use super::loads::{f16_last, f16_two, fifth_bits, nibbles};
use crate::kernels::acts::Acts;
use crate::kernels::format::BlockFormat;
use std::arch::x86_64::*;

/// Most activation rows one call multiplies.
pub const ROWS: usize = 8;

/// One weight row decoded for the kernels.
#[derive(Debug, Default)]
pub struct Prepared {
    pub(super) format: Option<BlockFormat>,
    /// The weights as bytes: unsigned, or signed for Q8_0.
    pub(super) q: crate::kernels::aligned::AlignedBytes<u8>,
    /// k-quants: per group of 32, the integer scales of its two halves as 16 lanes (8 + 8).
    pub(super) sv: Vec<[i16; 16]>,
    /// k-quants: per super-block, what multiplies each half's activation sum.
    pub(super) corr: Vec<[i16; 16]>,
    /// The scale per super-block (k-quants) or block.
    pub(super) d: Vec<f32>,
    /// `dmin` per super-block (k-quants), or the term added to each weight per block.
    pub(super) m: Vec<f32>,
}

impl Prepared {
    fn reset(&mut self, format: BlockFormat, k: usize) {
        self.format = Some(format);
        self.q.resize(k);
        let blocks = k / format.block_elems();
        self.d.resize(blocks, 0.0);
        self.m.resize(blocks, 0.0);
        if format.is_k_quant() {
            self.sv.resize(blocks * 8, [0; 16]);
            self.corr.resize(blocks, [0; 16]);
        }
    }
}

/// Decodes one weight row (`w`, the file's blocks in `format`, `k` weights) into `out`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `w` must hold whole blocks for `k` weights.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn prepare(format: BlockFormat, w: &[u8], k: usize, out: &mut Prepared) {
    unsafe {
        out.reset(format, k);
        let blocks = k / format.block_elems();
        let bytes = format.block_bytes();
        debug_assert!(w.len() >= blocks * bytes);
        let q = out.q.as_mut_ptr();
        for b in 0..blocks {
            let p = w.as_ptr().add(b * bytes);
            match format {
                BlockFormat::Q4_0
                | BlockFormat::Q4_1
                | BlockFormat::Q5_0
                | BlockFormat::Q5_1
                | BlockFormat::Q8_0 => {
                    // Every legacy block is at least 18 bytes: eight can be read.
                    let (d, m1) = f16_two(p);
                    let (v, m) = match format {
                        BlockFormat::Q4_0 => (nibbles(p.add(2)), -8.0 * d),
                        BlockFormat::Q4_1 => (nibbles(p.add(4)), m1),
                        BlockFormat::Q5_0 => (
                            _mm256_or_si256(nibbles(p.add(6)), fifth_bits(p.add(2))),
                            -16.0 * d,
                        ),
                        BlockFormat::Q5_1 => {
                            (_mm256_or_si256(nibbles(p.add(8)), fifth_bits(p.add(4))), m1)
                        }
                        _ => (_mm256_loadu_si256(p.add(2) as *const __m256i), 0.0),
                    };
                    _mm256_storeu_si256(q.add(32 * b) as *mut __m256i, v);
                    out.d[b] = d;
                    out.m[b] = m;
                }
                BlockFormat::Q4K | BlockFormat::Q5K => {
                    let h = std::slice::from_raw_parts(p, 16);
                    let s = &h[4..16];
                    for j in 0..8 {
                        let (sc, m) = crate::kernels::kquants::scale_min(j, s);
                        out.sv[8 * b + j] = [sc as i16; 16];
                        out.corr[b][2 * j] = m as i16;
                        out.corr[b][2 * j + 1] = m as i16;
                    }
                    (out.d[b], out.m[b]) = f16_two(p);
                    let low = _mm256_set1_epi8(0x0F);
                    let (qs, qh) = if format == BlockFormat::Q4K {
                        (p.add(16), None)
                    } else {
                        (
                            p.add(48),
                            Some(_mm256_loadu_si256(p.add(16) as *const __m256i)),
                        )
                    };
                    for j in 0..4 {
                        let raw = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
                        let mut lo = _mm256_and_si256(raw, low);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                        if let Some(qh) = qh {
                            let one = _mm256_set1_epi8(1);
                            let b0 = _mm256_and_si256(
                                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32)),
                                one,
                            );
                            let b1 = _mm256_and_si256(
                                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32 + 1)),
                                one,
                            );
                            lo = _mm256_or_si256(lo, _mm256_slli_epi16(b0, 4));
                            hi = _mm256_or_si256(hi, _mm256_slli_epi16(b1, 4));
                        }
                        _mm256_storeu_si256(q.add(256 * b + 64 * j) as *mut __m256i, lo);
                        _mm256_storeu_si256(q.add(256 * b + 64 * j + 32) as *mut __m256i, hi);
                    }
                }
                BlockFormat::Q6K => {
                    let sb = std::slice::from_raw_parts(p, 210);
                    for g in 0..8 {
                        let (lo, hi) = (
                            sb[192 + 2 * g] as i8 as i16,
                            sb[192 + 2 * g + 1] as i8 as i16,
                        );
                        let mut v = [lo; 16];
                        v[8..].fill(hi);
                        out.sv[8 * b + g] = v;
                    }
                    for h in 0..16 {
                        out.corr[b][h] = 32 * (sb[192 + h] as i8 as i16); // the weights are q − 32
                    }
                    let d = f16_last(p.add(208));
                    out.d[b] = d;
                    out.m[b] = d;
                    let (low, three) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
                    for half in 0..2 {
                        let ql0 = _mm256_loadu_si256(p.add(64 * half) as *const __m256i);
                        let ql1 = _mm256_loadu_si256(p.add(64 * half + 32) as *const __m256i);
                        let qh = _mm256_loadu_si256(p.add(128 + 32 * half) as *const __m256i);
                        let parts = [
                            (_mm256_and_si256(ql0, low), qh),
                            (_mm256_and_si256(ql1, low), _mm256_srli_epi16(qh, 2)),
                            (
                                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                                _mm256_srli_epi16(qh, 4),
                            ),
                            (
                                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                                _mm256_srli_epi16(qh, 6),
                            ),
                        ];
                        for (t, (l, h)) in parts.into_iter().enumerate() {
                            let v = _mm256_or_si256(
                                l,
                                _mm256_slli_epi16(_mm256_and_si256(h, three), 4),
                            );
                            _mm256_storeu_si256(
                                q.add(256 * b + 128 * half + 32 * t) as *mut __m256i,
                                v,
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Products of a prepared weight row with activation rows `r0 .. r0 + rows` (1–8) into `acc[..rows]`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `p` must be prepared for `x.k` weights and `x` hold the
/// rows asked for, quantized in the format's activation block (32, or 256 for k-quants).
pub unsafe fn dot_rows(p: &Prepared, x: &Acts, r0: usize, rows: usize, acc: &mut [f32; ROWS]) {
    unsafe {
        #[cfg(test)]
        crate::kernels::ran::mark(crate::kernels::ran::Kernel::Avx2);
        let format = p.format.expect("a prepared row");
        macro_rules! by_rows {
        ($kernel:ident $(, $flag:expr)?) => {
            match rows {
                1 => $kernel::<1 $(, $flag)?>(p, x, r0, acc),
                2 => $kernel::<2 $(, $flag)?>(p, x, r0, acc),
                3 => $kernel::<3 $(, $flag)?>(p, x, r0, acc),
                4 => $kernel::<4 $(, $flag)?>(p, x, r0, acc),
                5 => $kernel::<5 $(, $flag)?>(p, x, r0, acc),
                6 => $kernel::<6 $(, $flag)?>(p, x, r0, acc),
                7 => $kernel::<7 $(, $flag)?>(p, x, r0, acc),
                _ => $kernel::<8 $(, $flag)?>(p, x, r0, acc),
            }
        };
    }
        if format.is_k_quant() {
            by_rows!(kquant)
        } else if format == BlockFormat::Q8_0 {
            by_rows!(legacy, true)
        } else {
            by_rows!(legacy, false)
        }
    }
}

/// 32-weight formats: `SIGNED` weights (Q8_0) go through the sign trick (`|w| · sign(x, w)`); the
/// others are 0…31 with an additive term per block.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `r0` must lie within what `self` or the rows were built for: they are read without bounds checks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy<const R: usize, const SIGNED: bool>(
    p: &Prepared,
    x: &Acts,
    r0: usize,
    acc: &mut [f32; ROWS],
) {
    unsafe {
        debug_assert_eq!(x.block, 32);
        let (k, kb) = (x.k, x.k / 32);
        let ones = _mm256_set1_epi16(1);
        let xq = x.rows_from(r0).as_ptr();
        let xd = x.scales_from(r0).as_ptr();
        let xs = x.scaled_from(r0).as_ptr();
        let mut total = [_mm256_setzero_ps(); R];
        let mut extra = [0f32; R];
        let q = p.q.as_ptr();
        for b in 0..kb {
            let w = _mm256_loadu_si256(q.add(32 * b) as *const __m256i);
            let aw = if SIGNED { _mm256_sign_epi8(w, w) } else { w };
            let (d, m) = (*p.d.get_unchecked(b), *p.m.get_unchecked(b));
            let dv = _mm256_set1_ps(d);
            for i in 0..R {
                let xv = _mm256_loadu_si256(xq.add(i * k + 32 * b) as *const __m256i);
                // |pair| ≤ 2·128·127 (signed) or 2·31·127: no saturation.
                let pairs = if SIGNED {
                    _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, w))
                } else {
                    _mm256_maddubs_epi16(w, xv)
                };
                let sum = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones)), dv);
                total[i] =
                    _mm256_fmadd_ps(sum, _mm256_broadcast_ss(&*xd.add(i * kb + b)), total[i]);
                if !SIGNED {
                    extra[i] = m.mul_add(*xs.add(i * kb + b), extra[i]);
                }
            }
        }
        for i in 0..R {
            acc[i] = hsum(total[i]) + extra[i];
        }
    }
}

/// k-quants: integer sums over each super-block, scaled per 16 weights by `madd`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `r0` must lie within what `self` or the rows were built for: they are read without bounds checks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kquant<const R: usize>(p: &Prepared, x: &Acts, r0: usize, acc: &mut [f32; ROWS]) {
    unsafe {
        debug_assert_eq!(x.block, 256);
        let (k, kb) = (x.k, x.k / 256);
        let xq = x.rows_from(r0).as_ptr();
        let xd = x.scales_from(r0).as_ptr();
        let xs = x.sums_from(r0).as_ptr();
        let mut total = [0f32; R];
        let q = p.q.as_ptr();
        for b in 0..kb {
            let mut isum = [_mm256_setzero_si256(); R];
            for g in 0..8 {
                let w = _mm256_loadu_si256(q.add(256 * b + 32 * g) as *const __m256i);
                let sv =
                    _mm256_loadu_si256(p.sv.get_unchecked(8 * b + g).as_ptr() as *const __m256i);
                for (i, sum) in isum.iter_mut().enumerate() {
                    let xv = _mm256_loadu_si256(xq.add(i * k + 256 * b + 32 * g) as *const __m256i);
                    // |pair| ≤ 2·63·127; times |scale| ≤ 128, over 8 groups: well inside i32.
                    let pairs = _mm256_maddubs_epi16(w, xv);
                    *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(pairs, sv));
                }
            }
            let cv = _mm256_loadu_si256(p.corr.get_unchecked(b).as_ptr() as *const __m256i);
            let (d, dmin) = (*p.d.get_unchecked(b), *p.m.get_unchecked(b));
            for i in 0..R {
                let sums = _mm256_loadu_si256(xs.add(i * (k / 16) + 16 * b) as *const __m256i);
                let c = hsum_epi32(_mm256_madd_epi16(sums, cv));
                total[i] = kquant_step(
                    hsum_epi32(isum[i]),
                    c,
                    d,
                    dmin,
                    *xd.add(i * kb + b),
                    total[i],
                );
            }
        }
        acc[..R].copy_from_slice(&total);
    }
}
