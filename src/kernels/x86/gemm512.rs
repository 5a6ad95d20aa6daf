//! The AVX-512 kernel for many activation rows on k-quants: two blocks of [`NW`] interleaved
//! weight rows (eight columns) against up to [`KR`] activation rows, each 512-bit `maddubs`
//! multiplying 8 weights of eight rows with 8 broadcast activation bytes.
//!
//! Why it exists: on CPUs with 512-bit integer units (Intel Xeons from Skylake-SP on) one
//! instruction does the work of two AVX2 ones in the products that dominate prefill and large
//! batches; llama.cpp built for such a CPU uses them. It reads the same [`Interleaved`] blocks
//! (nothing laid out anew: each 512-bit weight vector is two blocks' 32-byte chunks side by side),
//! computes the same exact integer sums per super-block and puts them through the AVX2 kernel's float
//! step (`gemm::finish_block`) lane by lane, two blocks per instruction, so its outputs are that
//! kernel's bits.

use super::finish::{store_totals, RowsAt, NW};
use super::fused;
use super::gemm::{Interleaved, Packed, Quad};
use crate::kernels::acts::Acts;
use crate::kernels::format::BlockFormat;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Most activation rows per call: twice the AVX2 kernel's, as the 32 vector registers allow; each
/// call decodes its weights once (measured on Qwen2.5-Coder-1.5B, see the README's speed section).
pub const KR: usize = 8;

/// Most activation rows [`dot_packed_pair`] takes in one call: [`KR`] rows at a time against each
/// super-block's headers, decoded once for all of them.
pub const MAX_ROWS: usize = 64;

/// Per [`KR`] activation rows of a call, `acc[s][w][i]`: block `s`'s weight row `w`, row `i`.
pub type Acc = [[[f32; KR]; NW]; 2];

/// Products of the eight weight rows interleaved in `p[0]` and `p[1]` (both of one chunk summing,
/// `Interleaved::by_16` equal) with activation rows `r0 .. r0 + rows` (1 ≤ rows ≤ [`KR`]) into
/// `acc[s][w][i]`, block `s`'s weight row `w`.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW as well as AVX2, FMA and F16C; both blocks must be
/// built for `x.k` weights and `x` hold the rows asked for, in 256-wide activation blocks; with
/// `vnni`, the CPU has AVX-512 VNNI and VL.
pub unsafe fn dot_pair(
    mut p: [&Interleaved; 2],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut Acc,
    vnni: bool,
) {
    unsafe {
        #[cfg(test)]
        {
            crate::kernels::ran::mark(crate::kernels::ran::Kernel::Avx512);
            if vnni {
                crate::kernels::ran::mark(crate::kernels::ran::Kernel::Vnni);
            }
        }
        debug_assert_eq!(p[0].by_16, p[1].by_16);
        debug_assert!(rows <= KR);
        dot_quads(&mut p, x, r0, rows, std::slice::from_mut(acc), vnni)
    }
}

/// [`dot_pair`] on two groups of four rows repacked at load (`super::packed`), both of `format`,
/// for up to [`MAX_ROWS`] activation rows: rows `r0 + KR·c …` into `acc[c]`. Each super-block's
/// headers are decoded once for all the rows (they were once per [`KR`] rows: at batch 32 four times).
///
/// # Safety
/// As [`dot_pair`]; both groups hold four repacked rows of `x.k` weights of `format`, a k-quant;
/// `rows ≤ MAX_ROWS` and `acc` has `rows.div_ceil(KR)` entries.
pub unsafe fn dot_packed_pair(
    format: BlockFormat,
    groups: [&[u8]; 2],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [Acc],
    vnni: bool,
) {
    unsafe {
        #[cfg(test)]
        {
            crate::kernels::ran::mark(crate::kernels::ran::Kernel::Avx512);
            if vnni {
                crate::kernels::ran::mark(crate::kernels::ran::Kernel::Vnni);
            }
        }
        debug_assert!(rows <= MAX_ROWS && acc.len() >= rows.div_ceil(KR));
        let g = groups.map(|g| g.as_ptr());
        with_kquant!(
            format,
            F => packed_quads::<F>(g, x, r0, rows, acc, vnni),
            _ => unreachable!("only k-quants are repacked")
        )
    }
}

/// # Safety
/// The CPU must support AVX-512F and AVX-512BW besides AVX2, FMA and F16C.
/// `groups` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
unsafe fn packed_quads<F: fused::KQuant>(
    groups: [*const u8; 2],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [Acc],
    vnni: bool,
) {
    unsafe { dot_quads(&mut groups.map(Packed::<F>::new), x, r0, rows, acc, vnni) }
}

