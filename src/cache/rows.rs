//! Stored rows widened to f32 as decoding attention reads them: f16 and bf16 values and KIVI's 2- and
//! 4-bit codes, eight values an instruction where the CPU has AVX2, else a value at a time.
//!
//! Why it exists: attention converts every cached key and value once per step, so at a few thousand
//! tokens these conversions are a large share of a step. Every function here is inlined into its
//! caller; the vector versions carry `target_feature` and inline into attention's loop, which is
//! compiled for AVX2 and AVX-512 (`model::attention`). The conversions are exact, so every path gives
//! the same bits (a bf16 NaN may come out with another payload; it is a NaN either way).

use half::{bf16, f16};

/// `x` as f32 into `out` (`x.len()` values).
#[inline(always)]
pub fn f16s(x: &[f16], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::dispatch::has_avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above).
        return unsafe { x86::f16s(x, out) };
    }
    for (o, v) in out.iter_mut().zip(x) {
        *o = v.to_f32();
    }
}

/// `x` as f32 into `out` (`x.len()` values): each value's bits are an f32's upper half.
#[inline(always)]
pub fn bf16s(x: &[bf16], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::dispatch::has_avx2() {
        // SAFETY: as above.
        return unsafe { x86::bf16s(x, out) };
    }
    for (o, v) in out.iter_mut().zip(x) {
        *o = v.to_f32();
    }
}

/// Two f16 values stored little-endian in `bytes` (KIVI's scale and minimum of a value group) as f32:
/// by F16C where the CPU has it (a software conversion costs a dozen instructions each, per row).
#[inline(always)]
pub fn f16_pair(bytes: [u8; 4]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::dispatch::has_avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above).
        return unsafe { x86::f16_pair(u32::from_le_bytes(bytes)) };
    }
    let [a, b, c, d] = bytes;
    (
        f16::from_le_bytes([a, b]).to_f32_const(),
        f16::from_le_bytes([c, d]).to_f32_const(),
    )
}

/// KIVI's values from their codes (`out.len()` of them, code `i` at bit `i·bits` of `codes`, low bits
/// first): `q·s + m`, rounded after the product and after the sum, one scale and minimum for all.
#[inline(always)]
pub fn codes_scaled(codes: &[u8], bits: u8, s: f32, m: f32, out: &mut [f32]) {
    codes_then(codes, bits, Affine::One(s, m), out)
}

/// KIVI's keys from their codes: `q·s[i] + m[i]`, a scale and minimum per value (per channel).
#[inline(always)]
pub fn codes_scaled_each(codes: &[u8], bits: u8, s: &[f32], m: &[f32], out: &mut [f32]) {
    codes_then(codes, bits, Affine::PerValue(s, m), out)
}

/// The scales and minima of [`codes_then`]: one pair for all, or a pair per value.
#[derive(Clone, Copy)]
enum Affine<'a> {
    One(f32, f32),
    PerValue(&'a [f32], &'a [f32]),
}

/// The codes as f32 through `affine`, eight at a time where the CPU has AVX2: the loop stays here
/// (inlined into its caller, where `affine` is known) and only the vector step carries the target
/// feature, so that it inlines into attention's loop.
#[inline(always)]
fn codes_then(codes: &[u8], bits: u8, affine: Affine<'_>, out: &mut [f32]) {
    let n = out.len().min(codes.len() * 8 / bits.max(1) as usize);
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if matches!(bits, 2 | 4) && crate::kernels::dispatch::has_avx2() {
        if let Affine::PerValue(s, m) = affine {
            assert!(
                s.len() >= n && m.len() >= n,
                "a scale and minimum per value"
            );
        }
        while i + 8 <= n {
            let at = i * bits as usize / 8;
            let word = match bits {
                2 => codes[at..]
                    .first_chunk()
                    .map(|b| u16::from_le_bytes(*b) as u32),
                _ => codes[at..].first_chunk().map(|b| u32::from_le_bytes(*b)),
            }
            .unwrap_or(0); // never: n bounds the bytes read
            let dst = out[i..].as_mut_ptr();
            // SAFETY: the CPU has AVX2, FMA and F16C (checked above); i + 8 ≤ n ≤ out.len(), and
            // a per-value scale and minimum hold n values (asserted above).
            unsafe {
                match affine {
                    Affine::One(s, m) => x86::eight_codes(word, bits, s, m, None, dst),
                    Affine::PerValue(s, m) => x86::eight_codes(
                        word,
                        bits,
                        0.0,
                        0.0,
                        Some((s[i..].as_ptr(), m[i..].as_ptr())),
                        dst,
                    ),
                }
            }
            i += 8;
        }
    }
    if i < n {
        let rest = &mut out[i..n];
        codes_portable(&codes[i * bits as usize / 8..], bits, rest);
        match affine {
            Affine::One(s, m) => rest.iter_mut().for_each(|x| *x = *x * s + m),
            Affine::PerValue(s, m) => {
                for ((x, s), m) in rest.iter_mut().zip(&s[i..]).zip(&m[i..]) {
                    *x = *x * s + m;
                }
            }
        }
    }
}

/// Every byte's four 2-bit codes, and two 4-bit codes, as f32: a byte becomes one 16- or 8-byte copy.
static CODES_2: std::sync::LazyLock<[[f32; 4]; 256]> = std::sync::LazyLock::new(|| {
    std::array::from_fn(|b| std::array::from_fn(|i| ((b >> (2 * i)) & 3) as f32))
});
static CODES_4: std::sync::LazyLock<[[f32; 2]; 256]> = std::sync::LazyLock::new(|| {
    std::array::from_fn(|b| std::array::from_fn(|i| ((b >> (4 * i)) & 15) as f32))
});

