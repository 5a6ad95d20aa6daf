//! The multi-row driver: `y = x Wᵀ` for a [`QMatrix`] and quantized activations.
//!
//! Output columns are split into tasks run in parallel. Within a task, activation rows go in tiles of
//! [`TILE`] (a tile of 1,536-wide rows is 96 KiB of bytes: it stays in cache while the task's weight
//! rows stream past); each weight row is decoded once per tile (into L1) and multiplied with eight
//! activation rows at a time. Decoding (a few rows) is one tile: each weight row is read once per call.

use super::acts::Acts;
use super::dot::{portable, Path};
use super::{QMatrix, Unpacked};
use rayon::prelude::*;

/// Activation rows per tile.
const TILE: usize = 64;
/// Output columns per task (weight rows unpacked and used by one thread in turn).
const COLS: usize = 32;

pub fn run(w: &QMatrix, x: &Acts, path: Path) -> Vec<f32> {
    let (n, m, k) = (w.rows(), x.m, w.cols());
    let mut out = vec![0f32; m * n];
    let out_ptr = SendPtr(out.as_mut_ptr());
    let has_min = w.has_min();
    let path = if path == Path::Avx2 && !super::dot::has_avx2() {
        Path::Portable
    } else {
        path
    };
    (0..n.div_ceil(COLS)).into_par_iter().for_each_init(
        || Scratch {
            unpacked: Unpacked::with_len(k, has_min),
            #[cfg(target_arch = "x86_64")]
            prepared: Default::default(),
        },
        |scratch, task| {
            let out_ptr = &out_ptr;
            let cols = task * COLS..((task + 1) * COLS).min(n);
            for t0 in (0..m).step_by(TILE) {
                let t1 = (t0 + TILE).min(m);
                for j in cols.clone() {
                    let (format, bytes) = w.row(j);
                    #[cfg(target_arch = "x86_64")]
                    if path == Path::Avx2 && m < TILED_MIN_ROWS {
                        let mut r = t0;
                        while r < t1 {
                            let rows = (t1 - r).min(4);
                            let mut acc = [0f32; 4];
                            // SAFETY: AVX2, FMA and F16C were checked above; the row holds whole
                            // blocks of `k` weights and the activation rows `r .. r + rows` exist.
                            unsafe { super::fused::dot_rows(format, bytes, x, r, rows, &mut acc) };
                            for (i, a) in acc.iter().take(rows).enumerate() {
                                // SAFETY: (r + i, j) is inside `out`; column j is this task's only.
                                unsafe { *out_ptr.0.add((r + i) * n + j) = *a };
                            }
                            r += rows;
                        }
                        continue;
                    }
                    match path {
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: `Path::Avx2` is only taken on CPUs with AVX2, FMA and F16C (checked
                        // above); the row holds whole blocks of `k` weights.
                        Path::Avx2 => unsafe {
                            super::avx2::prepare(format, bytes, k, &mut scratch.prepared)
                        },
                        _ => format.unpack_row(bytes, &mut scratch.unpacked),
                    }
                    let mut r = t0;
                    while r < t1 {
                        let rows = (t1 - r).min(ROWS);
                        let mut acc = [0f32; ROWS];
                        match path {
                            #[cfg(target_arch = "x86_64")]
                            // SAFETY: as above; the row was prepared for `k` weights and the
                            // activation rows `r .. r + rows` exist.
                            Path::Avx2 => unsafe {
                                super::avx2::dot_rows(&scratch.prepared, x, r, rows, &mut acc)
                            },
                            _ => {
                                portable(&scratch.unpacked, format.has_min(), x, r, rows, &mut acc)
                            }
                        }
                        for (i, a) in acc.iter().take(rows).enumerate() {
                            // SAFETY: (r + i, j) is inside `out`, and column j belongs to this task only.
                            unsafe { *out_ptr.0.add((r + i) * n + j) = *a };
                        }
                        r += rows;
                    }
                }
            }
        },
    );
    out
}

/// Calls with fewer activation rows use the kernels that decode blocks in registers (decoding); from
/// here on a weight row is decoded once per tile. Measured on Qwen2.5-Coder-1.5B (README, speed): the
/// register kernels decode at batch 1 in 11.5 tokens/s where the tiled ones manage 7.4, and the tiled
/// ones prefill 512 tokens in 29.9 tokens/s where the register ones manage 25.6.
const TILED_MIN_ROWS: usize = 16;

/// Activation rows one kernel call multiplies with a decoded weight row.
const ROWS: usize = 8;

/// A task's decoded weight row.
struct Scratch {
    unpacked: Unpacked,
    #[cfg(target_arch = "x86_64")]
    prepared: super::avx2::Prepared,
}

struct SendPtr(*mut f32);
// SAFETY: tasks write disjoint columns of the output through this pointer.
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}
