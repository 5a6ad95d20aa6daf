//! Register-blocked AVX2 kernels for many activation rows (prefill, large batches): [`NW`] prepared
//! weight rows against up to [`R`] activation rows per call ([`KR`] for k-quants, and for the 32-weight
//! formats on CPUs with AVX-512 VNNI: [`rows_per_call`]).
//!
//! Why it exists: the one-row kernels of [`super::prepared`] load every 32 activation bytes again for each
//! weight row, so with tiles of activation rows larger than L1 the products wait on cache bandwidth
//! (measured on the 1536 × 8960 shape: 68 GMAC/s on two cores at 256 rows). Here each activation
//! vector loaded serves `NW` weight rows and each weight vector several activation rows.
//!
//! k-quants go further, as llama.cpp's repacked Q4_K does: the four weight rows are interleaved per
//! tile ([`Interleaved`]) so that one `maddubs` multiplies 8 weights of each row with 8 activation
//! bytes broadcast, and a group's four such products are summed in 16 bits before a single `madd` by
//! the sub-block scales: 1.25 multiply instructions per 32 products instead of 2. Rows repacked at
//! load (`super::packed`) are already interleaved and are read in place (`Packed`) or decoded into
//! an [`Interleaved`] tile; the kernels take either through `Quad`.
//!
//! Per (weight row, activation row) the float operations and their order are those of the other
//! kernels (k-quants: the exact integer sums of a super-block through
//! `super::finish::kquant_step`; 32-weight formats: [`super::prepared::dot_rows`]'s lanes), so the outputs
//! are bit-identical to the one-row kernels': a row's result does not depend on the kernel its batch
//! size picked.

use super::finish::{finish_block, hsum, pair_lanes, store_totals, RowsAt, Totals};
pub use super::finish::{KR, NW};
use super::fused;
use super::prepared::Prepared;
use crate::kernels::acts::Acts;
use crate::kernels::format::BlockFormat;
use std::arch::x86_64::*;

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
/// (1 ≤ rows ≤ [`rows_per_call`]) into `acc[w][i]`. For k-quants `inter` must hold `p` interleaved
/// ([`Interleaved::build`]). `vnni`: the 32-weight formats through `legacy_vnni` (the same bits).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; every row of `p` must be prepared for `x.k` weights in a
/// format of `kind`, and `x` hold the rows asked for in that kind's activation block.
#[allow(clippy::too_many_arguments)]
pub unsafe fn dot_block(
    kind: Kind,
    p: &[Prepared; NW],
    inter: &Interleaved,
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; KR]; NW],
    vnni: bool,
) {
    unsafe {
        match (kind, vnni, rows) {
            (Kind::KQuant, _, _) => dot_quad(&mut &*inter, x, r0, rows, acc),
            (Kind::Unsigned, false, 1) => legacy::<1, false>(p, x, r0, acc),
            (Kind::Unsigned, false, _) => legacy::<2, false>(p, x, r0, acc),
            (Kind::Signed, false, 1) => legacy::<1, true>(p, x, r0, acc),
            (Kind::Signed, false, _) => legacy::<2, true>(p, x, r0, acc),
            (Kind::Unsigned, true, 1) => legacy_vnni::<1, false>(p, x, r0, acc),
            (Kind::Unsigned, true, 2) => legacy_vnni::<2, false>(p, x, r0, acc),
            (Kind::Unsigned, true, 3) => legacy_vnni::<3, false>(p, x, r0, acc),
            (Kind::Unsigned, true, _) => legacy_vnni::<4, false>(p, x, r0, acc),
            (Kind::Signed, true, 1) => legacy_vnni::<1, true>(p, x, r0, acc),
            (Kind::Signed, true, 2) => legacy_vnni::<2, true>(p, x, r0, acc),
            (Kind::Signed, true, 3) => legacy_vnni::<3, true>(p, x, r0, acc),
            (Kind::Signed, true, _) => legacy_vnni::<4, true>(p, x, r0, acc),
        }
    }
}

/// Most activation rows one [`dot_block`] call takes for `kind` (`vnni` as there).
pub fn rows_per_call(kind: Kind, vnni: bool) -> usize {
    if kind == Kind::KQuant || vnni {
        KR
    } else {
        R
    }
}

/// `NW` prepared k-quant rows interleaved as llama.cpp's repacked layouts are: every 32 bytes hold 8
/// consecutive weights of each of the four rows, so one `maddubs` against 8 activation bytes
/// broadcast four times serves all four rows, and the products of a group's four chunks can be summed
/// in 16 bits (the largest, Q5_K: 8 products of 31 · 127 per lane, 31,496 < 32,767; Q6_K's per-16
/// scales sum two chunks: 4 products of 63 · 127) before one `madd` by the scales.
/// Built per tile from the rows' [`Prepared`] forms; nothing of the model is kept this way.
#[derive(Debug, Default)]
pub struct Interleaved {
    /// Weight bytes: chunk `t` (weights `8t … 8t + 7`) of row `w` at `32t + 8w`.
    q: crate::kernels::aligned::AlignedBytes<u8>,
    /// Per group of 32 and half (16 weights): the rows' integer scales, row `w` in lanes `4w … 4w + 3`.
    sv: Vec<[[i16; 16]; 2]>,
    /// Per super-block and row: what multiplies each 16 activations' sum.
    corr: Vec<[[i16; 16]; NW]>,
    /// Per super-block: `d` and `dmin` in the lanes of [`pair_lanes`]' order.
    d: Vec<[f32; 8]>,
    dmin: Vec<[f32; 8]>,
    /// Whether any row scales per 16 weights (Q6_K): then the chunks are summed two by two.
    pub(super) by_16: bool,
}

