//! The block formats kvbench multiplies in place, their sizes, and the one dispatch from a format to
//! its unpacking code ([`crate::kernels::legacy`], [`crate::kernels::kquants`]).

use super::{KernelError, Unpacked};
use candle_core::quantized::GgmlDType;

/// A GGUF block format with a kvbench kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl BlockFormat {
    pub const ALL: [BlockFormat; 8] = [
        BlockFormat::Q4_0,
        BlockFormat::Q4_1,
        BlockFormat::Q5_0,
        BlockFormat::Q5_1,
        BlockFormat::Q8_0,
        BlockFormat::Q4K,
        BlockFormat::Q5K,
        BlockFormat::Q6K,
    ];

    /// The format of a ggml tensor type, when kvbench has a kernel for it.
    pub fn from_ggml(dtype: GgmlDType) -> Option<Self> {
        Some(match dtype {
            GgmlDType::Q4_0 => Self::Q4_0,
            GgmlDType::Q4_1 => Self::Q4_1,
            GgmlDType::Q5_0 => Self::Q5_0,
            GgmlDType::Q5_1 => Self::Q5_1,
            GgmlDType::Q8_0 => Self::Q8_0,
            GgmlDType::Q4K => Self::Q4K,
            GgmlDType::Q5K => Self::Q5K,
            GgmlDType::Q6K => Self::Q6K,
            _ => return None,
        })
    }

    pub fn to_ggml(self) -> GgmlDType {
        match self {
            Self::Q4_0 => GgmlDType::Q4_0,
            Self::Q4_1 => GgmlDType::Q4_1,
            Self::Q5_0 => GgmlDType::Q5_0,
            Self::Q5_1 => GgmlDType::Q5_1,
            Self::Q8_0 => GgmlDType::Q8_0,
            Self::Q4K => GgmlDType::Q4K,
            Self::Q5K => GgmlDType::Q5K,
            Self::Q6K => GgmlDType::Q6K,
        }
    }

    /// Weights per block.
    pub fn block_elems(self) -> usize {
        if self.is_k_quant() {
            256
        } else {
            32
        }
    }

    /// Bytes per block, as in the file.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }

    pub fn is_k_quant(self) -> bool {
        matches!(self, Self::Q4K | Self::Q5K | Self::Q6K)
    }

    /// Whether weights carry an additive minimum (`d·q + m`); the others are symmetric (`d·q`, q signed).
    pub fn has_min(self) -> bool {
        matches!(self, Self::Q4_1 | Self::Q5_1 | Self::Q4K | Self::Q5K)
    }

    /// Bytes of one row of `k` weights.
    pub fn row_bytes(self, k: usize) -> Result<usize, KernelError> {
        if k == 0 || !k.is_multiple_of(self.block_elems()) {
            return Err(KernelError::RowLength {
                k,
                format: self,
                block: self.block_elems(),
            });
        }
        Ok(k / self.block_elems() * self.block_bytes())
    }

    /// Unpacks one row of this format's blocks into the common form.
    pub fn unpack_row(self, bytes: &[u8], out: &mut Unpacked) {
        use super::{kquants, legacy};
        if !self.has_min() && !out.mins.is_empty() {
            out.mins.fill(0.0);
        }
        let blocks = bytes.chunks_exact(self.block_bytes()).enumerate();
        match self {
            Self::Q4_0 => blocks.for_each(|(b, x)| legacy::q4_0(x, b, out)),
            Self::Q4_1 => blocks.for_each(|(b, x)| legacy::q4_1(x, b, out)),
            Self::Q5_0 => blocks.for_each(|(b, x)| legacy::q5_0(x, b, out)),
            Self::Q5_1 => blocks.for_each(|(b, x)| legacy::q5_1(x, b, out)),
            Self::Q8_0 => blocks.for_each(|(b, x)| legacy::q8_0(x, b, out)),
            Self::Q4K => blocks.for_each(|(b, x)| kquants::q4_k(x, b, out)),
            Self::Q5K => blocks.for_each(|(b, x)| kquants::q5_k(x, b, out)),
            Self::Q6K => blocks.for_each(|(b, x)| kquants::q6_k(x, b, out)),
        }
    }
}

/// An f16 stored little-endian at `bytes[at..at + 2]`, as f32.
#[inline(always)]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}
