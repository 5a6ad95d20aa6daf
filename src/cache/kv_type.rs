//! How the cache stores keys and values: the element type every entry is converted to when it is
//! appended, and that attention reads back, for keys and values alike (`q8_0`) or each its own
//! (`q8_0/f16`: keys in Q8_0 blocks, values in f16, as llama.cpp's `-ctk q8_0 -ctv f16`). The storage
//! decides bytes and (by rounding) tokens; the policy decides which entries stay: the two compose,
//! every policy with every type. `kivi2` and `kivi4` (KIVI's keys per channel, values per token, a
//! full-precision window: [`super::kivi`]) quantize keys and values together, so they name both;
//! `kivi2:64` sets the window (128 entries when not named).

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
    /// KIVI at 2 bits (keys and values together, [`super::kivi`]).
    Kivi2,
    /// KIVI at 4 bits.
    Kivi4,
}

impl KvElement {
    pub const ALL: [KvElement; 7] = [
        KvElement::F32,
        KvElement::F16,
        KvElement::Bf16,
        KvElement::Q8_0,
        KvElement::Q4_0,
        KvElement::Kivi2,
        KvElement::Kivi4,
    ];

    /// The bits of a KIVI mode.
    pub fn kivi_bits(self) -> Option<u8> {
        match self {
            KvElement::Kivi2 => Some(2),
            KvElement::Kivi4 => Some(4),
            _ => None,
        }
    }