impl Interleaved {
    /// Interleaves four prepared k-quant rows of `k` weights.
    ///
    /// # Safety
    /// The CPU must support AVX2; every row must be prepared for `k` weights.
    pub unsafe fn build(&mut self, p: &[Prepared; NW], k: usize) {
        unsafe {
            let kb = k / 256;
            self.q.resize(NW * k);
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
}

impl Interleaved {
    /// Interleaves four rows of `k` weights straight from their blocks when they share a k-quant
    /// format (decoded in registers, transposed there, stored once); `false` when they do not.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; every row holds whole blocks for `k` weights.
    pub unsafe fn build_raw(&mut self, rows: [(BlockFormat, &[u8]); NW], k: usize) -> bool {
        unsafe {
            let format = rows[0].0;
            if rows.iter().any(|r| r.0 != format) {
                return false;
            }
            let bytes = rows.map(|r| r.1.as_ptr());
            with_kquant!(format, F => self.build_from::<F>(bytes, k), _ => return false);
            true
        }
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    /// `rows` must point at weight bytes of the layout this function decodes, every byte it reads readable.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn build_from<F: fused::KQuant>(&mut self, rows: [*const u8; NW], k: usize) {
        unsafe {
            let kb = k / 256;
            self.resize(kb, F::BY_16);
            let q = self.q.as_mut_ptr();
            // The rows' super-blocks `dist` bytes ahead, as the decoding kernels ask for them: building
            // a tile waits on memory otherwise (measured: docs/kernels.md).
            let dist = crate::kernels::dispatch::prefetch_distance();
            for b in 0..kb {
                let p: [*const u8; NW] = rows.map(|r| r.add(b * F::BYTES));
                if dist > 0 {
                    for row in p {
                        super::loads::prefetch_lines(row.wrapping_add(dist), F::BYTES);
                    }
                }
                let hdr: [fused::Header; NW] = p.map(|p| F::header(p));
                for g in 0..8 {
                    let [a, bb, c, d] = p.map(|p| F::group(p, g));
                    store_transposed(q.add(4 * (256 * b + 32 * g)), a, bb, c, d);
                }
                self.store_meta::<F>(b, QuadMeta::of::<F>(&hdr));
            }
        }
    }

    /// Interleaves a group of four rows repacked at load (`super::packed`): its chunks are already
    /// interleaved, only decoded here.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `group` holds four repacked rows of `k` weights of `format`, a k-quant.
    pub unsafe fn build_packed(&mut self, format: BlockFormat, group: &[u8], k: usize) {
        unsafe {
            debug_assert_eq!(group.len(), NW * format.row_bytes(k).unwrap_or(0));
            with_kquant!(
                format,
                F => self.build_from_packed::<F>(group.as_ptr(), k),
                _ => unreachable!("only k-quants are repacked")
            )
        }
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    /// `group` must point at weight bytes of the layout this function decodes, every byte it reads readable.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn build_from_packed<F: fused::KQuant>(&mut self, group: *const u8, k: usize) {
        unsafe {
            let kb = k / 256;
            self.resize(kb, F::BY_16);
            let q = self.q.as_mut_ptr() as *mut __m256i;
            for b in 0..kb {
                let src = Packed::<F>::at(group, b);
                for g in 0..8 {
                    for c in 0..4 {
                        let v = F::group_in(src.add(NW * F::HEADER_LEN + 32 * c), 128, g);
                        _mm256_storeu_si256(q.add(4 * (8 * b + g) + c), v);
                    }
                }
                self.store_meta::<F>(b, QuadMeta::packed::<F>(src));
            }
        }
    }

    /// Sizes the buffers for `kb` super-blocks.
    fn resize(&mut self, kb: usize, by_16: bool) {
        self.q.resize(NW * 256 * kb);
        self.sv.resize(kb * 8, [[0; 16]; 2]);
        self.corr.resize(kb, [[0; 16]; NW]);
        self.d.resize(kb, [0.0; 8]);
        self.dmin.resize(kb, [0.0; 8]);
        self.by_16 = by_16;
    }

    /// Super-block `b`'s scales, corrections, `d` and `dmin` from the four rows' headers.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    /// `b` must lie within what `self` or the rows were built for: they are read without bounds checks.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store_meta<F: fused::KQuant>(&mut self, b: usize, meta: QuadMeta) {
        unsafe {
            for g in 0..8 {
                let sv = self.sv.get_unchecked_mut(8 * b + g);
                for (h, out) in sv.iter_mut().enumerate().take(if F::BY_16 { 2 } else { 1 }) {
                    let v = meta.scales::<F>(g, h);
                    _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, v);
                }
            }
            let corr = self.corr.get_unchecked_mut(b);
            for (out, c) in corr.iter_mut().zip(meta.corr) {
                _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, c);
            }
            _mm256_storeu_ps(self.d.get_unchecked_mut(b).as_mut_ptr(), meta.d);
            _mm256_storeu_ps(self.dmin.get_unchecked_mut(b).as_mut_ptr(), meta.dmin);
        }
    }
}

/// A super-block's headers of four rows, as the interleaved kernels use them, in registers.
#[derive(Clone, Copy)]
pub(super) struct QuadMeta {
    /// The rows' scales (16-bit lanes `j` of [`fused::Header::scales`]), paired: per 128-bit half,
    /// dword `q` of `pairs[j / 4]` holds lane `j` of rows 0 and 1 (low half) or of rows 2 and 3 (high
    /// half), so one byte shuffle gives a group's scales in any lane layout ([`scales`](Self::scales)).
    pairs: [__m256i; 4],
    /// What multiplies each 16 activations' sum, per row.
    corr: [__m256i; NW],
    /// `d` and `dmin` in [`pair_lanes`]' order (rows 0 1 0 1 2 3 2 3).
    d: __m256,
    dmin: __m256,
}

/// [`QuadMeta::pairs`] from the rows' scale lanes: `even[s]` holding rows 0 and 2's lanes `8s … 8s +
/// 7` in its two 128-bit halves, `odd[s]` rows 1 and 3's.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline(always)]
unsafe fn scale_pairs(even: [__m256i; 2], odd: [__m256i; 2]) -> [__m256i; 4] {
    unsafe {
        [
            _mm256_unpacklo_epi16(even[0], odd[0]),
            _mm256_unpackhi_epi16(even[0], odd[0]),
            _mm256_unpacklo_epi16(even[1], odd[1]),
            _mm256_unpackhi_epi16(even[1], odd[1]),
        ]
    }
}

