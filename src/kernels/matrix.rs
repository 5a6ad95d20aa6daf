//! The weight matrix the kernels multiply: the file's blocks, resident once, possibly several formats
//! stacked by rows, repacked at load four rows at a time. Products are computed by the driver
//! ([`super::driver`]); this module holds the bytes and answers where each row is.

use super::error::KernelError;
use super::format::BlockFormat;
use super::packed;
use super::unpacked::{Unpacked, GROUP};
use super::weight_bytes::WeightBytes;

/// A run of consecutive output rows stored in one block format.
#[derive(Debug, Clone)]
struct Part {
    format: BlockFormat,
    /// First output row of this part.
    start: usize,
    rows: usize,
    /// The file's blocks, row-major: `rows × row_bytes`; when `packed`, every whole group of
    /// [`packed::GROUP_ROWS`] rows repacked ([`packed`]), a last smaller group as in the file.
    bytes: WeightBytes,
    row_bytes: usize,
    packed: bool,
}

impl Part {
    /// Rows held repacked: the whole groups of four when `packed`.
    fn packed_rows(&self) -> usize {
        if self.packed {
            self.rows / packed::GROUP_ROWS * packed::GROUP_ROWS
        } else {
            0
        }
    }

    /// Puts the rows back as the file stored them.
    fn unpack(&mut self) {
        if self.packed {
            packed::unpack(self.format, &mut self.bytes, self.rows, self.row_bytes);
            self.packed = false;
        }
    }
}

/// A `[n, k]` weight matrix (`n` outputs, `k` inputs) held in the file's quantized blocks, possibly
/// several formats stacked by rows (a Q4_K_M file mixes Q4_K and Q6_K projections of one input).
#[derive(Debug, Clone)]
pub struct QMatrix {
    parts: Vec<Part>,
    n: usize,
    k: usize,
}

impl QMatrix {
    /// A matrix from the file's blocks (`n` rows of `k` weights), repacked ([`packed`]) unless
    /// `KVBENCH_REPACK=0` ([`repack_enabled`](super::dispatch::repack_enabled)).
    pub fn new(
        format: BlockFormat,
        bytes: impl Into<WeightBytes>,
        n: usize,
        k: usize,
    ) -> Result<Self, KernelError> {
        Self::with_layout(format, bytes, n, k, super::dispatch::repack_enabled())
    }

    /// [`new`](Self::new), the formats [`packed`] takes repacked or not as `repack` says.
    pub fn with_layout(
        format: BlockFormat,
        bytes: impl Into<WeightBytes>,
        n: usize,
        k: usize,
        repack: bool,
    ) -> Result<Self, KernelError> {
        let bytes = bytes.into();
        let row_bytes = format.row_bytes(k).ok_or(KernelError::RowLength {
            k,
            format,
            block: format.block_elems(),
        })?;
        let expected = row_bytes.saturating_mul(n);
        if bytes.len() != expected {
            return Err(KernelError::Size {
                found: bytes.len(),
                expected,
                rows: n,
                k,
                format,
            });
        }
        let mut bytes = bytes;
        if repack {
            packed::pack(format, &mut bytes, n, row_bytes);
        }
        Ok(Self {
            parts: vec![Part {
                format,
                start: 0,
                rows: n,
                bytes,
                row_bytes,
                packed: repack,
            }],
            n,
            k,
        })
    }

