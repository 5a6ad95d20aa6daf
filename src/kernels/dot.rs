//! The choice of code path, and the portable dot product: one unpacked weight row ([`Unpacked`]) with
//! up to four quantized activation rows ([`Acts`]). It computes the same integer sums as the AVX2
//! kernels ([`crate::kernels::avx2`]), which are tested against it.
//!
//! Per group of 32 weights and activation row: `Σ_half scale_half · Σ_i q_i·xq_i` (the two 16-wide
//! halves scaled apart, for Q6_K's per-16 scales), summed over an activation block and multiplied by
//! its scale; then `Σ_h min_h · d · Σ xq` for formats with a minimum.

use super::acts::Acts;
use super::{Unpacked, GROUP, HALF};

/// Which code computes the products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Portable,
    Avx2,
    /// The AVX2 kernels, with the k-quant products of many rows on 512-bit vectors
    /// ([`crate::kernels::gemm512`]).
    Avx512,
}

impl Path {
    /// The widest path this CPU runs: AVX-512, AVX2 with FMA, else portable.
    pub fn best() -> Self {
        if has_avx512() {
            Path::Avx512
        } else if has_avx2() {
            Path::Avx2
        } else {
            Path::Portable
        }
    }

    /// `self`, or the widest path below it that this CPU runs.
    pub fn supported(self) -> Self {
        match self {
            Path::Avx512 if !has_avx512() => Path::Avx2.supported(),
            Path::Avx2 if !has_avx2() => Path::Portable,
            p => p,
        }
    }

    /// Whether the AVX2 kernels run (on this path alone or under AVX-512's).
    pub fn simd(self) -> bool {
        matches!(self, Path::Avx2 | Path::Avx512)
    }
}

/// Whether this CPU runs the AVX2 path.
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX2.get_or_init(|| {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs the AVX-512 path (AVX-512F and BW, besides the AVX2 path's features).
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX512.get_or_init(|| {
            has_avx2()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// How far ahead (bytes) the decoding kernels ask for weights with a software prefetch; 0: never.
/// `KVBENCH_PREFETCH=BYTES` sets it; by default 4,608 on Intel CPUs and 1,152 elsewhere. Measured with
/// `kvbench perf --batch 1 --threads 2` on an Intel Xeon (family 6 model 207), two rounds: Qwen2.5-1.5B
/// (Q4_K) 11.6 / 11.5 tokens/s with none, 17.1 / 17.1 at 2,304 bytes, 18.1 / 17.9 at 4,608, 17.7 /
/// 17.8 at 9,216; SmolLM2 (Q4_1) 62.8 / 61.0 → 76.9 / 75.2 at 4,608. On an AMD EPYC Zen 4 (family 25
/// model 17), three rounds: SmolLM2 107.4 / 104.7 / 100.5 with none, 133.1 / 125.4 / 139.5 at 1,152,
/// 135.2 / 135.6 / 129.3 at 2,304, 128.9 / 133.9 / 111.9 at 4,608; Qwen2.5-1.5B (repacked groups, four
/// rows' stream: four times the distance) 27.1 / 27.0 / 24.7 with none, 30.3 / 26.5 / 28.3 at 1,152,
/// 25.6 / 26.9 against 24.4 / 23.0 at 4,608 in another run.
pub fn prefetch_distance() -> usize {
    static DIST: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *DIST.get_or_init(|| {
        // A malformed value is refused by the binary before any kernel runs (`prefetch_from_env`).
        prefetch_from_env()
            .ok()
            .flatten()
            .unwrap_or(if is_intel() { 4608 } else { 1152 })
    })
}

/// `KVBENCH_PREFETCH` as a number of bytes: `None` when unset, an error naming the variable and its
/// value when it is not a whole number.
pub fn prefetch_from_env() -> Result<Option<usize>, String> {
    match std::env::var("KVBENCH_PREFETCH") {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!(
            "KVBENCH_PREFETCH={v:?} is not a number of bytes (0 turns the prefetch off)"
        )),
        Ok(v) => v.trim().parse().map(Some).map_err(|_| {
            format!("KVBENCH_PREFETCH={v:?} is not a number of bytes (0 turns the prefetch off)")
        }),
    }
}

/// Asks for the `bytes` from `at` to be brought into L1, a cache line at a time (a hint: nothing is
/// read, and an address past the weights is harmless, which is why it is computed with
/// `wrapping_add`).
///
/// # Safety
/// The CPU must support SSE (every x86-64 does).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn prefetch_lines(at: *const u8, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for line in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line) as *const i8);
    }
}

/// Whether the CPU's vendor string is Intel's.
fn is_intel() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let r = std::arch::x86_64::__cpuid(0);
        let vendor: Vec<u8> = [r.ebx, r.edx, r.ecx]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        vendor == b"GenuineIntel"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `Σ_h mins_h · d(h) · sums_h`: the minimum's share of one row's product.
#[inline(always)]
fn min_term(mins: &[f32], x: &Acts, r: usize) -> f32 {
    let (sums, d) = (x.row_sums(r), x.scales(r));
    let per_block = x.block / HALF;
    mins.iter()
        .zip(sums)
        .enumerate()
        .fold(0f32, |t, (h, (m, &s))| t + m * d[h / per_block] * s as f32)
}

/// Products of one unpacked weight row `w` with activation rows `r0 .. r0 + rows` into
/// `acc[..rows]`, portable. `has_min` says whether `w`'s format has a minimum.
pub fn portable(w: &Unpacked, has_min: bool, x: &Acts, r0: usize, rows: usize, acc: &mut [f32]) {
    #[cfg(test)]
    super::ran::mark(super::ran::Kernel::Portable);
    let per_block = x.block / GROUP;
    for (i, a) in acc.iter_mut().take(rows).enumerate() {
        let (xq, xd) = (x.row(r0 + i), x.scales(r0 + i));
        let mut total = 0f32;
        for (b, &d) in xd.iter().enumerate() {
            let mut block = 0f32;
            for g in b * per_block..(b + 1) * per_block {
                for h in 0..2 {
                    let at = g * GROUP + h * HALF;
                    let s: i32 = (at..at + HALF).map(|t| w.q[t] as i32 * xq[t] as i32).sum();
                    block += s as f32 * w.scales[g * 8 + 4 * h];
                }
            }
            total += block * d;
        }
        if has_min {
            total += min_term(&w.mins, x, r0 + i);
        }
        *a = total;
    }
}