impl QuadMeta {
    /// From the four rows' decoded headers.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn of<F: fused::KQuant>(h: &[fused::Header; NW]) -> Self {
        unsafe {
            // 0x20: both low halves; 0x31: both high halves.
            Self {
                pairs: scale_pairs(
                    [
                        _mm256_permute2x128_si256(h[0].scales, h[2].scales, 0x20),
                        _mm256_permute2x128_si256(h[0].scales, h[2].scales, 0x31),
                    ],
                    [
                        _mm256_permute2x128_si256(h[1].scales, h[3].scales, 0x20),
                        _mm256_permute2x128_si256(h[1].scales, h[3].scales, 0x31),
                    ],
                ),
                corr: [
                    F::corr_lanes(&h[0]),
                    F::corr_lanes(&h[1]),
                    F::corr_lanes(&h[2]),
                    F::corr_lanes(&h[3]),
                ],
                d: _mm256_setr_ps(
                    h[0].d, h[1].d, h[0].d, h[1].d, h[2].d, h[3].d, h[2].d, h[3].d,
                ),
                dmin: _mm256_setr_ps(
                    h[0].dmin, h[1].dmin, h[0].dmin, h[1].dmin, h[2].dmin, h[3].dmin, h[2].dmin,
                    h[3].dmin,
                ),
            }
        }
    }

    /// The four rows' headers of a repacked super-block at `src` (their header bytes one after
    /// another, [`super::packed`]), decoded together: Q4_K and Q5_K's 16-byte headers one to a
    /// 128-bit lane ([`k45_quad_meta`]), Q6_K's through [`fused::Header`]s. The same values as
    /// [`of`](Self::of) on the rows' headers.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    /// `src` must point at weight bytes of the layout this function decodes, every byte it reads readable.
    #[inline(always)]
    unsafe fn packed<F: fused::KQuant>(src: *const u8) -> Self {
        unsafe {
            if F::BY_16 {
                Self::of::<F>(&Packed::<F>::headers(src))
            } else {
                k45_quad_meta(src)
            }
        }
    }

    /// Group `g`'s scales of half `h`, row `w`'s in 16-bit lanes `4w … 4w + 3` (what `madd` of the
    /// 16-bit sums takes): one byte shuffle.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn scales<F: fused::KQuant>(&self, g: usize, h: usize) -> __m256i {
        unsafe { self.pick::<F, false>(g, h) }
    }

    /// Group `g`'s scales of half `h`, row `w`'s in the low 16 bits of 32-bit lanes `2w`, `2w + 1`,
    /// the high 16 bits zero (what `vpdpwssd` of 32-bit sums below 2^15 takes): one byte shuffle.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn scales32<F: fused::KQuant>(&self, g: usize, h: usize) -> __m256i {
        unsafe { self.pick::<F, true>(g, h) }
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    /// `g`, `h` must lie within what `self` or the rows were built for: they are read without bounds checks.
    #[inline(always)]
    unsafe fn pick<F: fused::KQuant, const WIDE: bool>(&self, g: usize, h: usize) -> __m256i {
        unsafe {
            let lane = F::scale_lane(g, h);
            let table = if WIDE { &PICK_WIDE } else { &PICK };
            let pick = _mm256_loadu_si256(table.get_unchecked(lane % 4).as_ptr() as *const __m256i);
            _mm256_shuffle_epi8(*self.pairs.get_unchecked(lane / 4), pick)
        }
    }
}

/// The byte shuffles of [`QuadMeta::scales`]: for dword `q` of each 128-bit half, the first row's
/// 16-bit scale four times, then the second's.
static PICK: [[i8; 32]; 4] = pick_table(false);
/// [`QuadMeta::scales32`]'s: each row's scale twice, in the low half of a 32-bit lane (-1: a zero).
static PICK_WIDE: [[i8; 32]; 4] = pick_table(true);

/// The tables of [`PICK`] and [`PICK_WIDE`] (a table, not built per call: inside a loop the compiler
/// did not unroll, the masks were assembled byte by byte every time).
const fn pick_table(wide: bool) -> [[i8; 32]; 4] {
    let mut t = [[0i8; 32]; 4];
    let mut q = 0;
    while q < 4 {
        let mut i = 0;
        while i < 32 {
            // Byte `i`: 16-bit lane (i % 16) / 2 of its half; lanes 0–3 the first row's, 4–7 the
            // second's; the low or high byte of the scale by i's parity.
            let lane = (i % 16) / 2;
            let second = lane / 4;
            let byte = (4 * q + 2 * second + i % 2) as i8;
            t[q][i] = if wide && lane % 2 == 1 { -1 } else { byte };
            i += 1;
        }
        q += 1;
    }
    t
}

/// [`QuadMeta`] of four Q4_K/Q5_K headers stored one after another at `src` (64 bytes), with vector
/// instructions throughout: each 16-byte header (`d`, `dmin`, then the 12 bytes of 6-bit scales and
/// minima, as `fused::k45_header` reads them word by word) fills one 128-bit lane, so the whole-word
/// masks of that function work on two rows at a time, and `d`, `dmin` are converted four rows at once.
/// Replaces four scalar decodes and the assembly of their results lane by lane (about 140
/// instructions a super-block, most of a one-row product's work besides the multiplies).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `src` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
unsafe fn k45_quad_meta(src: *const u8) -> QuadMeta {
    unsafe {
        // Rows 0, 1 and rows 2, 3, one header per 128-bit lane: dwords [d·dmin, u0, u1, u2].
        let a = _mm256_loadu_si256(src as *const __m256i);
        let b = _mm256_loadu_si256(src.add(32) as *const __m256i);
        // Per lane: bytes 0–7 the eight 6-bit scales, 8–15 the eight minima.
        let (sa, sb) = (k45_scale_bytes(a), k45_scale_bytes(b));
        // Lane 0 rows 0 and 2, lane 1 rows 1 and 3.
        let sc = _mm256_unpacklo_epi64(sa, sb);
        let mn = _mm256_unpackhi_epi64(sa, sb);
        let even = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(sc));
        let odd = _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(sc));
        // Every minimum twice (it multiplies the sums of both halves of its 32 weights).
        let (m02, m13) = (_mm256_unpacklo_epi8(mn, mn), _mm256_unpackhi_epi8(mn, mn));
        let corr = [
            _mm256_cvtepu8_epi16(_mm256_castsi256_si128(m02)),
            _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(m02)),
            _mm256_cvtepu8_epi16(_mm256_castsi256_si128(m13)),
            _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(m13)),
        ];
        let (d, dmin) = k45_d_dmin(a, b);
        QuadMeta {
            pairs: scale_pairs([even, even], [odd, odd]),
            corr,
            d,
            dmin,
        }
    }
}

