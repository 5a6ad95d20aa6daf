//! Q4_K and Q5_K on repacked groups of four rows (`super::packed`) with AVX-512 VNNI on 256-bit
//! vectors: the kernel of a decoding step's products on Qwen2.5's Q4_K_M files, where one row of
//! activations meets every weight once and the products must go at the speed memory brings the
//! weights.
//!
//! Why it is not [`super::gemm`]'s `kquant_vnni` (which takes every k-quant and every layout through
//! its `Quad` trait): at one activation row the multiplies are a third of that kernel's work, and the
//! rest (the headers' decoding into per-row scale vectors, the per-group scaling, the float step with
//! its correction by the minima) is per super-block and does not shrink with the rows. Here:
//! - a group's scales are picked by one byte shuffle straight from the header's scale bytes, and two
//!   parts of 16-bit sums (two groups of Q4_K, or two halves of a Q5_K group) are packed into one
//!   vector and scaled by one `vpdpwssd` (where two shuffles, two `vpdpwssd` and two zeroings were);
//! - the minima multiply the activations' sums per 32 values (`crate::kernels::acts::Acts::sums32`), not per
//!   16 with every minimum twice: two `vpmaddwd` per activation row where four were, fewer shuffles;
//! - on CPUs with GFNI the high nibbles of Q4_K's odd groups come out of one `vgf2p8affineqb` (a bit
//!   matrix per byte: bits 4–7 to 0–3) instead of a shift and a mask.
//!
//! Integer sums are exact and the float step is [`super::gemm`]'s (the same operations on the same
//! integers, in the same lanes), so the results are bit-identical to every other kernel's.
//!
//! Measured on the AMD EPYC Zen 4 (family 25 model 17; README, speed), against `kquant_vnni` in one
//! process, alternating: on a 512 × 1536 Q4_K matrix held in cache (one core), 1.12× at one
//! activation row, 1.13× at two, 1.24× at three, 1.19× at four; in Qwen2.5-Coder-1.5B's decoding
//! steps (`kvbench perf`, the two kernels every two steps) 1.02× at batch 1 on one thread, 1.03× at
//! batch 2 and 1.06× at batch 4 on two, and 0.99–1.00× at batch 1 on two threads, where the step
//! waits on memory (both kernels read the weights at the rate a plain read loop does there).

use super::finish::{float_step, store_totals, RowsAt, Totals, KR, NW};
use super::fused::KQuant;
use super::gemm::{k45_d_dmin, k45_scale_bytes};
use crate::kernels::acts::Acts;
use crate::kernels::dispatch::has_gfni;
use crate::kernels::format::BlockFormat;
use std::arch::x86_64::*;

/// Whether this module multiplies repacked groups of `format` (Q4_K and Q5_K: not scaled per 16).
pub fn takes(format: BlockFormat) -> bool {
    with_kquant!(format, F => !F::BY_16, _ => false)
}

/// `dot` for a group of a runtime `format`.
///
/// # Safety
/// As `dot`; [`takes`]`(format)`.
pub unsafe fn dot_packed(
    format: BlockFormat,
    group: &[u8],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; KR]; NW],
) {
    debug_assert!(takes(format));
    let g = group.as_ptr();
    // SAFETY: the caller's contract is `dot`'s for this format.
    with_kquant!(format, F => unsafe { dot::<F>(g, x, r0, rows, acc) }, _ => unreachable!())
}

/// Products of the repacked group at `group` (four rows of `F`, Q4_K or Q5_K) with activation rows
/// `r0 .. r0 + rows` (1 ≤ rows ≤ [`KR`]) into `acc[w][i]`.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI; `group` holds four repacked rows
/// of `x.k` weights of `F` (not scaled per 16, [`KQuant::BY_16`] false) and `x` the rows asked for,
/// in 256-wide activation blocks.
pub(super) unsafe fn dot<F: KQuant>(
    group: *const u8,
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; KR]; NW],
) {
    unsafe {
        debug_assert!(!F::BY_16);
        #[cfg(test)]
        {
            crate::kernels::ran::mark(crate::kernels::ran::Kernel::Vnni);
            if has_gfni() {
                crate::kernels::ran::mark(crate::kernels::ran::Kernel::Gfni);
            }
        }
        if has_gfni() {
            match rows {
                1 => with_gfni::<F, 1>(group, x, r0, acc),
                2 => with_gfni::<F, 2>(group, x, r0, acc),
                3 => with_gfni::<F, 3>(group, x, r0, acc),
                _ => with_gfni::<F, 4>(group, x, r0, acc),
            }
        } else {
            match rows {
                1 => without_gfni::<F, 1>(group, x, r0, acc),
                2 => without_gfni::<F, 2>(group, x, r0, acc),
                3 => without_gfni::<F, 3>(group, x, r0, acc),
                _ => without_gfni::<F, 4>(group, x, r0, acc),
            }
        }
    }
}

