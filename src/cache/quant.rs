//! Keys and values held in llama.cpp's 32-value blocks: Q8_0 (34 bytes: an f16 scale and 32 signed
//! bytes, `x = d·q`) and Q4_0 (18 bytes: an f16 scale and 32 nibbles, `x = d·(q − 8)`), quantized as
//! ggml's reference code quantizes them (`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`), so a row
//! holds the bytes llama.cpp's `-ctk q8_0` / `-ctk q4_0` cache would.
//!
//! Rows are quantized once, when appended; attention and policies read them back a row at a time.

use candle_core::{DType, Tensor};

/// Values per block.
pub const BLOCK: usize = 32;

/// A block format the cache can hold entries in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocks {
    Q8_0,
    Q4_0,
}

impl Blocks {
    /// Bytes of one block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Blocks::Q8_0 => 34,
            Blocks::Q4_0 => 18,
        }
    }

    /// Bytes of one row of `d` values (`d` a multiple of [`BLOCK`]).
    pub const fn row_bytes(self, d: usize) -> usize {
        d / BLOCK * self.block_bytes()
    }

    /// Quantizes `x` (a multiple of [`BLOCK`] values) into `out` (its [`row_bytes`](Self::row_bytes)).
    pub fn quantize(self, x: &[f32], out: &mut [u8]) {
        debug_assert_eq!(out.len(), self.row_bytes(x.len()));
        for (v, o) in x
            .chunks_exact(BLOCK)
            .zip(out.chunks_exact_mut(self.block_bytes()))
        {
            match self {
                Blocks::Q8_0 => q8_0_block(v, o),
                Blocks::Q4_0 => q4_0_block(v, o),
            }
        }
    }

    /// The values of a row of blocks, into `out` (resized to them).
    #[inline(always)]
    pub fn dequantize(self, row: &[u8], out: &mut Vec<f32>) {
        out.resize(row.len() / self.block_bytes() * BLOCK, 0.0);
        self.dequantize_into(row, out);
    }

    /// The values of a row of blocks, into `out` (exactly their number): `q · d` per value, in f32,
    /// eight values an instruction where the CPU has AVX2 (the same operations, so the same bits).
    /// Inlined where it is used: in attention's loop compiled for AVX2 the vector version inlines too.
    #[inline(always)]
    pub fn dequantize_into(self, row: &[u8], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::dispatch::has_avx2() {
            // SAFETY: the CPU has AVX2, FMA and F16C (checked just above).
            return unsafe { dequantize_avx2(self, row, out) };
        }
        self.dequantize_portable(row, out)
    }

    /// The values of rows of blocks held in a tensor, `[.., row bytes]` of `u8` → `[.., d]` of f32,
    /// with candle's operations wherever the tensor lives, so that a cache on a GPU is read there
    /// instead of being copied to the host and back at every step. The same bits as
    /// [`Self::dequantize_into`]: the scale's f16 is decoded from its two bytes with exact operations
    /// (integers below 2¹⁶, powers of two; candle has no bit casts), then `q · d` is rounded once.
    pub fn dequantize_tensor(self, bytes: &Tensor) -> candle_core::Result<Tensor> {
        let dims = bytes.dims().to_vec();
        let (row, lead) = match dims.split_last() {
            Some((&row, lead)) if row % self.block_bytes() == 0 => (row, lead),
            _ => candle_core::bail!("dequantize: rows of {dims:?} bytes are not whole blocks"),
        };
        let per_row = row / self.block_bytes();
        let blocks = lead.iter().product::<usize>() * per_row;
        let b = bytes
            .contiguous()?
            .reshape((blocks, self.block_bytes()))?
            .to_dtype(DType::F32)?;
        // The scale: the f16 whose bits are `lo + 256·hi` (little-endian), `[blocks, 1]`.
        let bits = (b.narrow(1, 0, 1)? + (b.narrow(1, 1, 1)? * 256.0)?)?;
        let sign = (&bits / 32768.0)?.floor()?;
        let magnitude = (bits - (&sign * 32768.0)?)?;
        let exponent = (&magnitude / 1024.0)?.floor()?;
        let mantissa = (magnitude - (&exponent * 1024.0)?)?;
        // Per exponent `e`: the hidden bit (none below normal numbers) and 2^(max(e, 1) − 25), so
        // that the value is `(mantissa + hidden) · power`; e = 31 is infinity (no finite row has it).
        let table: Vec<f32> = (0..32)
            .flat_map(|e: i32| match e {
                0 => [0.0, 2f32.powi(-24)],
                31 => [1024.0, f32::INFINITY],
                e => [1024.0, 2f32.powi(e - 25)],
            })
            .collect();
        let per_exponent = Tensor::from_vec(table, (32, 2), bytes.device())?
            .index_select(&exponent.to_dtype(DType::U32)?.flatten_all()?, 0)?;
        let scale = ((mantissa + per_exponent.narrow(1, 0, 1)?)?
            * per_exponent.narrow(1, 1, 1)?)?
        .mul(&sign.affine(-2.0, 1.0)?)?;
        // The quantized values, as f32 integers.
        let q = match self {
            Blocks::Q8_0 => {
                let v = b.narrow(1, 2, BLOCK)?;
                // Signed bytes: 128 and above are negative.
                (&v - ((&v / 128.0)?.floor()? * 256.0)?)?
            }
            Blocks::Q4_0 => {
                let v = b.narrow(1, 2, BLOCK / 2)?;
                let high = (&v / 16.0)?.floor()?;
                let low = (&v - (&high * 16.0)?)?;
                (Tensor::cat(&[&low, &high], 1)? - 8.0)?
            }
        };
        let mut out = lead.to_vec();
        out.push(per_row * BLOCK);
        q.broadcast_mul(&scale)?.reshape(out)
    }

    /// [`Self::dequantize_into`] a value at a time.
    fn dequantize_portable(self, row: &[u8], out: &mut [f32]) {
        for (o, b) in out
            .chunks_exact_mut(BLOCK)
            .zip(row.chunks_exact(self.block_bytes()))
        {
            let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32_const();
            match self {
                Blocks::Q8_0 => {
                    for (o, &q) in o.iter_mut().zip(&b[2..2 + BLOCK]) {
                        *o = q as i8 as f32 * d;
                    }
                }
                Blocks::Q4_0 => {
                    let (lo, hi) = o.split_at_mut(BLOCK / 2);
                    for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&b[2..2 + BLOCK / 2]) {
                        *l = ((q & 0x0F) as i32 - 8) as f32 * d;
                        *h = ((q >> 4) as i32 - 8) as f32 * d;
                    }
                }
            }
        }
    }
}