/// `d` and `dmin` of four Q4_K/Q5_K headers loaded as [`k45_quad_meta`] loads them (rows 0, 1 in
/// `a`, rows 2, 3 in `b`, one per 128-bit lane), in [`pair_lanes`]' order (rows 0 1 0 1 2 3 2 3).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline(always)]
pub(super) unsafe fn k45_d_dmin(a: __m256i, b: __m256i) -> (__m256, __m256) {
    unsafe {
        // The four (d, dmin) dwords in row order, then the f16 words in `pair_lanes`' order.
        let t = _mm256_unpacklo_epi32(a, b);
        let dd = _mm_unpacklo_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
        let d_words = _mm_setr_epi8(0, 1, 4, 5, 0, 1, 4, 5, 8, 9, 12, 13, 8, 9, 12, 13);
        let m_words = _mm_setr_epi8(2, 3, 6, 7, 2, 3, 6, 7, 10, 11, 14, 15, 10, 11, 14, 15);
        (
            _mm256_cvtph_ps(_mm_shuffle_epi8(dd, d_words)),
            _mm256_cvtph_ps(_mm_shuffle_epi8(dd, m_words)),
        )
    }
}

/// Two Q4_K/Q5_K headers, one per 128-bit lane (dwords `[d·dmin, u0, u1, u2]`), to their scales'
/// bytes (0–7) and minima's (8–15), per lane: `fused::k45_header`'s masks on whole vectors.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline(always)]
pub(super) unsafe fn k45_scale_bytes(v: __m256i) -> __m256i {
    unsafe {
        // [u0, u1, u0, u1] and [u2, u2 >> 4, u2, u2 >> 4].
        let a = _mm256_shuffle_epi32::<0b10_01_10_01>(v);
        let c = _mm256_srlv_epi32(
            _mm256_shuffle_epi32::<0b11_11_11_11>(v),
            _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4),
        );
        let lo = _mm256_and_si256(a, _mm256_set1_epi32(0x3f3f_3f3f));
        let top = _mm256_and_si256(_mm256_srli_epi32::<6>(a), _mm256_set1_epi32(0x0303_0303));
        let hi = _mm256_or_si256(
            _mm256_and_si256(c, _mm256_set1_epi32(0x0f0f_0f0f)),
            _mm256_slli_epi32::<4>(top),
        );
        // [scales 0–3, scales 4–7, minima 0–3, minima 4–7].
        _mm256_unpacklo_epi32(lo, hi)
    }
}

/// Stores four rows' 32 bytes as four 32-byte chunks, chunk `c` holding bytes `8c … 8c + 7` of each
/// row in turn: a 4 × 4 transpose of 64-bit lanes.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `dst` must be valid for the writes made through it (the bytes the arguments index).
#[inline(always)]
unsafe fn store_transposed(dst: *mut u8, a: __m256i, b: __m256i, c: __m256i, d: __m256i) {
    unsafe {
        // ab_lo = a0 b0 | a2 b2, ab_hi = a1 b1 | a3 b3 (64-bit lanes), the same for c, d
        let (ab_lo, ab_hi) = (_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
        let (cd_lo, cd_hi) = (_mm256_unpacklo_epi64(c, d), _mm256_unpackhi_epi64(c, d));
        let dst = dst as *mut __m256i;
        _mm256_storeu_si256(dst, _mm256_permute2x128_si256(ab_lo, cd_lo, 0x20));
        _mm256_storeu_si256(dst.add(1), _mm256_permute2x128_si256(ab_hi, cd_hi, 0x20));
        _mm256_storeu_si256(dst.add(2), _mm256_permute2x128_si256(ab_lo, cd_lo, 0x31));
        _mm256_storeu_si256(dst.add(3), _mm256_permute2x128_si256(ab_hi, cd_hi, 0x31));
    }
}

/// Writes the four rows' bytes interleaved in 8-byte chunks: per 32 weights, a 4 × 4 transpose of
/// 64-bit lanes.
///
/// # Safety
/// The CPU must support AVX2.
/// `out` must be valid for the writes made through it (the bytes the arguments index).
#[target_feature(enable = "avx2")]
unsafe fn transpose_chunks(p: &[Prepared; NW], k: usize, out: *mut u8) {
    unsafe {
        let src: [*const u8; NW] = std::array::from_fn(|w| p[w].q.as_ptr());
        for at in (0..k).step_by(32) {
            let [a, b, c, d] = src.map(|s| _mm256_loadu_si256(s.add(at) as *const __m256i));
            store_transposed(out.add(4 * at), a, b, c, d);
        }
    }
}

/// Four interleaved k-quant weight rows as the kernels read them, a super-block at a time: built per
/// product from the file's rows ([`Interleaved`]) or repacked at load ([`Packed`]). The kernels are
/// generic over it, so both feed the same instructions and the same float step.
pub(super) trait Quad {
    /// The largest weight value any row may hold (unsigned), which bounds the integer sums.
    const TOP: u8;
    /// Whether [`kquant`] takes a super-block's eight groups one by one with constant indexes
    /// rather than in a loop. Measured on the AMD EPYC Zen 3 (`cargo bench --bench kernels`, one
    /// thread, 1536 × 8960, five alternations): for groups read in place, Q4_K 1.32× at one
    /// activation row and 1.35× at four and eight, Q6_K 1.22× at one and 1.48× at eight (the loop
    /// stayed a loop, with variable shifts and spills); unrolled, interleaved tiles were 7–9% slower
    /// on Q4_K at 32 and 256 rows, so they keep the loop.
    const UNROLL: bool;
    /// Whether any row scales per 16 weights (Q6_K): then the chunks are summed two by two.
    fn by_16(&self) -> bool;
    /// Readies super-block `b` (a repacked group decodes its four headers here).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn begin(&mut self, b: usize);
    /// Chunk `c` (weights `8c … 8c + 7`) of group `g` of super-block `b`, the four rows in turn.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn chunk(&self, b: usize, g: usize, c: usize) -> __m256i;
    /// Group `g`'s scales of half `h` (`h` = 1 only when [`by_16`](Self::by_16)), row `w`'s in 16-bit
    /// lanes `4w … 4w + 3`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn scales(&self, b: usize, g: usize, h: usize) -> __m256i;
    /// The same scales in the low 16 bits of 32-bit lanes `2w`, `2w + 1`, the high bits zero (for
    /// `vpdpwssd`).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn scales32(&self, b: usize, g: usize, h: usize) -> __m256i {
        unsafe { _mm256_and_si256(self.scales(b, g, h), _mm256_set1_epi32(0xFFFF)) }
    }
    /// Super-block `b`'s `d` and `dmin`, in [`pair_lanes`]' order.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn d(&self, b: usize) -> (__m256, __m256);
    /// What multiplies each 16 activations' sum, per row.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn corr(&self, b: usize) -> [__m256i; NW];
}

