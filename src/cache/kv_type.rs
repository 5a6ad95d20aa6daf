//! How the cache stores keys and values: the element type every entry is converted to when it is
//! appended, and that attention reads back, for keys and values alike (`q8_0`) or each its own
//! (`q8_0/f16`: keys in Q8_0 blocks, values in f16, as llama.cpp's `-ctk q8_0 -ctv f16`). The storage
//! decides bytes and (by rounding) tokens; the policy decides which entries stay: the two compose,
//! every policy with every type.

use super::quant::{Blocks, BLOCK};
use candle_core::DType;
use serde::{Deserialize, Serialize};

/// The element type of the cache's keys or values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvElement {
    /// 32-bit floats: the exact reference (the activations' own type on the CPU).
    #[default]
    F32,
    /// IEEE half precision, as llama.cpp's default cache (`-ctk f16`).
    F16,
    /// bfloat16, as GPU engines hold a bf16 model's cache.
    Bf16,
    /// llama.cpp's Q8_0 blocks (`-ctk q8_0 -ctv q8_0`): 34 bytes per 32 values.
    Q8_0,
    /// llama.cpp's Q4_0 blocks (`-ctk q4_0 -ctv q4_0`): 18 bytes per 32 values.
    Q4_0,
}

impl KvElement {
    pub const ALL: [KvElement; 5] = [
        KvElement::F32,
        KvElement::F16,
        KvElement::Bf16,
        KvElement::Q8_0,
        KvElement::Q4_0,
    ];

    /// The tensor type of the cache's buffers (bytes for block formats).
    pub fn dtype(self) -> DType {
        match self {
            KvElement::F32 => DType::F32,
            KvElement::F16 => DType::F16,
            KvElement::Bf16 => DType::BF16,
            KvElement::Q8_0 | KvElement::Q4_0 => DType::U8,
        }
    }

    /// The block format, for the quantized types.
    pub fn blocks(self) -> Option<Blocks> {
        match self {
            KvElement::Q8_0 => Some(Blocks::Q8_0),
            KvElement::Q4_0 => Some(Blocks::Q4_0),
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
            KvElement::F32 => "f32",
            KvElement::F16 => "f16",
            KvElement::Bf16 => "bf16",
            KvElement::Q8_0 => "q8_0",
            KvElement::Q4_0 => "q4_0",
        }
    }
}

impl std::fmt::Display for KvElement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvElement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        KvElement::ALL
            .into_iter()
            .find(|e| e.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names: Vec<&str> = KvElement::ALL.iter().map(|e| e.name()).collect();
                format!(
                    "unknown KV cache type {s:?}: expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// How the cache stores keys and values: each as a [`KvElement`]. Written as one name when both are
/// the same (`q8_0`), else `KEYS/VALUES` (`q8_0/f16`); records, configs and flags all use that text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct KvType {
    pub keys: KvElement,
    pub values: KvElement,
}

impl KvType {
    /// Keys and values both as `e`.
    pub const fn both(e: KvElement) -> Self {
        KvType { keys: e, values: e }
    }

    /// The exact reference: f32 keys and values.
    pub const F32: KvType = KvType::both(KvElement::F32);
    pub const F16: KvType = KvType::both(KvElement::F16);
    pub const BF16: KvType = KvType::both(KvElement::Bf16);
    pub const Q8_0: KvType = KvType::both(KvElement::Q8_0);
    pub const Q4_0: KvType = KvType::both(KvElement::Q4_0);

    /// The type used where none is given: 16 bits, as engines hold a cache: f16 on the CPU (llama.cpp's
    /// default, `-ctk f16 -ctv f16`), bf16 on a GPU (a bf16 model's own type, as GPU engines keep it).
    /// f32, the exact reference, is asked for by name; kvbench 0.4 and earlier always held f32.
    pub fn default_for(device: crate::device::DeviceSpec) -> KvType {
        match device {
            crate::device::DeviceSpec::Cpu => KvType::F16,
            crate::device::DeviceSpec::Cuda(_) => KvType::BF16,
        }
    }

    /// Whether heads of `d` values can be stored as keys and as values.
    pub fn fits(self, d: usize) -> bool {
        self.keys.fits(d) && self.values.fits(d)
    }

    /// Bytes of one entry's key and value row of one head (`d` values each), scales included.
    pub fn entry_row_bytes(self, d: usize) -> usize {
        self.keys.row_bytes(d) + self.values.row_bytes(d)
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.keys == self.values {
            write!(f, "{}", self.keys)
        } else {
            write!(f, "{}/{}", self.keys, self.values)
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |e: String| format!("{e} (a type for keys and values, or KEYS/VALUES: q8_0/f16)");
        match s.split_once('/') {
            None => Ok(KvType::both(s.parse().map_err(bad)?)),
            Some((k, v)) => Ok(KvType {
                keys: k.parse().map_err(bad)?,
                values: v.parse().map_err(bad)?,
            }),
        }
    }
}

impl From<KvType> for String {
    fn from(t: KvType) -> String {
        t.to_string()
    }
}

impl TryFrom<String> for KvType {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_parse_and_print_back_one_name_or_keys_slash_values() {
        assert_eq!("q8_0".parse::<KvType>().unwrap(), KvType::Q8_0);
        assert_eq!("F16".parse::<KvType>().unwrap(), KvType::F16);
        let mixed: KvType = "q8_0/f16".parse().unwrap();
        assert_eq!(mixed.keys, KvElement::Q8_0);
        assert_eq!(mixed.values, KvElement::F16);
        assert_eq!(mixed.to_string(), "q8_0/f16");
        assert_eq!("f16/f16".parse::<KvType>().unwrap().to_string(), "f16");
        for bad in ["q3", "q8_0/", "/f16", "f16/q8_0/f32", ""] {
            let e = bad.parse::<KvType>().unwrap_err();
            assert!(
                e.contains("expected one of f32, f16, bf16, q8_0, q4_0"),
                "{bad}: {e}"
            );
        }
        let json = serde_json::to_string(&mixed).unwrap();
        assert_eq!(json, "\"q8_0/f16\"");
        assert_eq!(serde_json::from_str::<KvType>(&json).unwrap(), mixed);
    }

    #[test]
    fn an_entry_holds_a_key_row_and_a_value_row_in_their_own_types() {
        // 128 values: f16 256 bytes, Q8_0 4 blocks of 34, Q4_0 4 blocks of 18.
        assert_eq!(KvType::F16.entry_row_bytes(128), 512);
        assert_eq!(
            "q8_0/f16".parse::<KvType>().unwrap().entry_row_bytes(128),
            136 + 256
        );
        assert_eq!(
            "q4_0/q8_0".parse::<KvType>().unwrap().entry_row_bytes(128),
            72 + 136
        );
        assert!(!"q8_0/f16".parse::<KvType>().unwrap().fits(48));
        assert!("f32/bf16".parse::<KvType>().unwrap().fits(48));
    }
}