    /// Stacks matrices of the same input width by rows, each keeping its own format.
    pub fn stack(mats: Vec<QMatrix>) -> Result<Self, KernelError> {
        let k = mats.first().map_or(0, |m| m.k);
        let families: std::collections::HashSet<bool> = mats
            .iter()
            .flat_map(|m| m.parts.iter().map(|p| p.format.is_k_quant()))
            .collect();
        if families.len() > 1 {
            return Err(KernelError::Families);
        }
        let mut parts = Vec::new();
        let mut n: usize = 0;
        for m in mats {
            if m.k != k {
                return Err(KernelError::Inputs {
                    found: m.k,
                    expected: k,
                });
            }
            for mut p in m.parts {
                if !n.is_multiple_of(packed::GROUP_ROWS) {
                    // The kernels take a repacked group as four aligned output columns.
                    p.unpack();
                }
                p.start = n;
                n += p.rows;
                parts.push(p);
            }
        }
        Ok(Self { parts, n, k })
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Inputs per row.
    pub fn cols(&self) -> usize {
        self.k
    }

    /// Bytes held: the file's blocks, nothing else.
    pub fn bytes(&self) -> usize {
        self.parts.iter().map(|p| p.bytes.len()).sum()
    }

    /// The formats of the parts, in row order.
    pub fn formats(&self) -> Vec<BlockFormat> {
        self.parts.iter().map(|p| p.format).collect()
    }

    /// The activation block: 256 for k-quant matrices (ggml's Q8_K), 32 for the others (Q8_0/Q8_1).
    /// [`stack`](Self::stack) keeps the two families apart.
    pub fn act_block(&self) -> usize {
        if self.parts[0].format.is_k_quant() {
            256
        } else {
            GROUP
        }
    }

    /// Whether `other` may be stacked under this matrix (same inputs, same family of formats).
    pub fn stacks_with(&self, other: &QMatrix) -> bool {
        self.k == other.k && self.act_block() == other.act_block()
    }

    pub(crate) fn has_min(&self) -> bool {
        self.parts.iter().any(|p| p.format.has_min())
    }

    #[inline]
    fn part(&self, j: usize) -> &Part {
        self.parts
            .iter()
            .find(|p| j < p.start + p.rows)
            .expect("row index inside the matrix")
    }

    /// Row `j`'s blocks and format, for a row held as in the file (see [`is_packed`](Self::is_packed)).
    #[inline]
    pub fn row(&self, j: usize) -> (BlockFormat, &[u8]) {
        let p = self.part(j);
        let r = j - p.start;
        debug_assert!(r >= p.packed_rows(), "row {j} is repacked");
        (p.format, &p.bytes[r * p.row_bytes..(r + 1) * p.row_bytes])
    }

    /// Row `j`'s format.
    #[inline]
    pub fn format(&self, j: usize) -> BlockFormat {
        self.part(j).format
    }

    /// Whether row `j` is held repacked ([`packed`]).
    #[inline]
    pub fn is_packed(&self, j: usize) -> bool {
        let p = self.part(j);
        j - p.start < p.packed_rows()
    }

    /// The repacked group of four rows that starts at row `j`, with its format; `None` when rows
    /// `j .. j + 4` are not one such group.
    #[inline]
    pub fn packed_group(&self, j: usize) -> Option<(BlockFormat, &[u8])> {
        let p = self.part(j);
        let r = j - p.start;
        (r.is_multiple_of(packed::GROUP_ROWS) && r < p.packed_rows()).then(|| {
            let group = packed::GROUP_ROWS * p.row_bytes;
            (p.format, &p.bytes[r * p.row_bytes..][..group])
        })
    }

    /// Row `j` as the file stored it: its own bytes, or put back together into `buf` when it is
    /// repacked.
    pub fn raw_row<'a>(&'a self, j: usize, buf: &'a mut Vec<u8>) -> (BlockFormat, &'a [u8]) {
        let p = self.part(j);
        let r = j - p.start;
        if r >= p.packed_rows() {
            return (p.format, &p.bytes[r * p.row_bytes..(r + 1) * p.row_bytes]);
        }
        let first = r / packed::GROUP_ROWS * packed::GROUP_ROWS;
        buf.resize(p.row_bytes, 0);
        let group = &p.bytes[first * p.row_bytes..][..packed::GROUP_ROWS * p.row_bytes];
        packed::unpack_row(p.format, group, r - first, buf);
        (p.format, buf)
    }

    /// Unpacks row `j` into `out` (sized by [`Unpacked::with_len`] for this matrix).
    pub fn unpack_row(&self, j: usize, out: &mut Unpacked) {
        let mut buf = Vec::new();
        let (format, bytes) = self.raw_row(j, &mut buf);
        format.unpack_row(bytes, out);
    }

    /// Row `j` as f32, exactly as ggml dequantizes it (embedding lookups).
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        let mut u = Unpacked::with_len(self.k, true);
        u.mins.fill(0.0);
        self.unpack_row(j, &mut u);
        u.dequantize(out);
    }

    /// The whole matrix as f32, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        for (j, row) in out.chunks_exact_mut(self.k).enumerate() {
            self.dequantize_row(j, row);
        }
        out
    }
}