impl Quad for &Interleaved {
    // Rows of any k-quant: Q6_K's bound.
    const TOP: u8 = 63;
    const UNROLL: bool = false;
    fn by_16(&self) -> bool {
        self.by_16
    }
    #[inline(always)]
    unsafe fn begin(&mut self, _: usize) {}
    #[inline(always)]
    unsafe fn chunk(&self, b: usize, g: usize, c: usize) -> __m256i {
        unsafe {
            _mm256_loadu_si256(self.q.as_ptr().add(4 * (256 * b + 32 * g + 8 * c)) as *const __m256i)
        }
    }
    #[inline(always)]
    unsafe fn scales(&self, b: usize, g: usize, h: usize) -> __m256i {
        unsafe {
            _mm256_loadu_si256(self.sv.get_unchecked(8 * b + g)[h].as_ptr() as *const __m256i)
        }
    }
    #[inline(always)]
    unsafe fn d(&self, b: usize) -> (__m256, __m256) {
        unsafe {
            (
                _mm256_loadu_ps(self.d.get_unchecked(b).as_ptr()),
                _mm256_loadu_ps(self.dmin.get_unchecked(b).as_ptr()),
            )
        }
    }
    #[inline(always)]
    unsafe fn corr(&self, b: usize) -> [__m256i; NW] {
        unsafe {
            let c = self.corr.get_unchecked(b).as_ptr() as *const __m256i;
            [
                _mm256_loadu_si256(c),
                _mm256_loadu_si256(c.add(1)),
                _mm256_loadu_si256(c.add(2)),
                _mm256_loadu_si256(c.add(3)),
            ]
        }
    }
}

/// A group of four rows repacked at load ([`super::packed`]), read in place: the chunks decoded from
/// their nibbles as they are multiplied; each super-block's headers decoded when it begins and kept in
/// registers ([`QuadMeta`]), a group's scales shuffled out of them when asked for.
#[derive(Clone, Copy)]
pub(super) struct Packed<F> {
    group: *const u8,
    /// Bytes ahead the next super-blocks are asked for (0: not).
    ahead: usize,
    /// The current super-block's headers.
    meta: QuadMeta,
    format: std::marker::PhantomData<F>,
}

impl<F: fused::KQuant> Packed<F> {
    /// The repacked group at `group` (four rows of `x.k` weights of `F`).
    pub(super) fn new(group: *const u8) -> Self {
        Self {
            group,
            // The four rows' streams are one here: four times the bytes per step of a row's.
            ahead: NW * crate::kernels::dispatch::prefetch_distance(),
            // SAFETY: zero vectors, replaced by `begin` before they are read.
            meta: unsafe {
                QuadMeta {
                    pairs: [_mm256_setzero_si256(); 4],
                    corr: [_mm256_setzero_si256(); NW],
                    d: _mm256_setzero_ps(),
                    dmin: _mm256_setzero_ps(),
                }
            },
            format: std::marker::PhantomData,
        }
    }

    /// Super-block `b` of the group at `group`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    /// `group` must point at weight bytes of the layout this function decodes, every byte it reads readable.
    #[inline(always)]
    unsafe fn at(group: *const u8, b: usize) -> *const u8 {
        unsafe { group.add(b * NW * F::BYTES) }
    }

    /// The four rows' headers of the repacked super-block at `src`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    /// `src` must point at weight bytes of the layout this function decodes, every byte it reads readable.
    #[inline(always)]
    unsafe fn headers(src: *const u8) -> [fused::Header; NW] {
        unsafe {
            [
                F::header_at(src),
                F::header_at(src.add(F::HEADER_LEN)),
                F::header_at(src.add(2 * F::HEADER_LEN)),
                F::header_at(src.add(3 * F::HEADER_LEN)),
            ]
        }
    }
}

impl<F: fused::KQuant> Quad for Packed<F> {
    const TOP: u8 = F::TOP;
    const UNROLL: bool = true;
    fn by_16(&self) -> bool {
        F::BY_16
    }
    #[inline(always)]
    unsafe fn begin(&mut self, b: usize) {
        unsafe {
            let src = Self::at(self.group, b);
            if self.ahead > 0 {
                super::loads::prefetch_lines(src.wrapping_add(self.ahead), NW * F::BYTES);
            }
            self.meta = QuadMeta::packed::<F>(src);
        }
    }
    #[inline(always)]
    unsafe fn chunk(&self, b: usize, g: usize, c: usize) -> __m256i {
        unsafe {
            let data = Self::at(self.group, b).add(NW * F::HEADER_LEN + 32 * c);
            F::group_in(data, 128, g)
        }
    }
    #[inline(always)]
    unsafe fn scales(&self, _: usize, g: usize, h: usize) -> __m256i {
        unsafe { self.meta.scales::<F>(g, h) }
    }
    #[inline(always)]
    unsafe fn scales32(&self, _: usize, g: usize, h: usize) -> __m256i {
        unsafe { self.meta.scales32::<F>(g, h) }
    }
    #[inline(always)]
    unsafe fn d(&self, _: usize) -> (__m256, __m256) {
        (self.meta.d, self.meta.dmin)
    }
    #[inline(always)]
    unsafe fn corr(&self, _: usize) -> [__m256i; NW] {
        self.meta.corr
    }
}