/// # Safety
/// The CPU must support AVX2, FMA, F16C, AVX-512F, AVX-512BW, AVX-512VL, AVX-512 VNNI and GFNI.
/// `group` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
unsafe fn with_gfni<F: KQuant, const RR: usize>(
    group: *const u8,
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; KR]; NW],
) {
    unsafe { kernel::<F, RR, true>(group, x, r0, acc) }
}

/// # Safety
/// The CPU must support AVX2, FMA, F16C, AVX-512F, AVX-512BW, AVX-512VL and AVX-512 VNNI.
/// `group` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn without_gfni<F: KQuant, const RR: usize>(
    group: *const u8,
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; KR]; NW],
) {
    unsafe { kernel::<F, RR, false>(group, x, r0, acc) }
}

/// A super-block's four headers as this kernel uses them.
struct Meta {
    /// Scale bytes: per 128-bit half, bytes 0–7 the first row's eight scales, 8–15 the second's
    /// (rows 0 and 1 in the low half, 2 and 3 in the high).
    scales: __m256i,
    /// Minima in 16 bits: `mins[0]` rows 0 (low half) and 2 (high), `mins[1]` rows 1 and 3.
    mins: [__m256i; 2],
    d: __m256,
    dmin: __m256,
}

impl Meta {
    /// From the four 16-byte headers at `src` (one after another, as [`super::packed`] stores them).
    ///
    /// # Safety
    /// The CPU must support AVX-512F, BW, VL and VNNI besides AVX2, FMA and F16C.
    /// `src` must point at weight bytes of the layout this function decodes, every byte it reads readable.
    #[inline(always)]
    unsafe fn at(src: *const u8) -> Self {
        unsafe {
            let a = _mm256_loadu_si256(src as *const __m256i);
            let b = _mm256_loadu_si256(src.add(32) as *const __m256i);
            let (sa, sb) = (k45_scale_bytes(a), k45_scale_bytes(b));
            // `sc`: the low half holds rows 0 and 2's scale bytes, the high half rows 1 and 3's (`mn` the
            // same for the minima); the scales' quadwords are then put in row order.
            let sc = _mm256_unpacklo_epi64(sa, sb);
            let mn = _mm256_unpackhi_epi64(sa, sb);
            let (d, dmin) = k45_d_dmin(a, b);
            Self {
                scales: _mm256_permute4x64_epi64::<0b11_01_10_00>(sc),
                mins: [
                    _mm256_cvtepu8_epi16(_mm256_castsi256_si128(mn)),
                    _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(mn)),
                ],
                d,
                dmin,
            }
        }
    }

    /// The words that scale [`pack`]ed parts of groups `lo` and `hi` ([`scale_pick`]).
    ///
    /// # Safety
    /// The CPU must support AVX-512F, BW, VL and VNNI besides AVX2, FMA and F16C.
    /// The buffers it reads must hold the rows asked for: they are read without bounds checks.
    #[inline(always)]
    unsafe fn pick(&self, table: &[i8; 32]) -> __m256i {
        unsafe {
            _mm256_shuffle_epi8(
                self.scales,
                _mm256_loadu_si256(table.as_ptr() as *const __m256i),
            )
        }
    }
}

/// The byte shuffle that turns [`Meta::scales`] into the 16-bit scales of a [`pack`]ed vector whose
/// low words come from group `lo` and high words from group `hi`: per half, words 0–1 the first
/// row's scale of `lo`, 2–3 the second row's, 4–5 and 6–7 the same of `hi` (high bytes zero).
const fn scale_pick(lo: usize, hi: usize) -> [i8; 32] {
    let mut t = [-128i8; 32];
    let mut i = 0;
    while i < 32 {
        let word = (i % 16) / 2;
        if i % 2 == 0 {
            let group = if word < 4 { lo } else { hi };
            let second_row = (word % 4) / 2;
            t[i] = (8 * second_row + group) as i8;
        }
        i += 1;
    }
    t
}

