//! The compute device: `--device cpu|cuda[:N]` (config key `device`), parsed once into a
//! [`DeviceSpec`], opened with a one-line error where it cannot be (a build without the `cuda` cargo
//! feature, no driver, no such GPU), and described for every record (GPU name, driver and CUDA
//! versions, memory).
//!
//! Work on a GPU is queued: a clock read right after a call measures the queueing, not the work.
//! Every timing in kvbench ends with a copy to the host (logits for sampling) or with
//! [`synchronize`], so what is timed has finished.

use crate::error::{Error, Result};
use candle_core::Device;
use std::fmt;
use std::str::FromStr;

/// Where the forward pass and the KV cache live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum DeviceSpec {
    /// The host's CPU, with kvbench's own kernels.
    #[default]
    Cpu,
    /// CUDA GPU number N (candle's CUDA backend).
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        // The names in any case, as users type them (`CPU`, `CUDA:1`).
        let lower = s.to_ascii_lowercase();
        match lower.as_str() {
            "cpu" => return Ok(DeviceSpec::Cpu),
            "cuda" => return Ok(DeviceSpec::Cuda(0)),
            _ => {}
        }
        match lower.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) if n < 1024 => Ok(DeviceSpec::Cuda(n)),
            _ => Err(format!(
                "unknown device {s:?}: expected cpu, cuda or cuda:N (N the GPU's number, from 0)"
            )),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl From<DeviceSpec> for String {
    fn from(d: DeviceSpec) -> String {
        d.to_string()
    }
}

impl TryFrom<String> for DeviceSpec {
    type Error = String;
    fn try_from(s: String) -> std::result::Result<Self, String> {
        s.parse()
    }
}

impl DeviceSpec {
    /// The kind without the GPU's number (`cpu`, `cuda`): what decides a result's numbers. Shards of
    /// one sweep may run on different GPUs of a node and still share a results directory.
    pub fn kind(&self) -> &'static str {
        match self {
            DeviceSpec::Cpu => "cpu",
            DeviceSpec::Cuda(_) => "cuda",
        }
    }

    pub fn is_cpu(&self) -> bool {
        matches!(self, DeviceSpec::Cpu)
    }

    /// Whether this kvbench can drive the device at all (a GPU needs the `cuda` build), without
    /// opening it: for work that runs elsewhere (an emitted Slurm script execs this binary on the
    /// cluster's GPUs). The error reads as [`Self::open`]'s on a build without CUDA.
    pub fn check_built(&self, setting: &str) -> Result<()> {
        match self {
            DeviceSpec::Cuda(_) if !cfg!(feature = "cuda") => open_cuda(0, setting).map(|_| ()),
            _ => Ok(()),
        }
    }

    /// Opens the device. `setting` says where the choice came from and what it was (`--device
    /// cuda:1`, `sweep.toml: device = "cuda:1"`), the start of the one-line error when it cannot be
    /// used. A GPU is opened once per process: every later call gets the same device (one stream,
    /// one set of libraries' handles), so tensors of two loads in one process can meet.
    pub fn open(&self, setting: &str) -> Result<Device> {
        match *self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(n) => {
                static OPENED: std::sync::OnceLock<
                    std::sync::Mutex<std::collections::HashMap<usize, Device>>,
                > = std::sync::OnceLock::new();
                let mut opened = OPENED
                    .get_or_init(Default::default)
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if let Some(device) = opened.get(&n) {
                    return Ok(device.clone());
                }
                let device = open_cuda(n, setting)?;
                opened.insert(n, device.clone());
                Ok(device)
            }
        }
    }

    /// `--device` as a flag with this value, for [`DeviceSpec::open`]'s message.
    pub fn as_flag(&self) -> String {
        format!("--device {self}")
    }

    /// A config file's `device` key with this value, for [`DeviceSpec::open`]'s message.
    pub fn as_config_key(&self, file: &std::path::Path) -> String {
        format!("{}: device = \"{self}\"", file.display())
    }
}

