//! The one place that decides which kernel runs: what this CPU can do (checked once per process), the
//! environment's overrides (`KVBENCH_PATH`, `KVBENCH_VNNI`, `KVBENCH_REPACK`, `KVBENCH_PREFETCH`), and
//! the row counts at which one kernel family hands over to another, gathered per product into a
//! [`Plan`].
//!
//! Why it exists: the kernels themselves only compute; a new instruction set or a new threshold is a
//! change here and in its own folder (`x86/`), never a search through the kernels for the checks.

use super::format::BlockFormat;

/// Which code computes the products, narrowest first (the order `KVBENCH_PATH` caps by).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Path {
    Portable,
    Avx2,
    /// The AVX2 kernels, with the k-quant products of many rows on 512-bit vectors (`x86::gemm512`).
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

    /// The path's name as `run` and every record print it.
    pub fn name(self) -> &'static str {
        match self {
            Path::Avx512 => "AVX-512",
            Path::Avx2 => "AVX2",
            Path::Portable => "portable",
        }
    }
}

/// Whether this CPU runs the AVX2 path (AVX2, FMA and F16C), and `KVBENCH_PATH` allows it. Everything
/// that converts or multiplies on vectors asks here or [`has_avx512`], so the cap holds for the whole
/// process: kernels, attention, the cache's row conversions.
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX2.get_or_init(|| {
            ceiling() >= Path::Avx2
                && is_x86_feature_detected!("avx2")
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
                && ceiling() >= Path::Avx512
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The widest path `KVBENCH_PATH` allows (the widest of all when unset).
fn ceiling() -> Path {
    // A malformed value is refused by the binary before any kernel runs (`path_from_env`).
    path_from_env().ok().flatten().unwrap_or(Path::Avx512)
}

/// `KVBENCH_PATH` (`avx512`, `avx2` or `portable`): the widest code path the process may take, to
/// measure on an AVX-512 machine what an AVX2-only machine runs. `None` when unset; an error naming
/// the variable, its value and the accepted ones otherwise. It caps, never raises: `avx512` on an AVX2
/// machine still runs AVX2, and every record names the path that ran.
pub fn path_from_env() -> Result<Option<Path>, String> {
    let Some(raw) = std::env::var_os("KVBENCH_PATH") else {
        return Ok(None);
    };
    match raw
        .to_str()
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        Some("avx512" | "avx-512") => Ok(Some(Path::Avx512)),
        Some("avx2") => Ok(Some(Path::Avx2)),
        Some("portable") => Ok(Some(Path::Portable)),
        _ => Err(format!(
            "KVBENCH_PATH={raw:?} must be avx512, avx2 or portable (the widest code path to use)"
        )),
    }
}

/// Whether the AVX-512 path may use VNNI (`vpdpbusd`: bytes multiplied and summed four by four into
/// 32-bit lanes in one instruction, on 256-bit vectors, hence VL too). `KVBENCH_VNNI=0` turns it off
/// for an A/B (a malformed value is refused by the binary at start, [`crate::switches`]).
pub fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *VNNI.get_or_init(|| {
            has_avx512()
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx512vl")
                && crate::switches::VNNI.is_on()
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the VNNI kernels may also use GFNI (one affine byte transform for Q5_K's fifth bits).
pub fn has_gfni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static GFNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *GFNI.get_or_init(|| is_x86_feature_detected!("gfni"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether weight matrices are repacked at load (`packed`): yes unless
/// `KVBENCH_REPACK=0` (kept to measure the two layouts against each other; a malformed value is
/// refused by the binary at start, [`crate::switches`]).
pub fn repack_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::switches::REPACK.is_on())
}

/// How far ahead (bytes) the decoding kernels ask for weights with a software prefetch; 0: never.
/// `KVBENCH_PREFETCH=BYTES` sets it; by default 4,608 on Intel CPUs and 1,152 elsewhere (measured per
/// vendor: docs/kernels.md).
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

/// Calls with fewer activation rows use the kernels that decode blocks in registers (decoding); from
/// here on weight rows are decoded once per tile (measured on Qwen2.5-Coder-1.5B: docs/kernels.md).
const TILED_MIN_ROWS: usize = 16;

/// Activation rows from which two repacked groups go through the AVX-512 kernel together rather than
/// one group at a time through the 256-bit kernels (the kernel bench put the two even from 5 to 7 rows
/// and the pairs ahead from 8; decoding at batch 1 and 4 measured faster one at a time).
const PAIR_FROM: usize = 6;

/// Output columns per task (weight rows unpacked and used by one thread in turn).
const COLS: usize = 32;

/// Every kernel choice of one product of `m` activation rows, computed once per call from the path and
/// the CPU's features: the driver only reads it.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// The path the CPU runs (the asked one or the widest below it).
    pub path: Path,
    /// Activation rows of the call.
    pub m: usize,
    /// Whether the AVX-512 path's VNNI kernels run (Q4_K/Q5_K through `x86::k45_vnni`, the 32-weight
    /// formats' tiles through `gemm::legacy_vnni`, Q6_K through `gemm::kquant_vnni`).
    pub vnni: bool,
    /// Output columns per parallel task: 128 below 8 rows (decoding: a task is a few microseconds of
    /// streaming weights, longer runs help the hardware prefetcher), else 32.
    pub cols_per_task: usize,
    /// Rows from which repacked k-quant groups are interleaved once per tile rather than read in place
    /// by every call: 64 with VNNI (its in-place kernels stay ahead to batch 32), else 32.
    pub packed_tiled_from: usize,
    /// Rows from which two repacked groups go through the AVX-512 pair kernel.
    pub pair_from: usize,
}

impl Plan {
    /// The plan for a product of `m` activation rows on `path` (or the widest path below it).
    pub fn new(path: Path, m: usize) -> Self {
        let path = path.supported();
        let vnni = path == Path::Avx512 && has_vnni();
        Self {
            path,
            m,
            vnni,
            cols_per_task: if m < 8 { 4 * COLS } else { COLS },
            packed_tiled_from: if vnni { 64 } else { 32 },
            pair_from: PAIR_FROM,
        }
    }

    /// The fewest activation rows that go through the tiled kernels for a column of `format`:
    /// k-quants on the AVX-512 path from 8 rows, the rest from 16.
    pub fn tiled_from(&self, format: BlockFormat) -> usize {
        if self.path == Path::Avx512 && format.is_k_quant() {
            8
        } else {
            TILED_MIN_ROWS
        }
    }

    /// Whether the columns of `format` are decoded in registers (too few rows for tiles).
    pub fn in_registers(&self, format: BlockFormat) -> bool {
        self.m < self.tiled_from(format)
    }

    /// Whether repacked groups are read in place (too few rows to interleave them per tile).
    pub fn packed_in_place(&self) -> bool {
        self.m < self.packed_tiled_from
    }

    /// Whether two neighbouring repacked groups of one format go through the pair kernel for a tile
    /// of `rows` rows.
    pub fn pairs_packed(&self, rows: usize) -> bool {
        self.path == Path::Avx512 && rows >= self.pair_from
    }

    /// Whether two neighbouring interleaved k-quant blocks go through the 512-bit kernel together.
    pub fn pairs_tiles(&self) -> bool {
        self.path == Path::Avx512
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_never_asks_for_more_than_the_cpu_runs() {
        for path in [Path::Portable, Path::Avx2, Path::Avx512] {
            for m in [1, 4, 8, 16, 64, 512] {
                let plan = Plan::new(path, m);
                assert_eq!(plan.path, path.supported());
                assert!(!plan.vnni || (plan.path == Path::Avx512 && has_vnni()));
                assert!(plan.path != Path::Avx512 || has_avx512());
                assert!(!plan.path.simd() || has_avx2());
            }
        }
    }

    #[test]
    fn decoding_calls_take_the_register_kernels_and_prefill_the_tiles() {
        let plan = Plan::new(Path::Avx2, 1);
        assert!(plan.in_registers(BlockFormat::Q4K) && plan.in_registers(BlockFormat::Q4_0));
        let plan = Plan::new(Path::Avx2, 512);
        assert!(!plan.in_registers(BlockFormat::Q4K) && !plan.in_registers(BlockFormat::Q4_0));
        assert!(!plan.packed_in_place());
        assert_eq!(Plan::new(Path::Portable, 1).cols_per_task, 128);
        assert_eq!(Plan::new(Path::Portable, 8).cols_per_task, 32);
    }
}
