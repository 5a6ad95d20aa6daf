//! Measurements that come from the operating system, simple statistics over timings, and the
//! divergence of a compressed model from the full one ([`divergence`]).

pub mod divergence;

/// Peak resident set size of this process in bytes (`VmHWM` from /proc/self/status), when available.
pub fn peak_rss_bytes() -> Option<u64> {
    kib_field("/proc/self/status", "VmHWM:")
}

/// This process's anonymous memory held in 2 MiB pages, in bytes (`AnonHugePages` from
/// /proc/self/smaps_rollup), when available: how much of the weights got the pages they asked for
/// ([`crate::kernels::weight_bytes`]).
pub fn huge_page_bytes() -> Option<u64> {
    kib_field("/proc/self/smaps_rollup", "AnonHugePages:")
}

/// This machine's physical memory in bytes (`MemTotal` from /proc/meminfo), when available.
pub fn total_memory_bytes() -> Option<u64> {
    kib_field("/proc/meminfo", "MemTotal:")
}

/// The `key: N kB` line of a /proc file, in bytes.
fn kib_field(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resident set size of this process now, in bytes (`VmRSS`), when available.
pub fn current_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// This machine's memory bandwidth as a copy achieves it: bytes read plus bytes written per second,
/// the median of `repeats` copies of a `bytes`-sized buffer (after one warm-up copy), using every
/// thread of the pool in parallel as decoding does.
pub fn copy_bandwidth(bytes: usize, repeats: usize) -> f64 {
    use rayon::prelude::*;
    let n = bytes / 8;
    let src: Vec<u64> = (0..n as u64).collect();
    let mut dst = vec![0u64; n];
    let chunk = n.div_ceil(rayon::current_num_threads().max(1) * 4).max(1);
    let mut rates = Vec::new();
    for i in 0..=repeats {
        let t = std::time::Instant::now();
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(&dst);
        if i > 0 {
            rates.push(2.0 * (n * 8) as f64 / secs);
        }
    }
    median(&rates).unwrap_or(0.0)
}

/// Median of a sample (mean of the two middle values for even sizes); `None` when empty.
pub fn median(xs: &[f64]) -> Option<f64> {
    percentile(xs, 50.0)
}

/// Linear-interpolated percentile `p` in [0, 100].
pub fn percentile(xs: &[f64], p: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = p.clamp(0.0, 100.0) / 100.0 * (v.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    Some(v[lo] + (v[hi] - v[lo]) * (rank - lo as f64))
}

/// A short description of this machine for result records: CPU model (with its family and model
/// numbers, since a cloud "AMD EPYC" can be several generations), the vector instructions that decide
/// kernel speed, the kernel path kvbench takes on them, and logical cores. The same 2-core VM has been
/// a Zen 3 (AVX2 only), a Zen 4 and an Intel Xeon (both AVX-512 with VNNI), and llama.cpp built for the
/// machine uses all it has.
pub fn machine() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().map(str::trim) == Some(name))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
    };
    let cpu = field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut extra = Vec::new();
    if let (Some(family), Some(model)) = (field("cpu family"), field("model")) {
        extra.push(format!("family {family} model {model}"));
    }
    if let Some(flags) = field("flags") {
        let has: Vec<&str> = [
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512_vnni",
            "avx_vnni",
        ]
        .into_iter()
        .filter(|f| flags.split_whitespace().any(|g| g == *f))
        .collect();
        if !has.is_empty() {
            extra.push(has.join(" "));
        }
    }
    extra.push(format!("kvbench kernels: {}", kernel_path()));
    format!("{cpu} ({}), {cores} logical cores", extra.join("; "))
}

/// The CPU kernel path this process chose: AVX-512, AVX2 or portable.
pub fn kernel_path() -> &'static str {
    crate::kernels::dispatch::Path::best().name()
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles() {
        assert_eq!(super::median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(super::median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(super::percentile(&[0.0, 10.0], 90.0), Some(9.0));
        assert_eq!(super::median(&[]), None);
    }
}