/// [`Blocks::dequantize_into`] on AVX2: per eight values, bytes widened to 32-bit integers, converted
/// to f32 and multiplied by the block's scale (exact conversions and one rounded product, as the
/// portable loop computes them).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dequantize_avx2(blocks: Blocks, row: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let bytes = blocks.block_bytes();
    // `o` is a whole block's values and `b` a whole block's bytes (exact chunks): every load and
    // store below lies inside them.
    for (o, b) in out.chunks_exact_mut(BLOCK).zip(row.chunks_exact(bytes)) {
        let d = _mm256_set1_ps(half::f16::from_le_bytes([b[0], b[1]]).to_f32_const());
        let (src, dst) = (b.as_ptr().add(2), o.as_mut_ptr());
        // Eight 32-bit integers as f32, times the scale, stored at value `i`.
        macro_rules! put {
            ($i:expr, $v:expr) => {
                _mm256_storeu_ps(dst.add($i), _mm256_mul_ps(_mm256_cvtepi32_ps($v), d))
            };
        }
        match blocks {
            Blocks::Q8_0 => {
                for i in (0..BLOCK).step_by(8) {
                    put!(i, _mm256_cvtepi8_epi32(_mm_loadl_epi64(src.add(i).cast())));
                }
            }
            Blocks::Q4_0 => {
                let (mask, eight) = (_mm256_set1_epi32(0x0F), _mm256_set1_epi32(8));
                for i in (0..BLOCK / 2).step_by(8) {
                    let q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(src.add(i).cast()));
                    put!(i, _mm256_sub_epi32(_mm256_and_si256(q, mask), eight));
                    put!(
                        i + BLOCK / 2,
                        _mm256_sub_epi32(_mm256_srli_epi32(q, 4), eight)
                    );
                }
            }
        }
    }
}

/// ggml's `quantize_row_q8_0_ref` for one block: `d = max|x| / 127`, `q = round(x / d)`.
fn q8_0_block(x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
    for (o, &v) in out[2..].iter_mut().zip(x) {
        *o = (v * id).round() as i8 as u8;
    }
}

