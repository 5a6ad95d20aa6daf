//! Stored rows widened to f32 as decoding attention reads them: f16 and bf16 values and KIVI's 2- and
//! 4-bit codes, eight values an instruction where the CPU has AVX2, else a value at a time.
//!
//! Why it exists: attention converts every cached key and value once per step, so at a few thousand
//! tokens these conversions are a large share of a step. Every function here is inlined into its
//! caller. The vector versions carry `target_feature` for callers compiled without it; attention's
//! loops, compiled for AVX2 and AVX-512 (`model::attention`), take [`halves_in`] with `AVX2` and
//! `halves_wide_avx2`, whose vector steps are always inlined: LLVM left the
//! `target_feature` functions as a call per row there. f16 and bf16 values also go straight to f64,
//! which attention sums them in. The conversions are exact, so every path gives the same bits (a bf16
//! NaN may come out with another payload; it is a NaN either way).

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

/// A 16-bit float type a cache stores (f16 or bf16), as the forms below convert it.
pub trait Half: Copy + Sync {
    /// The value as f32 (exact).
    fn value(self) -> f32;
    /// `x` as f32 into `out` ([`f16s`] or [`bf16s`]: for callers compiled without AVX2).
    fn row(x: &[Self], out: &mut [f32]);
    /// Eight values from `at` as f32 lanes.
    ///
    /// # Safety
    /// As [`halves_in`] with `AVX2`; `at` is valid for eight values.
    #[cfg(target_arch = "x86_64")]
    unsafe fn eight(at: *const Self) -> std::arch::x86_64::__m256;
}

impl Half for f16 {
    #[inline(always)]
    fn value(self) -> f32 {
        self.to_f32()
    }

    #[inline(always)]
    fn row(x: &[Self], out: &mut [f32]) {
        f16s(x, out)
    }

    /// `vcvtph2ps`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn eight(at: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(at.cast())) }
    }
}

impl Half for bf16 {
    #[inline(always)]
    fn value(self) -> f32 {
        self.to_f32()
    }

    #[inline(always)]
    fn row(x: &[Self], out: &mut [f32]) {
        bf16s(x, out)
    }

    /// Sixteen bits widened and shifted up: an f32's upper half.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn eight(at: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's.
        unsafe {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(at.cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
        }
    }
}

/// [`f16s`] or [`bf16s`] inside a loop that knows its instruction set: with `AVX2` the vector steps
/// are written into the caller's loop (LLVM left the `target_feature` functions as a call per row
/// there), else [`Half::row`].
///
/// # Safety
/// With `AVX2`, the CPU must support AVX2, FMA and F16C and the caller be compiled for them (else
/// each intrinsic becomes a call).
#[inline(always)]
pub unsafe fn halves_in<T: Half, const AVX2: bool>(x: &[T], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: the caller's.
        return unsafe { x86::halves_body(x, out) };
    }
    T::row(x, out)
}

/// `x` as f64 into `out` (`x.len()` values): what [`halves_in`] then a widening give (both exact),
/// without the f32 row between them; for attention's AVX2 and AVX-512 loops (elsewhere: a row to f32,
/// then widened).
///
/// # Safety
/// As [`halves_in`] with `AVX2`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn halves_wide_avx2<T: Half>(x: &[T], out: &mut [f64]) {
    // SAFETY: the caller's.
    unsafe { x86::halves_wide_body(x, out) }
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

/// KIVI's values from their `B`-bit codes (`out.len()` of them, code `i` at bit `i·B` of `codes`, low
/// bits first): `q·s + m`, rounded after the product and after the sum, one scale and minimum for all.
#[inline(always)]
pub fn codes_scaled<const B: usize>(codes: &[u8], s: f32, m: f32, out: &mut [f32]) {
    codes_then::<B>(codes, Affine::One(s, m), out)
}

/// KIVI's keys from their `B`-bit codes: `q·s[i] + m[i]`, a scale and minimum per value (per channel).
#[inline(always)]
pub fn codes_scaled_each<const B: usize>(codes: &[u8], s: &[f32], m: &[f32], out: &mut [f32]) {
    codes_then::<B>(codes, Affine::PerValue(s, m), out)
}

/// The scales and minima of [`codes_then`]: one pair for all, or a pair per value.
#[derive(Clone, Copy)]
enum Affine<'a> {
    One(f32, f32),
    PerValue(&'a [f32], &'a [f32]),
}

/// Values a vector step of [`codes_then`] converts: a KIVI group, `4·B` bytes of codes.
const STEP: usize = 32;