/// Q4_K: groups `2p` and `2p + 1` packed together.
static PAIRS: [[i8; 32]; 4] = [
    scale_pick(0, 1),
    scale_pick(2, 3),
    scale_pick(4, 5),
    scale_pick(6, 7),
];
/// Q5_K: the two halves of group `g` packed together.
static HALVES: [[i8; 32]; 8] = [
    scale_pick(0, 0),
    scale_pick(1, 1),
    scale_pick(2, 2),
    scale_pick(3, 3),
    scale_pick(4, 4),
    scale_pick(5, 5),
    scale_pick(6, 6),
    scale_pick(7, 7),
];

/// Chunk `c` of group `G` of the super-block whose nibbles start at `data` (segments 128 bytes
/// apart): [`KQuant::group_in`], or with GFNI one affine byte operation for Q4_K's high nibbles (Q4_K
/// is the one k-quant whose values top at 15; Q5_K's fifth bit goes through `group_in`).
///
/// # Safety
/// The CPU must support AVX-512F, BW, VL and VNNI besides AVX2, FMA and F16C (with `GF`, also GFNI).
/// `data` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
unsafe fn chunk<F: KQuant, const G: usize, const GF: bool>(data: *const u8, c: usize) -> __m256i {
    unsafe {
        let at = data.add(32 * c);
        if GF && F::TOP == 15 && G % 2 == 1 {
            let raw = _mm256_loadu_si256(at.add(128 * (G / 2)) as *const __m256i);
            // Output bit i (0–3) is input bit i + 4: matrix byte 7 - i holds 1 << (i + 4).
            _mm256_gf2p8affine_epi64_epi8::<0>(raw, _mm256_set1_epi64x(0x1020_4080_0000_0000))
        } else {
            F::group_in(at, 128, G)
        }
    }
}

/// Chunks `c0 .. c0 + n` of group `G` against each activation row (at `xb`, `k` apart), summed per
/// 32-bit lane (four weights of a row each): below 2^15, as [`pack`] needs.
///
/// # Safety
/// The CPU must support AVX-512F, BW, VL and VNNI besides AVX2, FMA and F16C (with `GF`, also GFNI).
/// `data` must point at weight bytes of the layout this function decodes, every byte it reads readable.
/// `xb` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
unsafe fn part<F: KQuant, const RR: usize, const G: usize, const GF: bool>(
    data: *const u8,
    xb: *const i8,
    k: usize,
    c0: usize,
    n: usize,
) -> [__m256i; RR] {
    unsafe {
        let mut sums = [_mm256_setzero_si256(); RR];
        for c in c0..c0 + n {
            let w = chunk::<F, G, GF>(data, c);
            for (i, s) in sums.iter_mut().enumerate() {
                let xv = _mm256_set1_epi64x(std::ptr::read_unaligned(
                    xb.add(i * k + 32 * G + 8 * c) as *const i64,
                ));
                *s = _mm256_dpbusd_epi32(*s, w, xv);
            }
        }
        sums
    }
}

/// Two parts' 32-bit sums (each below 2^15) as 16-bit words in one vector, scaled by `scales` and
/// added to `isum`: per half, words 0–3 `lo`'s lanes 0–3, words 4–7 `hi`'s (`vpackssdw`, which
/// saturates nothing here).
///
/// # Safety
/// The CPU must support AVX-512F, BW, VL and VNNI besides AVX2, FMA and F16C.
#[inline(always)]
unsafe fn pack<const RR: usize>(
    isum: &mut [__m256i; RR],
    lo: [__m256i; RR],
    hi: [__m256i; RR],
    scales: __m256i,
) {
    unsafe {
        for i in 0..RR {
            isum[i] = _mm256_dpwssd_epi32(isum[i], _mm256_packs_epi32(lo[i], hi[i]), scales);
        }
    }
}

