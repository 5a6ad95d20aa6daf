//! Register-blocked AVX2 kernels for many activation rows (prefill, large batches): [`NW`] prepared
//! weight rows against up to [`R`] activation rows per call ([`KR`] for k-quants).
//!
//! Why it exists: the one-row kernels of [`super::avx2`] load every 32 activation bytes again for each
//! weight row, so with tiles of activation rows larger than L1 the products wait on cache bandwidth
//! (measured on the 1536 × 8960 shape: 68 GMAC/s on two cores at 256 rows). Here each activation
//! vector loaded serves `NW` weight rows and each weight vector several activation rows.
//!
//! k-quants go further, as llama.cpp's repacked Q4_K does: the four weight rows are interleaved per
//! tile ([`Interleaved`]) so that one `maddubs` multiplies 8 weights of each row with 8 activation
//! bytes broadcast, and a group's four such products are summed in 16 bits before a single `madd` by
//! the sub-block scales: 1.25 multiply instructions per 32 products instead of 2.
//!
//! Per (weight row, activation row) the float operations and their order are those of the other
//! kernels (k-quants: the exact integer sums of a super-block through
//! [`super::avx2::kquant_step`]; 32-weight formats: [`super::avx2::dot_rows`]'s lanes), so the outputs
//! are bit-identical to the one-row kernels': a row's result does not depend on the kernel its batch
//! size picked.

use super::acts::Acts;
use super::avx2::{hsum, Prepared};
use super::{fused, BlockFormat};
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
/// (1 ≤ rows ≤ [`R`], or ≤ [`KR`] for k-quants) into `acc[w][i]`. For k-quants `inter` must hold `p`
/// interleaved ([`Interleaved::build`]).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; every row of `p` must be prepared for `x.k` weights in a
/// format of `kind`, and `x` hold the rows asked for in that kind's activation block.
pub unsafe fn dot_block(
    kind: Kind,
    p: &[Prepared; NW],
    inter: &Interleaved,
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; KR]; NW],
) {
    match (kind, rows) {
        (Kind::KQuant, 1) => kquant_by_16::<1>(inter, x, r0, acc),
        (Kind::KQuant, 2) => kquant_by_16::<2>(inter, x, r0, acc),
        (Kind::KQuant, 3) => kquant_by_16::<3>(inter, x, r0, acc),
        (Kind::KQuant, _) => kquant_by_16::<4>(inter, x, r0, acc),
        (Kind::Unsigned, 1) => legacy::<1, false>(p, x, r0, acc),
        (Kind::Unsigned, _) => legacy::<2, false>(p, x, r0, acc),
        (Kind::Signed, 1) => legacy::<1, true>(p, x, r0, acc),
        (Kind::Signed, _) => legacy::<2, true>(p, x, r0, acc),
    }
}

/// Most activation rows one k-quant call multiplies.
pub const KR: usize = 4;

/// `NW` prepared k-quant rows interleaved as llama.cpp's repacked layouts are: every 32 bytes hold 8
/// consecutive weights of each of the four rows, so one `maddubs` against 8 activation bytes
/// broadcast four times serves all four rows, and the products of a group's four chunks can be summed
/// in 16 bits (the largest, Q5_K: 8 products of 31 · 127 per lane, 31,496 < 32,767; Q6_K's per-16
/// scales sum two chunks: 4 products of 63 · 127) before one `madd` by the scales.
/// Built per tile from the rows' [`Prepared`] forms; nothing of the model is kept this way.
#[derive(Debug, Default)]
pub struct Interleaved {
    /// Weight bytes: chunk `t` (weights `8t … 8t + 7`) of row `w` at `32t + 8w`.
    pub(super) q: Vec<u8>,
    /// Per group of 32 and half (16 weights): the rows' integer scales, row `w` in lanes `4w … 4w + 3`.
    pub(super) sv: Vec<[[i16; 16]; 2]>,
    /// Per super-block and row: what multiplies each 16 activations' sum.
    pub(super) corr: Vec<[[i16; 16]; NW]>,
    /// Per super-block: `d` and `dmin` in the lanes of [`pair_lanes`]' order.
    pub(super) d: Vec<[f32; 8]>,
    pub(super) dmin: Vec<[f32; 8]>,
    /// Whether any row scales per 16 weights (Q6_K): then the chunks are summed two by two.
    pub(super) by_16: bool,
}