/// The CUDA libraries the `cuda` build calls into, in the order they are loaded, each with a function
/// it exports and what it is. `scripts/build_cuda.sh` reads this list (its one home) and leaves them
/// out of the binary's needed libraries (and links the CUDA runtime in), with lazy binding, so that
/// the binary starts on any machine (the CPU path, `--version`, a clear error) and loads them only
/// when a GPU is asked for: without them the system loader refused to start it at all (exit 127, no
/// kvbench message). A binary linked against them as usual (a build on a machine with a CUDA
/// toolkit) has them loaded already, and nothing is loaded twice.
#[cfg(all(feature = "cuda", target_os = "linux", target_env = "gnu"))]
const CUDA_LIBRARIES: [(&str, &str, &str); 4] = [
    ("libcuda.so.1", "cuInit", "the NVIDIA driver's library"),
    ("libcublasLt.so.13", "cublasLtCreate", "CUDA 13's cuBLASLt"),
    ("libcublas.so.13", "cublasCreate_v2", "CUDA 13's cuBLAS"),
    (
        "libcurand.so.10",
        "curandCreateGenerator",
        "CUDA 13's cuRAND",
    ),
];

/// Loads [`CUDA_LIBRARIES`] into the process's global scope (once), where a function of each is not
/// found there already: the error names the library that could not be loaded and why.
#[cfg(all(feature = "cuda", target_os = "linux", target_env = "gnu"))]
fn load_cuda_libraries(setting: &str) -> Result<()> {
    static LOADED: std::sync::OnceLock<std::result::Result<(), String>> =
        std::sync::OnceLock::new();
    let loaded = LOADED.get_or_init(|| {
        for (library, function, what) in CUDA_LIBRARIES {
            let function = std::ffi::CString::new(function).expect("no NUL in a function name");
            // SAFETY: dlsym with a NUL-terminated name on the default scope only looks the name up.
            if !unsafe { libc::dlsym(libc::RTLD_DEFAULT, function.as_ptr()) }.is_null() {
                continue;
            }
            let name = std::ffi::CString::new(library).expect("no NUL in a library name");
            // SAFETY: loading a CUDA library runs its initialisers, which are the vendor's and
            // expected in any CUDA process; the handle is kept for the process's life.
            let handle =
                unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
            if handle.is_null() {
                // SAFETY: dlerror returns the calling thread's last error as a C string, or null.
                let why = unsafe {
                    let e = libc::dlerror();
                    match e.is_null() {
                        true => "not found".to_string(),
                        false => std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned(),
                    }
                };
                let help = match library {
                    "libcuda.so.1" => "no NVIDIA driver here; check `nvidia-smi`",
                    _ => "put CUDA 13's libraries on LD_LIBRARY_PATH (a PyTorch cu130 install's nvidia/cu13/lib, or the wheels' lib/ that scripts/build_cuda.sh prints)",
                };
                return Err(format!(
                    "cannot load {library}, {what} ({why}): {help}"
                ));
            }
        }
        Ok(())
    });
    loaded
        .clone()
        .map_err(|why| Error::Input(format!("{setting}: {why}")))
}

/// Elsewhere the libraries are the binary's needed ones, as linked.
#[cfg(all(feature = "cuda", not(all(target_os = "linux", target_env = "gnu"))))]
fn load_cuda_libraries(_: &str) -> Result<()> {
    Ok(())
}

