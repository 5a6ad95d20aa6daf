//! Products with 16-bit float matrices (bf16 and f16) as a checkpoint stores them, on the CPU.
//!
//! Why it exists: DeepSeek-R1-Distill and Qwen3 come from the hub as bf16 safetensors, other
//! checkpoints as f16, and random models at real shapes are bf16. candle's 16-bit products on the CPU
//! round the activations to 16 bits, and its bf16 one was the whole cost of decoding:
//! `random:qwen2.5-coder-0.5b` decoded 2.4 tokens/s at batch 1 on a 2-core AMD EPYC (Zen 4) and
//! `random:r1-distill-qwen-1.5b` 0.3 (its f16 one is a blocked GEMM: 10.8 at batch 1, prefill 131
//! on a 2-core Intel Xeon with AVX-512). Here each output is a dot product of the f32 activations
//! with a matrix row in f32, summed in f32. For one activation row (decoding at batch 1) the row is
//! widened on the fly (a bf16 is the top half of an f32: a shift; an f16 is widened by F16C's
//! `vcvtph2ps`) and read in its stored 2 bytes. For several, each task widens its matrix rows once
//! into a scratch buffer and computes tiles of activation rows × matrix rows (4 × 4 on AVX-512, 2 × 2
//! on AVX2), each loaded vector used for several products. Measured on the 0.5B's shapes in f16
//! (Intel Xeon, AVX-512, against candle's f16 product): batch 1 17.5 and 17.2 tokens/s (10.0, 10.0),
//! batch 8 57.0 and 57.9 (40.5, 40.0), prefill of 64 tokens 145.9 and 141.6 (127.7, 127.4); the
//! tiles took batch 8 from 39.6 and prefill from 79.7 (docs/models.md has bf16 too). In bf16 on the
//! AMD EPYC, before the tiles: batch 1 17.5 (2.4), batch 8 42.9 (12.6), the 1.5B's batch 1 6.2 (0.3).
//!
//! The arithmetic: every product and sum in f32, the activations never rounded to 16 bits, so the
//! result is that of the widened matrix in f32 up to the order of the sums. Every dot product, tiled
//! or not, on the stored bits or the widened row, keeps sixteen partial sums lane by lane and adds
//! them pairwise at the end, so on one code path (AVX-512, or AVX2 with FMA and F16C, as
//! `KVBENCH_PATH` caps it; widening is exact) a product's value does not depend on the batch it is in
//! or where in a tile it falls. Output columns are split into tasks on kvbench's threads.

use half::slice::HalfBitsSliceExt;
use half::{bf16, f16};

/// Which 16-bit float a matrix stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Float16 {
    Bf16,
    F16,
}

impl Float16 {
    pub fn name(self) -> &'static str {
        match self {
            Float16::Bf16 => "bf16",
            Float16::F16 => "f16",
        }
    }

    /// `bits` as f32 values appended to `out` (exact).
    fn widen_into(self, bits: &[u16], out: &mut Vec<f32>) {
        let start = out.len();
        out.resize(start + bits.len(), 0.0);
        match self {
            Float16::Bf16 => crate::cache::rows::bf16s(bits.reinterpret_cast(), &mut out[start..]),
            Float16::F16 => crate::cache::rows::f16s(bits.reinterpret_cast(), &mut out[start..]),
        }
    }
}

/// A `[rows, cols]` matrix of 16-bit floats (their bits), row-major: `cols` is the input width.
#[derive(Debug, Clone)]
pub struct Float16Matrix {
    kind: Float16,
    bits: Vec<u16>,
    rows: usize,
    cols: usize,
}

/// Matrix rows per parallel task: enough work (16 rows of a 1,536-wide matrix are 48 KiB) to pay
/// for handing it out, small enough to split a layer among the threads.
const ROWS_PER_TASK: usize = 16;

/// The most activation rows, and matrix rows, of a tile.
const MAX_SIDE: usize = 4;
const MAX_TILE: usize = MAX_SIDE * MAX_SIDE;

/// Partial sums per dot product.
const LANES: usize = 16;

impl Float16Matrix {
    /// `bits`: `rows · cols` values of `kind`, row-major.
    pub fn new(kind: Float16, bits: Vec<u16>, rows: usize, cols: usize) -> Result<Self, String> {
        if bits.len() != rows * cols {
            return Err(format!(
                "{} matrix: {} values for {rows} × {cols}",
                kind.name(),
                bits.len()
            ));
        }
        Ok(Self {
            kind,
            bits,
            rows,
            cols,
        })
    }