/// Codes as f32 without vectors: 2- and 4-bit codes a byte at a time through a table, others one by one.
fn codes_portable(codes: &[u8], bits: u8, out: &mut [f32]) {
    match bits {
        2 => {
            let table = &*CODES_2;
            for (o, &b) in out.chunks_mut(4).zip(codes) {
                o.copy_from_slice(&table[b as usize][..o.len()]);
            }
        }
        4 => {
            let table = &*CODES_4;
            for (o, &b) in out.chunks_mut(2).zip(codes) {
                o.copy_from_slice(&table[b as usize][..o.len()]);
            }
        }
        _ => {
            for (i, o) in out.iter_mut().enumerate() {
                let bit = i * bits as usize;
                *o = ((codes[bit / 8] >> (bit % 8)) & ((1u8 << bits) - 1)) as f32;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::{bf16, f16};
    use std::arch::x86_64::*;

    /// [`super::f16s`]: `vcvtph2ps`, eight at a time.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn f16s(x: &[f16], out: &mut [f32]) {
        let n = x.len().min(out.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 ≤ n, inside both slices.
            unsafe {
                let h = _mm_loadu_si128(x.as_ptr().add(i).cast());
                _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        for (o, v) in out[i..n].iter_mut().zip(&x[i..n]) {
            *o = v.to_f32();
        }
    }

    /// [`super::f16_pair`]: one `vcvtph2ps` of the two values.
    ///
    /// # Safety
    /// As [`f16s`].
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn f16_pair(bits: u32) -> (f32, f32) {
        let x = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
        (_mm_cvtss_f32(x), _mm_cvtss_f32(_mm_movehdup_ps(x)))
    }

    /// [`super::bf16s`]: sixteen bits widened and shifted up, eight at a time.
    ///
    /// # Safety
    /// As [`f16s`].
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn bf16s(x: &[bf16], out: &mut [f32]) {
        let n = x.len().min(out.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 ≤ n, inside both slices.
            unsafe {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(x.as_ptr().add(i).cast()));
                _mm256_storeu_si256(out.as_mut_ptr().add(i).cast(), _mm256_slli_epi32(h, 16));
            }
            i += 8;
        }
        for (o, v) in out[i..n].iter_mut().zip(&x[i..n]) {
            *o = v.to_f32();
        }
    }

    /// Eight codes of `bits` (2 or 4) bits from the low bits of `word` as f32 at `dst`: `word`
    /// broadcast to eight lanes, each lane shifted to its own code and masked; then `q·s + m`, with
    /// eight scales and minima read from `each` when given, else `s` and `m` for all (`1` and `0`:
    /// the codes themselves, exactly).
    ///
    /// # Safety
    /// As [`f16s`]; `dst`, and `each`'s pointers when given, are valid for eight values.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn eight_codes(
        word: u32,
        bits: u8,
        s: f32,
        m: f32,
        each: Option<(*const f32, *const f32)>,
        dst: *mut f32,
    ) {
        let (shifts, mask) = match bits {
            2 => (
                _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
                _mm256_set1_epi32(3),
            ),
            _ => (
                _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
                _mm256_set1_epi32(15),
            ),
        };
        let q = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32(word as i32), shifts),
            mask,
        );
        // SAFETY: the caller's.
        unsafe {
            let (s, m) = match each {
                Some((s, m)) => (_mm256_loadu_ps(s), _mm256_loadu_ps(m)),
                None => (_mm256_set1_ps(s), _mm256_set1_ps(m)),
            };
            let x = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), s), m);
            _mm256_storeu_ps(dst, x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Every path gives what the scalar conversions give, tails included.
    #[test]
    fn vector_conversions_equal_the_scalar_ones() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for n in [0, 5, 8, 64, 67, 128] {
            let x: Vec<f32> = (0..n)
                .map(|_| rng.random_range(-70000.0f32..70000.0))
                .collect();
            let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            let b: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            let mut out = vec![0f32; n];
            f16s(&h, &mut out);
            let want: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
            assert_eq!(
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "f16, {n} values"
            );
            bf16s(&b, &mut out);
            let want: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
            assert_eq!(out, want, "bf16, {n} values");
            for bits in [2u8, 4] {
                let bytes: Vec<u8> = (0..n * bits as usize / 8 + 1)
                    .map(|_| rng.random())
                    .collect();
                // Every value the bytes hold: vector steps of eight and a tail.
                let k = n * bits as usize / 8 * 8 / bits as usize;
                let raw: Vec<f32> = (0..k)
                    .map(|i| {
                        let bit = i * bits as usize;
                        ((bytes[bit / 8] >> (bit % 8)) & ((1 << bits) - 1)) as f32
                    })
                    .collect();
                let mut out = vec![0f32; k];
                codes_portable(&bytes, bits, &mut out);
                assert_eq!(out, raw, "{bits}-bit codes without vectors, {k} values");
                // With KIVI's scales and minima.
                let (sc, mi): (Vec<f32>, Vec<f32>) = (0..k)
                    .map(|_| {
                        (
                            rng.random_range(0.01f32..2.0),
                            rng.random_range(-3.0f32..3.0),
                        )
                    })
                    .unzip();
                let mut out = vec![0f32; k];
                codes_scaled_each(&bytes, bits, &sc, &mi, &mut out);
                let want: Vec<f32> = (0..k).map(|i| raw[i] * sc[i] + mi[i]).collect();
                assert_eq!(out, want, "{bits}-bit codes, a scale per value, {k} values");
                let (s0, m0) = (0.37, -1.25);
                codes_scaled(&bytes, bits, s0, m0, &mut out);
                let want: Vec<f32> = raw.iter().map(|q| q * s0 + m0).collect();
                assert_eq!(out, want, "{bits}-bit codes, one scale, {k} values");
            }
        }
    }
}
