//! Register-blocked AVX2 kernels for many activation rows (prefill, large batches): [`NW`] prepared
//! weight rows against up to [`R`] activation rows per call.
//!
//! Why it exists: the one-row kernels of [`super::avx2`] load every 32 activation bytes again for each
//! weight row, so with tiles of activation rows larger than L1 the products wait on cache bandwidth
//! (measured on the 1536 × 8960 shape: 68 GMAC/s on two cores at 256 rows). Here each activation
//! vector loaded serves `NW` weight rows and each weight vector `R` activation rows.
//!
//! Per (weight row, activation row) the float operations and their order are those of
//! [`super::avx2::dot_rows`] (integer sums per super-block or block, then the same fused
//! multiply-adds), so the outputs are bit-identical to the one-row kernels': a row's result does not
//! depend on the kernel its batch size picked.

use super::acts::Acts;
use super::avx2::{hsum, Prepared};
use super::BlockFormat;
use std::arch::x86_64::*;

/// Weight rows per call.
pub const NW: usize = 4;
/// Most activation rows per call.
pub const R: usize = 2;

/// Which kernel a prepared row needs; `NW` rows go together only when it is the same for all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    KQuant,
    Unsigned,
    Signed,
}

impl Kind {
    pub fn of(format: BlockFormat) -> Self {
        if format.is_k_quant() {
            Kind::KQuant
        } else if format == BlockFormat::Q8_0 {
            Kind::Signed
        } else {
            Kind::Unsigned
        }
    }
}

/// Products of `NW` prepared weight rows `p` (all of `kind`) with activation rows `r0 .. r0 + rows`
/// (1 ≤ rows ≤ [`R`]) into `acc[w][i]`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; every row of `p` must be prepared for `x.k` weights in a
/// format of `kind`, and `x` hold the rows asked for in that kind's activation block.
pub unsafe fn dot_block(
    kind: Kind,
    p: &[Prepared; NW],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; R]; NW],
) {
    match (kind, rows) {
        (Kind::KQuant, 1) => kquant::<1>(p, x, r0, acc),
        (Kind::KQuant, _) => kquant::<2>(p, x, r0, acc),
        (Kind::Unsigned, 1) => legacy::<1, false>(p, x, r0, acc),
        (Kind::Unsigned, _) => legacy::<2, false>(p, x, r0, acc),
        (Kind::Signed, 1) => legacy::<1, true>(p, x, r0, acc),
        (Kind::Signed, _) => legacy::<2, true>(p, x, r0, acc),
    }
}

/// k-quants: integer sums over each super-block, scaled per 16 weights by `madd`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kquant<const RR: usize>(
    p: &[Prepared; NW],
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; R]; NW],
) {
    debug_assert_eq!(x.block, 256);
    let (k, kb) = (x.k, x.k / 256);
    let xq = x.row(r0).as_ptr();
    let xd = x.scales(r0).as_ptr();
    let xs = x.row_sums(r0).as_ptr();
    let q: [*const u8; NW] = std::array::from_fn(|w| p[w].q.as_ptr());
    let mut total = [[_mm256_setzero_ps(); RR]; NW];
    for b in 0..kb {
        let mut isum = [[_mm256_setzero_si256(); RR]; NW];
        for g in 0..8 {
            let at = 256 * b + 32 * g;
            let xv: [__m256i; RR] =
                std::array::from_fn(|i| _mm256_loadu_si256(xq.add(i * k + at) as *const __m256i));
            for w in 0..NW {
                let wv = _mm256_loadu_si256(q[w].add(at) as *const __m256i);
                let sv =
                    _mm256_loadu_si256(p[w].sv.get_unchecked(8 * b + g).as_ptr() as *const __m256i);
                for i in 0..RR {
                    let pairs = _mm256_maddubs_epi16(wv, xv[i]);
                    isum[w][i] = _mm256_add_epi32(isum[w][i], _mm256_madd_epi16(pairs, sv));
                }
            }
        }
        for w in 0..NW {
            let cv = _mm256_loadu_si256(p[w].corr.get_unchecked(b).as_ptr() as *const __m256i);
            let (d, dmin) = (
                _mm256_set1_ps(*p[w].d.get_unchecked(b)),
                _mm256_set1_ps(*p[w].m.get_unchecked(b)),
            );
            for i in 0..RR {
                let sums = _mm256_loadu_si256(xs.add(i * (k / 16) + 16 * b) as *const __m256i);
                let c = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums, cv));
                let dx = _mm256_broadcast_ss(&*xd.add(i * kb + b));
                let v = _mm256_fmsub_ps(_mm256_cvtepi32_ps(isum[w][i]), d, _mm256_mul_ps(c, dmin));
                total[w][i] = _mm256_fmadd_ps(v, dx, total[w][i]);
            }
        }
    }
    for w in 0..NW {
        for i in 0..RR {
            acc[w][i] = hsum(total[w][i]);
        }
    }
}