/// Rows `r0 .. r0 + rows` in [`KR`]-row chunks, the last one of `rows % KR` rows (a kernel of its own).
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW besides AVX2, FMA and F16C.
#[inline(always)]
unsafe fn dot_quads<S: Quad>(
    p: &mut [S; 2],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [Acc],
    vnni: bool,
) {
    unsafe {
        let full = rows / KR;
        match (vnni, p[0].by_16(), rows % KR) {
            (false, false, 0) => kquant::<S, 0, false>(p, x, r0, full, acc),
            (false, false, 1) => kquant::<S, 1, false>(p, x, r0, full, acc),
            (false, false, 2) => kquant::<S, 2, false>(p, x, r0, full, acc),
            (false, false, 3) => kquant::<S, 3, false>(p, x, r0, full, acc),
            (false, false, 4) => kquant::<S, 4, false>(p, x, r0, full, acc),
            (false, false, 5) => kquant::<S, 5, false>(p, x, r0, full, acc),
            (false, false, 6) => kquant::<S, 6, false>(p, x, r0, full, acc),
            (false, false, 7) => kquant::<S, 7, false>(p, x, r0, full, acc),
            (false, true, 0) => kquant::<S, 0, true>(p, x, r0, full, acc),
            (false, true, 1) => kquant::<S, 1, true>(p, x, r0, full, acc),
            (false, true, 2) => kquant::<S, 2, true>(p, x, r0, full, acc),
            (false, true, 3) => kquant::<S, 3, true>(p, x, r0, full, acc),
            (false, true, 4) => kquant::<S, 4, true>(p, x, r0, full, acc),
            (false, true, 5) => kquant::<S, 5, true>(p, x, r0, full, acc),
            (false, true, 6) => kquant::<S, 6, true>(p, x, r0, full, acc),
            (false, true, 7) => kquant::<S, 7, true>(p, x, r0, full, acc),
            (true, false, 0) => kquant_vnni::<S, 0, false>(p, x, r0, full, acc),
            (true, false, 1) => kquant_vnni::<S, 1, false>(p, x, r0, full, acc),
            (true, false, 2) => kquant_vnni::<S, 2, false>(p, x, r0, full, acc),
            (true, false, 3) => kquant_vnni::<S, 3, false>(p, x, r0, full, acc),
            (true, false, 4) => kquant_vnni::<S, 4, false>(p, x, r0, full, acc),
            (true, false, 5) => kquant_vnni::<S, 5, false>(p, x, r0, full, acc),
            (true, false, 6) => kquant_vnni::<S, 6, false>(p, x, r0, full, acc),
            (true, false, 7) => kquant_vnni::<S, 7, false>(p, x, r0, full, acc),
            (true, true, 0) => kquant_vnni::<S, 0, true>(p, x, r0, full, acc),
            (true, true, 1) => kquant_vnni::<S, 1, true>(p, x, r0, full, acc),
            (true, true, 2) => kquant_vnni::<S, 2, true>(p, x, r0, full, acc),
            (true, true, 3) => kquant_vnni::<S, 3, true>(p, x, r0, full, acc),
            (true, true, 4) => kquant_vnni::<S, 4, true>(p, x, r0, full, acc),
            (true, true, 5) => kquant_vnni::<S, 5, true>(p, x, r0, full, acc),
            (true, true, 6) => kquant_vnni::<S, 6, true>(p, x, r0, full, acc),
            (true, true, 7) => kquant_vnni::<S, 7, true>(p, x, r0, full, acc),
            _ => unreachable!("rows % KR < KR"),
        }
    }
}

/// Two 256-bit vectors as one 512-bit vector, `lo` in the low half.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW besides AVX2, FMA and F16C.
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi) }
}

/// `full` chunks of [`KR`] activation rows from `r0` and one of `RT` rows after them (none when `RT`
/// is 0), chunk `c` into `acc[c]`.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn kquant<S: Quad, const RT: usize, const BY_16: bool>(
    p: &mut [S; 2],
    x: &Acts,
    r0: usize,
    full: usize,
    acc: &mut [Acc],
) {
    unsafe { kquant_body::<S, RT, BY_16, false>(p, x, r0, full, acc) }
}

