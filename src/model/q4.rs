//! A weight-stationary Q4_1 matrix product for decoding, on the file's own 4-bit weights.
//!
//! Why it exists: the default model's layers are Q4_1 (per block of 32 weights: a scale `d`, a minimum
//! `m` and 32 four-bit values `q`, weight = `d·q + m`). candle's Q4_1 kernel is a scalar loop, so until
//! now decoding requantized every matrix to Q8_0 ([`crate::model::q8`]) and read 36 bytes per block
//! where this kernel reads 24 (the file's 20, its two f16 scales widened to f32 once at load).
//! Decoding a small batch is bound by reading the weights, so reading fewer bytes is the lever; and
//! the file's own weights are used exactly, with no second rounding.
//!
//! The arithmetic is ggml's `Q4_1 × Q8_1`: activations are quantized per row and 32-block to i8 with
//! `dx = max|x| / 127` (shared with the Q8_0 kernel), and
//! `Σ_b d_b·dx_b·Σ_i q_i·xq_i + Σ_b m_b·dx_b·Σ_i xq_i`. Scales are stored as f32 (converted once from
//! the file's f16), nibbles as in the file. The AVX2 path is chosen at run time; the portable path
//! computes the same integer sums and is what the AVX2 path is tested against.

use crate::model::q8::{column_parallel, has_avx2, quantize_blocks, BLOCK};

/// Bytes of one Q4_1 block in a GGUF file: f16 `d`, f16 `m`, 16 bytes of nibbles.
const FILE_BLOCK_BYTES: usize = 20;
/// Bytes of nibbles per block.
const NIBBLE_BYTES: usize = BLOCK / 2;

/// A `[n, k]` matrix in Q4_1.
#[derive(Debug, Clone)]
pub struct Q41Matrix {
    n: usize,
    k: usize,
    /// `d[j * kb + b]`, `m[j * kb + b]`: scale and minimum of block `b` of row `j`.
    d: Vec<f32>,
    m: Vec<f32>,
    /// `qs[(j * kb + b) * 16 + i]`: weights `i` (low nibble) and `i + 16` (high nibble) of the block.
    qs: Vec<u8>,
}

impl Q41Matrix {
    /// Reads ggml's Q4_1 blocks (`n` rows of `k` weights, row-major); `None` when the sizes disagree.
    pub fn from_ggml(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        if !k.is_multiple_of(BLOCK) || bytes.len() != n * k / BLOCK * FILE_BLOCK_BYTES {
            return None;
        }
        let blocks = n * k / BLOCK;
        let (mut d, mut m) = (Vec::with_capacity(blocks), Vec::with_capacity(blocks));
        let mut qs = Vec::with_capacity(blocks * NIBBLE_BYTES);
        for block in bytes.chunks_exact(FILE_BLOCK_BYTES) {
            let f16 = |at: usize| half::f16::from_le_bytes([block[at], block[at + 1]]).to_f32();
            d.push(f16(0));
            m.push(f16(2));
            qs.extend_from_slice(&block[4..]);
        }
        Some(Self { n, k, d, m, qs })
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn bytes(&self) -> usize {
        (self.d.len() + self.m.len()) * 4 + self.qs.len()
    }

    /// The weights as f32 (`n × k`, row-major), exactly as ggml dequantizes them.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.n * self.k);
        for (b, q) in self.qs.chunks_exact(NIBBLE_BYTES).enumerate() {
            let (d, m) = (self.d[b], self.m[b]);
            out.extend(q.iter().map(|v| (v & 0xF) as f32 * d + m));
            out.extend(q.iter().map(|v| (v >> 4) as f32 * d + m));
        }
        out
    }

    /// `x`: `m × k` row-major; returns `m × n` row-major.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        assert_eq!(x.len(), m * self.k, "Q41Matrix::matmul: bad input length");
        let (mut xs, mut xq) = (Vec::new(), Vec::new());
        quantize_blocks(x, self.k, &mut xs, &mut xq);
        let xsum = block_sums(&xq, &xs);
        let kb = self.k / BLOCK;
        let avx2 = has_avx2();
        column_parallel(self.n, m, |j, r, rows, acc| {
            let w = Row {
                qs: &self.qs[j * kb * NIBBLE_BYTES..(j + 1) * kb * NIBBLE_BYTES],
                d: &self.d[j * kb..(j + 1) * kb],
                m: &self.m[j * kb..(j + 1) * kb],
            };
            let x = Acts {
                q: &xq[r * self.k..],
                d: &xs[r * kb..],
                sum: &xsum[r * kb..],
                k: self.k,
            };
            if avx2 {
                // SAFETY: AVX2 was detected at run time; slices are in bounds by construction.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    avx2::dot_rows(&w, &x, rows, acc)
                };
            } else {
                portable_dot_rows(&w, &x, rows, acc);
            }
        })
    }
}

/// `dx_b · Σ_i xq_i` per activation block: what each block's minimum multiplies.
fn block_sums(xq: &[i8], xs: &[f32]) -> Vec<f32> {
    xq.chunks_exact(BLOCK)
        .zip(xs)
        .map(|(q, d)| d * q.iter().map(|&v| v as i32).sum::<i32>() as f32)
        .collect()
}