/// 32-weight formats: `SIGNED` weights (Q8_0) through the sign trick, the others 0…31 with an
/// additive term per block (summed afterwards, in the same order as the one-row kernel). The `NW` rows
/// go in pairs: four rows of float accumulators for two activation rows would not fit the registers.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy<const RR: usize, const SIGNED: bool>(
    p: &[Prepared; NW],
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; R]; NW],
) {
    for w0 in (0..NW).step_by(LEGACY_NW) {
        legacy_part::<RR, SIGNED>(p, w0, x, r0, acc);
    }
}

/// Weight rows one pass of [`legacy_part`] takes.
const LEGACY_NW: usize = 2;

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_part<const RR: usize, const SIGNED: bool>(
    p: &[Prepared; NW],
    w0: usize,
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; R]; NW],
) {
    debug_assert_eq!(x.block, 32);
    let (k, kb) = (x.k, x.k / 32);
    let ones = _mm256_set1_epi16(1);
    let xq = x.row(r0).as_ptr();
    let xd = x.scales(r0).as_ptr();
    let q: [*const u8; LEGACY_NW] = std::array::from_fn(|w| p[w0 + w].q.as_ptr());
    let d: [*const f32; LEGACY_NW] = std::array::from_fn(|w| p[w0 + w].d.as_ptr());
    let mut total = [[_mm256_setzero_ps(); RR]; LEGACY_NW];
    for b in 0..kb {
        let xv: [__m256i; RR] =
            std::array::from_fn(|i| _mm256_loadu_si256(xq.add(i * k + 32 * b) as *const __m256i));
        for w in 0..LEGACY_NW {
            let wv = _mm256_loadu_si256(q[w].add(32 * b) as *const __m256i);
            let aw = if SIGNED { _mm256_sign_epi8(wv, wv) } else { wv };
            let dv = _mm256_set1_ps(*d[w].add(b));
            for i in 0..RR {
                // |pair| ≤ 2·128·127 (signed) or 2·31·127: no saturation.
                let pairs = if SIGNED {
                    _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[i], wv))
                } else {
                    _mm256_maddubs_epi16(wv, xv[i])
                };
                let sum = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones)), dv);
                let dx = _mm256_broadcast_ss(&*xd.add(i * kb + b));
                total[w][i] = _mm256_fmadd_ps(sum, dx, total[w][i]);
            }
        }
    }
    // The additive terms, as independent chains (one per pair) so their latency overlaps.
    let mut extra = [[0f32; RR]; LEGACY_NW];
    if !SIGNED {
        let m: [*const f32; LEGACY_NW] = std::array::from_fn(|w| p[w0 + w].m.as_ptr());
        let xs = x.row_scaled(r0).as_ptr();
        for b in 0..kb {
            for w in 0..LEGACY_NW {
                let mw = *m[w].add(b);
                for (i, e) in extra[w].iter_mut().enumerate() {
                    *e = mw.mul_add(*xs.add(i * kb + b), *e);
                }
            }
        }
    }
    for w in 0..LEGACY_NW {
        for i in 0..RR {
            acc[w0 + w][i] = hsum(total[w][i]) + extra[w][i];
        }
    }
}