/// [`kquant`] with AVX-512 VNNI. Sources whose values stay below 32 (Q4_K and Q5_K repacked, read in
/// place): each chunk's products summed by `vpdpbusd` straight into 32-bit lanes (four weights a lane),
/// as many chunks as keep the sums within 16 bits, then multiplied by the group's scales and added by
/// one `vpdpwssd`: for Q4_K 5 instructions a group and row, where `maddubs`, 16-bit adds, `madd` and a
/// 32-bit add take 10. The others (Q6_K, and the interleaved tiles, bounded by Q6_K's 63): the
/// `maddubs` sums as in [`kquant`], scaled and added by one `vpdpwssd` instead of `madd` and an add.
/// The integer sums are the same (no sum of the other kernel saturates), so are the bits.
///
/// A first form multiplied by the scales with `vpmulld` (two cycles of the one port that runs 512-bit
/// multiplies on the Xeon): `cargo bench --bench kernels -- --threads 1 --formats Q4K,Q6K --rows 8,32`,
/// two rounds, Xeon: Q4_K at 8 rows 1.61 → 1.48 ms; at 32 rows (tiles) 5.91 → 6.02; Q6_K at 8 rows
/// 2.01 → 2.03, at 32 6.27 → 6.9.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW, AVX-512 VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn kquant_vnni<S: Quad, const RT: usize, const BY_16: bool>(
    p: &mut [S; 2],
    x: &Acts,
    r0: usize,
    full: usize,
    acc: &mut [Acc],
) {
    unsafe { kquant_body::<S, RT, BY_16, true>(p, x, r0, full, acc) }
}

/// The super-block loop: each super-block's headers readied once ([`Quad::begin`]), then multiplied
/// with every chunk of activation rows, each chunk's float sums kept apart.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW besides AVX2, FMA and F16C (with `VNNI`, also AVX-512 VNNI and VL).
#[inline(always)]
unsafe fn kquant_body<S: Quad, const RT: usize, const BY_16: bool, const VNNI: bool>(
    p: &mut [S; 2],
    x: &Acts,
    r0: usize,
    full: usize,
    acc: &mut [Acc],
) {
    unsafe {
        debug_assert_eq!(x.block, 256);
        let chunks = full + usize::from(RT > 0);
        debug_assert!(chunks <= MAX_ROWS / KR && acc.len() >= chunks);
        let at = RowsAt::new(x, r0);
        // Only the chunks this call sums are zeroed: all eight were 2 KiB of stores a call, and a
        // prefill's calls are of one chunk (`pair_columns`).
        let mut room = [MaybeUninit::<[__m512; KR / 2]>::uninit(); MAX_ROWS / KR];
        for total in &mut room[..chunks] {
            total.write([_mm512_setzero_ps(); KR / 2]);
        }
        // SAFETY: the first `chunks` entries were written just above.
        let totals = &mut *(&mut room[..chunks] as *mut [MaybeUninit<[__m512; KR / 2]>]
            as *mut [[__m512; KR / 2]]);
        for b in 0..at.kb {
            p[0].begin(b);
            p[1].begin(b);
            for (c, total) in totals.iter_mut().take(full).enumerate() {
                super_block::<S, KR, BY_16, VNNI>(p, b, &at.skip(KR * c), total);
            }
            if RT > 0 {
                super_block::<S, RT, BY_16, VNNI>(p, b, &at.skip(KR * full), &mut totals[full]);
            }
        }
        for (c, (total, acc)) in totals.iter().zip(acc.iter_mut()).take(chunks).enumerate() {
            // Each half holds exactly what the AVX2 kernel's sums hold for that block.
            let mut lo = [_mm256_setzero_ps(); KR / 2];
            let mut hi = [_mm256_setzero_ps(); KR / 2];
            for pair in 0..KR / 2 {
                lo[pair] = _mm512_castps512_ps256(total[pair]);
                hi[pair] =
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(total[pair])));
            }
            if c < full {
                store_totals::<KR, KR>(&lo, &mut acc[0]);
                store_totals::<KR, KR>(&hi, &mut acc[1]);
            } else {
                store_totals::<RT, KR>(&lo, &mut acc[0]);
                store_totals::<RT, KR>(&hi, &mut acc[1]);
            }
        }
    }
}

