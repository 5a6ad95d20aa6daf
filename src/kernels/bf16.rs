//! Products with bf16 matrices as a checkpoint stores them, on the CPU.
//!
//! Why it exists: DeepSeek-R1-Distill and Qwen3 come from the hub as bf16 safetensors, and random
//! models at real shapes are bf16 too. candle's bf16 product on the CPU was the whole cost of
//! decoding them: `random:qwen2.5-coder-0.5b` decoded 2.4 tokens/s at batch 1 on the 2-core AMD EPYC
//! (Zen 4) and `random:r1-distill-qwen-1.5b` 0.3. Here each output is a dot product of the f32
//! activations with a matrix row in f32, summed in f32: for one activation row (decoding at batch 1)
//! the row is widened on the fly (a bf16 is the top half of an f32: a shift) and read in its stored
//! 2 bytes; for several, each task widens its matrix rows once into a scratch buffer that every
//! activation row then reads (the same values in the same order). Measured against candle's product:
//! 17 and 6.2 tokens/s at batch 1, batch 8 of the 0.5B 43 (13.6), prefill of the 1.5B 19.8 (8.3), of
//! the 0.5B about the same (73 against 69).
//!
//! The arithmetic: every product and sum in f32, the activations never rounded to bf16 (candle's
//! bf16 product rounds them first), so the result is that of the widened matrix in f32 up to the
//! order of the sums. Output columns are split into tasks on kvbench's threads; within a task each
//! matrix row is used for four activation rows while it is in cache, and sixteen partial sums per
//! dot product let the compiler keep them in vector registers (AVX-512, or AVX2 with FMA, the
//! process's code path as `KVBENCH_PATH` caps it).

/// A `[rows, cols]` matrix of bf16 values (their bits), row-major: `cols` is the input width.
#[derive(Debug, Clone)]
pub struct Bf16Matrix {
    bits: Vec<u16>,
    rows: usize,
    cols: usize,
}

/// Matrix rows per parallel task: enough work (16 rows of a 1,536-wide matrix are 48 KiB) to pay
/// for handing it out, small enough to split a layer among the threads.
const ROWS_PER_TASK: usize = 16;

/// Activation rows that share each loaded matrix row.
const X_ROWS: usize = 4;

/// Partial sums per dot product.
const LANES: usize = 16;

