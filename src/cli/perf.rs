//! `kvbench perf`: the engine's speed on this machine, measured honestly: warm-up runs first, then
//! several repeats, reporting the median and the range, with the machine and thread count recorded.

use super::UsageError;
use clap::Args;
use kvbench::eval::builtin;
use kvbench::flags::{ModelFlags, PolicyFlags, RuntimeFlags};
use kvbench::generate::{generate_copies, Request, SamplingParams};
use kvbench::metrics;
use kvbench::model::profile::{Phase, PhaseTimes};
use kvbench::model::{Activations, Model, SeqInput};
use kvbench::policy::{Full, PolicySpec};
use std::process::ExitCode;
use std::time::Instant;

/// The most repeats, and the most warm-up runs, one measurement takes: counts past it are typing
/// errors (their sums could pass `usize` and leave nothing measured), not measurements.
const MOST_RUNS: u64 = 10_000;

#[derive(Args, Debug)]
pub struct PerfArgs {
    #[command(flatten)]
    pub model: ModelFlags,
    #[command(flatten)]
    pub runtime: RuntimeFlags,
    /// Policies measured one after another in the decode measurement (default `full`), each at
    /// every budget; a ratio budget is resolved against --decode-tokens (the full run's length here).
    #[command(flatten)]
    pub policy: PolicyFlags,
    /// Prompt length of the prefill measurement.
    #[arg(long, default_value_t = 512, value_parser = super::parse_positive)]
    pub prompt_tokens: usize,
    /// Prompt length of each sequence in the decode measurement.
    #[arg(long, default_value_t = 64, value_parser = super::parse_positive)]
    pub decode_prompt_tokens: usize,
    /// Tokens decoded per sequence in the decode measurement, from 2 (the first comes from the
    /// prefill's logits: the rest are the decoding steps timed).
    #[arg(long, default_value_t = 64, value_parser = super::parse_generated_length)]
    pub decode_tokens: usize,
    /// Batch sizes of the decode measurement, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32", value_parser = super::parse_positive)]
    pub batch: Vec<usize>,
    /// Measured repeats (after the warm-up), 1 to 10,000.
    #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MOST_RUNS))]
    pub repeats: usize,
    /// Unmeasured warm-up runs, 0 to 10,000.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=MOST_RUNS))]
    pub warmup: usize,
    /// Tokens each sequence decodes in a warm-up run (default: --decode-tokens, as the measured
    /// runs); fewer make long measurements affordable (a warm-up only has to touch every path once).
    #[arg(long, value_parser = super::parse_positive)]
    pub warmup_tokens: Option<usize>,
    /// Also write the table's rows as JSON (one object per row: measurement, median, min, max,
    /// every repeat) to this file.
    #[arg(long, value_name = "FILE")]
    pub export_json: Option<std::path::PathBuf>,
    /// Skip the memory-bandwidth measurement (its 512 MiB of buffers would count in the peak RSS,
    /// e.g. when the process's memory is compared with another engine's).
    #[arg(long)]
    pub no_bandwidth: bool,
    /// A KV-cache memory limit in MiB: each policy is also measured at the largest batch whose
    /// sequences' peak KV cache and policy state fit in it (measured at batch 1), up to --max-batch.
    #[arg(long, value_name = "MIB")]
    pub mem_limit: Option<f64>,
    /// The largest batch --mem-limit may choose; a row whose batch it capped says so, with the
    /// batch that would fit.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_batch: usize,
    /// How a decoding batch attends off the CPU's own loop (on a GPU): `batched`, all sequences at
    /// once over caches pooled per layer, or `per-sequence`, one at a time (the earlier engine, kept
    /// to measure what batching gives).
    #[arg(long, value_enum, ignore_case = true, default_value_t = Attention::Batched)]
    pub attention: Attention,
    /// After each decode measurement, one more run (not counted in its rates) that waits for the
    /// device after every phase of every layer and prints where a decoding step's time goes: norms,
    /// projections, RoPE, attention with the cache and policy, the head, and the rest (logits to the
    /// host, sampling). The phases' sum exceeds an unprofiled step by what overlapping them gains.
    #[arg(long)]
    pub profile: bool,
}

