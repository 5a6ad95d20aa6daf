//! The AVX-512 kernel for many activation rows on k-quants: two blocks of [`NW`] interleaved
//! weight rows (eight columns) against up to [`KR`] activation rows, each 512-bit `maddubs`
//! multiplying 8 weights of eight rows with 8 broadcast activation bytes.
//!
//! Why it exists: on CPUs with 512-bit integer units (Intel Xeons from Skylake-SP on) one
//! instruction does the work of two AVX2 ones in the products that dominate prefill and large
//! batches; llama.cpp built for such a CPU uses them. It reads the same [`Interleaved`] blocks
//! (nothing laid out anew: each 512-bit weight vector is two blocks' 32-byte chunks side by side),
//! computes the same exact integer sums per super-block and hands them to the AVX2 kernel's own float
//! step ([`finish_block`]), so its outputs are that kernel's bits.

use super::acts::Acts;
use super::gemm::{finish_block, store_totals, Interleaved, Totals, KR, NW};
use std::arch::x86_64::*;

/// Products of the eight weight rows interleaved in `p[0]` and `p[1]` (both of one chunk summing,
/// [`Interleaved::by_16`] equal) with activation rows `r0 .. r0 + rows` (1 ≤ rows ≤ [`KR`]) into
/// `acc[s][w][i]`, block `s`'s weight row `w`.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW as well as AVX2, FMA and F16C; both blocks must be
/// built for `x.k` weights and `x` hold the rows asked for, in 256-wide activation blocks.
pub unsafe fn dot_pair(
    p: [&Interleaved; 2],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[[f32; KR]; NW]; 2],
) {
    debug_assert_eq!(p[0].by_16, p[1].by_16);
    match (p[0].by_16, rows) {
        (false, 1) => kquant::<1, false>(p, x, r0, acc),
        (false, 2) => kquant::<2, false>(p, x, r0, acc),
        (false, 3) => kquant::<3, false>(p, x, r0, acc),
        (false, _) => kquant::<4, false>(p, x, r0, acc),
        (true, 1) => kquant::<1, true>(p, x, r0, acc),
        (true, 2) => kquant::<2, true>(p, x, r0, acc),
        (true, 3) => kquant::<3, true>(p, x, r0, acc),
        (true, _) => kquant::<4, true>(p, x, r0, acc),
    }
}

/// Two 32-byte vectors as one 512-bit vector, `lo` in the low half.
#[inline(always)]
unsafe fn join(lo: *const u8, hi: *const u8) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_loadu_si256(lo as *const __m256i)),
        _mm256_loadu_si256(hi as *const __m256i),
    )
}

// Indexes are clearer than iterators here: `h` picks both chunks and scales.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn kquant<const RR: usize, const BY_16: bool>(
    p: [&Interleaved; 2],
    x: &Acts,
    r0: usize,
    acc: &mut [[[f32; KR]; NW]; 2],
) {
    debug_assert_eq!(x.block, 256);
    let (k, kb) = (x.k, x.k / 256);
    let xq = x.row(r0).as_ptr();
    let q = p.map(|p| p.q.as_ptr());
    let mut total: [Totals; 2] = [[_mm256_setzero_ps(); KR / 2]; 2];
    for b in 0..kb {
        let mut isum = [_mm512_setzero_si512(); RR];
        for g in 0..8 {
            let at = 256 * b + 32 * g;
            let sv = p.map(|p| p.sv.get_unchecked(8 * b + g));
            let halves = if BY_16 { 2 } else { 1 };
            for h in 0..halves {
                let chunks = if BY_16 { 2 * h..2 * h + 2 } else { 0..4 };
                let mut part = [_mm512_setzero_si512(); RR];
                for c in chunks {
                    let off = 4 * (at + 8 * c);
                    let wv = join(q[0].add(off), q[1].add(off));
                    for (i, s) in part.iter_mut().enumerate() {
                        let xv = _mm512_set1_epi64(std::ptr::read_unaligned(
                            xq.add(i * k + at + 8 * c) as *const i64,
                        ));
                        // Per 16-bit lane, the same sums as the AVX2 kernel's (bounds there).
                        *s = _mm512_add_epi16(*s, _mm512_maddubs_epi16(wv, xv));
                    }
                }
                let scales = join(
                    sv[0][h].as_ptr() as *const u8,
                    sv[1][h].as_ptr() as *const u8,
                );
                for i in 0..RR {
                    isum[i] = _mm512_add_epi32(isum[i], _mm512_madd_epi16(part[i], scales));
                }
            }
        }
        // Each half holds exactly what the AVX2 kernel's sums hold for that block.
        let lo: [__m256i; RR] = std::array::from_fn(|i| _mm512_castsi512_si256(isum[i]));
        let hi: [__m256i; RR] = std::array::from_fn(|i| _mm512_extracti64x4_epi64::<1>(isum[i]));
        finish_block(p[0], b, &lo, x, r0, &mut total[0]);
        finish_block(p[1], b, &hi, x, r0, &mut total[1]);
    }
    store_totals::<RR>(&total[0], &mut acc[0]);
    store_totals::<RR>(&total[1], &mut acc[1]);
}

/// Whether two blocks can go through [`dot_pair`] together.
pub fn pairs_with(a: &Interleaved, b: &Interleaved) -> bool {
    a.by_16 == b.by_16
}