/// Where `_mm256_hadd_epi32` of two activation rows' sums (`i`, `i + 1`) puts each product: lanes 0–3
/// hold (i, w0), (i, w1), (i + 1, w0), (i + 1, w1), lanes 4–7 the same for weight rows 2 and 3. Maps a
/// lane to (activation row within the pair, weight row).
const fn pair_lanes(lane: usize) -> (usize, usize) {
    ((lane % 4) / 2, (lane / 4) * 2 + lane % 2)
}

impl Interleaved {
    /// Interleaves four prepared k-quant rows of `k` weights.
    ///
    /// # Safety
    /// The CPU must support AVX2; every row must be prepared for `k` weights.
    pub unsafe fn build(&mut self, p: &[Prepared; NW], k: usize) {
        let kb = k / 256;
        self.q.resize(NW * k, 0);
        debug_assert!(p.iter().all(|row| row.q.len() >= k));
        // SAFETY: AVX2 by this function's contract; every row holds `k` bytes and `q` holds `NW · k`.
        transpose_chunks(p, k, self.q.as_mut_ptr());
        self.sv.resize(kb * 8, [[0; 16]; 2]);
        // By format, not by the values: Q6_K's bytes are 0…63, too large to sum four chunks.
        self.by_16 = p.iter().any(|row| row.format == Some(BlockFormat::Q6K));
        for (g, sv) in self.sv.iter_mut().enumerate() {
            for (w, row) in p.iter().enumerate() {
                let (lo, hi) = (row.sv[g][0], row.sv[g][8]);
                sv[0][4 * w..4 * w + 4].fill(lo);
                sv[1][4 * w..4 * w + 4].fill(hi);
            }
        }

        self.corr.resize(kb, [[0; 16]; NW]);
        self.d.resize(kb, [0.0; 8]);
        self.dmin.resize(kb, [0.0; 8]);
        for b in 0..kb {
            for (w, row) in p.iter().enumerate() {
                self.corr[b][w] = row.corr[b];
            }
            for lane in 0..8 {
                let w = pair_lanes(lane).1;
                self.d[b][lane] = p[w].d[b];
                self.dmin[b][lane] = p[w].m[b];
            }
        }
    }
}

impl Interleaved {
    /// Interleaves four rows of `k` weights straight from their blocks when they share a k-quant
    /// format (decoded in registers, transposed there, stored once); `false` when they do not.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; every row holds whole blocks for `k` weights.
    pub unsafe fn build_raw(&mut self, rows: [(BlockFormat, &[u8]); NW], k: usize) -> bool {
        let format = rows[0].0;
        if rows.iter().any(|r| r.0 != format) {
            return false;
        }
        let bytes = rows.map(|r| r.1.as_ptr());
        match format {
            BlockFormat::Q4K => self.build_from::<fused::Q4K>(bytes, k),
            BlockFormat::Q5K => self.build_from::<fused::Q5K>(bytes, k),
            BlockFormat::Q6K => self.build_from::<fused::Q6K>(bytes, k),
            _ => return false,
        }
        true
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn build_from<F: fused::KQuant>(&mut self, rows: [*const u8; NW], k: usize) {
        let kb = k / 256;
        self.q.resize(NW * k, 0);
        self.sv.resize(kb * 8, [[0; 16]; 2]);
        self.corr.resize(kb, [[0; 16]; NW]);
        self.d.resize(kb, [0.0; 8]);
        self.dmin.resize(kb, [0.0; 8]);
        self.by_16 = F::BY_16;
        let q = self.q.as_mut_ptr();
        // The rows' super-blocks `dist` bytes ahead, as the decoding kernels ask for them (Qwen2.5-1.5B
        // on the Xeon, two rounds: batch 8 36.7 / 37.0 → 38.6 / 38.5 tokens/s, batch 32 66.1 / 64.6 →
        // 68.3 / 66.5, prefill within noise).
        let dist = super::dot::prefetch_distance();
        for b in 0..kb {
            let p: [*const u8; NW] = rows.map(|r| r.add(b * F::BYTES));
            if dist > 0 {
                for row in p {
                    super::dot::prefetch_lines(row.wrapping_add(dist), F::BYTES);
                }
            }
            let hdr: [fused::Header; NW] = p.map(|p| F::header(p));
            for g in 0..8 {
                let [a, bb, c, d] = p.map(|p| F::group(p, g));
                store_transposed(q.add(4 * (256 * b + 32 * g)), a, bb, c, d);
                // Row w's scales for the group's two halves, into lanes 4w … 4w + 3.
                let s: [__m256i; NW] = std::array::from_fn(|w| F::group_scales(&hdr[w], g));
                let sv = self.sv.get_unchecked_mut(8 * b + g);
                for (h, out) in sv.iter_mut().enumerate().take(if F::BY_16 { 2 } else { 1 }) {
                    // lane 0 (low half) or lane 8 (high half) of each row's scales, as 64 bits
                    let pick = |v: __m256i| {
                        if h == 0 {
                            _mm256_extract_epi64(v, 0)
                        } else {
                            _mm256_extract_epi64(v, 2)
                        }
                    };
                    let v = _mm256_setr_epi64x(pick(s[0]), pick(s[1]), pick(s[2]), pick(s[3]));
                    _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, v);
                }
            }
            let corr = self.corr.get_unchecked_mut(b);
            for w in 0..NW {
                _mm256_storeu_si256(corr[w].as_mut_ptr() as *mut __m256i, F::corr_lanes(&hdr[w]));
            }
            for lane in 0..8 {
                let w = pair_lanes(lane).1;
                self.d[b][lane] = hdr[w].d;
                self.dmin[b][lane] = hdr[w].dmin;
            }
        }
    }
}