/// Super-block `b` (readied) of both blocks against the `RR` activation rows at `at`, into `total`.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW besides AVX2, FMA and F16C (with `VNNI`, also AVX-512 VNNI and VL).
/// `b` must lie within what `self` or the rows were built for: they are read without bounds checks.
#[inline(always)]
unsafe fn super_block<S: Quad, const RR: usize, const BY_16: bool, const VNNI: bool>(
    p: &[S; 2],
    b: usize,
    at: &RowsAt,
    total: &mut [__m512; KR / 2],
) {
    unsafe {
        let mut isum = [_mm512_setzero_si512(); RR];
        let xb = at.xq.add(256 * b);
        // A loop the compiler keeps: unrolled over the eight groups, every activation load of the
        // super-block was hoisted to its start and spilled.
        for g in 0..8 {
            group::<S, RR, BY_16, VNNI>(p, b, g, xb, at.k, &mut isum);
        }
        finish_pair::<S, RR, VNNI>(p, b, &isum, at, total);
    }
}

/// Group `g` of super-block `b` of both blocks into `isum` (activation rows at `xb`, `k` apart):
/// [`kquant_body`]'s integer part.
// Indexes are clearer than iterators here: `h` picks both chunks and scales.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW besides AVX2, FMA and F16C (with `VNNI`, also AVX-512 VNNI and VL).
/// `xb` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn group<S: Quad, const RR: usize, const BY_16: bool, const VNNI: bool>(
    p: &[S; 2],
    b: usize,
    g: usize,
    xb: *const i8,
    k: usize,
    isum: &mut [__m512i; RR],
) {
    unsafe {
        let halves = if BY_16 { 2 } else { 1 };
        // Chunks `vpdpbusd` may sum in 32-bit lanes that `vpdpwssd` then scales as 16-bit values.
        let per = 32767 / (4 * 127 * S::TOP as usize);
        for h in 0..halves {
            let chunks = if BY_16 { 2 * h..2 * h + 2 } else { 0..4 };
            if VNNI && !BY_16 && per >= 2 {
                // Each row's scale in the low half of its 32-bit lanes: `vpdpwssd` multiplies a 32-bit
                // sum below 2^15 by it exactly.
                let s16 = join(p[0].scales32(b, g, h), p[1].scales32(b, g, h));
                // Chunks summed per lane before the scale: as many as keep |sum| ≤ 4 · per · TOP · 127
                // below 2^15 (four for Q4_K, two for Q5_K).
                let per = per.min(4);
                let mut c0 = chunks.start;
                while c0 < chunks.end {
                    let mut part = [_mm512_setzero_si512(); RR];
                    for c in c0..(c0 + per).min(chunks.end) {
                        let wv = join(p[0].chunk(b, g, c), p[1].chunk(b, g, c));
                        for (i, s) in part.iter_mut().enumerate() {
                            let xv = _mm512_set1_epi64(std::ptr::read_unaligned(
                                xb.add(i * k + 32 * g + 8 * c) as *const i64,
                            ));
                            // Per 32-bit lane: weights 4t … 4t + 3 of a row, exact.
                            *s = _mm512_dpbusd_epi32(*s, wv, xv);
                        }
                    }
                    for i in 0..RR {
                        isum[i] = _mm512_dpwssd_epi32(isum[i], part[i], s16);
                    }
                    c0 += per;
                }
                continue;
            }
            let scales = join(p[0].scales(b, g, h), p[1].scales(b, g, h));
            let mut part = [_mm512_setzero_si512(); RR];
            for c in chunks {
                let wv = join(p[0].chunk(b, g, c), p[1].chunk(b, g, c));
                for (i, s) in part.iter_mut().enumerate() {
                    let xv = _mm512_set1_epi64(std::ptr::read_unaligned(
                        xb.add(i * k + 32 * g + 8 * c) as *const i64,
                    ));
                    // Per 16-bit lane, the same sums as the AVX2 kernel's (bounds there).
                    *s = _mm512_add_epi16(*s, _mm512_maddubs_epi16(wv, xv));
                }
            }
            for i in 0..RR {
                isum[i] = if VNNI {
                    _mm512_dpwssd_epi32(isum[i], part[i], scales)
                } else {
                    _mm512_add_epi32(isum[i], _mm512_madd_epi16(part[i], scales))
                };
            }
        }
    }
}

/// `_mm256_hadd_epi32` on each 256-bit half: per 128-bit lane `a0 + a1, a2 + a3, b0 + b1, b2 + b3`.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn hadd(a: __m512i, b: __m512i) -> __m512i {
    let (a, b) = (_mm512_castsi512_ps(a), _mm512_castsi512_ps(b));
    let even = _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(a, b));
    let odd = _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(a, b));
    _mm512_add_epi32(even, odd)
}

