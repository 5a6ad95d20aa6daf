//! One weight row in the form every kernel family starts from, whatever its file format: the
//! unpackers (`legacy`, `kquants`) write it, the portable kernel and the tests read it.

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

/// An f16 stored little-endian at `bytes[at..at + 2]`, as f32.
#[inline(always)]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}
