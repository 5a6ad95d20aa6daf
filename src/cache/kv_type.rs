//! How the cache stores keys and values: the element type every entry is converted to when it is
//! appended, and that attention reads back. The storage decides bytes and (by rounding) tokens; the
//! policy decides which entries stay: the two compose, every policy with every type.

use super::quant::{Blocks, BLOCK};
use candle_core::DType;
use serde::{Deserialize, Serialize};

/// The element type of the cache's keys and values.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum KvType {
    /// 32-bit floats: the exact reference (the activations' own type on the CPU).
    #[default]
    F32,
    /// IEEE half precision, as llama.cpp's default cache (`-ctk f16`).
    F16,
    /// bfloat16, as GPU engines hold a bf16 model's cache.
    Bf16,
    /// llama.cpp's Q8_0 blocks (`-ctk q8_0 -ctv q8_0`): 34 bytes per 32 values.
    #[value(name = "q8_0")]
    Q8_0,
    /// llama.cpp's Q4_0 blocks (`-ctk q4_0 -ctv q4_0`): 18 bytes per 32 values.
    #[value(name = "q4_0")]
    Q4_0,
}

impl KvType {
    pub const ALL: [KvType; 5] = [
        KvType::F32,
        KvType::F16,
        KvType::Bf16,
        KvType::Q8_0,
        KvType::Q4_0,
    ];

    /// The tensor type of the cache's buffers (bytes for block formats).
    pub fn dtype(self) -> DType {
        match self {
            KvType::F32 => DType::F32,
            KvType::F16 => DType::F16,
            KvType::Bf16 => DType::BF16,
            KvType::Q8_0 | KvType::Q4_0 => DType::U8,
        }
    }

    /// The block format, for the quantized types.
    pub fn blocks(self) -> Option<Blocks> {
        match self {
            KvType::Q8_0 => Some(Blocks::Q8_0),
            KvType::Q4_0 => Some(Blocks::Q4_0),
            _ => None,
        }
    }

    /// Elements of the buffer per stored row of `d` values (bytes for block formats).
    pub fn row_width(self, d: usize) -> usize {
        match self.blocks() {
            Some(b) => b.row_bytes(d),
            None => d,
        }
    }

    /// Bytes of one stored row of `d` values, scales included.
    pub fn row_bytes(self, d: usize) -> usize {
        self.row_width(d) * self.dtype().size_in_bytes()
    }

    /// Whether a head of `d` values can be stored: block formats need whole blocks.
    pub fn fits(self, d: usize) -> bool {
        self.blocks()
            .is_none_or(|_| d > 0 && d.is_multiple_of(BLOCK))
    }

    /// The name the flag, the config key and every record use.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Bf16 => "bf16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