impl Bf16Matrix {
    /// `bits`: `rows · cols` bf16 values, row-major.
    pub fn new(bits: Vec<u16>, rows: usize, cols: usize) -> Result<Self, String> {
        if bits.len() != rows * cols {
            return Err(format!(
                "bf16 matrix: {} values for {rows} × {cols}",
                bits.len()
            ));
        }
        Ok(Self { bits, rows, cols })
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
    pub fn stacked(mut self, other: &Bf16Matrix) -> Result<Self, String> {
        if other.cols != self.cols {
            return Err(format!(
                "bf16 matrices of {} and {} columns cannot be stacked",
                self.cols, other.cols
            ));
        }
        self.bits.extend_from_slice(&other.bits);
        self.rows += other.rows;
        Ok(self)
    }

    /// `x Wᵀ` for `x` = `[n, cols]` f32 (row-major): `[n, rows]`.
    pub fn matmul(&self, x: &[f32], n: usize) -> Vec<f32> {
        assert_eq!(x.len(), n * self.cols, "bf16 matmul: activations' shape");
        let mut out = vec![0f32; n * self.rows];
        let tasks = self.rows.div_ceil(ROWS_PER_TASK);
        let out_cols = crate::kernels::output::Out::new(&mut out, self.rows);
        let (dot, dot_wide) = dots_for_this_cpu();
        let cols = self.cols;
        // Several activation rows: the task's matrix rows are widened once into a scratch buffer and
        // every activation row reads them as f32 (the same values in the same order). Measured on
        // random:qwen2.5-coder-0.5b: prefill 78 tokens/s against 35 widening on the fly, batch 8
        // 41 against 24, batch 4 27-33 against 22 with it from two rows on; batch 2 the same.
        let widen_first = n > 1;
        let task = |wide: &mut Vec<f32>, t: usize| {
            let r0 = t * ROWS_PER_TASK;
            let r1 = (r0 + ROWS_PER_TASK).min(self.rows);
            if widen_first {
                wide.clear();
                wide.extend(self.bits[r0 * cols..r1 * cols].iter().map(|&b| widen(b)));
            }
            for i0 in (0..n).step_by(X_ROWS) {
                let i1 = (i0 + X_ROWS).min(n);
                for r in r0..r1 {
                    for i in i0..i1 {
                        let xi = &x[i * cols..(i + 1) * cols];
                        let v = match widen_first {
                            true => dot_wide(xi, &wide[(r - r0) * cols..(r - r0 + 1) * cols]),
                            false => dot(xi, &self.bits[r * cols..(r + 1) * cols]),
                        };
                        // SAFETY: (i, r) is inside the `n × rows` output, and task `t` alone
                        // writes columns r0..r1.
                        unsafe { out_cols.set(i, r, v) };
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

type Dot = fn(&[f32], &[u16]) -> f32;
type DotWide = fn(&[f32], &[f32]) -> f32;

/// The widest dot products this CPU runs (with bf16 and with widened rows), chosen once.
fn dots_for_this_cpu() -> (Dot, DotWide) {
    static CHOSEN: std::sync::OnceLock<(Dot, DotWide)> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        // The process's code path (`KVBENCH_PATH` caps it), as every other kernel.
        #[cfg(target_arch = "x86_64")]
        {
            use crate::kernels::dispatch::{has_avx2, has_avx512};
            if has_avx512() {
                return (dot_avx512::<u16>, dot_avx512::<f32>);
            }
            if has_avx2() {
                return (dot_avx2::<u16>, dot_avx2::<f32>);
            }
        }
        (dot_portable::<u16>, dot_portable::<f32>)
    })
}

fn widen(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// A matrix element as an f32: a bf16's bits widened, or an already widened value.
trait Element: Copy {
    fn f32(self) -> f32;
}

impl Element for u16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        widen(self)
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

fn dot_portable<W: Element>(x: &[f32], w: &[W]) -> f32 {
    dot_lanes::<W, false>(x, w)
}

#[cfg(target_arch = "x86_64")]
fn dot_avx2<W: Element>(x: &[f32], w: &[W]) -> f32 {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn inner<W: Element>(x: &[f32], w: &[W]) -> f32 {
        dot_lanes::<W, true>(x, w)
    }
    // SAFETY: chosen only where the CPU reports AVX2 and FMA (`dots_for_this_cpu`, `has_avx2`).
    unsafe { inner(x, w) }
}

#[cfg(target_arch = "x86_64")]
fn dot_avx512<W: Element>(x: &[f32], w: &[W]) -> f32 {
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    unsafe fn inner<W: Element>(x: &[f32], w: &[W]) -> f32 {
        dot_lanes::<W, true>(x, w)
    }
    // SAFETY: chosen only where the CPU reports AVX-512F and BW besides AVX2 and FMA
    // (`dots_for_this_cpu`, `has_avx512`).
    unsafe { inner(x, w) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16_bits(v: f32) -> u16 {
        half::bf16::from_f32(v).to_bits()
    }

    /// Against the widened matrix in f64: every width's remainder, one to nine activation rows (the
    /// four-row blocks and their rest), rows that end a task short; every dot product path.
    #[test]
    fn products_are_the_widened_matrix_s_to_f32_rounding() {
        for (rows, cols, n) in [
            (1, 1, 1),
            (17, 33, 5),
            (40, 896, 9),
            (3, 16, 4),
            (33, 100, 1),
        ] {
            let w: Vec<u16> = (0..rows * cols)
                .map(|i| bf16_bits(((i * 7919 % 2003) as f32 - 1001.0) / 613.0))
                .collect();
            let x: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.731).sin()).collect();
            let m = Bf16Matrix::new(w.clone(), rows, cols).unwrap();
            let got = m.matmul(&x, n);
            for i in 0..n {
                for r in 0..rows {
                    let want: f64 = (0..cols)
                        .map(|k| x[i * cols + k] as f64 * widen(w[r * cols + k]) as f64)
                        .sum();
                    let tol = 1e-5 * (cols as f64).sqrt() * (1.0 + want.abs());
                    let g = got[i * rows + r] as f64;
                    assert!(
                        (g - want).abs() <= tol,
                        "{rows}×{cols}, n {n}: [{i},{r}] {g} vs {want}"
                    );
                }
            }
            // Each dot product, on bf16 bits and on widened rows, portable and this CPU's: the same
            // sums, and the bits and the widened row give the same bits.
            let wide: Vec<f32> = w[..cols].iter().map(|&b| widen(b)).collect();
            let want: f64 = (0..cols).map(|k| x[k] as f64 * wide[k] as f64).sum();
            for (dot, dot_wide) in [
                (dot_portable::<u16> as Dot, dot_portable::<f32> as DotWide),
                dots_for_this_cpu(),
            ] {
                let d = dot(&x[..cols], &w[..cols]);
                assert_eq!(d, dot_wide(&x[..cols], &wide));
                let tol = 1e-5 * (cols as f64).sqrt() * (1.0 + want.abs());
                assert!((d as f64 - want).abs() <= tol);
            }
        }
    }

    #[test]
    fn stacking_appends_rows_and_refuses_other_widths() {
        let a = Bf16Matrix::new(vec![bf16_bits(1.0); 6], 2, 3).unwrap();
        let b = Bf16Matrix::new(vec![bf16_bits(2.0); 3], 1, 3).unwrap();
        let s = a.clone().stacked(&b).unwrap();
        assert_eq!((s.rows(), s.cols(), s.bytes()), (3, 3, 18));
        assert_eq!(s.matmul(&[1.0, 1.0, 1.0], 1), vec![3.0, 3.0, 6.0]);
        let c = Bf16Matrix::new(vec![0; 4], 1, 4).unwrap();
        assert!(a.stacked(&c).is_err());
        assert!(Bf16Matrix::new(vec![0; 5], 2, 3).is_err());
    }
}
