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

/// The memory this process may use at most, named for a message: the machine's
/// ([`total_memory_bytes`]) or, when less, the limit of its control group and the groups above it (a
/// container's, or a Slurm job's `--mem`), cgroup v2 or v1, where readable.
pub fn memory_limit_bytes() -> Option<(u64, &'static str)> {
    let total = total_memory_bytes()?;
    let groups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    Some(
        match cgroup_limit(&groups, |p| std::fs::read_to_string(p).ok()) {
            Some(limit) if limit < total => (limit, "this process's control group's"),
            _ => (total, "this machine's"),
        },
    )
}

/// The least memory limit along this process's control groups, as `/proc/self/cgroup` (`groups`)
/// names them: cgroup v2's `memory.max` (line `0::PATH`) and v1's `memory.limit_in_bytes` (the
/// `memory` controller's line), in the group and each group above it. `read` gives a file's text.
fn cgroup_limit(groups: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    cgroup_least(groups, &read, |limit, _| Some(limit))
}

/// The least room left along this process's control groups: each limited group's limit less its
/// working set (usage, v2 `memory.current` or v1 `memory.usage_in_bytes`, less the inactive page
/// cache the kernel reclaims first, `memory.stat`'s `inactive_file` or v1's `total_inactive_file`,
/// as container runtimes count it), as [`cgroup_limit`] reads them; a group whose usage cannot be
/// read has its whole limit.
fn cgroup_headroom(groups: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    cgroup_least(groups, &read, |limit, usage| {
        Some(limit.saturating_sub(usage().unwrap_or(0)))
    })
}

/// The least of `value(limit, usage)` over every group along the paths `groups` names that has a
/// limit ("max" (v2) or a huge number (v1's unlimited) is none); `usage` reads the group's working
/// set when `value` asks for it (the limit alone reads no usage files).
fn cgroup_least(
    groups: &str,
    read: &impl Fn(&str) -> Option<String>,
    value: impl Fn(u64, &dyn Fn() -> Option<u64>) -> Option<u64>,
) -> Option<u64> {
    let number = |at: String| read(&at).and_then(|t| t.trim().parse::<u64>().ok());
    let mut least: Option<u64> = None;
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (root, limit_file, usage_file, inactive_key) = match controllers {
            "" => (
                "/sys/fs/cgroup",
                "memory.max",
                "memory.current",
                "inactive_file",
            ),
            c if c.split(',').any(|x| x == "memory") => (
                "/sys/fs/cgroup/memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            ),
            _ => continue,
        };
        let mut dir = std::path::PathBuf::from(path.trim());
        loop {
            let base = format!("{root}{}", dir.display().to_string().trim_end_matches('/'));
            if let Some(limit) = number(format!("{base}/{limit_file}")).filter(|&v| v < 1 << 60) {
                let usage = || {
                    let inactive = read(&format!("{base}/memory.stat")).and_then(|t| {
                        t.lines().find_map(|l| {
                            let (key, n) = l.split_once(' ')?;
                            if key != inactive_key {
                                return None;
                            }
                            n.trim().parse::<u64>().ok()
                        })
                    });
                    number(format!("{base}/{usage_file}"))
                        .map(|u| u.saturating_sub(inactive.unwrap_or(0)))
                };
                if let Some(v) = value(limit, &usage) {
                    least = Some(least.map_or(v, |l| l.min(v)));
                }
            }
            if !dir.pop() {
                break;
            }
        }
    }
    least
}

