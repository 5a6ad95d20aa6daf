//! Matrix products computed directly on GGUF's quantized blocks.
//!
//! Why it exists: a model file is its weights. Decoding is bound by reading them and prefill by
//! multiplying them, so kvbench keeps every matrix in the file's own block format (Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), resident once, and multiplies from those blocks: no f32 or
//! requantized copy of the model (issue 12).
//!
//! The layout, so that adding a format touches one place:
//! - [`format`]: the formats and their block sizes; the one `match` that dispatches a row's unpacking;
//! - [`legacy`] and [`kquants`]: one file per block family, each turning a row of blocks into the
//!   common unpacked form ([`Unpacked`]);
//! - [`acts`]: activations quantized per block to 8 bits, as ggml does (32-wide, or 256-wide for
//!   k-quant matrices);
//! - [`fused`] (a few rows: blocks decoded in registers), [`avx2`] (each weight row decoded once per
//!   tile of many rows) and [`gemm`] (several decoded weight rows against several activation rows at
//!   once): the AVX2 kernels, with the same arithmetic; [`gemm512`] the k-quant part of [`gemm`] on
//!   512-bit vectors where the CPU has AVX-512 (the same integer sums and float step, so the same bits);
//!   [`k45_vnni`] the decoding steps' Q4_K and Q5_K products (one to four activation rows) with
//!   AVX-512 VNNI, in fewer instructions a super-block than [`gemm`]'s general kernel (the same bits);
//! - [`dot`]: the choice of path and the portable kernel they are tested against;
//! - [`driver`]: the multi-row driver: output columns split across threads, activation rows in tiles
//!   that stay in cache;
//! - [`packed`]: k-quant rows repacked at load four at a time, the layout the multi-row kernels read;
//! - [`aligned`]: the byte buffers the kernels load from (activations, decoded rows), 64-byte aligned;
//! - [`weight_bytes`]: the memory the weights live in, in 2 MiB pages where the OS lends them.

pub mod acts;
pub mod aligned;
#[cfg(target_arch = "x86_64")]
pub mod avx2;
pub mod dot;
pub mod driver;
pub mod format;
#[cfg(target_arch = "x86_64")]
pub mod fused;
#[cfg(target_arch = "x86_64")]
pub mod gemm;
#[cfg(target_arch = "x86_64")]
pub mod gemm512;
#[cfg(target_arch = "x86_64")]
pub mod k45_vnni;
pub mod kquants;
pub mod legacy;
pub mod packed;
#[cfg(test)]
pub(crate) mod ran;
pub mod weight_bytes;

pub use format::BlockFormat;
pub use weight_bytes::WeightBytes;

/// Elements per group: the unit of the integer dot product (one 256-bit register of bytes).
pub const GROUP: usize = 32;
/// Elements per scale lane: k-quants such as Q6_K scale every 16 weights.
pub const HALF: usize = 16;

/// One weight row in the kernels' common form: weight `i` is `q[i] · scale(i) + min[i / 16]`, where
/// `scale(i)` is `scales[(i / 32) · 8 + 4 · ((i % 32) / 16)]` (each group stores its two half-scales as
/// eight lanes, laid out as the AVX2 product's lanes: four for elements 0–15, four for 16–31).
#[derive(Debug, Clone, Default)]
pub struct Unpacked {
    /// Quantized values: signed for symmetric formats, 0…63 for formats with a minimum.
    pub q: Vec<i8>,
    /// Eight f32 lanes per group of 32.
    pub scales: Vec<f32>,
    /// The additive minimum per 16 weights (formats with a minimum only; otherwise empty).
    pub mins: Vec<f32>,
}

impl Unpacked {
    pub fn with_len(k: usize, has_min: bool) -> Self {
        Self {
            q: vec![0; k],
            scales: vec![0.0; k / GROUP * 8],
            mins: if has_min {
                vec![0.0; k / HALF]
            } else {
                Vec::new()
            },
        }
    }