    pub fn kind(&self) -> Float16 {
        self.kind
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn bytes(&self) -> usize {
        self.bits.len() * 2
    }

    /// This matrix's rows followed by `other`'s (projections of one input stacked into one layer).
    pub fn stacked(mut self, other: &Float16Matrix) -> Result<Self, String> {
        if other.cols != self.cols || other.kind != self.kind {
            return Err(format!(
                "a {} matrix of {} columns and a {} matrix of {} cannot be stacked",
                self.kind.name(),
                self.cols,
                other.kind.name(),
                other.cols
            ));
        }
        self.bits.extend_from_slice(&other.bits);
        self.rows += other.rows;
        Ok(self)
    }

    /// `x Wᵀ` for `x` = `[n, cols]` f32 (row-major): `[n, rows]`.
    pub fn matmul(&self, x: &[f32], n: usize) -> Vec<f32> {
        assert_eq!(x.len(), n * self.cols, "16-bit matmul: activations' shape");
        let mut out = vec![0f32; n * self.rows];
        if n == 0 {
            return out;
        }
        let tasks = self.rows.div_ceil(ROWS_PER_TASK);
        let out_cols = crate::kernels::output::Out::new(&mut out, self.rows);
        let dots = dots_for_this_cpu();
        let dot = dots.on_bits(self.kind);
        let cols = self.cols;
        // Several activation rows: the task's matrix rows are widened once into a scratch buffer and
        // read as f32 (the same values in the same order), in tiles of activation rows × matrix rows
        // that use each loaded vector several times. Measured on random:qwen2.5-coder-0.5b (bf16,
        // AMD EPYC, before the tiles): prefill 78 tokens/s against 35 widening on the fly, batch 8
        // 41 against 24, batch 4 27-33 against 22 with it from two rows on; batch 2 the same.
        let widen_first = n > 1;
        let Tile { xb, rb, .. } = dots.tile;
        let task = |wide: &mut Vec<f32>, t: usize| {
            let r0 = t * ROWS_PER_TASK;
            let r1 = (r0 + ROWS_PER_TASK).min(self.rows);
            if !widen_first {
                for r in r0..r1 {
                    let v = dot(x, &self.bits[r * cols..(r + 1) * cols]);
                    // SAFETY: (0, r) is inside the `1 × rows` output, and task `t` alone writes
                    // columns r0..r1.
                    unsafe { out_cols.set(0, r, v) };
                }
                return;
            }
            wide.clear();
            self.kind.widen_into(&self.bits[r0 * cols..r1 * cols], wide);
            let x_row = |i: usize| &x[i * cols..(i + 1) * cols];
            let w_row = |r: usize| &wide[(r - r0) * cols..(r - r0 + 1) * cols];
            let mut sums = [0f32; MAX_TILE];
            for i0 in (0..n).step_by(xb) {
                for ra in (r0..r1).step_by(rb) {
                    if i0 + xb <= n && ra + rb <= r1 {
                        let xs: [&[f32]; MAX_SIDE] =
                            std::array::from_fn(|a| x_row(i0 + a.min(xb - 1)));
                        let ws: [&[f32]; MAX_SIDE] =
                            std::array::from_fn(|b| w_row(ra + b.min(rb - 1)));
                        (dots.tile.f)(&xs[..xb], &ws[..rb], &mut sums[..xb * rb]);
                    } else {
                        // The edges, one dot product each (the same sums as a tile's).
                        for a in 0..xb.min(n - i0) {
                            for b in 0..rb.min(r1 - ra) {
                                sums[a * rb + b] = (dots.wide)(x_row(i0 + a), w_row(ra + b));
                            }
                        }
                    }
                    for a in 0..xb.min(n - i0) {
                        for b in 0..rb.min(r1 - ra) {
                            // SAFETY: (i0 + a, ra + b) is inside the `n × rows` output, and task
                            // `t` alone writes columns r0..r1.
                            unsafe { out_cols.set(i0 + a, ra + b, sums[a * rb + b]) };
                        }
                    }
                }
            }
        };
        if n * self.rows * self.cols >= 1 << 20 {
            crate::parallel::for_each_init(tasks, Vec::new, task);
        } else {
            crate::parallel::for_each_init_on_team(tasks, Vec::new, task);
        }
        out
    }
}

/// A dot product of f32 activations with a row of 16-bit values (their bits).
type Dot = fn(&[f32], &[u16]) -> f32;
/// A dot product of f32 activations with a widened row.
type DotWide = fn(&[f32], &[f32]) -> f32;

/// Dot products of `xb` activation rows with `rb` widened matrix rows at once, each loaded vector used
/// for several products: `f(xs, ws, out)` sets `out[a·rb + b]` to `wide(xs[a], ws[b])`, bit for bit
/// (each product's sixteen partial sums in the same order).
#[derive(Clone, Copy)]
struct Tile {
    xb: usize,
    rb: usize,
    f: TileFn,
}

type TileFn = fn(&[&[f32]], &[&[f32]], &mut [f32]);

/// The dot products this CPU runs fastest.
#[derive(Clone, Copy)]
struct Dots {
    bf16: Dot,
    f16: Dot,
    wide: DotWide,
    tile: Tile,
}

impl Dots {
    fn on_bits(&self, kind: Float16) -> Dot {
        match kind {
            Float16::Bf16 => self.bf16,
            Float16::F16 => self.f16,
        }
    }
}

const PORTABLE: Dots = Dots {
    bf16: |x, w| dot_lanes::<bf16, false>(x, w.reinterpret_cast()),
    f16: |x, w| dot_lanes::<f16, false>(x, w.reinterpret_cast()),
    wide: dot_lanes::<f32, false>,
    tile: Tile {
        xb: 1,
        rb: 1,
        f: |xs, ws, out| out[0] = dot_lanes::<f32, false>(xs[0], ws[0]),
    },
};

/// The widest dot products this CPU runs, chosen once.
fn dots_for_this_cpu() -> Dots {
    static CHOSEN: std::sync::OnceLock<Dots> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        // The process's code path (`KVBENCH_PATH` caps it), as every other kernel.
        #[cfg(target_arch = "x86_64")]
        {
            use crate::kernels::dispatch::{has_avx2, has_avx512};
            if has_avx512() {
                return x86::AVX512;
            }
            if has_avx2() {
                return x86::AVX2;
            }
        }
        PORTABLE
    })
}

