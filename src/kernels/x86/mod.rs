//! The x86-64 kernels: AVX2 (with FMA and F16C), AVX-512 and VNNI code, all behind runtime checks
//! ([`crate::kernels::dispatch`]), so one binary runs on any x86-64 and takes the widest path the CPU
//! has. Every kernel computes the same exact integer sums and the same float step
//! ([`finish`]), so every path gives the same bits.
//!
//! - [`loads`]: decoding a block's pieces (f16 scales, nibbles, fifth bits) and prefetching weights;
//! - [`finish`]: horizontal sums, the float step, where a call's activation rows and results are;
//! - [`prepared`]: a weight row decoded once, then multiplied with up to eight activation rows;
//! - [`fused`]: decoding steps (a few rows): blocks decoded in registers, one or two weight rows;
//! - [`gemm`]: four decoded weight rows against several activation rows at once (prefill, batches),
//!   with the VNNI variants of the 32-weight formats and Q6_K;
//! - [`gemm512`]: the k-quant part of [`gemm`] on 512-bit vectors, two groups of four rows at once;
//! - [`k45_vnni`]: Q4_K and Q5_K groups read in place with AVX-512 VNNI (and GFNI where present);
//! - [`legacy_packed`]: 32-weight groups repacked at load, read in place at every batch size;
//! - [`columns`]: the driver's x86 side: which of these computes a task's columns, by the [`Plan`].
//!
//! A block format meets its x86 kernel type in one place: `with_kquant!` and `with_legacy!`.
//!
//! [`Plan`]: crate::kernels::dispatch::Plan

/// Evaluates `$body` with the type `$F` naming the x86 kernels' decoding of k-quant `$format`
/// (`fused::Q4K`, `Q5K`, `Q6K`); `$other` for a format that is not a k-quant. The one place a k-quant
/// format is matched to its kernel type: a new k-quant is one arm here.
macro_rules! with_kquant {
    ($format:expr, $F:ident => $body:expr, _ => $other:expr) => {
        match $format {
            $crate::kernels::format::BlockFormat::Q4K => {
                type $F = $crate::kernels::x86::fused::Q4K;
                $body
            }
            $crate::kernels::format::BlockFormat::Q5K => {
                type $F = $crate::kernels::x86::fused::Q5K;
                $body
            }
            $crate::kernels::format::BlockFormat::Q6K => {
                type $F = $crate::kernels::x86::fused::Q6K;
                $body
            }
            _ => $other,
        }
    };
}

/// [`with_kquant!`] for the 32-weight formats (`fused::Q4_0` … `Q8_0`).
macro_rules! with_legacy {
    ($format:expr, $F:ident => $body:expr, _ => $other:expr) => {
        match $format {
            $crate::kernels::format::BlockFormat::Q4_0 => {
                type $F = $crate::kernels::x86::fused::Q4_0;
                $body
            }
            $crate::kernels::format::BlockFormat::Q4_1 => {
                type $F = $crate::kernels::x86::fused::Q4_1;
                $body
            }
            $crate::kernels::format::BlockFormat::Q5_0 => {
                type $F = $crate::kernels::x86::fused::Q5_0;
                $body
            }
            $crate::kernels::format::BlockFormat::Q5_1 => {
                type $F = $crate::kernels::x86::fused::Q5_1;
                $body
            }
            $crate::kernels::format::BlockFormat::Q8_0 => {
                type $F = $crate::kernels::x86::fused::Q8_0;
                $body
            }
            _ => $other,
        }
    };
}

// After the macros, so that every kernel file sees them.
pub mod columns;
pub mod finish;
pub mod fused;
pub mod gemm;
pub mod gemm512;
pub mod k45_vnni;
pub mod legacy_packed;
pub mod loads;
pub mod prepared;