/// Products of the four repacked rows `group` (k-quant `format`) with activation rows
/// `r0 .. r0 + rows` (1 ≤ rows ≤ [`KR`]) into `acc[w][i]`, read in place.
///
/// # Safety
/// AVX2, FMA and F16C; `group` holds four repacked rows of `x.k` weights of `format` and `x` the rows
/// asked for, in 256-wide activation blocks.
/// With `vnni` (the CPU must have AVX-512 VNNI, VL and BW): through `kquant_vnni` (the plan sends
/// Q4_K and Q5_K groups to [`super::k45_vnni`] instead, in fewer instructions).
pub unsafe fn dot_packed(
    format: BlockFormat,
    group: &[u8],
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; KR]; NW],
    vnni: bool,
) {
    unsafe {
        let g = group.as_ptr();
        with_kquant!(
            format,
            F => packed_quad::<F>(g, x, r0, rows, acc, vnni),
            _ => unreachable!("only k-quants are repacked")
        )
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `group` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
unsafe fn packed_quad<F: fused::KQuant>(
    group: *const u8,
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; KR]; NW],
    vnni: bool,
) {
    unsafe {
        let p = Packed::<F>::new(group);
        if !vnni {
            return dot_quad(&mut { p }, x, r0, rows, acc);
        }
        match rows {
            1 => kquant_vnni::<_, 1>(p, x, r0, acc),
            2 => kquant_vnni::<_, 2>(p, x, r0, acc),
            3 => kquant_vnni::<_, 3>(p, x, r0, acc),
            _ => kquant_vnni::<_, 4>(p, x, r0, acc),
        }
    }
}

/// [`kquant`] with AVX-512 VNNI on 256-bit vectors: each chunk's products summed by `vpdpbusd` into
/// 32-bit lanes (four weights a lane), as many chunks as keep a lane within 16 bits (four for Q4_K,
/// two for Q5_K, one for Q6_K), then scaled and added by one `vpdpwssd`; even and odd groups in two
/// chains of sums, so that one group's scaling need not wait for the last. The same exact integer
/// sums as the other kernels (none of theirs saturates), the same float step, so the same bits.
///
/// Why 256 bits and not [`super::gemm512`]'s pairs of groups for a few rows: a 512-bit vector of
/// two groups' chunks costs an insert per chunk, and on CPUs that split 512-bit instructions in two
/// (AMD Zen 4) nothing is gained by the width (README, speed).
// Indexes are clearer than iterators here: `i` picks sums and activation rows.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C, AVX-512F, AVX-512VL and AVX-512 VNNI.
/// `r0` must lie within what `self` or the rows were built for: they are read without bounds checks.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn kquant_vnni<S: Quad, const RR: usize>(
    // By value: a local the compiler can keep in registers (through a reference, each super-block's
    // decoded headers went to memory and back).
    mut p: S,
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; KR]; NW],
) {
    unsafe {
        #[cfg(test)]
        crate::kernels::ran::mark(crate::kernels::ran::Kernel::Vnni);
        debug_assert_eq!(x.block, 256);
        let at = RowsAt::new(x, r0);
        let RowsAt { xq, k, kb, .. } = at;
        let mut total: Totals = [_mm256_setzero_ps(); KR / 2];
        for b in 0..kb {
            p.begin(b);
            // Even groups into one chain of sums, odd into the other.
            let mut isum = [[_mm256_setzero_si256(); RR]; 2];
            let [even, odd] = &mut isum;
            let xb = xq.add(256 * b);
            // Each group's index a constant, so that its loads, shifts and shuffles are fixed.
            vnni_group::<S, RR, 0>(&p, b, xb, k, even);
            vnni_group::<S, RR, 1>(&p, b, xb, k, odd);
            vnni_group::<S, RR, 2>(&p, b, xb, k, even);
            vnni_group::<S, RR, 3>(&p, b, xb, k, odd);
            vnni_group::<S, RR, 4>(&p, b, xb, k, even);
            vnni_group::<S, RR, 5>(&p, b, xb, k, odd);
            vnni_group::<S, RR, 6>(&p, b, xb, k, even);
            vnni_group::<S, RR, 7>(&p, b, xb, k, odd);
            let sums: [__m256i; RR] =
                std::array::from_fn(|i| _mm256_add_epi32(isum[0][i], isum[1][i]));
            let (dv, dminv) = p.d(b);
            finish_block(dv, dminv, p.corr(b), b, &sums, &at, &mut total);
        }
        store_totals::<RR, KR>(&total, acc);
    }
}

/// [`kquant`] for 1 ≤ `rows` ≤ [`KR`] activation rows.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline(always)]
unsafe fn dot_quad<S: Quad>(
    p: &mut S,
    x: &Acts,
    r0: usize,
    rows: usize,
    acc: &mut [[f32; KR]; NW],
) {
    unsafe {
        match (p.by_16(), rows) {
            (false, 1) => kquant::<S, 1, false>(p, x, r0, acc),
            (false, 2) => kquant::<S, 2, false>(p, x, r0, acc),
            (false, 3) => kquant::<S, 3, false>(p, x, r0, acc),
            (false, _) => kquant::<S, 4, false>(p, x, r0, acc),
            (true, 1) => kquant::<S, 1, true>(p, x, r0, acc),
            (true, 2) => kquant::<S, 2, true>(p, x, r0, acc),
            (true, 3) => kquant::<S, 3, true>(p, x, r0, acc),
            (true, _) => kquant::<S, 4, true>(p, x, r0, acc),
        }
    }
}

