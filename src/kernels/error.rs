//! Why a tensor cannot be a [`QMatrix`](super::QMatrix): shapes, sizes and formats the kernels refuse.

use super::format::BlockFormat;

/// Why a tensor cannot be a `QMatrix`.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("block format {0} has no kvbench kernel")]
    Unsupported(String),
    #[error("a row of {k} weights is not a whole number of {format:?} blocks of {block}")]
    RowLength {
        k: usize,
        format: BlockFormat,
        block: usize,
    },
    #[error("{found} bytes for {rows} rows of {k} {format:?} weights, expected {expected}")]
    Size {
        found: usize,
        expected: usize,
        rows: usize,
        k: usize,
        format: BlockFormat,
    },
    #[error("stacked parts have {found} inputs, the first has {expected}")]
    Inputs { found: usize, expected: usize },
    #[error(
        "k-quant and 32-wide block formats cannot share one matrix (their activations differ)"
    )]
    Families,
}