/// ggml's `quantize_row_q4_0_ref` for one block: `d` = the value of largest magnitude / −8,
/// `q = min(15, trunc(x / d + 8.5))`, value `j` in the low nibble of byte `j`, value `j + 16` in its
/// high nibble.
fn q4_0_block(x: &[f32], out: &mut [u8]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
    let nibble = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
    for j in 0..BLOCK / 2 {
        out[2 + j] = nibble(x[j]) | (nibble(x[j + BLOCK / 2]) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{BlockFormat, Unpacked};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};
    use rand::{Rng, SeedableRng};

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect()
    }

    #[test]
    fn blocks_are_byte_for_byte_ggmls_and_read_back_as_ggml_dequantizes() {
        for (blocks, ggml, format) in [
            (Blocks::Q8_0, GgmlDType::Q8_0, BlockFormat::Q8_0),
            (Blocks::Q4_0, GgmlDType::Q4_0, BlockFormat::Q4_0),
        ] {
            let mut x = values(8 * BLOCK, 5);
            x[BLOCK..2 * BLOCK].fill(0.0); // an all-zero block: d = 0
            let mut ours = vec![0u8; blocks.row_bytes(x.len())];
            blocks.quantize(&x, &mut ours);
            // candle implements ggml's block formats and reference quantization.
            let t = Tensor::from_vec(x.clone(), (1, x.len()), &Device::Cpu).unwrap();
            let theirs = QTensor::quantize(&t, ggml)
                .unwrap()
                .data()
                .unwrap()
                .to_vec();
            assert_eq!(ours, theirs, "{blocks:?}: the bytes of ggml's layout");
            // Read back as the weight kernels' unpacker (ggml's dequantize_row_*) reads them.
            let mut back = Vec::new();
            blocks.dequantize(&ours, &mut back);
            let mut u = Unpacked::with_len(x.len(), false);
            format.unpack_row(&ours, &mut u);
            let mut want = vec![0f32; x.len()];
            u.dequantize(&mut want);
            assert_eq!(back, want, "{blocks:?}: dequantized values");
            let mut portable = vec![0f32; x.len()];
            blocks.dequantize_portable(&ours, &mut portable);
            assert_eq!(portable, want, "{blocks:?}: dequantized without vectors");
            let worst = x
                .iter()
                .zip(&back)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            let step = if blocks == Blocks::Q8_0 {
                3.0 / 127.0
            } else {
                3.0 / 8.0
            };
            assert!(
                worst <= step,
                "{blocks:?}: error {worst} beyond a quantization step"
            );
        }
    }

    /// The tensor version (a cache on a GPU) reads every block as the host does, bit for bit: scales
    /// of every magnitude (f16 subnormals, the largest normals), both signs (Q4_0's scale is
    /// negative when its largest value is positive), zero blocks, bytes of every value; from a view
    /// of part of a buffer, as a cache holds it.
    #[test]
    fn the_tensor_version_reads_every_block_as_the_host_does() {
        let (heads, len, cap, d) = (3, 40, 48, 4 * BLOCK);
        for blocks in [Blocks::Q8_0, Blocks::Q4_0] {
            let row = blocks.row_bytes(d);
            let mut bytes = vec![0u8; heads * cap * row];
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
            for (r, out) in bytes.chunks_exact_mut(row).enumerate() {
                // A magnitude per row from 1e-9 (subnormal scales) to 6e4 (near f16's largest).
                let scale = 10f32.powf(-9.0 + 13.8 * (r % 23) as f32 / 22.0);
                let mut x: Vec<f32> = (0..d)
                    .map(|_| scale * rng.random_range(-1.0f32..1.0))
                    .collect();
                if r % 5 == 0 {
                    x[..BLOCK].fill(0.0);
                }
                blocks.quantize(&x, out);
            }
            // Besides: every byte value and random scale bits (finite ones: exponent below 31).
            for out in bytes.chunks_exact_mut(row).step_by(7) {
                for (i, b) in out.iter_mut().enumerate() {
                    *b = match i % blocks.block_bytes() {
                        1 => rng.random_range(0u8..0x7C) | (rng.random::<u8>() & 0x80),
                        _ => rng.random(),
                    };
                }
            }
            let buffer = Tensor::from_vec(bytes.clone(), (heads, cap, row), &Device::Cpu).unwrap();
            let held = buffer.narrow(1, 0, len).unwrap();
            let got = blocks.dequantize_tensor(&held).unwrap();
            assert_eq!(got.dims(), &[heads, len, d]);
            let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let mut want = Vec::new();
            let mut vals = Vec::new();
            for h in 0..heads {
                for e in 0..len {
                    blocks.dequantize(&bytes[(h * cap + e) * row..][..row], &mut vals);
                    want.extend_from_slice(&vals);
                }
            }
            assert_eq!(got.len(), want.len());
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits(),
                    "{blocks:?}: value {i}: {a:e} against the host's {b:e}"
                );
            }
        }
    }
}