/// Stores four rows' 32 bytes as four 32-byte chunks, chunk `c` holding bytes `8c … 8c + 7` of each
/// row in turn: a 4 × 4 transpose of 64-bit lanes.
#[inline(always)]
unsafe fn store_transposed(dst: *mut u8, a: __m256i, b: __m256i, c: __m256i, d: __m256i) {
    // ab_lo = a0 b0 | a2 b2, ab_hi = a1 b1 | a3 b3 (64-bit lanes), the same for c, d
    let (ab_lo, ab_hi) = (_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
    let (cd_lo, cd_hi) = (_mm256_unpacklo_epi64(c, d), _mm256_unpackhi_epi64(c, d));
    let dst = dst as *mut __m256i;
    _mm256_storeu_si256(dst, _mm256_permute2x128_si256(ab_lo, cd_lo, 0x20));
    _mm256_storeu_si256(dst.add(1), _mm256_permute2x128_si256(ab_hi, cd_hi, 0x20));
    _mm256_storeu_si256(dst.add(2), _mm256_permute2x128_si256(ab_lo, cd_lo, 0x31));
    _mm256_storeu_si256(dst.add(3), _mm256_permute2x128_si256(ab_hi, cd_hi, 0x31));
}

/// Writes the four rows' bytes interleaved in 8-byte chunks: per 32 weights, a 4 × 4 transpose of
/// 64-bit lanes.
#[target_feature(enable = "avx2")]
unsafe fn transpose_chunks(p: &[Prepared; NW], k: usize, out: *mut u8) {
    let src: [*const u8; NW] = std::array::from_fn(|w| p[w].q.as_ptr());
    for at in (0..k).step_by(32) {
        let [a, b, c, d] = src.map(|s| _mm256_loadu_si256(s.add(at) as *const __m256i));
        store_transposed(out.add(4 * at), a, b, c, d);
    }
}

/// k-quants on interleaved rows: per group, the chunks' products summed in 16 bits, then one `madd`
/// by the scales (two for Q6_K). Per super-block,
/// the exact integer sums are reduced and put through [`super::avx2::kquant_step`]'s float
/// operations lane by lane, so the results are the other kernels' bits.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kquant_by_16<const RR: usize>(
    p: &Interleaved,
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; KR]; NW],
) {
    if p.by_16 {
        kquant::<RR, true>(p, x, r0, acc)
    } else {
        kquant::<RR, false>(p, x, r0, acc)
    }
}

// Indexes are clearer than iterators here: `h` picks both chunks and scales, `pair` two rows.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kquant<const RR: usize, const BY_16: bool>(
    p: &Interleaved,
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; KR]; NW],
) {
    debug_assert_eq!(x.block, 256);
    let (k, kb) = (x.k, x.k / 256);
    let xq = x.row(r0).as_ptr();
    let q = p.q.as_ptr();
    let mut total: Totals = [_mm256_setzero_ps(); KR / 2];
    for b in 0..kb {
        let mut isum = [_mm256_setzero_si256(); RR];
        for g in 0..8 {
            let at = 256 * b + 32 * g;
            let sv = p.sv.get_unchecked(8 * b + g);
            let halves = if BY_16 { 2 } else { 1 };
            for h in 0..halves {
                let chunks = if BY_16 { 2 * h..2 * h + 2 } else { 0..4 };
                let mut part = [_mm256_setzero_si256(); RR];
                for c in chunks {
                    let wv = _mm256_loadu_si256(q.add(4 * (at + 8 * c)) as *const __m256i);
                    for (i, s) in part.iter_mut().enumerate() {
                        let xv = _mm256_set1_epi64x(std::ptr::read_unaligned(
                            xq.add(i * k + at + 8 * c) as *const i64,
                        ));
                        *s = _mm256_add_epi16(*s, _mm256_maddubs_epi16(wv, xv));
                    }
                }
                let scales = _mm256_loadu_si256(sv[h].as_ptr() as *const __m256i);
                for i in 0..RR {
                    isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(part[i], scales));
                }
            }
        }
        finish_block(p, b, &isum, x, r0, &mut total);
    }
    store_totals::<RR>(&total, acc);
}