/// [`finish_block`] for both blocks at once, block `s` in the 256-bit half `s` of every vector: the
/// same integer sums and the same float operations lane by lane (`total` holds, per pair of activation
/// rows, the two blocks' [`Totals`] lanes side by side), in half the instructions.
///
/// The corrections `Σ_h corr[w][h] · Σ xq_h` are summed in the layout of the integer sums (32-bit lane
/// `(s, w, parity)`), so that the horizontal add that pairs two activation rows' sums pairs their
/// corrections too: the four rows' corrections transposed once per super-block (four unpacks, four
/// permutes), then per activation row four multiply-adds of 16-bit pairs against the row's 16 sums
/// broadcast 64 bits at a time. The first form reduced each row's products with three horizontal adds
/// and a shuffle before pairing them (16 instructions a row against 4 here); the integers are the same,
/// so are the bits.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW besides AVX2, FMA and F16C (with `VNNI`, also AVX-512 VNNI and VL).
/// `b` must lie within what `self` or the rows were built for: they are read without bounds checks.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn finish_pair<S: Quad, const RR: usize, const VNNI: bool>(
    p: &[S; 2],
    b: usize,
    isum: &[__m512i; RR],
    x: &RowsAt,
    total: &mut [__m512; KR / 2],
) {
    unsafe {
        let RowsAt { xd, xs, k, kb, .. } = *x;
        // No closures here: they would not inherit the caller's target features, and every intrinsic in
        // them would become a call.
        let ((d0, m0), (d1, m1)) = (p[0].d(b), p[1].d(b));
        let dv = _mm512_castsi512_ps(join(_mm256_castps_si256(d0), _mm256_castps_si256(d1)));
        let dminv = _mm512_castsi512_ps(join(_mm256_castps_si256(m0), _mm256_castps_si256(m1)));
        let (c0, c1) = (p[0].corr(b), p[1].corr(b));
        let mut cw = [_mm512_setzero_si512(); NW];
        for w in 0..NW {
            cw[w] = join(c0[w], c1[w]);
        }
        // `ct[q]`, 32-bit lane (s, w, parity): 16-bit corrections 4q + 2·parity and the next of row w of
        // block s, i.e. 64-bit word q of each row's corrections, the four rows side by side per half.
        let (lo01, hi01) = (
            _mm512_unpacklo_epi64(cw[0], cw[1]),
            _mm512_unpackhi_epi64(cw[0], cw[1]),
        );
        let (lo23, hi23) = (
            _mm512_unpacklo_epi64(cw[2], cw[3]),
            _mm512_unpackhi_epi64(cw[2], cw[3]),
        );
        let even = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
        let odd = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
        let ct = [
            _mm512_permutex2var_epi64(lo01, even, lo23),
            _mm512_permutex2var_epi64(hi01, even, hi23),
            _mm512_permutex2var_epi64(lo01, odd, lo23),
            _mm512_permutex2var_epi64(hi01, odd, hi23),
        ];
        let mut c = [_mm512_setzero_si512(); RR];
        for i in 0..RR {
            let sums = xs.add(i * (k / 16) + 16 * b) as *const i64;
            for (q, t) in ct.iter().enumerate() {
                let xq = _mm512_set1_epi64(std::ptr::read_unaligned(sums.add(q)));
                c[i] = if VNNI {
                    _mm512_dpwssd_epi32(c[i], *t, xq)
                } else {
                    _mm512_add_epi32(c[i], _mm512_madd_epi16(*t, xq))
                };
            }
        }
        for pair in 0..RR.div_ceil(2) {
            let (i0, i1) = (2 * pair, (2 * pair + 1).min(RR - 1));
            // Per block: (i0, w0), (i0, w1), (i1, w0), (i1, w1) | the same for w2, w3; both the sums
            // and the corrections.
            let s = hadd(isum[i0], isum[i1]);
            let cc = hadd(c[i0], c[i1]);
            let (dx0, dx1) = (*xd.add(i0 * kb + b), *xd.add(i1 * kb + b));
            let dx = _mm512_castps256_ps512(_mm256_setr_ps(dx0, dx0, dx1, dx1, dx0, dx0, dx1, dx1));
            let dx = _mm512_shuffle_f32x4::<0b01_00_01_00>(dx, dx);
            let v = _mm512_fmsub_ps(
                _mm512_cvtepi32_ps(s),
                dv,
                _mm512_mul_ps(_mm512_cvtepi32_ps(cc), dminv),
            );
            total[pair] = _mm512_fmadd_ps(v, dx, total[pair]);
        }
    }
}

/// Whether two blocks can go through [`dot_pair`] together.
pub fn pairs_with(a: &Interleaved, b: &Interleaved) -> bool {
    a.by_16 == b.by_16
}