/// Groups `E` and `O = E + 1` of one super-block into `isum`.
///
/// # Safety
/// The CPU must support AVX-512F, BW, VL and VNNI besides AVX2, FMA and F16C (with `GF`, also GFNI).
/// `data` must point at weight bytes of the layout this function decodes, every byte it reads readable.
/// `xb` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
unsafe fn group_pair<F: KQuant, const RR: usize, const E: usize, const O: usize, const GF: bool>(
    meta: &Meta,
    data: *const u8,
    xb: *const i8,
    k: usize,
    isum: &mut [__m256i; RR],
) {
    unsafe {
        // Chunks summed before the scale: |sum| ≤ 4 · per · TOP · 127 < 2^15 (four chunks for Q4_K, two
        // for Q5_K).
        if 4 * 4 * F::TOP as usize * 127 < 1 << 15 {
            let even = part::<F, RR, E, GF>(data, xb, k, 0, 4);
            let odd = part::<F, RR, O, GF>(data, xb, k, 0, 4);
            pack(isum, even, odd, meta.pick(&PAIRS[E / 2]));
        } else {
            let (a0, a1) = (
                part::<F, RR, E, GF>(data, xb, k, 0, 2),
                part::<F, RR, E, GF>(data, xb, k, 2, 2),
            );
            pack(isum, a0, a1, meta.pick(&HALVES[E]));
            let (b0, b1) = (
                part::<F, RR, O, GF>(data, xb, k, 0, 2),
                part::<F, RR, O, GF>(data, xb, k, 2, 2),
            );
            pack(isum, b0, b1, meta.pick(&HALVES[O]));
        }
    }
}

/// The products, per super-block: the four group pairs, then [`float_step`] on the exact
/// sums, in the lanes `finish_block` gives it.
// Indexes are clearer than iterators here: `i` picks sums and activation rows.
///
/// # Safety
/// The CPU must support AVX-512F, BW, VL and VNNI besides AVX2, FMA and F16C (with `GF`, also GFNI).
/// `group` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn kernel<F: KQuant, const RR: usize, const GF: bool>(
    group: *const u8,
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; KR]; NW],
) {
    unsafe {
        let at = RowsAt::new(x, r0);
        let RowsAt {
            xq,
            xd,
            xs32,
            k,
            kb,
            ..
        } = at;
        let ahead = NW * crate::kernels::dispatch::prefetch_distance();
        let block_bytes = NW * F::BYTES;
        let mut total: Totals = [_mm256_setzero_ps(); KR / 2];
        for b in 0..kb {
            let src = group.add(b * block_bytes);
            if ahead > 0 {
                super::loads::prefetch_lines(src.wrapping_add(ahead), block_bytes);
            }
            let meta = Meta::at(src);
            let data = src.add(NW * F::HEADER_LEN);
            let xb = xq.add(256 * b);
            // Per activation row, lanes: rows 0, 1, 0, 1 | 2, 3, 2, 3 (each row's sum in two lanes).
            let mut isum = [_mm256_setzero_si256(); RR];
            group_pair::<F, RR, 0, 1, GF>(&meta, data, xb, k, &mut isum);
            group_pair::<F, RR, 2, 3, GF>(&meta, data, xb, k, &mut isum);
            group_pair::<F, RR, 4, 5, GF>(&meta, data, xb, k, &mut isum);
            group_pair::<F, RR, 6, 7, GF>(&meta, data, xb, k, &mut isum);
            for pair in 0..RR.div_ceil(2) {
                let (i0, i1) = (2 * pair, (2 * pair + 1).min(RR - 1));
                // Lanes in `pair_lanes`' order: activation rows i0, i0, i1, i1 of weight rows 0, 1 (low
                // half) and 2, 3 (high half).
                let s = _mm256_add_epi32(
                    _mm256_unpacklo_epi64(isum[i0], isum[i1]),
                    _mm256_unpackhi_epi64(isum[i0], isum[i1]),
                );
                let c = _mm256_hadd_epi32(
                    min_sums(&meta, xs32, k, b, i0),
                    min_sums(&meta, xs32, k, b, i1),
                );
                let dx = (*xd.add(i0 * kb + b), *xd.add(i1 * kb + b));
                total[pair] = float_step(s, c, meta.d, meta.dmin, dx, total[pair]);
            }
        }
        store_totals::<RR, KR>(&total, acc);
    }
}

