//! The block formats kvbench multiplies in place, as one table: a format is one row of `TABLE` (its
//! ggml type, block layout and unpacker) plus, for the x86 kernels, one arm of `x86::with_format!`.

use super::unpacked::Unpacked;
use super::{kquants, legacy};
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

/// What the kernels need to know of a format.
struct Layout {
    format: BlockFormat,
    ggml: GgmlDType,
    /// Weights per block.
    elems: usize,
    /// Bytes per block, as in the file.
    bytes: usize,
    /// Whether weights carry an additive minimum (`d·q + m`); the others are symmetric (`d·q`).
    has_min: bool,
    /// Unpacks block `b` (its bytes) into the common form.
    unpack: fn(&[u8], usize, &mut Unpacked),
}

/// Every format, in [`BlockFormat::ALL`]'s order.
const TABLE: [Layout; 8] = [
    Layout {
        format: BlockFormat::Q4_0,
        ggml: GgmlDType::Q4_0,
        elems: 32,
        bytes: 18,
        has_min: false,
        unpack: legacy::q4_0,
    },
    Layout {
        format: BlockFormat::Q4_1,
        ggml: GgmlDType::Q4_1,
        elems: 32,
        bytes: 20,
        has_min: true,
        unpack: legacy::q4_1,
    },
    Layout {
        format: BlockFormat::Q5_0,
        ggml: GgmlDType::Q5_0,
        elems: 32,
        bytes: 22,
        has_min: false,
        unpack: legacy::q5_0,
    },
    Layout {
        format: BlockFormat::Q5_1,
        ggml: GgmlDType::Q5_1,
        elems: 32,
        bytes: 24,
        has_min: true,
        unpack: legacy::q5_1,
    },
    Layout {
        format: BlockFormat::Q8_0,
        ggml: GgmlDType::Q8_0,
        elems: 32,
        bytes: 34,
        has_min: false,
        unpack: legacy::q8_0,
    },
    Layout {
        format: BlockFormat::Q4K,
        ggml: GgmlDType::Q4K,
        elems: 256,
        bytes: 144,
        has_min: true,
        unpack: kquants::q4_k,
    },
    Layout {
        format: BlockFormat::Q5K,
        ggml: GgmlDType::Q5K,
        elems: 256,
        bytes: 176,
        has_min: true,
        unpack: kquants::q5_k,
    },
    Layout {
        format: BlockFormat::Q6K,
        ggml: GgmlDType::Q6K,
        elems: 256,
        bytes: 210,
        has_min: false,
        unpack: kquants::q6_k,
    },
];

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

    /// This format's row of [`TABLE`].
    fn layout(self) -> &'static Layout {
        &TABLE[self as usize]
    }

    /// The format of a ggml tensor type, when kvbench has a kernel for it.
    pub fn from_ggml(dtype: GgmlDType) -> Option<Self> {
        TABLE.iter().find(|l| l.ggml == dtype).map(|l| l.format)
    }

    pub fn to_ggml(self) -> GgmlDType {
        self.layout().ggml
    }

    /// Weights per block.
    pub fn block_elems(self) -> usize {
        self.layout().elems
    }

    /// Bytes per block, as in the file.
    pub fn block_bytes(self) -> usize {
        self.layout().bytes
    }

    /// Whether blocks are 256-weight super-blocks (their activations are quantized 256 at a time).
    pub fn is_k_quant(self) -> bool {
        self.layout().elems == 256
    }

    /// Whether weights carry an additive minimum (`d·q + m`); the others are symmetric (`d·q`, q signed).
    pub fn has_min(self) -> bool {
        self.layout().has_min
    }

    /// Bytes of one row of `k` weights; `None` when `k` is not a whole number of blocks.
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        (k > 0 && k.is_multiple_of(self.block_elems()))
            .then(|| k / self.block_elems() * self.block_bytes())
    }

    /// Unpacks one row of this format's blocks into the common form.
    pub fn unpack_row(self, bytes: &[u8], out: &mut Unpacked) {
        if !self.has_min() && !out.mins.is_empty() {
            out.mins.fill(0.0);
        }
        let unpack = self.layout().unpack;
        for (b, block) in bytes.chunks_exact(self.block_bytes()).enumerate() {
            unpack(block, b, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_holds_every_format_once_in_order() {
        for (i, f) in BlockFormat::ALL.iter().enumerate() {
            assert_eq!(TABLE[i].format, *f);
            assert_eq!(BlockFormat::from_ggml(f.to_ggml()), Some(*f));
        }
    }

    #[test]
    fn block_sizes_are_ggml_s() {
        for f in BlockFormat::ALL {
            assert_eq!(f.block_elems(), f.to_ggml().block_size(), "{f:?}");
            assert_eq!(f.block_bytes(), f.to_ggml().type_size(), "{f:?}");
        }
    }
}
