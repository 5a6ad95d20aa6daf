//! Where a decoding step's time goes, phase by phase (`kvbench perf --profile`).
//!
//! Why it exists: on a GPU a decoding step is a few hundred queued operations, and its time alone
//! does not say whether the products, the attention, the small element-wise steps or the host's
//! launching of them bound it (batch 1 of R1-Distill-Qwen-7B's shapes on an H100 reached 40% of
//! the memory-bandwidth bound; which phase to make faster is the question). When profiling is on,
//! the forward pass waits for the device at the end of every phase of every layer and adds the time
//! since the phase began to that phase's total: each phase's own time, launches included, without
//! the overlap of one phase's launching with the previous one's execution. The sum is therefore
//! more than an unprofiled step; the difference is what overlap buys. Only decoding steps are
//! recorded (one new token per sequence), not prefill. Off, a phase costs one branch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A phase of a forward pass, in the order a layer runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Looking up the new tokens' embeddings.
    Embed,
    /// The two RMS norms of every layer.
    Norms,
    /// The fused query, key and value projection (with its biases).
    Qkv,
    /// Laying q, k and v out per head and rotating q and k (inside attention on the CPU's own loop).
    Rope,
    /// Appending to the cache, attending over it, and the policy's work after it.
    Attention,
    /// The output projection and the residual sum.
    Output,
    /// The fused gate and up projection.
    GateUp,
    /// `silu(gate) · up`.
    Swiglu,
    /// The down projection and the residual sum.
    Down,
    /// The final norm, the vocabulary projection and the logits' conversion to f32.
    Head,
}

impl Phase {
    pub const ALL: [Phase; 10] = [
        Phase::Embed,
        Phase::Norms,
        Phase::Qkv,
        Phase::Rope,
        Phase::Attention,
        Phase::Output,
        Phase::GateUp,
        Phase::Swiglu,
        Phase::Down,
        Phase::Head,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Embed => "embed",
            Phase::Norms => "norms",
            Phase::Qkv => "qkv",
            Phase::Rope => "rope",
            Phase::Attention => "attention",
            Phase::Output => "output",
            Phase::GateUp => "gate_up",
            Phase::Swiglu => "swiglu",
            Phase::Down => "down",
            Phase::Head => "head",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Time spent in each phase over the decoding steps recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PhaseTimes {
    /// Decoding steps (forward calls) recorded.
    pub steps: u64,
    /// Per phase, in [`Phase::ALL`]'s order.
    pub total: [Duration; Phase::ALL.len()],
}

impl PhaseTimes {
    /// `phase`'s mean time per recorded step, in seconds.
    pub fn per_step_secs(&self, phase: Phase) -> f64 {
        self.total[phase.index()].as_secs_f64() / self.steps.max(1) as f64
    }

    /// Every phase's mean time per step, in seconds.
    pub fn sum_per_step_secs(&self) -> f64 {
        Phase::ALL.iter().map(|&p| self.per_step_secs(p)).sum()
    }

    /// What a step of `step_secs` spent outside the phases (logits to the host, sampling,
    /// bookkeeping), in seconds; never below 0.
    pub fn rest_secs(&self, step_secs: f64) -> f64 {
        (step_secs - self.sum_per_step_secs()).max(0.0)
    }
}

/// A forward pass's phase clock: off unless [`Profiler::set`] turned it on.
#[derive(Debug, Default)]
pub struct Profiler {
    on: AtomicBool,
    times: Mutex<PhaseTimes>,
}

impl Profiler {
    /// Turns recording on or off; turning it on starts from nothing.
    pub fn set(&self, on: bool) {
        if on {
            *self.lock() = PhaseTimes::default();
        }
        self.on.store(on, Ordering::Relaxed);
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// What was recorded since recording was turned on.
    pub fn times(&self) -> PhaseTimes {
        self.lock().clone()
    }

    pub(crate) fn add(&self, phase: Phase, elapsed: Duration) {
        self.lock().total[phase.index()] += elapsed;
    }

    pub(crate) fn count_step(&self) {
        self.lock().steps += 1;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PhaseTimes> {
        self.times.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs `f` as `phase`: when `clock` records, waits for the device after it and adds the time since
/// the phase began (the previous phase ended with the same wait, so it starts with an idle device).
pub(crate) fn timed<R, E: From<candle_core::Error>>(
    profiler: &Profiler,
    device: &candle_core::Device,
    recording: bool,
    phase: Phase,
    f: impl FnOnce() -> Result<R, E>,
) -> Result<R, E> {
    let started = recording.then(Instant::now);
    let out = f()?;
    if let Some(started) = started {
        if !device.is_cpu() {
            device.synchronize()?;
        }
        profiler.add(phase, started.elapsed());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_is_recorded_only_while_recording() {
        let p = Profiler::default();
        let dev = candle_core::Device::Cpu;
        let slow = || -> candle_core::Result<()> {
            std::thread::sleep(Duration::from_millis(2));
            Ok(())
        };
        timed(&p, &dev, p.is_on(), Phase::Qkv, slow).unwrap();
        assert_eq!(p.times(), PhaseTimes::default());
        p.set(true);
        timed(&p, &dev, p.is_on(), Phase::Qkv, slow).unwrap();
        p.count_step();
        let t = p.times();
        assert_eq!(t.steps, 1);
        assert!(t.per_step_secs(Phase::Qkv) >= 0.002, "{t:?}");
        assert_eq!(t.per_step_secs(Phase::Head), 0.0);
        assert_eq!(t.sum_per_step_secs(), t.per_step_secs(Phase::Qkv));
        // Turning it on again starts from nothing.
        p.set(true);
        assert_eq!(p.times(), PhaseTimes::default());
        // An error passes through and records nothing.
        let failed: candle_core::Result<()> =
            timed(&p, &dev, true, Phase::Down, || candle_core::bail!("no"));
        assert!(failed.is_err());
        assert_eq!(p.times(), PhaseTimes::default());
    }
}
