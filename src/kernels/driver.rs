//! The multi-row driver: `y = x Wᵀ` for a [`QMatrix`] and quantized activations.
//!
//! Output columns are split into tasks run in parallel, which a decoding team's threads claim in runs
//! of consecutive tasks (`crate::parallel::for_each_range_init`: each run one stream of weights).
//! Within a task, activation rows go in tiles (`tile_rows`: as many as keep the tile's bytes in L2
//! while the task's weight rows stream past). Which kernel computes a task's columns is the
//! [`Plan`]'s choice ([`super::dispatch`]), carried out by the instruction set's side of the driver
//! (`x86::columns`), or by the portable kernel ([`super::portable`]) on any other CPU.

use super::acts::Acts;
use super::dispatch::{Path, Plan};
use super::matrix::QMatrix;
use super::output::Out;
use super::portable::portable;
use super::unpacked::Unpacked;
#[cfg(target_arch = "x86_64")]
use super::x86::{columns, finish};
use std::ops::Range;

/// Activation bytes a tile may hold: half of a 512 KiB L2, leaving room for the weights.
const TILE_BYTES: usize = 256 * 1024;

/// Activation rows per tile for `m` rows of `k` inputs: at most as many as keep a tile's 8-bit
/// activations in L2 (64 rows of 1,536 inputs, 29 of 8,960; never fewer than 16), the `m` rows then
/// split into tiles of equal size rounded up to whole k-quant calls (32 rows of 8,960 inputs: two of 16,
/// not 29 and 3).
fn tile_rows(m: usize, k: usize) -> usize {
    let most = (TILE_BYTES / k.max(1)).clamp(16, 64);
    let tiles = m.div_ceil(most).max(1);
    m.div_ceil(tiles).next_multiple_of(gemm_rows())
}

/// The k-quant kernel's activation rows per call, which tiles are made a multiple of.
fn gemm_rows() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        finish::KR
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        1
    }
}

/// `y = x Wᵀ` on `path` (or the widest path below it that this CPU runs): `m × n` row-major. Refuses
/// activations that do not fit the matrix ([`ShapeError`]) before any kernel reads them.
pub fn run(w: &QMatrix, x: &Acts, path: Path) -> Result<Vec<f32>, ShapeError> {
    check(w, x)?;
    let (n, m, k) = (w.rows(), x.m, w.cols());
    let plan = Plan::new(path, m);
    let tile = tile_rows(m, k);
    let per_task = plan.cols_per_task;
    let task = |dst: &Out, scratch: &mut Scratch, cols: Range<usize>| {
        for t0 in (0..m).step_by(tile) {
            let rows = t0..(t0 + tile).min(m);
            let mut j = cols.start;
            while j < cols.end {
                #[cfg(target_arch = "x86_64")]
                if plan.path.simd() {
                    // SAFETY: the plan's path is one this CPU runs (`Plan::new`); the columns are
                    // this task's only; `check` matched the activations to the matrix.
                    j += unsafe {
                        columns::next(
                            w,
                            x,
                            rows.clone(),
                            (j, cols.start, cols.end),
                            &plan,
                            &mut scratch.x86,
                            dst,
                        )
                    };
                    continue;
                }
                portable_column(w, x, rows.clone(), j, scratch, dst);
                j += 1;
            }
        }
    };
    // Tasks of `per_task` columns, claimed in runs of consecutive tasks (a run's weights are one stream
    // for the prefetchers; see `for_each_range_init`).
    let fill = |dst: &Out| {
        crate::parallel::for_each_range_init(
            n,
            per_task,
            per_task,
            Scratch::default,
            |scratch, run| {
                for start in run.clone().step_by(per_task) {
                    task(dst, scratch, start..(start + per_task).min(run.end));
                }
            },
        )
    };
    // SAFETY: the runs cover columns `0..n`, a task's loop every row of its columns (each kernel
    // writes all the rows it is given of the columns it says it did).
    Ok(unsafe { super::output::written(m, n, fill) })
}

/// Inputs a product was given that do not fit each other: `run` is safe and public, and its kernels
/// read the activations and weights without bounds checks, so a mismatch is refused before any read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kernels: {0}")]
pub struct ShapeError(String);

/// The checks `run` makes (a constant cost per call): the activations have the matrix's width, in
/// the activation block its format reads, and every buffer has the length its shape implies.
fn check(w: &QMatrix, x: &Acts) -> Result<(), ShapeError> {
    let (m, k, block) = x.shape();
    let bad = |why: String| Err(ShapeError(why));
    if k != w.cols() {
        return bad(format!(
            "activations of {k} values for a matrix of {} columns",
            w.cols()
        ));
    }
    if block != w.act_block() {
        return bad(format!(
            "activations in blocks of {block} for a matrix whose format reads blocks of {}",
            w.act_block()
        ));
    }
    let kb = k / block;
    let sums32 = if block == 256 { m * (k / 32) } else { 0 };
    if x.q.len() != m * k
        || x.d.len() != m * kb
        || x.scaled.len() != m * kb
        || x.sums.len() != m * (k / 16)
        || x.sums32.len() != sums32
    {
        return bad(format!(
            "activation buffers that do not hold {m} rows of {k}"
        ));
    }
    Ok(())
}

/// Activation rows one portable call multiplies with an unpacked weight row.
const ROWS: usize = 8;

/// Column `j` for activation `rows`: the weight row unpacked once, then multiplied eight activation
/// rows at a time by the portable kernel.
fn portable_column(
    w: &QMatrix,
    x: &Acts,
    rows: Range<usize>,
    j: usize,
    scratch: &mut Scratch,
    out: &Out,
) {
    let (format, bytes) = w.raw_row(j, &mut scratch.raw);
    let unpacked = scratch
        .unpacked
        .get_or_insert_with(|| Unpacked::with_len(w.cols(), w.has_min()));
    format.unpack_row(bytes, unpacked);
    let mut r = rows.start;
    while r < rows.end {
        let take = (rows.end - r).min(ROWS);
        let mut acc = [0f32; ROWS];
        portable(unpacked, format.has_min(), x, r, take, &mut acc);
        for (i, a) in acc.iter().take(take).enumerate() {
            // SAFETY: a row of the activations, a column of the weights, owned by this task.
            unsafe { out.set(r + i, j, *a) };
        }
        r += take;
    }
}

/// A task's decoded weight rows.
#[derive(Default)]
struct Scratch {
    /// The portable path's row, allocated on first use: the x86 kernels never need it, and every
    /// split of the parallel loop builds a scratch (several per product, a hundred products a step).
    unpacked: Option<Unpacked>,
    /// A repacked row put back as in the file, for the portable kernel.
    raw: Vec<u8>,
    #[cfg(target_arch = "x86_64")]
    x86: columns::Scratch,
}

impl QMatrix {
    /// `y = x Wᵀ`: `x` is `m × k` row-major; returns `m × n` row-major.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_with(x, m, Path::best())
    }

    /// [`matmul`](Self::matmul) on a chosen code path (tests compare the paths).
    pub fn matmul_with(&self, x: &[f32], m: usize, path: Path) -> Vec<f32> {
        assert_eq!(
            x.len(),
            m * self.cols(),
            "QMatrix::matmul: bad input length"
        );
        let acts = Acts::quantize(x, m, self.cols(), self.act_block());
        run(self, &acts, path).expect("activations quantized for this matrix")
    }
}