/// The memory this process could take now without the kernel reclaiming from others, named for a
/// message: the machine's `MemAvailable` or, when less, the least room left in its control groups.
pub fn memory_available_bytes() -> Option<(u64, &'static str)> {
    let available = kib_field("/proc/meminfo", "MemAvailable:")?;
    let groups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    Some(
        match cgroup_headroom(&groups, |p| std::fs::read_to_string(p).ok()) {
            Some(room) if room < available => (room, "this process's control group has"),
            _ => (available, "this machine has"),
        },
    )
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

/// How far apart a measurement's repeats are: the fastest over the slowest (1 when they agree);
/// `None` with fewer than two, or a repeat that is not a positive number.
pub fn spread(xs: &[f64]) -> Option<f64> {
    let lo = xs.iter().copied().reduce(f64::min)?;
    let hi = xs.iter().copied().reduce(f64::max)?;
    (xs.len() >= 2 && lo > 0.0 && hi.is_finite()).then(|| hi / lo)
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

    #[test]
    fn spread_is_fastest_over_slowest_of_two_or_more_positive_repeats() {
        assert_eq!(super::spread(&[100.0, 150.0, 120.0]), Some(1.5));
        assert_eq!(super::spread(&[80.0, 80.0]), Some(1.0));
        assert_eq!(super::spread(&[80.0]), None);
        assert_eq!(super::spread(&[]), None);
        assert_eq!(super::spread(&[0.0, 5.0]), None);
        assert_eq!(super::spread(&[5.0, f64::INFINITY]), None);
    }

    /// A Slurm job's `--mem` (cgroup v2, a limit two levels up from the process's group) and a
    /// container's (v1): the least limit along the path; "max" and v1's unlimited are none.
    #[test]
    fn the_least_limit_along_the_control_groups_is_found() {
        let files = |map: &'static [(&'static str, &'static str)]| {
            move |p: &str| {
                map.iter()
                    .find(|(k, _)| *k == p)
                    .map(|(_, v)| v.to_string())
            }
        };
        let v2 = "0::/system.slice/job_7/step_0/user/task_0\n";
        let read = files(&[
            ("/sys/fs/cgroup/memory.max", "max\n"),
            (
                "/sys/fs/cgroup/system.slice/job_7/memory.max",
                "17179869184\n",
            ),
            (
                "/sys/fs/cgroup/system.slice/job_7/step_0/memory.max",
                "max\n",
            ),
        ]);
        assert_eq!(super::cgroup_limit(v2, read), Some(16 << 30));
        let v1 = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n";
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
                "8589934592",
            ),
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712",
            ),
        ]);
        assert_eq!(super::cgroup_limit(v1, read), Some(8 << 30));
        // In a namespace the group is "/": the root's own file.
        let read = files(&[("/sys/fs/cgroup/memory.max", "4294967296")]);
        assert_eq!(super::cgroup_limit("0::/\n", read), Some(4 << 30));
        assert_eq!(super::cgroup_limit("0::/\n", files(&[])), None);
        assert_eq!(super::cgroup_limit("garbage\n\n", files(&[])), None);
    }

    /// The room left is the least of limit less usage over the limited groups; a group without a
    /// limit gives none, one whose usage cannot be read its limit.
    #[test]
    fn the_least_room_along_the_control_groups_is_found() {
        let map = [
            ("/sys/fs/cgroup/memory.max", "max\n"),
            ("/sys/fs/cgroup/memory.current", "999999999999\n"),
            ("/sys/fs/cgroup/job/memory.max", "17179869184\n"),
            ("/sys/fs/cgroup/job/memory.current", "13958643712\n"),
            (
                "/sys/fs/cgroup/job/memory.stat",
                "anon 1\nfile 2\nactive_file 5\ninactive_file 1073741824\n",
            ),
            ("/sys/fs/cgroup/job/step/memory.max", "34359738368\n"),
            ("/sys/fs/cgroup/job/step/memory.current", "1073741824\n"),
            ("/sys/fs/cgroup/job/step/task/memory.max", "6442450944\n"),
        ];
        let read = |p: &str| {
            map.iter()
                .find(|(k, _)| *k == p)
                .map(|(_, v)| v.to_string())
        };
        // job: 16 GiB less 13 in use of which 1 is inactive page cache; step: 32 less 1; task: a
        // limit of 6 without a usage file.
        let groups = "0::/job/step/task\n";
        assert_eq!(super::cgroup_headroom(groups, read), Some(4 << 30));
        assert_eq!(super::cgroup_limit(groups, read), Some(6 << 30));
        assert_eq!(
            super::cgroup_headroom("0::/job/step/task\n", |p: &str| match p {
                "/sys/fs/cgroup/job/step/task/memory.max" => Some("6442450944".into()),
                _ => None,
            }),
            Some(6 << 30)
        );
        // v1: its own key in memory.stat; usage past the limit is no room, not a wrap-around.
        let v1 = |inactive: &'static str| {
            move |p: &str| match p {
                "/sys/fs/cgroup/memory/memory.limit_in_bytes" => Some("1000".to_string()),
                "/sys/fs/cgroup/memory/memory.usage_in_bytes" => Some("2000".to_string()),
                "/sys/fs/cgroup/memory/memory.stat" => Some(format!("cache 5\n{inactive}\n")),
                _ => None,
            }
        };
        let groups = "5:memory:/\n";
        assert_eq!(
            super::cgroup_headroom(groups, v1("inactive_file 1500")),
            Some(0)
        );
        assert_eq!(
            super::cgroup_headroom(groups, v1("total_inactive_file 1500")),
            Some(500)
        );
    }
}