#[cfg(feature = "cuda")]
fn open_cuda(n: usize, setting: &str) -> Result<Device> {
    load_cuda_libraries(setting)?;
    let device = Device::new_cuda(n).map_err(|e| {
        Error::Input(format!(
            "{setting}: no usable CUDA device ({}): check `nvidia-smi`, the driver and CUDA_VISIBLE_DEVICES",
            crate::error::candle_message(&e).lines().next().unwrap_or("")
        ))
    })?;
    if let Device::Cuda(d) = &device {
        // candle puts its work on a stream of its own, which switches cudarc into tracking every
        // buffer's reads and writes with CUDA events (created, recorded and waited on per buffer and
        // operation) to order work across streams. kvbench queues everything on that one stream, so
        // the ordering is the stream's own and the events are pure per-operation overhead.
        // SAFETY: no tensor exists on this device yet (it is opened once per process), and kvbench
        // uses no other stream: nothing is freed, read or written from a second stream.
        unsafe { d.disable_event_tracking() };
    }
    Ok(device)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_: usize, setting: &str) -> Result<Device> {
    Err(Error::Input(format!(
        "{setting}: this kvbench was built without CUDA support; build it with `scripts/build_cuda.sh` (cargo feature `cuda`)"
    )))
}

/// Waits until the device has finished all work queued so far (nothing to wait for on the CPU).
pub fn synchronize(device: &Device) -> Result<()> {
    if !device.is_cpu() {
        device.synchronize()?;
    }
    Ok(())
}

/// The device's memory bandwidth as a copy on it achieves it: bytes read plus written per second,
/// the median of `repeats` copies of a `bytes`-sized buffer after one warm-up, each ended by
/// [`synchronize`].
pub fn copy_bandwidth(device: &Device, bytes: usize, repeats: usize) -> Result<f64> {
    let src = candle_core::Tensor::zeros(bytes / 4, candle_core::DType::F32, device)?;
    let mut rates = Vec::with_capacity(repeats);
    for i in 0..=repeats {
        synchronize(device)?;
        let t = std::time::Instant::now();
        let dst = src.copy()?;
        synchronize(device)?;
        let secs = t.elapsed().as_secs_f64();
        drop(dst);
        if i > 0 {
            rates.push(2.0 * bytes as f64 / secs);
        }
    }
    Ok(crate::metrics::median(&rates).unwrap_or(0.0))
}

/// What a record says about the device it ran on.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceInfo {
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// The GPU's name (`NVIDIA H100 80GB HBM3`); the CPU model on the CPU.
    pub name: String,
    /// The CUDA driver's version (`13.0`), on a GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The CUDA version kvbench was built against, on a GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    /// The device's memory in bytes, on a GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.device, self.name)?;
        if let Some(d) = &self.driver {
            write!(f, ", driver CUDA {d}")?;
        }
        if let Some(c) = &self.cuda {
            write!(f, ", built with CUDA {c}")?;
        }
        if let Some(m) = self.memory_bytes {
            write!(f, ", {:.1} GiB", m as f64 / (1u64 << 30) as f64)?;
        }
        Ok(())
    }
}

/// Describes an opened device.
pub fn describe(spec: DeviceSpec, device: &Device) -> DeviceInfo {
    match spec {
        DeviceSpec::Cpu => DeviceInfo {
            device: "cpu".into(),
            name: crate::metrics::machine(),
            ..Default::default()
        },
        DeviceSpec::Cuda(n) => cuda_info(n, device),
    }
}

/// The memory a model and its caches on `device` can have at most, in bytes, with its name for a
/// message (this machine's physical memory, or its control group's limit where that is less, on the
/// CPU; the GPU's on a GPU), where it is known.
pub fn memory_capacity(device: &Device) -> Option<(u64, &'static str)> {
    if device.is_cpu() {
        crate::metrics::memory_limit_bytes()
    } else {
        memory_total_bytes(device).map(|b| (b, "the GPU's"))
    }
}

/// The memory a model on `device` could take now, in bytes, with its subject for a message: what this
/// machine (or its control group) has available on the CPU, the GPU's free memory on a GPU.
pub fn memory_available(device: &Device) -> Option<(u64, &'static str)> {
    if device.is_cpu() {
        crate::metrics::memory_available_bytes()
    } else {
        cuda_memory(device).map(|(free, _)| (free, "the GPU has"))
    }
}

