//! Loads that decode a block's pieces straight from the file's bytes: f16 scales, nibbles, fifth bits,
//! and the software prefetch that asks for weights ahead of the kernels. Shared by every x86 kernel.

use std::arch::x86_64::*;

/// The f16 values at `p` and `p + 2` (a block's `d` and `m`) as f32 lanes 0 and 1, converted straight
/// from memory: the 8 bytes from `p` must be readable.
///
/// Why assembly: written with intrinsics (or `half`), LLVM narrows the conversion of the one or two
/// values used to an insert into whatever register is at hand, keeping that register's other lanes;
/// in the Q4_1 decoding kernel the register was the running sum, so every block's decode waited for
/// the previous block's last add (about 13 cycles a block where the arithmetic needs 6). The
/// conversion from memory writes a whole register and depends on nothing but the load.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
/// `p` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
pub(crate) unsafe fn f16_lanes(p: *const u8) -> __m128 {
    unsafe {
        let v: __m128;
        // SAFETY: the caller's CPU has F16C and the 8 bytes are readable (the callers' contracts).
        std::arch::asm!(
            "vcvtph2ps {v}, qword ptr [{p}]",
            p = in(reg) p,
            v = out(xmm_reg) v,
            options(pure, readonly, nostack, preserves_flags)
        );
        v
    }
}

/// The f16 values at `p` and `p + 2` as f32 (see [`f16_lanes`]; the 8 bytes from `p` must be readable).
///
/// # Safety
/// The CPU must support AVX2 and F16C.
/// `p` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
pub(crate) unsafe fn f16_two(p: *const u8) -> (f32, f32) {
    unsafe {
        let v = f16_lanes(p);
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }
}

/// The f16 at `p` as f32 (see [`f16_lanes`]; the 8 bytes from `p` must be readable).
///
/// # Safety
/// The CPU must support AVX2 and F16C.
/// `p` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
pub(crate) unsafe fn f16_one(p: *const u8) -> f32 {
    unsafe { _mm_cvtss_f32(f16_lanes(p)) }
}

/// The f16 at `p` as f32 where only its two bytes may be read (Q6_K's `d` ends its block): zero-extended
/// into a whole register first, for the reason [`f16_lanes`] gives.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
/// `p` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
pub(crate) unsafe fn f16_last(p: *const u8) -> f32 {
    unsafe {
        let v: __m128;
        // SAFETY: the caller's CPU has F16C and the 2 bytes are readable.
        std::arch::asm!(
            "movzx {t:e}, word ptr [{p}]",
            "vmovd {v}, {t:e}",
            "vcvtph2ps {v}, {v}",
            p = in(reg) p,
            t = out(reg) _,
            v = out(xmm_reg) v,
            options(pure, readonly, nostack, preserves_flags)
        );
        _mm_cvtss_f32(v)
    }
}

/// 32 weights from 16 bytes of nibbles at `p`: low nibbles are weights 0–15, high nibbles 16–31.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
/// `p` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
pub(crate) unsafe fn nibbles(p: *const u8) -> __m256i {
    unsafe {
        let raw = _mm_loadu_si128(p as *const __m128i);
        let low = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(raw, low);
        let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
        _mm256_set_m128i(hi, lo)
    }
}

/// 0x10 in byte `i` where bit `i` of the 32 bits at `p` is set (Q5_0/Q5_1's fifth bits).
///
/// # Safety
/// The CPU must support AVX2 and F16C.
/// `p` must point at weight bytes of the layout this function decodes, every byte it reads readable.
#[inline(always)]
pub(crate) unsafe fn fifth_bits(p: *const u8) -> __m256i {
    unsafe {
        let bits = u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]);
        // byte i takes the source byte i / 8, then tests its bit i % 8
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_set_epi64x(
                0x0303030303030303,
                0x0202020202020202,
                0x0101010101010101,
                0,
            ),
        );
        let select = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

/// Asks for the `bytes` from `at` to be brought into L1, a cache line at a time (a hint: nothing is
/// read, and an address past the weights is harmless, which is why it is computed with
/// `wrapping_add`).
///
/// # Safety
/// None beyond SSE, which every x86-64 has: a prefetch never faults.
#[inline(always)]
pub(crate) unsafe fn prefetch_lines(at: *const u8, bytes: usize) {
    unsafe {
        for line in (0..bytes).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line) as *const i8);
        }
    }
}