/// k-quants on interleaved rows: per group, the chunks' products summed in 16 bits, then one `madd`
/// by the scales (two for Q6_K). Per super-block, the exact integer sums are reduced and put through
/// [`super::finish::kquant_step`]'s float operations lane by lane, so the results are the other
/// kernels' bits.
// Indexes are clearer than iterators here: `h` picks both chunks and scales, `pair` two rows.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `r0` must lie within what `self` or the rows were built for: they are read without bounds checks.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kquant<S: Quad, const RR: usize, const BY_16: bool>(
    p: &mut S,
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; KR]; NW],
) {
    unsafe {
        debug_assert_eq!(x.block, 256);
        let at = RowsAt::new(x, r0);
        let RowsAt { xq, k, kb, .. } = at;
        let mut total: Totals = [_mm256_setzero_ps(); KR / 2];
        for b in 0..kb {
            p.begin(b);
            let mut isum = [_mm256_setzero_si256(); RR];
            // The groups one by one with a constant index (the decoding's shifts and offsets then
            // constants) where that is faster ([`Quad::UNROLL`]).
            let xb = xq.add(256 * b);
            if S::UNROLL {
                kquant_group::<S, RR, BY_16>(p, b, xb, k, 0, &mut isum);
                kquant_group::<S, RR, BY_16>(p, b, xb, k, 1, &mut isum);
                kquant_group::<S, RR, BY_16>(p, b, xb, k, 2, &mut isum);
                kquant_group::<S, RR, BY_16>(p, b, xb, k, 3, &mut isum);
                kquant_group::<S, RR, BY_16>(p, b, xb, k, 4, &mut isum);
                kquant_group::<S, RR, BY_16>(p, b, xb, k, 5, &mut isum);
                kquant_group::<S, RR, BY_16>(p, b, xb, k, 6, &mut isum);
                kquant_group::<S, RR, BY_16>(p, b, xb, k, 7, &mut isum);
            } else {
                for g in 0..8 {
                    kquant_group::<S, RR, BY_16>(p, b, xb, k, g, &mut isum);
                }
            }
            let (dv, dminv) = p.d(b);
            finish_block(dv, dminv, p.corr(b), b, &isum, &at, &mut total);
        }
        store_totals::<RR, KR>(&total, acc);
    }
}

/// Group `g` of super-block `b` into `isum` (activation rows at `xb`, `k` apart): [`kquant`]'s integer
/// part. Per half of the group's chunks (one half; two for Q6_K's scales per 16 weights), the products
/// summed in 16 bits, then one `madd` by the scales into `isum`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `xb` must point at the super-block's activations of the rows asked for, `k` apart, and `p` at
/// weight bytes of the layout it decodes.
#[inline(always)]
unsafe fn kquant_group<S: Quad, const RR: usize, const BY_16: bool>(
    p: &S,
    b: usize,
    xb: *const i8,
    k: usize,
    g: usize,
    isum: &mut [__m256i; RR],
) {
    unsafe {
        let halves = if BY_16 { 2 } else { 1 };
        for h in 0..halves {
            let chunks = if BY_16 { 2 * h..2 * h + 2 } else { 0..4 };
            let mut part = [_mm256_setzero_si256(); RR];
            for c in chunks {
                let wv = p.chunk(b, g, c);
                for (i, s) in part.iter_mut().enumerate() {
                    let xv = _mm256_set1_epi64x(std::ptr::read_unaligned(
                        xb.add(i * k + 32 * g + 8 * c) as *const i64,
                    ));
                    *s = _mm256_add_epi16(*s, _mm256_maddubs_epi16(wv, xv));
                }
            }
            let scales = p.scales(b, g, h);
            for (sum, part) in isum.iter_mut().zip(&part) {
                *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(*part, scales));
            }
        }
    }
}

/// Group `G` of super-block `b` into `isum` (activation rows at `xb`, `k` apart): [`kquant_vnni`]'s
/// integer part.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `xb` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
unsafe fn vnni_group<S: Quad, const RR: usize, const G: usize>(
    p: &S,
    b: usize,
    xb: *const i8,
    k: usize,
    isum: &mut [__m256i; RR],
) {
    unsafe {
        let xv = |i: usize, c: usize| {
            _mm256_set1_epi64x(std::ptr::read_unaligned(
                xb.add(i * k + 32 * G + 8 * c) as *const i64
            ))
        };
        // Chunks summed before the scale: |sum| ≤ 4 · per · TOP · 127 < 2^15 (four for Q4_K, two for
        // Q5_K, one for Q6_K, whose values reach 63).
        let per = 32767 / (4 * 127 * S::TOP as usize);
        if per < 2 {
            // Two chunks' `maddubs` pairs summed in 16 bits (|lane| ≤ 2 · 2 · 63 · 127 < 2^15), then
            // scaled and added by one `vpdpwssd`: 4 instructions per two chunks, where `vpdpbusd` into a
            // zeroed sum and `vpdpwssd` for each chunk take 6. Q6_K's scales change every two chunks.
            for c in [0, 2] {
                let (w0, w1) = (p.chunk(b, G, c), p.chunk(b, G, c + 1));
                let sc = p.scales(b, G, if p.by_16() { c / 2 } else { 0 });
                for (i, sum) in isum.iter_mut().enumerate() {
                    let pairs = _mm256_add_epi16(
                        _mm256_maddubs_epi16(w0, xv(i, c)),
                        _mm256_maddubs_epi16(w1, xv(i, c + 1)),
                    );
                    *sum = _mm256_dpwssd_epi32(*sum, pairs, sc);
                }
            }
            return;
        }
        let per = per.min(4);
        let mut c0 = 0;
        while c0 < 4 {
            let mut part = [_mm256_setzero_si256(); RR];
            for c in c0..c0 + per {
                let wv = p.chunk(b, G, c);
                for (i, s) in part.iter_mut().enumerate() {
                    // Per 32-bit lane: weights 4t … 4t + 3 of a row, exact.
                    *s = _mm256_dpbusd_epi32(*s, wv, xv(i, c));
                }
            }
            // Q4_K and Q5_K scale every 32 weights: one scale for the group.
            let sc = p.scales32(b, G, 0);
            for (sum, part) in isum.iter_mut().zip(part) {
                *sum = _mm256_dpwssd_epi32(*sum, part, sc);
            }
            c0 += per;
        }
    }
}