/// One weight row's blocks.
struct Row<'a> {
    qs: &'a [u8],
    d: &'a [f32],
    m: &'a [f32],
}

/// Quantized activation rows (row `i` at `q[i * k..]`, `d[i * kb..]`, `sum[i * kb..]`).
struct Acts<'a> {
    q: &'a [i8],
    d: &'a [f32],
    sum: &'a [f32],
    k: usize,
}

/// `Σ_b m_b · sum_b` in block order: the minimum's share of one row's product.
#[inline(always)]
fn min_term(m: &[f32], sum: &[f32]) -> f32 {
    m.iter().zip(sum).fold(0f32, |t, (m, s)| t + m * s)
}

/// Products of one weight row with up to 4 activation rows, portable.
fn portable_dot_rows(w: &Row, x: &Acts, rows: usize, acc: &mut [f32; 4]) {
    let kb = x.k / BLOCK;
    for (i, a) in acc.iter_mut().take(rows).enumerate() {
        let mut total = 0f32;
        for b in 0..kb {
            let q = &w.qs[b * NIBBLE_BYTES..(b + 1) * NIBBLE_BYTES];
            let xb = &x.q[i * x.k + b * BLOCK..i * x.k + (b + 1) * BLOCK];
            let dot: i32 = q
                .iter()
                .enumerate()
                .map(|(t, v)| (v & 0xF) as i32 * xb[t] as i32 + (v >> 4) as i32 * xb[t + 16] as i32)
                .sum();
            total += w.d[b] * x.d[i * kb + b] * dot as f32;
        }
        *a = total + min_term(w.m, &x.sum[i * kb..(i + 1) * kb]);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Acts, Row, BLOCK, NIBBLE_BYTES};
    use crate::model::q8::avx2::hsum;
    use std::arch::x86_64::*;

    /// The 32 weights of block `b` as unsigned bytes, in weight order (low nibbles, then high).
    #[inline(always)]
    unsafe fn weights(qs: &[u8], b: usize) -> __m256i {
        let raw = _mm_loadu_si128(qs.as_ptr().add(b * NIBBLE_BYTES) as *const __m128i);
        let low = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(raw, low);
        let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
        _mm256_set_m128i(hi, lo)
    }

    /// `sum + scale · (w · x)` over one block, `w` unsigned (0–15) and `x` signed 32 bytes at `x`.
    #[inline(always)]
    unsafe fn block_dot(w: __m256i, x: *const i8, scale: f32, sum: __m256) -> __m256 {
        let x = _mm256_loadu_si256(x as *const __m256i);
        let pairs = _mm256_maddubs_epi16(w, x); // |pair| ≤ 2·15·127: no saturation
        let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(quads), _mm256_set1_ps(scale), sum)
    }

    /// `Σ_b m_b · sum_b`, eight blocks at a time, then the remainder in block order.
    #[inline(always)]
    unsafe fn min_term(m: &[f32], sum: &[f32]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut b = 0;
        while b + 8 <= m.len() {
            let (mv, sv) = (
                _mm256_loadu_ps(m.as_ptr().add(b)),
                _mm256_loadu_ps(sum.as_ptr().add(b)),
            );
            acc = _mm256_fmadd_ps(mv, sv, acc);
            b += 8;
        }
        hsum(acc) + super::min_term(&m[b..], &sum[b..])
    }

    /// AVX2 version of [`super::portable_dot_rows`]: `rows` (1–4) activation rows against one weight
    /// row, each block's nibbles unpacked once for all of them. Even and odd blocks feed separate
    /// accumulators so consecutive FMAs do not wait on each other. Every row is summed in the same
    /// order whatever its batch, so a sequence decodes to the same bits alone or batched.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `x` must hold `rows` rows.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_rows(w: &Row, x: &Acts, rows: usize, acc: &mut [f32; 4]) {
        match rows {
            1 => dot_n::<1>(w, x, acc),
            2 => dot_n::<2>(w, x, acc),
            3 => dot_n::<3>(w, x, acc),
            _ => dot_n::<4>(w, x, acc),
        }
    }

    /// [`dot_rows`] for a number of rows known at compile time, so the accumulators stay in registers.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_n<const R: usize>(w: &Row, x: &Acts, acc: &mut [f32; 4]) {
        let (k, kb) = (x.k, x.k / BLOCK);
        let mut even = [_mm256_setzero_ps(); R];
        let mut odd = [_mm256_setzero_ps(); R];
        let mut b = 0;
        while b + 1 < kb {
            let (w0, w1) = (weights(w.qs, b), weights(w.qs, b + 1));
            let (d0, d1) = (*w.d.get_unchecked(b), *w.d.get_unchecked(b + 1));
            for i in 0..R {
                let xp = x.q.as_ptr().add(i * k + b * BLOCK);
                let (x0, x1) = (
                    *x.d.get_unchecked(i * kb + b),
                    *x.d.get_unchecked(i * kb + b + 1),
                );
                even[i] = block_dot(w0, xp, d0 * x0, even[i]);
                odd[i] = block_dot(w1, xp.add(BLOCK), d1 * x1, odd[i]);
            }
            b += 2;
        }
        if b < kb {
            let w0 = weights(w.qs, b);
            let d0 = *w.d.get_unchecked(b);
            for (i, e) in even.iter_mut().enumerate() {
                let xp = x.q.as_ptr().add(i * k + b * BLOCK);
                *e = block_dot(w0, xp, d0 * *x.d.get_unchecked(i * kb + b), *e);
            }
        }
        for i in 0..R {
            acc[i] = hsum(_mm256_add_ps(even[i], odd[i]))
                + min_term(w.m, x.sum.get_unchecked(i * kb..(i + 1) * kb));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::q8::tests::random;
    use rand::{Rng, SeedableRng};

    /// `n × k` random Q4_1 blocks in the file's layout.
    fn random_blocks(n: usize, k: usize, seed: u64) -> Vec<u8> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut bytes = Vec::new();
        for _ in 0..n * k / BLOCK {
            let d = half::f16::from_f32(rng.random_range(0.001f32..0.05));
            let m = half::f16::from_f32(rng.random_range(-0.4f32..0.0));
            bytes.extend(d.to_le_bytes());
            bytes.extend(m.to_le_bytes());
            bytes.extend((0..NIBBLE_BYTES).map(|_| rng.random::<u8>()));
        }
        bytes
    }

    #[test]
    fn dequantizes_as_candle_does() {
        let (n, k) = (3, 64);
        let bytes = random_blocks(n, k, 1);
        let ours = Q41Matrix::from_ggml(&bytes, n, k).unwrap().dequantize();
        let theirs = candle_core::quantized::QTensor::new(
            candle_core::quantized::QStorage::from_data(
                std::borrow::Cow::Borrowed(&bytes),
                &candle_core::Device::Cpu,
                candle_core::quantized::GgmlDType::Q4_1,
            )
            .unwrap(),
            (n, k),
        )
        .unwrap()
        .dequantize(&candle_core::Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn matches_the_dequantized_product_within_the_activation_rounding() {
        let (n, k) = (70, 96);
        let q = Q41Matrix::from_ggml(&random_blocks(n, k, 2), n, k).unwrap();
        let w = q.dequantize();
        for m in [1, 3, 4, 9] {
            let x = random(m * k, 3 + m as u64);
            let y = q.matmul(&x, m);
            for r in 0..m {
                let xr = &x[r * k..(r + 1) * k];
                for j in 0..n {
                    let wj = &w[j * k..(j + 1) * k];
                    let exact: f32 = (0..k).map(|i| xr[i] * wj[i]).sum();
                    // Only activations are rounded, each by at most half its block's scale.
                    let bound: f32 = (0..k)
                        .map(|i| {
                            let b = i / BLOCK * BLOCK;
                            let dx =
                                xr[b..b + BLOCK].iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                            wj[i].abs() * dx / 2.0
                        })
                        .sum();
                    let got = y[r * n + j];
                    assert!(
                        (got - exact).abs() <= bound * 1.001 + 1e-5,
                        "m={m} r={r} j={j}: {got} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }

    #[test]
    fn simd_and_portable_paths_agree() {
        let (n, k) = (5, 160);
        let q = Q41Matrix::from_ggml(&random_blocks(n, k, 4), n, k).unwrap();
        let x = random(4 * k, 5);
        let (mut xs, mut xq) = (Vec::new(), Vec::new());
        quantize_blocks(&x, k, &mut xs, &mut xq);
        let sum = block_sums(&xq, &xs);
        let kb = k / BLOCK;
        for j in 0..n {
            let w = Row {
                qs: &q.qs[j * kb * NIBBLE_BYTES..(j + 1) * kb * NIBBLE_BYTES],
                d: &q.d[j * kb..(j + 1) * kb],
                m: &q.m[j * kb..(j + 1) * kb],
            };
            let x = Acts {
                q: &xq,
                d: &xs,
                sum: &sum,
                k,
            };
            let mut a = [0f32; 4];
            portable_dot_rows(&w, &x, 4, &mut a);
            if has_avx2() {
                let mut b = [0f32; 4];
                // SAFETY: AVX2 detected just above.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    avx2::dot_rows(&w, &x, 4, &mut b)
                };
                for (p, s) in a.iter().zip(&b) {
                    assert!((p - s).abs() <= 1e-4 * p.abs().max(1.0), "{p} vs {s}");
                }
            }
        }
    }

    #[test]
    fn a_row_is_independent_of_its_batch() {
        let (n, k) = (33, 64);
        let q = Q41Matrix::from_ggml(&random_blocks(n, k, 6), n, k).unwrap();
        let x = random(5 * k, 7);
        let all = q.matmul(&x, 5);
        let one = q.matmul(&x[2 * k..3 * k], 1);
        assert_eq!(&all[2 * n..3 * n], &one[..]);
    }

    #[test]
    fn wrong_sizes_are_refused() {
        assert!(Q41Matrix::from_ggml(&[0; 20], 1, 64).is_none());
        assert!(Q41Matrix::from_ggml(&[0; 20], 1, 30).is_none());
    }
}