/// For activation row `i` and super-block `b`: per half, two partial sums of `Σ_g min_g · Σ x_g`
/// (over the activations' sums per 32) for each of its two weight rows, in the order
/// `hadd` of two such vectors makes [`pair_lanes`](super::gemm) of.
///
/// # Safety
/// The CPU must support AVX-512F, BW, VL and VNNI besides AVX2, FMA and F16C.
/// `xs32` must point at activation rows that hold every entry the arguments index.
#[inline(always)]
unsafe fn min_sums(meta: &Meta, xs32: *const i16, k: usize, b: usize, i: usize) -> __m256i {
    unsafe {
        let sums = _mm256_broadcastsi128_si256(_mm_loadu_si128(
            xs32.add(i * (k / 32) + 8 * b) as *const __m128i
        ));
        _mm256_hadd_epi32(
            _mm256_madd_epi16(meta.mins[0], sums),
            _mm256_madd_epi16(meta.mins[1], sums),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::fused;
    use super::*;
    use crate::kernels::dispatch::Path;
    use crate::kernels::tests::{quantized, random};
    use crate::kernels::{BlockFormat, QMatrix};

    /// Both variants (with and without GFNI, where the CPU runs them) give, for one to four activation
    /// rows, the bits of the file's layout through the other kernels, on Q4_K and Q5_K groups of three
    /// super-blocks.
    #[test]
    fn both_variants_give_the_bits_of_the_other_kernels() {
        if !crate::kernels::tests::needs(
            crate::kernels::ran::Kernel::Vnni,
            crate::kernels::dispatch::has_vnni() && crate::kernels::dispatch::has_avx512(),
        ) {
            return;
        }
        let with_gfni = crate::kernels::tests::needs(crate::kernels::ran::Kernel::Gfni, has_gfni());
        let (n, k) = (8, 768);
        for format in [BlockFormat::Q4K, BlockFormat::Q5K] {
            let bytes = quantized(format, n, k, 60);
            let file = QMatrix::with_layout(format, bytes.clone(), n, k, false).unwrap();
            let packed = QMatrix::with_layout(format, bytes, n, k, true).unwrap();
            for m in 1..=KR {
                let x = random(m * k, 61 + m as u64);
                let want = file.matmul_with(&x, m, Path::Avx512);
                let acts = Acts::quantize(&x, m, k, 256);
                for gfni in [false, true] {
                    if gfni && !with_gfni {
                        continue;
                    }
                    for j in [0, NW] {
                        let (_, group) = packed.packed_group(j).unwrap();
                        let mut acc = [[f32::NAN; KR]; NW];
                        // SAFETY: the CPU has what both variants need (checked above); the group
                        // holds four repacked rows of `k` weights and `acts` its `m` rows.
                        unsafe {
                            match format {
                                BlockFormat::Q4K => {
                                    call::<fused::Q4K>(gfni, group, &acts, m, &mut acc)
                                }
                                _ => call::<fused::Q5K>(gfni, group, &acts, m, &mut acc),
                            }
                        }
                        for (w, row) in acc.iter().enumerate() {
                            for (i, got) in row.iter().take(m).enumerate() {
                                assert_eq!(
                                    got.to_bits(),
                                    want[i * n + j + w].to_bits(),
                                    "{format:?}, GFNI {gfni}, {m} rows: row {} of activation row {i}",
                                    j + w
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// # Safety
    /// The CPU must support AVX-512F, BW, VL and VNNI besides AVX2, FMA and F16C (and GFNI with
    /// `gfni`); `group` holds four repacked rows of `x.k` weights of `F` and `x` at least `rows` rows.
    unsafe fn call<F: KQuant>(
        gfni: bool,
        group: &[u8],
        x: &Acts,
        rows: usize,
        acc: &mut [[f32; KR]; NW],
    ) {
        let g = group.as_ptr();
        // SAFETY: this function's contract is the kernels'.
        unsafe {
            match (gfni, rows) {
                (true, 1) => with_gfni::<F, 1>(g, x, 0, acc),
                (true, 2) => with_gfni::<F, 2>(g, x, 0, acc),
                (true, 3) => with_gfni::<F, 3>(g, x, 0, acc),
                (true, _) => with_gfni::<F, 4>(g, x, 0, acc),
                (false, 1) => without_gfni::<F, 1>(g, x, 0, acc),
                (false, 2) => without_gfni::<F, 2>(g, x, 0, acc),
                (false, 3) => without_gfni::<F, 3>(g, x, 0, acc),
                (false, _) => without_gfni::<F, 4>(g, x, 0, acc),
            }
        }
    }
}