/// A matrix element as an f32: a 16-bit float widened (exactly), or an already widened value.
trait Element: Copy {
    fn f32(self) -> f32;
}

impl Element for bf16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        // The top half of an f32: a shift that vectorizes.
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

impl Element for f16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self.to_f32()
    }
}

impl Element for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
}

/// `Σ x[k] · w[k]` in f32 with [`LANES`] partial sums, added pairwise at the end; `FMA`: whether
/// each step is one fused multiply-add (where the CPU has it) or a product and a sum. (Blocks of
/// four activation rows sharing each widened value, written out, vectorized worse: prefill of
/// `random:qwen2.5-coder-0.5b` 23.7 tokens/s against 32 with this.)
#[inline(always)]
fn dot_lanes<W: Element, const FMA: bool>(x: &[f32], w: &[W]) -> f32 {
    let mut acc = [0f32; LANES];
    let (xc, wc) = (x.chunks_exact(LANES), w.chunks_exact(LANES));
    let (xr, wr) = (xc.remainder(), wc.remainder());
    for (xs, ws) in xc.zip(wc) {
        for l in 0..LANES {
            acc[l] = match FMA {
                true => xs[l].mul_add(ws[l].f32(), acc[l]),
                false => acc[l] + xs[l] * ws[l].f32(),
            };
        }
    }
    finish::<W, FMA>(acc, xr, wr)
}

/// The end of [`dot_lanes`]: the last `len % LANES` products into the first partial sums, then the
/// partial sums added pairwise.
#[inline(always)]
fn finish<W: Element, const FMA: bool>(mut acc: [f32; LANES], xr: &[f32], wr: &[W]) -> f32 {
    for (l, (&a, &b)) in xr.iter().zip(wr).enumerate() {
        acc[l] = match FMA {
            true => a.mul_add(b.f32(), acc[l]),
            false => acc[l] + a * b.f32(),
        };
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0]
}