/// The codes as f32 through `affine`, [`STEP`] at a time where the CPU has AVX2, the rest without
/// vectors. `B` (2 or 4) is a constant so that this loop, inlined into attention's, holds no division,
/// no branch on the width and no bounds check per step (`perf` showed those at two thirds of the
/// instructions when the width was read at run time); only the vector step carries the target feature.
#[inline(always)]
fn codes_then<const B: usize>(codes: &[u8], affine: Affine<'_>, out: &mut [f32]) {
    const { assert!(B == 2 || B == 4, "2- or 4-bit codes") };
    let n = out.len().min(codes.len() * 8 / B);
    if let Affine::PerValue(s, m) = affine {
        debug_assert!(
            s.len() >= n && m.len() >= n,
            "a scale and minimum per value"
        );
    }
    #[allow(unused_mut)]
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::dispatch::has_avx2() {
        i = n / STEP * STEP;
        let steps = out[..i]
            .chunks_exact_mut(STEP)
            .zip(codes[..i * B / 8].chunks_exact(STEP * B / 8));
        match affine {
            Affine::One(s, m) => {
                for (o, c) in steps {
                    // SAFETY: the CPU has AVX2, FMA and F16C (checked above); `c` holds the STEP
                    // codes' bytes and `o` STEP values.
                    unsafe { x86::step_codes::<B>(c.as_ptr(), (s, m), None, o.as_mut_ptr()) }
                }
            }
            Affine::PerValue(s, m) => {
                let each = s[..i].chunks_exact(STEP).zip(m[..i].chunks_exact(STEP));
                for ((o, c), (s, m)) in steps.zip(each) {
                    let each = Some((s.as_ptr(), m.as_ptr()));
                    // SAFETY: as above; `s` and `m` hold STEP values each.
                    unsafe { x86::step_codes::<B>(c.as_ptr(), (0.0, 0.0), each, o.as_mut_ptr()) }
                }
            }
        }
    }
    if i < n {
        let rest = &mut out[i..n];
        codes_portable(&codes[i * B / 8..], B as u8, rest);
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
    use super::Half;
    use half::{bf16, f16};
    use std::arch::x86_64::*;

    /// [`super::f16s`]: [`halves_body`] compiled for AVX2, FMA and F16C (for callers that are not).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn f16s(x: &[f16], out: &mut [f32]) {
        // SAFETY: compiled for the features the caller promises.
        unsafe { halves_body(x, out) }
    }

    /// [`super::bf16s`]: [`halves_body`] compiled for AVX2, FMA and F16C (for callers that are not).
    ///
    /// # Safety
    /// As [`f16s`].
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn bf16s(x: &[bf16], out: &mut [f32]) {
        // SAFETY: compiled for the features the caller promises.
        unsafe { halves_body(x, out) }
    }

    /// `x` as f32 into `out`, eight at a time ([`Half::eight`]).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; always inlined, so that its intrinsics become
    /// instructions only in a caller compiled for them (decoding attention's AVX2 and AVX-512 loops,
    /// or [`f16s`] and [`bf16s`]).
    #[inline(always)]
    pub unsafe fn halves_body<T: Half>(x: &[T], out: &mut [f32]) {
        let n = x.len().min(out.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 ≤ n, inside both slices.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(i), T::eight(x.as_ptr().add(i))) };
            i += 8;
        }
        for (o, &v) in out[i..n].iter_mut().zip(&x[i..n]) {
            *o = v.value();
        }
    }

    /// [`super::halves_wide_avx2`]: [`Half::eight`] then `vcvtps2pd`, eight at a time, in registers.
    ///
    /// # Safety
    /// As [`halves_body`].
    #[inline(always)]
    pub unsafe fn halves_wide_body<T: Half>(x: &[T], out: &mut [f64]) {
        let n = x.len().min(out.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 ≤ n, inside both slices.
            unsafe {
                let f = T::eight(x.as_ptr().add(i));
                let o = out.as_mut_ptr().add(i);
                _mm256_storeu_pd(o, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
                _mm256_storeu_pd(o.add(4), _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
            }
            i += 8;
        }
        for (o, &v) in out[i..n].iter_mut().zip(&x[i..n]) {
            *o = v.value() as f64;
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

    /// [`super::STEP`] (32) codes of `B` (2 or 4) bits at `codes` as f32 at `dst`: each 32-bit word
    /// of codes broadcast to eight lanes (loaded straight into the vector), each lane shifted to its
    /// own code and masked; then `q·s + m`, with the scales and minima read from `each` when given,
    /// else `sm` for all.
    ///
    /// # Safety
    /// As [`f16s`]; `codes` is valid for `4·B` bytes, `dst` and `each`'s pointers for 32 values.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn step_codes<const B: usize>(
        codes: *const u8,
        sm: (f32, f32),
        each: Option<(*const f32, *const f32)>,
        dst: *mut f32,
    ) {
        // Word `k` of the codes in every lane (a macro, not a closure: closures do not carry the
        // target features).
        macro_rules! word {
            ($k:expr) => {
                // SAFETY: the caller's (each word read is inside the 4·B bytes).
                _mm256_set1_epi32(unsafe { codes.add(4 * $k).cast::<i32>().read_unaligned() })
            };
        }
        let q: [__m256i; 4] = match B {
            2 => {
                // A word holds sixteen codes: its low half's eight, then its high half's.
                let low = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
                let high = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
                let (a, b) = (word!(0), word!(1));
                [
                    _mm256_srlv_epi32(a, low),
                    _mm256_srlv_epi32(a, high),
                    _mm256_srlv_epi32(b, low),
                    _mm256_srlv_epi32(b, high),
                ]
            }
            _ => {
                let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
                [
                    _mm256_srlv_epi32(word!(0), shifts),
                    _mm256_srlv_epi32(word!(1), shifts),
                    _mm256_srlv_epi32(word!(2), shifts),
                    _mm256_srlv_epi32(word!(3), shifts),
                ]
            }
        };
        let mask = _mm256_set1_epi32((1 << B) - 1);
        let (s1, m1) = (_mm256_set1_ps(sm.0), _mm256_set1_ps(sm.1));
        for (k, q) in q.into_iter().enumerate() {
            // SAFETY: the caller's; k < 4, so 8·k + 8 ≤ 32.
            unsafe {
                let (s, m) = match each {
                    Some((s, m)) => (_mm256_loadu_ps(s.add(8 * k)), _mm256_loadu_ps(m.add(8 * k))),
                    None => (s1, m1),
                };
                let x = _mm256_cvtepi32_ps(_mm256_and_si256(q, mask));
                _mm256_storeu_ps(dst.add(8 * k), _mm256_add_ps(_mm256_mul_ps(x, s), m));
            }
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
        for n in [0, 5, 8, 32, 40, 64, 67, 100, 128] {
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
            // The forms written into attention's loops, vector (where the CPU has AVX2) and not,
            // to f32 and straight to f64.
            let bits = |x: &[f64]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let want_h: Vec<f64> = h.iter().map(|v| v.to_f32() as f64).collect();
            let want_b: Vec<f64> = b.iter().map(|v| v.to_f32() as f64).collect();
            let mut wide = vec![0f64; n];
            #[cfg(target_arch = "x86_64")]
            if crate::kernels::dispatch::has_avx2() {
                // SAFETY: the CPU has AVX2 (this test is not compiled for it: each intrinsic is a
                // call, slower, the same operations).
                unsafe { halves_wide_avx2(&h, &mut wide) };
                assert_eq!(bits(&wide), bits(&want_h), "f16 to f64, {n} values");
                // SAFETY: as above.
                unsafe { halves_wide_avx2(&b, &mut wide) };
                assert_eq!(bits(&wide), bits(&want_b), "bf16 to f64, {n} values");
            }
            for avx2 in [false, crate::kernels::dispatch::has_avx2()] {
                // SAFETY: AVX2 only where the CPU has it (as above).
                unsafe {
                    out.fill(0.0);
                    match avx2 {
                        true => halves_in::<_, true>(&h, &mut out),
                        false => halves_in::<_, false>(&h, &mut out),
                    }
                    assert_eq!(
                        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        h.iter().map(|v| v.to_f32().to_bits()).collect::<Vec<_>>(),
                        "f16 in a loop, {n} values"
                    );
                    out.fill(0.0);
                    match avx2 {
                        true => halves_in::<_, true>(&b, &mut out),
                        false => halves_in::<_, false>(&b, &mut out),
                    }
                    assert_eq!(out, want, "bf16 in a loop, {n} values");
                }
            }
            for bits in [2u8, 4] {
                let bytes: Vec<u8> = (0..n * bits as usize / 8 + 1)
                    .map(|_| rng.random())
                    .collect();
                // Every value the bytes hold: vector steps of 32 and a tail.
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
                match bits {
                    2 => codes_scaled_each::<2>(&bytes, &sc, &mi, &mut out),
                    _ => codes_scaled_each::<4>(&bytes, &sc, &mi, &mut out),
                }
                let want: Vec<f32> = (0..k).map(|i| raw[i] * sc[i] + mi[i]).collect();
                assert_eq!(out, want, "{bits}-bit codes, a scale per value, {k} values");
                let (s0, m0) = (0.37, -1.25);
                match bits {
                    2 => codes_scaled::<2>(&bytes, s0, m0, &mut out),
                    _ => codes_scaled::<4>(&bytes, s0, m0, &mut out),
                }
                let want: Vec<f32> = raw.iter().map(|q| q * s0 + m0).collect();
                assert_eq!(out, want, "{bits}-bit codes, one scale, {k} values");
            }
        }
    }
}
