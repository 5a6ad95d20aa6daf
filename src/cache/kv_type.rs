//! How the cache stores keys and values: the element type every entry is converted to when it is
//! appended, and that attention reads back. The storage decides bytes and (by rounding) tokens; the
//! policy decides which entries stay: the two compose, every policy with every type.

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
}

impl KvType {
    /// The tensor type of the cache's buffers.
    pub fn dtype(self) -> DType {
        match self {
            KvType::F32 => DType::F32,
            KvType::F16 => DType::F16,
            KvType::Bf16 => DType::BF16,
        }
    }

    /// The name the flag, the config key and every record use.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Bf16 => "bf16",
        }
    }

    /// Bytes of one stored element.
    pub fn element_bytes(self) -> usize {
        self.dtype().size_in_bytes()
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