/// The AVX2 and AVX-512 dot products: [`dot_lanes`] compiled for them, and f16 rows widened by F16C
/// sixteen at a time into the same sixteen partial sums in the same order (the compiler does not
/// vectorize a scalar f16 conversion).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{dot_lanes, finish, Dots, LANES};
    use half::slice::HalfBitsSliceExt;
    use half::{bf16, f16};
    use std::arch::x86_64::*;

    /// One instruction set's table: every function in it needs that set's features, and the table is
    /// chosen only where the CPU reports them (`dots_for_this_cpu`: `has_avx2`, `has_avx512`).
    macro_rules! table {
        ($bits:ident, $wide:ident, $tile:ident, $xb:literal, $rb:literal) => {
            Dots {
                // SAFETY (each entry): the CPU has the table's features, as above.
                bf16: |x, w| unsafe { $bits::<bf16>(x, w) },
                f16: |x, w| unsafe { $bits::<f16>(x, w) },
                wide: |x, w| unsafe { $wide(x, w) },
                tile: super::Tile {
                    xb: $xb,
                    rb: $rb,
                    f: |xs, ws, out| unsafe { $tile::<$xb, $rb>(xs, ws, out) },
                },
            }
        };
    }

    pub const AVX2: Dots = table!(bits_avx2, wide_avx2, tile_avx2, 2, 2);
    pub const AVX512: Dots = table!(bits_avx512, wide_avx512, tile_avx512, 4, 4);

    /// [`dot_lanes`] on widened rows with fused multiply-adds.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn wide_avx2(x: &[f32], w: &[f32]) -> f32 {
        dot_lanes::<f32, true>(x, w)
    }

    /// [`dot_lanes`] on widened rows with fused multiply-adds, on 512-bit vectors.
    ///
    /// # Safety
    /// The CPU must support AVX-512F and BW besides AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    unsafe fn wide_avx512(x: &[f32], w: &[f32]) -> f32 {
        dot_lanes::<f32, true>(x, w)
    }

    /// The width of a tile's rows, checked: `XB` activation rows and `RB` matrix rows of one width,
    /// `XB·RB` outputs (the bounds the tiles' loads rely on).
    #[inline(always)]
    fn tile_width<const XB: usize, const RB: usize>(
        xs: &[&[f32]],
        ws: &[&[f32]],
        out: &[f32],
    ) -> usize {
        let cols = xs[0].len();
        assert!(xs.len() == XB && ws.len() == RB && out.len() == XB * RB);
        assert!(xs.iter().chain(ws).all(|r| r.len() == cols));
        cols
    }

    /// [`super::Tile`] on 512-bit vectors: one register of sixteen partial sums per product, the
    /// `RB` matrix rows' vectors loaded once for the `XB` activation rows.
    ///
    /// # Safety
    /// The CPU must support AVX-512F besides AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    unsafe fn tile_avx512<const XB: usize, const RB: usize>(
        xs: &[&[f32]],
        ws: &[&[f32]],
        out: &mut [f32],
    ) {
        let cols = tile_width::<XB, RB>(xs, ws, out);
        let mut acc = [[_mm512_setzero_ps(); RB]; XB];
        let mut w = [_mm512_setzero_ps(); RB];
        let mut k = 0;
        while k + LANES <= cols {
            for b in 0..RB {
                // SAFETY: k + 16 ≤ cols, the length of every row (asserted above).
                w[b] = unsafe { _mm512_loadu_ps(ws[b].as_ptr().add(k)) };
            }
            for a in 0..XB {
                // SAFETY: as above.
                let xv = unsafe { _mm512_loadu_ps(xs[a].as_ptr().add(k)) };
                for b in 0..RB {
                    acc[a][b] = _mm512_fmadd_ps(xv, w[b], acc[a][b]);
                }
            }
            k += LANES;
        }
        for a in 0..XB {
            for b in 0..RB {
                let mut lanes = [0f32; LANES];
                // SAFETY: `lanes` holds sixteen values.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[a][b]) };
                out[a * RB + b] = finish::<f32, true>(lanes, &xs[a][k..], &ws[b][k..]);
            }
        }
    }

    /// [`super::Tile`] on 256-bit vectors: two registers (partial sums 0–7 and 8–15) per product.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2<const XB: usize, const RB: usize>(
        xs: &[&[f32]],
        ws: &[&[f32]],
        out: &mut [f32],
    ) {
        let cols = tile_width::<XB, RB>(xs, ws, out);
        let mut acc = [[[_mm256_setzero_ps(); 2]; RB]; XB];
        let mut w = [[_mm256_setzero_ps(); 2]; RB];
        let mut k = 0;
        while k + LANES <= cols {
            for (wb, row) in w.iter_mut().zip(ws) {
                for (h, v) in wb.iter_mut().enumerate() {
                    // SAFETY: k + 16 ≤ cols, the length of every row (asserted above).
                    *v = unsafe { _mm256_loadu_ps(row.as_ptr().add(k + 8 * h)) };
                }
            }
            for a in 0..XB {
                for h in 0..2 {
                    // SAFETY: as above.
                    let xv = unsafe { _mm256_loadu_ps(xs[a].as_ptr().add(k + 8 * h)) };
                    for b in 0..RB {
                        acc[a][b][h] = _mm256_fmadd_ps(xv, w[b][h], acc[a][b][h]);
                    }
                }
            }
            k += LANES;
        }
        for a in 0..XB {
            for b in 0..RB {
                let mut lanes = [0f32; LANES];
                // SAFETY: `lanes` holds sixteen values.
                unsafe {
                    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[a][b][0]);
                    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[a][b][1]);
                }
                out[a * RB + b] = finish::<f32, true>(lanes, &xs[a][k..], &ws[b][k..]);
            }
        }
    }

    /// A 16-bit float type widened eight or sixteen at a time (exactly).
    trait Widen: super::Element {
        /// Stored bits as values of this type.
        fn values(bits: &[u16]) -> &[Self];
        /// Eight values at `p` as f32.
        ///
        /// # Safety
        /// AVX2, FMA and F16C; `p` valid for eight values.
        unsafe fn eight(p: *const u16) -> __m256;
        /// Sixteen values at `p` as f32.
        ///
        /// # Safety
        /// AVX-512F and BW besides the above; `p` valid for sixteen values.
        unsafe fn sixteen(p: *const u16) -> __m512;
    }

    impl Widen for f16 {
        fn values(bits: &[u16]) -> &[Self] {
            bits.reinterpret_cast()
        }
        #[inline(always)]
        unsafe fn eight(p: *const u16) -> __m256 {
            // SAFETY: the caller's.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
        }
        #[inline(always)]
        unsafe fn sixteen(p: *const u16) -> __m512 {
            // SAFETY: the caller's.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
        }
    }

    impl Widen for bf16 {
        fn values(bits: &[u16]) -> &[Self] {
            bits.reinterpret_cast()
        }
        /// Each value's bits as an f32's upper half.
        #[inline(always)]
        unsafe fn eight(p: *const u16) -> __m256 {
            // SAFETY: the caller's.
            unsafe {
                let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))
            }
        }
        #[inline(always)]
        unsafe fn sixteen(p: *const u16) -> __m512 {
            // SAFETY: the caller's.
            unsafe {
                let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
                _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))
            }
        }
    }

    /// [`dot_lanes`] over a row's bits, partial sums 0–7 and 8–15 in two registers. (The compiler's
    /// own vectorization of the bf16 shift ran batch-1 decoding at 6.9 tokens/s on an Intel Xeon
    /// where F16C's f16 product ran 17.5, in the same binary; written out, bf16 ran 16.4 and 16.7.)
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn bits_avx2<W: Widen>(x: &[f32], w: &[u16]) -> f32 {
        let n = x.len().min(w.len());
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + LANES <= n {
            // SAFETY: i + 16 ≤ n, inside both slices; the CPU's features are the caller's.
            unsafe {
                let w_lo = W::eight(w.as_ptr().add(i));
                let w_hi = W::eight(w.as_ptr().add(i + 8));
                lo = _mm256_fmadd_ps(_mm256_loadu_ps(x.as_ptr().add(i)), w_lo, lo);
                hi = _mm256_fmadd_ps(_mm256_loadu_ps(x.as_ptr().add(i + 8)), w_hi, hi);
            }
            i += LANES;
        }
        let mut acc = [0f32; LANES];
        // SAFETY: `acc` holds sixteen values.
        unsafe {
            _mm256_storeu_ps(acc.as_mut_ptr(), lo);
            _mm256_storeu_ps(acc.as_mut_ptr().add(8), hi);
        }
        finish::<W, true>(acc, &x[i..n], W::values(&w[i..n]))
    }

    /// [`dot_lanes`] over a row's bits, the sixteen partial sums in one register.
    ///
    /// # Safety
    /// The CPU must support AVX-512F and BW besides AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn bits_avx512<W: Widen>(x: &[f32], w: &[u16]) -> f32 {
        let n = x.len().min(w.len());
        let mut acc16 = _mm512_setzero_ps();
        let mut i = 0;
        while i + LANES <= n {
            // SAFETY: i + 16 ≤ n, inside both slices; the CPU's features are the caller's.
            unsafe {
                let wf = W::sixteen(w.as_ptr().add(i));
                acc16 = _mm512_fmadd_ps(_mm512_loadu_ps(x.as_ptr().add(i)), wf, acc16);
            }
            i += LANES;
        }
        let mut acc = [0f32; LANES];
        // SAFETY: `acc` holds sixteen values.
        unsafe { _mm512_storeu_ps(acc.as_mut_ptr(), acc16) };
        finish::<W, true>(acc, &x[i..n], W::values(&w[i..n]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(kind: Float16, v: f32) -> u16 {
        match kind {
            Float16::Bf16 => bf16::from_f32(v).to_bits(),
            Float16::F16 => f16::from_f32(v).to_bits(),
        }
    }

    fn widened(kind: Float16, b: &[u16]) -> Vec<f32> {
        b.iter()
            .map(|&b| match kind {
                Float16::Bf16 => bf16::from_bits(b).to_f32(),
                Float16::F16 => f16::from_bits(b).to_f32(),
            })
            .collect()
    }

    /// Against the widened matrix in f64, both kinds: every width's remainder, one to nine
    /// activation rows (the four-row blocks and their rest), rows that end a task short; every dot
    /// product path (f16 values include subnormals, infinities excluded).
    #[test]
    fn products_are_the_widened_matrix_s_to_f32_rounding() {
        for kind in [Float16::Bf16, Float16::F16] {
            for (rows, cols, n) in [
                (1, 1, 1),
                (17, 33, 5),
                (40, 896, 9),
                (3, 16, 4),
                (33, 100, 1),
            ] {
                let w: Vec<u16> = (0..rows * cols)
                    .map(|i| {
                        let v = ((i * 7919 % 2003) as f32 - 1001.0) / 613.0;
                        // Every seventh value tiny: f16 subnormals (below 6.1e-5).
                        bits(kind, if i % 7 == 3 { v * 1e-5 } else { v })
                    })
                    .collect();
                let wide = widened(kind, &w);
                let x: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.731).sin()).collect();
                let m = Float16Matrix::new(kind, w.clone(), rows, cols).unwrap();
                let got = m.matmul(&x, n);
                for i in 0..n {
                    for r in 0..rows {
                        let want: f64 = (0..cols)
                            .map(|k| x[i * cols + k] as f64 * wide[r * cols + k] as f64)
                            .sum();
                        let tol = 1e-5 * (cols as f64).sqrt() * (1.0 + want.abs());
                        let g = got[i * rows + r] as f64;
                        assert!(
                            (g - want).abs() <= tol,
                            "{kind:?} {rows}×{cols}, n {n}: [{i},{r}] {g} vs {want}"
                        );
                    }
                }
                // Each dot product, on the bits and on widened rows, portable and this CPU's: the
                // same sums in the same order, so the bits and the widened row give the same bits.
                let (row, wrow) = (&w[..cols], &wide[..cols]);
                let want: f64 = (0..cols).map(|k| x[k] as f64 * wrow[k] as f64).sum();
                for d in [PORTABLE, dots_for_this_cpu()] {
                    let d_bits = d.on_bits(kind)(&x[..cols], row);
                    assert_eq!(d_bits, (d.wide)(&x[..cols], wrow), "{kind:?} {cols}");
                    let tol = 1e-5 * (cols as f64).sqrt() * (1.0 + want.abs());
                    assert!((d_bits as f64 - want).abs() <= tol, "{kind:?} {cols}");
                }
                // The product is this CPU's dot product of each pair, bit for bit, whether a tile
                // or an edge computed it.
                let wide_dot = dots_for_this_cpu().wide;
                for i in 0..n {
                    for r in 0..rows {
                        let xi = &x[i * cols..(i + 1) * cols];
                        let wr = &wide[r * cols..(r + 1) * cols];
                        assert_eq!(got[i * rows + r], wide_dot(xi, wr), "{kind:?} [{i},{r}]");
                    }
                }
            }
        }
    }

    /// Every tile this CPU runs gives each pair's dot product of its path bit for bit.
    #[test]
    fn tiles_are_their_dot_products() {
        let cols = 16 * 5 + 7;
        let rows: Vec<Vec<f32>> = (0..8)
            .map(|r| {
                (0..cols)
                    .map(|k| ((r * 131 + k * 17) as f32 * 0.01).sin())
                    .collect()
            })
            .collect();
        let mut paths = vec![PORTABLE];
        #[cfg(target_arch = "x86_64")]
        {
            use crate::kernels::dispatch::{has_avx2, has_avx512};
            if has_avx2() {
                paths.push(x86::AVX2);
            }
            if has_avx512() {
                paths.push(x86::AVX512);
            }
        }
        for d in paths {
            let Tile { xb, rb, f } = d.tile;
            let xs: Vec<&[f32]> = rows[..xb].iter().map(|r| r.as_slice()).collect();
            let ws: Vec<&[f32]> = rows[8 - rb..].iter().map(|r| r.as_slice()).collect();
            let mut out = vec![0f32; xb * rb];
            f(&xs, &ws, &mut out);
            for a in 0..xb {
                for b in 0..rb {
                    assert_eq!(
                        out[a * rb + b],
                        (d.wide)(xs[a], ws[b]),
                        "{xb}×{rb} [{a},{b}]"
                    );
                }
            }
        }
    }

    /// Every x86 path this CPU runs gives, from the stored bits of either kind, the fused
    /// multiply-adds of the generic sixteen-lane dot product bit for bit (the widening is exact and
    /// the sums are in the same order).
    #[test]
    fn x86_dots_on_bits_agree_to_the_bit() {
        let cols = 16 * 9 + 5;
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).cos()).collect();
        for kind in [Float16::Bf16, Float16::F16] {
            let w: Vec<u16> = (0..cols)
                .map(|i| bits(kind, ((i * 31 % 97) as f32 - 48.0) / 7.0))
                .collect();
            let fma = match kind {
                Float16::Bf16 => dot_lanes::<bf16, true>(&x, w.reinterpret_cast()),
                Float16::F16 => dot_lanes::<f16, true>(&x, w.reinterpret_cast()),
            };
            assert!(fma.is_finite());
            #[cfg(target_arch = "x86_64")]
            {
                use crate::kernels::dispatch::{has_avx2, has_avx512};
                if has_avx2() {
                    assert_eq!(x86::AVX2.on_bits(kind)(&x, &w), fma, "{kind:?}");
                }
                if has_avx512() {
                    assert_eq!(x86::AVX512.on_bits(kind)(&x, &w), fma, "{kind:?}");
                }
            }
        }
    }

    #[test]
    fn stacking_appends_rows_and_refuses_other_widths_and_kinds() {
        let one = |kind, v: f32, n: usize, rows, cols| {
            Float16Matrix::new(kind, vec![bits(kind, v); n], rows, cols).unwrap()
        };
        let a = one(Float16::Bf16, 1.0, 6, 2, 3);
        let b = one(Float16::Bf16, 2.0, 3, 1, 3);
        let s = a.clone().stacked(&b).unwrap();
        assert_eq!((s.rows(), s.cols(), s.bytes()), (3, 3, 18));
        assert_eq!(s.matmul(&[1.0, 1.0, 1.0], 1), vec![3.0, 3.0, 6.0]);
        assert!(a
            .clone()
            .stacked(&one(Float16::Bf16, 0.0, 4, 1, 4))
            .is_err());
        assert!(a.stacked(&one(Float16::F16, 2.0, 3, 1, 3)).is_err());
        let h = one(Float16::F16, 0.5, 6, 2, 3).stacked(&one(Float16::F16, 0.25, 3, 1, 3));
        assert_eq!(h.unwrap().matmul(&[1.0, 2.0, 4.0], 1), vec![3.5, 3.5, 1.75]);
        assert!(Float16Matrix::new(Float16::F16, vec![0; 5], 2, 3).is_err());
        // No activation rows: no output, nothing written.
        assert!(one(Float16::F16, 0.5, 6, 2, 3).matmul(&[], 0).is_empty());
    }
}