/// `--attention`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Attention {
    Batched,
    PerSequence,
}

/// What one decode measurement gave: per measured repeat, aggregate tokens/s, the policy's share of
/// decode time (its decode-time work over decode time), the KV ratio in bytes (time-averaged bytes
/// held over a full cache's); and per sequence the peak KV bytes (with policy state) and the KV
/// bytes a decode step reads for attention (sparse attention reads fewer than it holds).
struct Decode {
    rates: Vec<f64>,
    policy_share: Vec<f64>,
    ratio: Vec<f64>,
    peak_per_seq: usize,
    read_per_step_per_seq: f64,
    /// The most device memory in use during the measured repeats (on a GPU).
    device_peak: Option<u64>,
    /// `--profile`: the phases' times over the extra run's steps, and that run's time per step.
    profile: Option<(PhaseTimes, f64)>,
    /// Copies to the host and bytes copied per decoding step, of the batch (the last measured
    /// repeat's; `kvbench::host_copy`).
    host_copies_per_step: (f64, f64),
}

fn measure_decode(
    model: &Model,
    spec: &PolicySpec,
    prompt: &[u32],
    b: usize,
    args: &PerfArgs,
) -> anyhow::Result<Decode> {
    let ctx = model.policy_context(spec, args.decode_tokens);
    let mut d = Decode {
        rates: Vec::new(),
        policy_share: Vec::new(),
        ratio: Vec::new(),
        peak_per_seq: 0,
        read_per_step_per_seq: 0.0,
        device_peak: None,
        profile: None,
        host_copies_per_step: (0.0, 0.0),
    };
    let runs = args.warmup + args.repeats + usize::from(args.profile);
    for i in 0..runs {
        // `--profile`'s run comes after the measured ones, apart from them.
        let profiling = args.profile && i == runs - 1;
        model.transformer.profiler().set(profiling);
        let tokens = match args.warmup_tokens {
            Some(w) if i < args.warmup => w.clamp(1, args.decode_tokens),
            _ => args.decode_tokens,
        };
        let requests = (0..b)
            .map(|_| -> anyhow::Result<Request> {
                Ok(Request {
                    prompt: prompt.to_vec(),
                    sampling: SamplingParams::greedy(),
                    max_new_tokens: tokens,
                    policy: spec.build(&ctx)?,
                    trace: false,
                    kv_type: None,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        // No end tokens: every sequence decodes exactly --decode-tokens tokens. The batch's requests
        // are copies: one prefill, the others start from copies of its state (prefill is measured
        // apart; prefilling every copy of a long prompt took minutes at large batches).
        let gens = generate_copies(&model.transformer, requests, &[], &mut |_, _| {})?;
        let secs = gens
            .iter()
            .map(|g| g.decode_time.as_secs_f64())
            .fold(0.0, f64::max);
        // The first token comes from the prefill logits; decode steps produce the rest.
        let decoded: usize = gens.iter().map(|g| g.tokens.len() - 1).sum();
        if profiling {
            let times = model.transformer.profiler().times();
            model.transformer.profiler().set(false);
            d.profile = Some((times, secs / (tokens - 1) as f64));
            continue;
        }
        if i >= args.warmup {
            d.rates.push(decoded as f64 / secs);
            let policy: f64 = gens
                .iter()
                .map(|g| (g.policy_time.saturating_sub(g.policy_prefill_time)).as_secs_f64())
                .sum();
            d.policy_share.push(100.0 * policy / (secs * b as f64));
            d.ratio.push(
                gens.iter()
                    .map(|g| g.kv_bytes_mean / g.kv_bytes_full_mean.max(1e-9))
                    .sum::<f64>()
                    / gens.len() as f64,
            );
            d.peak_per_seq = gens
                .iter()
                .map(|g| g.kv_bytes_peak + g.policy_state_bytes_peak)
                .max()
                .unwrap_or(0);
            d.device_peak = gens
                .iter()
                .filter_map(|g| g.device_memory_peak)
                .chain(d.device_peak)
                .max();
            if let Some(g) = gens.first() {
                let (c, steps) = g.decode_host_copies;
                let steps = steps.max(1) as f64;
                d.host_copies_per_step = (c.copies as f64 / steps, c.bytes as f64 / steps);
            }
            d.read_per_step_per_seq = gens
                .iter()
                .map(|g| g.decode_bytes_read as f64 / (g.tokens.len().max(2) - 1) as f64)
                .sum::<f64>()
                / gens.len() as f64;
        }
    }
    Ok(d)
}

/// A prompt of exactly `n` tokens made from built-in problem text.
pub(super) fn prompt_of(model: &Model, n: usize) -> anyhow::Result<Vec<u32>> {
    let mut ids = Vec::new();
    let mut seed = 0;
    while ids.len() < n {
        for p in builtin::problems(30, seed) {
            ids.extend(model.tokenizer.encode(&format!("{}\n", p.problem))?);
        }
        seed += 1;
    }
    ids.truncate(n);
    Ok(ids)
}

/// A row's policy: its name, and its budget unless it is the full cache (which takes none).
fn policy_label(spec: &PolicySpec) -> String {
    match spec.name() {
        "full" => "full cache".into(),
        name => format!("{name} budget {}", spec.budget()),
    }
}

fn summary(xs: &[f64]) -> String {
    let med = metrics::median(xs).unwrap_or(f64::NAN);
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{med:>8.1} | {lo:>7.1} … {hi:<7.1}")
}

pub fn run(args: PerfArgs) -> anyhow::Result<ExitCode> {
    if args.max_batch == 0 {
        return Err(UsageError("--max-batch 0: expected a batch of at least 1".into()).into());
    }
    if let Some(limit) = args.mem_limit {
        if !(limit.is_finite() && limit > 0.0) {
            return Err(UsageError(format!(
                "--mem-limit {limit}: expected a positive number of MiB"
            ))
            .into());
        }
    }
    if let Some(path) = &args.export_json {
        super::check_output_file(
            "--export-json",
            path,
            kvbench::results::replace::Output::PerfJson,
        )?;
    }
    let specs = args
        .policy
        .grid(&["full"], args.policy.rule())?
        .iter()
        .map(|s| s.resolve(args.decode_tokens as f64, args.decode_prompt_tokens as f64))
        .collect::<kvbench::Result<Vec<PolicySpec>>>()?;
    let load_start = Instant::now();
    let mut model = super::load_model(&args.model, &args.runtime)?;
    let load_secs = load_start.elapsed().as_secs_f64();
    model
        .transformer
        .set_batched_attention(args.attention == Attention::Batched);
    let activations = model.transformer.activation_dtype();
    model.check_fits(args.prompt_tokens, 0, "--prompt-tokens")?;
    model.check_fits(
        args.decode_prompt_tokens,
        args.decode_tokens,
        "--decode-prompt-tokens and --decode-tokens",
    )?;
    for &b in &args.batch {
        model.check_batch_memory(b, args.decode_prompt_tokens + args.decode_tokens, "--batch")?;
    }
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_default();
    println!(
        "model {} (weights {}, {:.0} MiB of them, loaded in {:.1} s; {} MiB of memory in 2 MiB pages), {} threads, machine: {}",
        model.name,
        kvbench::flags::spelled(&args.model.weights()),
        model.transformer.weight_bytes() as f64 / (1 << 20) as f64,
        load_secs,
        metrics::huge_page_bytes().map_or("n/a".into(), |b| (b >> 20).to_string()),
        threads,
        metrics::machine()
    );
    let device = kvbench::device::describe(args.model.device(), model.transformer.device());
    println!("device: {device}");
    if on_device_path(&model) {
        println!("attention: {:?}", args.attention);
    }
    match (args.model.activations(), activations) {
        (Activations::F32, _) => {}
        (_, candle_core::DType::F32) => {
            println!(
                "activations: F32 (--activations weights: the weights are not all 16-bit floats)"
            )
        }
        (_, t) => println!("activations: {t:?}"),
    }
    println!(
        "warm-up {} run(s), then median of {} repeats (min … max)\n",
        args.warmup, args.repeats
    );
    let on_gpu = !model.transformer.device().is_cpu();
    let bandwidth = if args.no_bandwidth {
        f64::NAN
    } else if on_gpu {
        let b = kvbench::device::copy_bandwidth(model.transformer.device(), 1 << 30, 5)?;
        println!(
            "device memory bandwidth (copy of 1 GiB on the device, read + write, median of 5): {:.1} GB/s\n",
            b / 1e9
        );
        b
    } else {
        let b = metrics::copy_bandwidth(256 << 20, 5);
        println!(
            "memory bandwidth (parallel copy of 256 MiB, read + write, median of 5): {:.1} GB/s\n",
            b / 1e9
        );
        b
    };
    println!("| measurement | tokens/s (median) | range |");
    println!("|---|---:|---|");

    let prompt = prompt_of(&model, args.prompt_tokens)?;
    let mut rates = Vec::new();
    for i in 0..args.warmup + args.repeats {
        let mut state = model.transformer.new_state(Box::new(Full))?;
        let t = Instant::now();
        model.transformer.forward(&mut [SeqInput {
            tokens: &prompt,
            state: &mut state,
        }])?;
        // On a GPU the call returns with the work queued: wait for it before reading the clock.
        kvbench::device::synchronize(model.transformer.device())?;
        if i >= args.warmup {
            rates.push(prompt.len() as f64 / t.elapsed().as_secs_f64());
        }
    }
    println!(
        "| prefill, {}-token prompt | {} |",
        args.prompt_tokens,
        summary(&rates)
    );
    let mut spreads = vec![(
        format!("prefill, {}-token prompt", args.prompt_tokens),
        metrics::spread(&rates),
    )];
    let mut exported = vec![export_row(
        serde_json::json!({"phase": "prefill", "prompt_tokens": args.prompt_tokens}),
        &rates,
    )];

    let decode_prompt = prompt_of(&model, args.decode_prompt_tokens)?;
    let mut profiles = Vec::new();
    for spec in &specs {
        // Each batch size once, in the order given (`--batch 1,1` is not two measurements).
        let mut batches: Vec<usize> = Vec::new();
        for &b in &args.batch {
            if !batches.contains(&b) {
                batches.push(b);
            }
        }
        let mut fit = None;
        if let Some(limit) = args.mem_limit {
            let one = measure_decode(&model, spec, &decode_prompt, 1, &args)?;
            let per_seq = one.peak_per_seq.max(1) as f64;
            let b = ((limit * (1 << 20) as f64) / per_seq).floor() as usize;
            fit = Some((b.min(args.max_batch), per_seq, b));
            if b > 0 && !batches.contains(&b.min(args.max_batch)) {
                batches.push(b.min(args.max_batch));
            }
        }
        for &b in &batches {
            let d = measure_decode(&model, spec, &decode_prompt, b, &args)?;
            // Bytes a decode step reads: the weights once for the batch, and what each sequence's
            // attention read (all its entries, or a sparse policy's choice), as counted by the engine.
            let rate = metrics::median(&d.rates).unwrap_or(0.0);
            let step_bytes =
                model.transformer.weight_bytes_read(b) as f64 + b as f64 * d.read_per_step_per_seq;
            let achieved = step_bytes * rate / b as f64;
            let fits = match fit {
                Some((f, per_seq, all)) if f == b && all > f => format!(
                    "; {all} sequences' KV ({:.2} MiB each) fit {} MiB: capped at --max-batch {f}",
                    per_seq / (1 << 20) as f64,
                    args.mem_limit.unwrap_or(0.0)
                ),
                Some((f, per_seq, _)) if f == b => format!(
                    "; largest batch whose KV ({:.2} MiB per sequence) fits {} MiB",
                    per_seq / (1 << 20) as f64,
                    args.mem_limit.unwrap_or(0.0)
                ),
                _ => String::new(),
            };
            let device_peak = d.device_peak.map_or(String::new(), |b| {
                format!(
                    "; device memory peak {:.2} GiB",
                    b as f64 / (1u64 << 30) as f64
                )
            });
            // Off the CPU each copy to the host is a transfer and a wait for the device.
            let (copies, copied) = d.host_copies_per_step;
            let host_copies = match on_device_path(&model) {
                true => format!(
                    "; {copies:.1} copies to the host per step ({:.1} KiB)",
                    copied / 1024.0
                ),
                false => String::new(),
            };
            println!(
                "| decode, {}, batch {b} ({}-token prompts, {} new tokens each), aggregate; policy {:.1}% of decode time, KV bytes ratio {:.3}, attention reads {:.0} KiB per step and sequence; reads {:.1} GB/s{}{fits}{device_peak}{host_copies} | {} |",
                policy_label(spec),
                args.decode_prompt_tokens,
                args.decode_tokens,
                metrics::median(&d.policy_share).unwrap_or(0.0),
                metrics::median(&d.ratio).unwrap_or(1.0),
                d.read_per_step_per_seq / 1024.0,
                achieved / 1e9,
                if bandwidth.is_nan() {
                    String::new()
                } else {
                    format!(" ({:.0}% of copy)", 100.0 * achieved / bandwidth.max(1.0))
                },
                summary(&d.rates)
            );
            spreads.push((
                format!("{}, batch {b}", policy_label(spec)),
                metrics::spread(&d.rates),
            ));
            let profile = d.profile.as_ref().map(|(times, profiled)| {
                let unprofiled = b as f64 / rate.max(1e-12);
                profiles.push((
                    format!("{}, batch {b}", policy_label(spec)),
                    times.clone(),
                    *profiled,
                    unprofiled,
                ));
                profile_json(times, *profiled, unprofiled)
            });
            exported.push(export_row(
                serde_json::json!({
                    "phase": "decode",
                    "policy": spec.describe(),
                    "batch": b,
                    "prompt_tokens": args.decode_prompt_tokens,
                    "new_tokens": args.decode_tokens,
                    "policy_share_percent": metrics::median(&d.policy_share),
                    "kv_ratio": metrics::median(&d.ratio),
                    "peak_kv_and_state_bytes_per_sequence": d.peak_per_seq,
                    "achieved_bytes_per_s": achieved,
                    "kv_bytes_read_per_step_per_sequence": d.read_per_step_per_seq,
                    "fits_mem_limit": fit.is_some_and(|(f, _, _)| f == b),
                    "batch_that_fits": fit.filter(|&(f, _, _)| f == b).map(|(_, _, all)| all),
                    "device_memory_peak_bytes": d.device_peak,
                    "host_copies_per_step": on_device_path(&model).then_some(copies),
                    "host_bytes_per_step": on_device_path(&model).then_some(copied),
                    "profile": profile,
                }),
                &d.rates,
            ));
        }
        if let Some((0, per_seq, _)) = fit {
            println!(
                "| decode, {}: not even one sequence's KV ({:.2} MiB) fits {} MiB | - | - |",
                spec.name(),
                per_seq / (1 << 20) as f64,
                args.mem_limit.unwrap_or(0.0)
            );
        }
    }
    if let Some(note) = spread_note(&spreads, args.repeats) {
        println!("\n{note}");
    }
    if !profiles.is_empty() {
        print_profiles(&profiles);
    }
    println!(
        "\npeak RSS {}",
        metrics::peak_rss_bytes().map_or("n/a".into(), |b| format!(
            "{:.0} MiB",
            b as f64 / (1 << 20) as f64
        ))
    );
    if let Some(path) = &args.export_json {
        let doc = serde_json::json!({
            "model": model.name,
            "weights": args.model.weights(),
            "machine": metrics::machine(),
            "device": device,
            "threads": threads,
            "attention": on_device_path(&model).then_some(args.attention),
            "activations": format!("{activations:?}").to_lowercase(),
            "copy_bandwidth_bytes_per_s": bandwidth,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "peak_rss_bytes": metrics::peak_rss_bytes(),
            "rows": exported,
        });
        let mut f = kvbench::results::AtomicFile::create(path)?;
        std::io::Write::write_all(&mut f, serde_json::to_string_pretty(&doc)?.as_bytes())
            .map_err(|e| kvbench::Error::io(path, e))?;
        f.commit()?;
        println!("rows written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `--profile`'s table: per decode measurement, each phase's time per step and its share of the
/// profiled step, the rest (outside the forward pass: logits to the host, sampling, bookkeeping),
/// and the step's time with and without profiling.
fn print_profiles(profiles: &[(String, PhaseTimes, f64, f64)]) {
    println!(
        "\nwhere a decoding step's time goes (--profile: one more run, the device waited for after every phase of every layer; ms per step, share of the profiled step):\n"
    );
    let names: Vec<&str> = Phase::ALL.iter().map(|p| p.name()).collect();
    println!(
        "| decode | {} | rest | profiled step | unprofiled step |",
        names.join(" | ")
    );
    println!("|---|{}---:|---:|---:|", "---:|".repeat(names.len()));
    let cell = |secs: f64, step: f64| format!("{:.3} ({:.0}%)", secs * 1e3, 100.0 * secs / step);
    for (label, times, profiled, unprofiled) in profiles {
        let phases: Vec<String> = Phase::ALL
            .iter()
            .map(|&p| cell(times.per_step_secs(p), *profiled))
            .collect();
        let rest = times.rest_secs(*profiled);
        println!(
            "| {label} | {} | {} | {:.3} ms | {:.3} ms |",
            phases.join(" | "),
            cell(rest, *profiled),
            profiled * 1e3,
            unprofiled * 1e3
        );
    }
}

/// `--profile`'s figures for the exported row, in seconds per decoding step.
fn profile_json(times: &PhaseTimes, profiled: f64, unprofiled: f64) -> serde_json::Value {
    let phases: serde_json::Map<String, serde_json::Value> = Phase::ALL
        .iter()
        .map(|&p| (p.name().to_string(), times.per_step_secs(p).into()))
        .collect();
    serde_json::json!({
        "steps": times.steps,
        "phases_secs_per_step": phases,
        "rest_secs_per_step": times.rest_secs(profiled),
        "profiled_secs_per_step": profiled,
        "unprofiled_secs_per_step": unprofiled,
    })
}

/// Repeats further apart than this (fastest over slowest) get a note under the table.
const NOISY_SPREAD: f64 = 1.25;

/// A note when some row's repeats are more than [`NOISY_SPREAD`] apart, naming the widest: the
/// machine's speed changed during the measurement (another process, the clock, a neighbour on a
/// shared host's memory), and one figure from such a run is not worth its digits. Rows measured
/// once say nothing.
fn spread_note(spreads: &[(String, Option<f64>)], repeats: usize) -> Option<String> {
    let noisy: Vec<(&str, f64)> = spreads
        .iter()
        .filter_map(|(label, s)| s.filter(|&s| s > NOISY_SPREAD).map(|s| (label.as_str(), s)))
        .collect();
    let (label, worst) = noisy.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1))?;
    Some(format!(
        "note: the repeats of {} of {} rows are more than {:.0}% apart (fastest over slowest; the widest {worst:.2}×, {label}): the machine's speed changed while measuring. Compare medians of more repeats (--repeats, now {repeats}), or two builds alternated in one run, rather than figures from separate runs.",
        noisy.len(),
        spreads.len(),
        100.0 * (NOISY_SPREAD - 1.0),
    ))
}

/// One exported row: what was measured, tokens/s as median, min, max and every repeat.
fn export_row(what: serde_json::Value, rates: &[f64]) -> serde_json::Value {
    serde_json::json!({
        "measurement": what,
        "tokens_per_s_median": metrics::median(rates),
        "tokens_per_s_min": rates.iter().copied().reduce(f64::min),
        "tokens_per_s_max": rates.iter().copied().reduce(f64::max),
        "spread": metrics::spread(rates),
        "tokens_per_s": rates,
    })
}

/// Whether decoding attends through candle's operations (a GPU), where `--attention` applies.
fn on_device_path(model: &Model) -> bool {
    !model.transformer.device().is_cpu()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_note_names_the_widest_spread_only_past_the_threshold() {
        let row = |l: &str, s: Option<f64>| (l.to_string(), s);
        let quiet = [row("prefill", Some(1.1)), row("full cache, batch 1", None)];
        assert_eq!(super::spread_note(&quiet, 3), None);
        let noisy = [
            row("prefill", Some(1.3)),
            row("full cache, batch 1", Some(1.8)),
            row("full cache, batch 8", Some(1.05)),
        ];
        let note = super::spread_note(&noisy, 3).unwrap();
        assert!(
            note.contains("2 of 3 rows") && note.contains("1.80×, full cache, batch 1"),
            "{note}"
        );
        assert!(note.contains("--repeats, now 3"), "{note}");
    }
}
