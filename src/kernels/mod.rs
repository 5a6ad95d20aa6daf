//! Matrix products computed directly on GGUF's quantized blocks.
//!
//! Why it exists: a model file is its weights. Decoding is bound by reading them and prefill by
//! multiplying them, so kvbench keeps every matrix in the file's own block format (Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), resident once, and multiplies from those blocks: no f32 or
//! requantized copy of the model (issue 12).
//!
//! The layout, so that adding a format touches one place:
//! - [`format`](mod@format): the table of formats (ggml type, block layout, unpacker): a format is one row there,
//!   its unpacker in [`legacy`] or [`kquants`] (into the common form, [`unpacked`]) and, for the x86
//!   kernels, one arm of `x86::with_kquant!` or `with_legacy!` with its decoding type;
//! - [`acts`]: activations quantized per block to 8 bits, as ggml does (32-wide, or 256-wide for
//!   k-quant matrices);
//! - [`matrix`]: the weight matrix (the file's blocks, stacked parts, rows [`packed`] at load);
//! - [`dispatch`]: the one place that decides which kernel runs (the CPU's features, checked once;
//!   the environment's overrides; the row counts where one kernel hands over to another), as a
//!   [`dispatch::Plan`] per product;
//! - [`driver`]: output columns split across threads, activation rows in tiles that stay in cache,
//!   each task's columns computed by the plan's kernels: `x86` (AVX2, AVX-512, VNNI, GFNI; its own
//!   folder, leaving room for others) or [`portable`] (any CPU, and the reference the others are
//!   tested against);
//! - [`aligned`], [`output`], [`error`], [`weight_bytes`]: the buffers, the output, the errors and the
//!   memory the weights live in (2 MiB pages where the OS lends them).
//!
//! Beside them, [`float16`]: products with a checkpoint's bf16 and f16 matrices, widened on the fly
//! (float weights, not blocks; the activations stay f32).
//!
//! Imports only go down this list (no module imports one that imports it back; a test checks), and
//! every `unsafe fn` says what its caller must guarantee (`# Safety`).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod acts;
pub mod aligned;
pub mod dispatch;
pub mod driver;
pub mod error;
pub mod float16;
pub mod format;
pub mod kquants;
pub mod legacy;
pub mod matrix;
pub mod output;
pub mod packed;
pub mod portable;
#[cfg(test)]
pub(crate) mod ran;
pub mod unpacked;
pub mod weight_bytes;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use error::KernelError;
pub use format::BlockFormat;
pub use matrix::QMatrix;
pub use unpacked::{Unpacked, GROUP, HALF};
pub use weight_bytes::WeightBytes;

#[cfg(test)]
mod tests;