/// 32-weight formats: `SIGNED` weights (Q8_0) through the sign trick, the others 0…31 with an
/// additive term per block (summed afterwards, in the same order as the one-row kernel). The `NW` rows
/// go in pairs: four rows of float accumulators for two activation rows would not fit the registers.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy<const RR: usize, const SIGNED: bool>(
    p: &[Prepared; NW],
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; KR]; NW],
) {
    unsafe {
        for w0 in (0..NW).step_by(LEGACY_NW) {
            legacy_part::<RR, SIGNED>(p, w0, x, r0, acc);
        }
    }
}

/// [`legacy`] on CPUs with AVX-512 VNNI, in 256-bit vectors: all [`NW`] weight rows in one pass against
/// up to [`KR`] activation rows (AVX-512VL's 32 vector registers hold the 16 accumulators, where AVX2's
/// 16 allowed two rows of each), and each block's products summed by one `vpdpbusd` where `maddubs`
/// and `madd` took two. Every activation and weight vector loaded serves four products, not two. The
/// integer sums are the same (four products a lane, none saturating in the `maddubs` form), the float
/// steps and their order are [`legacy_part`]'s, so are the bits.
///
/// # Safety
/// As [`legacy`], and the CPU supports AVX-512F, AVX-512VL and AVX-512 VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn legacy_vnni<const RR: usize, const SIGNED: bool>(
    p: &[Prepared; NW],
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; KR]; NW],
) {
    unsafe {
        #[cfg(test)]
        crate::kernels::ran::mark(crate::kernels::ran::Kernel::Vnni);
        debug_assert_eq!(x.block, 32);
        let (k, kb) = (x.k, x.k / 32);
        let xq = x.rows_from(r0).as_ptr();
        let xd = x.scales_from(r0).as_ptr();
        let q: [*const u8; NW] = std::array::from_fn(|w| p[w].q.as_ptr());
        let d: [*const f32; NW] = std::array::from_fn(|w| p[w].d.as_ptr());
        let mut total = [[_mm256_setzero_ps(); RR]; NW];
        for b in 0..kb {
            let xv: [__m256i; RR] = std::array::from_fn(|i| {
                _mm256_loadu_si256(xq.add(i * k + 32 * b) as *const __m256i)
            });
            let dx: [__m256; RR] =
                std::array::from_fn(|i| _mm256_broadcast_ss(&*xd.add(i * kb + b)));
            for w in 0..NW {
                let wv = _mm256_loadu_si256(q[w].add(32 * b) as *const __m256i);
                let aw = if SIGNED { _mm256_sign_epi8(wv, wv) } else { wv };
                let dv = _mm256_set1_ps(*d[w].add(b));
                for i in 0..RR {
                    let xs = if SIGNED {
                        _mm256_sign_epi8(xv[i], wv)
                    } else {
                        xv[i]
                    };
                    // Per 32-bit lane the four products `madd(maddubs(..), 1)` sums there.
                    let isum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, xs);
                    let sum = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), dv);
                    total[w][i] = _mm256_fmadd_ps(sum, dx[i], total[w][i]);
                }
            }
        }
        legacy_finish::<RR, NW, SIGNED>(p, 0, x, r0, &total, acc);
    }
}

/// Weight rows one pass of [`legacy_part`] takes.
const LEGACY_NW: usize = 2;

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
/// `w0`, `r0` must lie within what `self` or the rows were built for: they are read without bounds checks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_part<const RR: usize, const SIGNED: bool>(
    p: &[Prepared; NW],
    w0: usize,
    x: &Acts,
    r0: usize,
    acc: &mut [[f32; KR]; NW],
) {
    unsafe {
        debug_assert_eq!(x.block, 32);
        let (k, kb) = (x.k, x.k / 32);
        let ones = _mm256_set1_epi16(1);
        let xq = x.rows_from(r0).as_ptr();
        let xd = x.scales_from(r0).as_ptr();
        let q: [*const u8; LEGACY_NW] = std::array::from_fn(|w| p[w0 + w].q.as_ptr());
        let d: [*const f32; LEGACY_NW] = std::array::from_fn(|w| p[w0 + w].d.as_ptr());
        let mut total = [[_mm256_setzero_ps(); RR]; LEGACY_NW];
        for b in 0..kb {
            let xv: [__m256i; RR] = std::array::from_fn(|i| {
                _mm256_loadu_si256(xq.add(i * k + 32 * b) as *const __m256i)
            });
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
        legacy_finish::<RR, LEGACY_NW, SIGNED>(p, w0, x, r0, &total, acc);
    }
}

/// The last step of [`legacy_part`] and [`legacy_vnni`] for weight rows `w0 .. w0 + N`: the additive
/// terms (as independent chains, one per pair, so that their latency overlaps; for each pair over the
/// blocks in order) and each pair's lanes summed, into `acc`.
///
/// # Safety
/// As [`legacy`]; inlined into its callers, whose target features it uses.
#[inline(always)]
unsafe fn legacy_finish<const RR: usize, const N: usize, const SIGNED: bool>(
    p: &[Prepared; NW],
    w0: usize,
    x: &Acts,
    r0: usize,
    total: &[[__m256; RR]; N],
    acc: &mut [[f32; KR]; NW],
) {
    unsafe {
        let kb = x.k / 32;
        let mut extra = [[0f32; RR]; N];
        if !SIGNED {
            let m: [*const f32; N] = std::array::from_fn(|w| p[w0 + w].m.as_ptr());
            let xs = x.scaled_from(r0).as_ptr();
            for b in 0..kb {
                for w in 0..N {
                    let mw = *m[w].add(b);
                    for (i, e) in extra[w].iter_mut().enumerate() {
                        *e = mw.mul_add(*xs.add(i * kb + b), *e);
                    }
                }
            }
        }
        for w in 0..N {
            for i in 0..RR {
                acc[w0 + w][i] = hsum(total[w][i]) + extra[w][i];
            }
        }
    }
}