/// Per-pair float sums of [`kquant`]'s activation rows (lanes in [`pair_lanes`]' order).
pub(super) type Totals = [__m256; KR / 2];

/// The float step of super-block `b` for the four interleaved rows `p` and activation rows
/// `r0 .. r0 + RR`, from the exact integer sums `isum[i]` (lanes `2w`, `2w + 1` of row `i` belong to
/// weight row `w`): [`super::avx2::kquant_step`]'s operations, lane by lane. Shared by every kernel
/// on interleaved rows, so their bits are the same.
// `pair` picks two sums, two corrections, two scales and one total.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) unsafe fn finish_block<const RR: usize>(
    p: &Interleaved,
    b: usize,
    isum: &[__m256i; RR],
    x: &Acts,
    r0: usize,
    total: &mut Totals,
) {
    let (k, kb) = (x.k, x.k / 256);
    let xd = x.scales(r0).as_ptr();
    let xs = x.row_sums(r0).as_ptr();
    let dv = _mm256_loadu_ps(p.d.get_unchecked(b).as_ptr());
    let dminv = _mm256_loadu_ps(p.dmin.get_unchecked(b).as_ptr());
    let corr = p.corr.get_unchecked(b);
    for pair in 0..RR.div_ceil(2) {
        let (i0, i1) = (2 * pair, (2 * pair + 1).min(RR - 1));
        let s = _mm256_hadd_epi32(isum[i0], isum[i1]);
        let (c0, c1) = (corr_sums(xs, k, b, i0, corr), corr_sums(xs, k, b, i1, corr));
        let c = _mm256_set_m128i(_mm_unpackhi_epi64(c0, c1), _mm_unpacklo_epi64(c0, c1));
        let (dx0, dx1) = (*xd.add(i0 * kb + b), *xd.add(i1 * kb + b));
        let dx = _mm256_setr_ps(dx0, dx0, dx1, dx1, dx0, dx0, dx1, dx1);
        let v = _mm256_fmsub_ps(
            _mm256_cvtepi32_ps(s),
            dv,
            _mm256_mul_ps(_mm256_cvtepi32_ps(c), dminv),
        );
        total[pair] = _mm256_fmadd_ps(v, dx, total[pair]);
    }
}

/// Writes the first `RR` activation rows' sums of `total` into `acc[w][i]`.
#[inline(always)]
pub(super) unsafe fn store_totals<const RR: usize>(total: &Totals, acc: &mut [[f32; KR]; NW]) {
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

/// For activation row `i` and super-block `b`: `Σ_h corr[w][h] · Σ xq_h` for the four weight rows, in
/// lanes 0–3 (exact integers).
#[inline(always)]
unsafe fn corr_sums(
    xs: *const i16,
    k: usize,
    b: usize,
    i: usize,
    corr: &[[i16; 16]; NW],
) -> __m128i {
    let sums = _mm256_loadu_si256(xs.add(i * (k / 16) + 16 * b) as *const __m256i);
    let m: [__m256i; NW] = std::array::from_fn(|w| {
        _mm256_madd_epi16(sums, _mm256_loadu_si256(corr[w].as_ptr() as *const __m256i))
    });
    let t = _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]));
    _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1))
}

/// 32-weight formats: `SIGNED` weights (Q8_0) through the sign trick, the others 0…31 with an
/// additive term per block (summed afterwards, in the same order as the one-row kernel). The `NW` rows
/// go in pairs: four rows of float accumulators for two activation rows would not fit the registers.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy<const RR: usize, const SIGNED: bool>(
    p: &[Prepared; NW],
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; KR]; NW],
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
    acc: &mut [[f32; KR]; NW],
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