    /// Sets group `g`'s two half-scales.
    #[inline(always)]
    pub fn set_scales(&mut self, g: usize, lo: f32, hi: f32) {
        let s = &mut self.scales[g * 8..g * 8 + 8];
        s[..4].fill(lo);
        s[4..].fill(hi);
    }

    /// The weights as f32, exactly as ggml dequantizes them.
    pub fn dequantize(&self, out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            let s = self.scales[i / GROUP * 8 + 4 * ((i % GROUP) / HALF)];
            let m = self.mins.get(i / HALF).copied().unwrap_or(0.0);
            *o = self.q[i] as f32 * s + m;
        }
    }
}

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

/// Why a tensor cannot be a [`QMatrix`].
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

impl QMatrix {
    /// A matrix from the file's blocks (`n` rows of `k` weights), k-quants repacked unless
    /// `KVBENCH_REPACK=0` ([`repack_enabled`]).
    pub fn new(
        format: BlockFormat,
        bytes: impl Into<WeightBytes>,
        n: usize,
        k: usize,
    ) -> Result<Self, KernelError> {
        Self::with_layout(format, bytes, n, k, repack_enabled())
    }

    /// [`new`](Self::new), k-quants repacked ([`packed`]) or not as `repack` says.
    pub fn with_layout(
        format: BlockFormat,
        bytes: impl Into<WeightBytes>,
        n: usize,
        k: usize,
        repack: bool,
    ) -> Result<Self, KernelError> {
        let bytes = bytes.into();
        let row_bytes = format.row_bytes(k)?;
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
        let packed = packed::repacks(format) && repack;
        if packed {
            packed::pack(format, &mut bytes, n, row_bytes);
        }
        Ok(Self {
            parts: vec![Part {
                format,
                start: 0,
                rows: n,
                bytes,
                row_bytes,
                packed,
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

    fn has_min(&self) -> bool {
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

    /// `y = x Wᵀ`: `x` is `m × k` row-major; returns `m × n` row-major.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_with(x, m, dot::Path::best())
    }

    /// [`matmul`](Self::matmul) on a chosen code path (tests compare the paths).
    pub fn matmul_with(&self, x: &[f32], m: usize, path: dot::Path) -> Vec<f32> {
        assert_eq!(x.len(), m * self.k, "QMatrix::matmul: bad input length");
        let acts = acts::Acts::quantize(x, m, self.k, self.act_block());
        driver::run(self, &acts, path).expect("activations quantized for this matrix")
    }
}

/// Whether k-quant matrices are repacked at load ([`packed`]): yes unless `KVBENCH_REPACK=0` (kept
/// to measure the two layouts against each other; a malformed value is refused by the binary at
/// start, see [`repack_from_env`]).
pub fn repack_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| repack_from_env().ok().flatten().unwrap_or(true))
}

/// `KVBENCH_REPACK` as a yes or no: `None` when unset, an error naming the variable and its value when
/// it is neither 0 nor 1.
pub fn repack_from_env() -> Result<Option<bool>, String> {
    switch_from_env(
        "KVBENCH_REPACK",
        "rows as in the file",
        "repacked, the default",
    )
}

/// `KVBENCH_VNNI` as a yes or no (see `gemm512::has_vnni`): `None` when unset.
pub fn vnni_from_env() -> Result<Option<bool>, String> {
    switch_from_env(
        "KVBENCH_VNNI",
        "never vpdpbusd",
        "vpdpbusd where the CPU has it, the default",
    )
}

/// An on/off setting `var`: `None` when unset, `Some` for 0 or 1, else an error naming the variable,
/// its value and what each setting means.
fn switch_from_env(var: &str, off: &str, on: &str) -> Result<Option<bool>, String> {
    match std::env::var(var).as_deref().map(str::trim) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok("1") => Ok(Some(true)),
        Ok("0") => Ok(Some(false)),
        _ => Err(format!(
            "{var}={:?} must be 0 ({off}) or 1 ({on})",
            std::env::var_os(var).unwrap_or_default()
        )),
    }
}

#[cfg(test)]
mod tests;