/// The device's memory in bytes, on a GPU; `None` on the CPU.
pub fn memory_total_bytes(device: &Device) -> Option<u64> {
    if device.is_cpu() {
        return None;
    }
    cuda_memory(device).map(|(_, total)| total)
}

/// The device's memory in use now (all processes), in bytes, on a GPU; `None` on the CPU.
pub fn memory_used_bytes(device: &Device) -> Option<u64> {
    if device.is_cpu() {
        return None;
    }
    cuda_memory(device).map(|(free, total)| total.saturating_sub(free))
}

#[cfg(feature = "cuda")]
fn cuda_memory(device: &Device) -> Option<(u64, u64)> {
    let Device::Cuda(d) = device else {
        return None;
    };
    let (free, total) = d.cuda_stream().context().mem_get_info().ok()?;
    Some((free as u64, total as u64))
}

#[cfg(not(feature = "cuda"))]
fn cuda_memory(_: &Device) -> Option<(u64, u64)> {
    None
}

#[cfg(feature = "cuda")]
fn cuda_info(n: usize, device: &Device) -> DeviceInfo {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let name = match device {
        Device::Cuda(d) => d.cuda_stream().context().name().ok(),
        _ => None,
    };
    let version = |v: i32| format!("{}.{}", v / 1000, (v % 1000) / 10);
    let mut driver = 0i32;
    // SAFETY: cuDriverGetVersion writes one int through the pointer it is given.
    let ok = unsafe { sys::cuDriverGetVersion(&mut driver) } == sys::CUresult::CUDA_SUCCESS;
    DeviceInfo {
        device: format!("cuda:{n}"),
        name: name.unwrap_or_else(|| "unknown GPU".into()),
        driver: ok.then(|| version(driver)),
        cuda: Some(version(sys::CUDA_VERSION as i32)),
        memory_bytes: cuda_memory(device).map(|(_, total)| total),
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_info(n: usize, _: &Device) -> DeviceInfo {
    DeviceInfo {
        device: format!("cuda:{n}"),
        name: "unavailable (built without CUDA)".into(),
        ..Default::default()
    }
}

/// Tracks the most device memory in use, sampled where the engine calls [`PeakMemory::sample`]
/// (after each forward step): the device's own counter, so it includes other processes on the same
/// GPU and the allocator's cache.
#[derive(Debug, Default, Clone, Copy)]
pub struct PeakMemory {
    pub peak_bytes: Option<u64>,
}

impl PeakMemory {
    pub fn sample(&mut self, device: &Device) {
        if let Some(used) = memory_used_bytes(device) {
            self.peak_bytes = Some(self.peak_bytes.map_or(used, |p| p.max(used)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print_back() {
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("cuda:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        assert_eq!(" CPU ".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("CUDA:2".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(2));
        assert_eq!(DeviceSpec::Cuda(3).to_string(), "cuda:3");
        assert_eq!(DeviceSpec::Cuda(3).kind(), "cuda");
        for bad in [
            "gpu",
            "cuda:",
            "cuda:-1",
            "cuda:x",
            "cuda:99999",
            "metal",
            "",
        ] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(e.contains("cuda:N"), "{bad}: {e}");
        }
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_is_an_input_error_naming_the_flag() {
        let cuda = DeviceSpec::Cuda(0);
        for (setting, start) in [
            (cuda.as_flag(), "--device cuda:0:"),
            (
                cuda.as_config_key(std::path::Path::new("s.toml")),
                "s.toml: device = \"cuda:0\":",
            ),
        ] {
            let e = cuda.open(&setting).unwrap_err();
            assert!(e.is_input_error());
            let msg = e.to_string();
            assert!(msg.starts_with(start), "{msg}");
            assert!(msg.contains("without CUDA support"), "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
    }
}