    /// The tensor type of the cache's buffers (bytes for block formats).
    pub fn dtype(self) -> DType {
        match self {
            KvElement::F32 => DType::F32,
            KvElement::F16 => DType::F16,
            KvElement::Bf16 => DType::BF16,
            KvElement::Q8_0 | KvElement::Q4_0 | KvElement::Kivi2 | KvElement::Kivi4 => DType::U8,
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

    /// Bytes of one stored row of `d` values, scales included (a KIVI row: see [`KvType::head_bytes`]).
    pub fn row_bytes(self, d: usize) -> usize {
        self.row_width(d) * self.dtype().size_in_bytes()
    }

    /// Whether a head of `d` values can be stored: block formats need whole blocks, KIVI whole
    /// channel groups.
    pub fn fits(self, d: usize) -> bool {
        match self {
            KvElement::Kivi2 | KvElement::Kivi4 => d > 0 && d.is_multiple_of(super::kivi::GROUP),
            _ => self
                .blocks()
                .is_none_or(|_| d > 0 && d.is_multiple_of(BLOCK)),
        }
    }

    /// Bits per value before scales: how finely the type holds a value (f32 32, 16-bit 16, Q8_0 8,
    /// Q4_0 and KIVI-4 4, KIVI-2 2).
    pub fn nominal_bits(self) -> u32 {
        match self {
            KvElement::F32 => 32,
            KvElement::F16 | KvElement::Bf16 => 16,
            KvElement::Q8_0 => 8,
            KvElement::Q4_0 | KvElement::Kivi4 => 4,
            KvElement::Kivi2 => 2,
        }
    }

    /// The name the flag, the config key and every record use.
    pub fn name(self) -> &'static str {
        match self {
            KvElement::F32 => "f32",
            KvElement::F16 => "f16",
            KvElement::Bf16 => "bf16",
            KvElement::Q8_0 => "q8_0",
            KvElement::Q4_0 => "q4_0",
            KvElement::Kivi2 => "kivi2",
            KvElement::Kivi4 => "kivi4",
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
/// the same (`q8_0`), else `KEYS/VALUES` (`q8_0/f16`); a KIVI mode as `kivi2` or `kivi2:WINDOW`.
/// Records, configs and flags all use that text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct KvType {
    pub keys: KvElement,
    pub values: KvElement,
    /// A KIVI mode's full-precision window, in entries per head (0 for the other types).
    pub window: u32,
}

impl KvType {
    /// Keys and values both as `e` (a KIVI mode with its default window).
    pub const fn both(e: KvElement) -> Self {
        let window = match e {
            KvElement::Kivi2 | KvElement::Kivi4 => super::kivi::DEFAULT_WINDOW as u32,
            _ => 0,
        };
        KvType {
            keys: e,
            values: e,
            window,
        }
    }

    /// The KIVI mode's bits and window, if this is one.
    pub fn kivi(self) -> Option<(u8, usize)> {
        self.keys.kivi_bits().map(|b| (b, self.window as usize))
    }

    /// Whether keys and values are stored as plain rows of values (f32, f16, bf16), which candle's
    /// operations read in place: not blocks, not KIVI.
    pub fn plain_rows(self) -> bool {
        self.kivi().is_none() && self.keys.blocks().is_none() && self.values.blocks().is_none()
    }

    /// Exact bytes one KV head of a full cache (nothing evicted) holds at `entries` entries of
    /// `d` values: linear in the entries for every type but KIVI's, whose window costs more.
    pub fn head_bytes(self, entries: usize, d: usize) -> usize {
        match self.kivi() {
            Some((bits, window)) => super::kivi::full_head_bytes(bits, window, d, entries),
            None => entries * self.entry_row_bytes(d),
        }
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

    /// Bits per key value plus bits per value value, before scales: the finer of two types holds
    /// more (a report compares every row with the full cache of the finest type it has).
    pub fn nominal_bits(self) -> u32 {
        self.keys.nominal_bits() + self.values.nominal_bits()
    }

    /// Whether heads of `d` values can be stored as keys and as values.
    pub fn fits(self, d: usize) -> bool {
        self.keys.fits(d) && self.values.fits(d)
    }

    /// Whether a cache of heads of `d` values can be held on `device`, as a message naming the flag
    /// when not: block formats need whole blocks; KIVI's layout lives on the host, so the CPU only
    /// (on a GPU every decoding step would copy it to the device).
    pub fn check(self, d: usize, device: &candle_core::Device) -> Result<(), String> {
        if !self.fits(d) {
            return Err(format!(
                "--kv-type {self}: heads of {d} values are not whole blocks of {BLOCK}"
            ));
        }
        if self.kivi().is_some() && !device.is_cpu() {
            return Err(format!(
                "--kv-type {self}: KIVI's cache runs on the CPU only (--device cpu)"
            ));
        }
        Ok(())
    }

    /// Bytes of one entry's key and value row of one head (`d` values each), scales included.
    pub fn entry_row_bytes(self, d: usize) -> usize {
        self.keys.row_bytes(d) + self.values.row_bytes(d)
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.kivi().is_some() && self.window as usize != super::kivi::DEFAULT_WINDOW {
            write!(f, "{}:{}", self.keys, self.window)
        } else if self.keys == self.values {
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
        let t = match s.split_once('/') {
            None => {
                let (name, window) = match s.split_once(':') {
                    Some((n, w)) => (n, Some(w)),
                    None => (s, None),
                };
                let mut t = KvType::both(name.parse().map_err(bad)?);
                if let Some(w) = window {
                    if t.kivi().is_none() {
                        return Err(format!(
                            "KV cache type {s:?}: only kivi2 and kivi4 take a window (kivi2:64)"
                        ));
                    }
                    t.window = w.trim().parse::<u32>().ok().filter(|&w| w <= 1 << 20).ok_or_else(|| {
                        format!("KV cache type {s:?}: the window is a number of entries, 0 to 1048576")
                    })?;
                }
                t
            }
            Some((k, v)) => KvType {
                keys: k.parse().map_err(bad)?,
                values: v.parse().map_err(bad)?,
                window: 0,
            },
        };
        if (t.keys.kivi_bits().is_some() || t.values.kivi_bits().is_some()) && t.keys != t.values {
            return Err(format!(
                "KV cache type {s:?}: KIVI quantizes keys and values together; write kivi2 or kivi4"
            ));
        }
        Ok(t)
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
                e.contains("expected one of f32, f16, bf16, q8_0, q4_0, kivi2, kivi4"),
                "{bad}: {e}"
            );
        }
        let kivi: KvType = "kivi2".parse().unwrap();
        assert_eq!(kivi.kivi(), Some((2, 128)));
        assert_eq!("kivi2:128".parse::<KvType>().unwrap(), kivi);
        let small: KvType = "KIVI4:64".parse().unwrap();
        assert_eq!(
            (small.kivi(), small.to_string()),
            (Some((4, 64)), "kivi4:64".into())
        );
        for bad in ["kivi2/f16", "f16/kivi4", "q8_0:64", "kivi2:-1", "kivi2:x"] {
            assert!(bad.parse::<KvType>().is_err(), "{bad}");
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
