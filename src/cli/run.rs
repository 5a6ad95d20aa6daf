//! `kvbench run`: one policy at one budget on a problem set, with answers, grades and speed.

use super::DataArgs;
use super::{ModelArgs, UsageError};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kvbench::eval::accuracy::{accuracy, mean_pass_at_k, ProblemSamples};
use kvbench::eval::grade::Verdict;
use kvbench::eval::prompt::DecodingPreset;
use kvbench::generate::{generate_batch, FinishReason, Request, SamplingParams};
use kvbench::metrics;
use kvbench::policy::PolicySpec;
use kvbench::results::sample::SampleRecord;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Compression policy: full, streaming, h2o, snapkv, pyramidkv, rkv, lazy, rocket, kara (an
    /// interpretation of the paper's abstract). `kvbench policies` lists their parameters.
    #[arg(long, default_value = "full")]
    pub policy: String,
    /// KV budget: at most 1 is a fraction of the tokens seen so far (rounded up), above 1 an absolute
    /// number of entries per layer and KV head; each policy may exceed it by its declared buffer.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub budget: f64,
    /// A policy parameter, `key=value` (repeatable), e.g. `--policy-arg window=16`.
    #[arg(long = "policy-arg", value_name = "KEY=VALUE")]
    pub policy_args: Vec<String>,
    /// Write every compression event (step, layer, head, original positions kept) as JSON Lines.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub data: DataArgs,
    /// Maximum new tokens per sample (default: 512 on the built-in set, the dataset manifest's value
    /// otherwise).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Samples per problem (pass@1 is their mean; cons@n their majority vote).
    #[arg(long, default_value_t = 1)]
    pub samples: usize,
    /// Decoding preset: `greedy`, or `r1` (temperature 0.6, top-p 0.95).
    #[arg(long, value_enum, default_value_t = DecodingPreset::Greedy)]
    pub preset: DecodingPreset,
    /// Sampling temperature (overrides the preset; 0: greedy).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Nucleus sampling threshold (overrides the preset).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Base seed; sample s of problem i uses seed + i·samples + s.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write every sample (raw output, extracted answer, normalised forms, verdict) as JSON Lines, for
    /// `kvbench regrade`.
    #[arg(long, value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
    /// Lenient extraction (never the default): search unclosed thinking blocks, fall back to the
    /// last number.
    #[arg(long)]
    pub lenient: bool,
    /// Print each full output.
    #[arg(long)]
    pub show_output: bool,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    if args.batch_size == 0 || args.samples == 0 || args.max_new_tokens == Some(0) {
        return Err(UsageError(
            "--batch-size, --samples and --max-new-tokens must be at least 1".into(),
        )
        .into());
    }
    let (preset_t, preset_p) = args.preset.sampling();
    let (temperature, top_p) = (
        args.temperature.unwrap_or(preset_t),
        args.top_p.unwrap_or(preset_p),
    );
    if !(top_p > 0.0 && top_p <= 1.0) || temperature < 0.0 {
        return Err(
            UsageError("--top-p must be in (0, 1] and --temperature at least 0".into()).into(),
        );
    }
    if let Some(path) = &args.out {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        if dir.is_some_and(|d| !d.is_dir()) {
            return Err(UsageError(format!(
                "--out {}: the directory does not exist",
                path.display()
            ))
            .into());
        }
    }
    // Validate the policy before loading anything.
    let spec = PolicySpec::from_args(&args.policy, args.budget, &args.policy_args)?;
    let mut trace_out = match &args.trace {
        Some(path) => Some(TraceWriter::create(path)?),
        None => None,
    };
    let set = args.data.load()?;
    let max_new = args.max_new_tokens.unwrap_or(set.max_new_tokens);
    let model = args.model.load()?;
    let ctx = model.policy_context(&spec, max_new);
    let problems = &set.problems;
    eprintln!(
        "kvbench run: {} on {} problems × {} samples ({}), template {:?} (prompt {:?}, hash {}), weights {:?}\npolicy: {}\ndecoding: temperature {temperature}, top-p {top_p}, max {max_new} new tokens, seed {}",
        model.name,
        problems.len(),
        args.samples,
        set.source,
        model.template,
        args.data.prompt,
        args.data.prompt.template_hash(model.template),
        args.model.weights,
        spec.describe(),
        args.seed
    );
    // Work units: every (problem, sample), in order.
    let units: Vec<(usize, usize)> = (0..problems.len())
        .flat_map(|i| (0..args.samples).map(move |s| (i, s)))
        .collect();
    let total_tokens = (units.len() * max_new) as u64;
    let bar = ProgressBar::new(total_tokens);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} tokens (upper bound) {msg}",
        )
        .expect("static template"),
    );
    let started = std::time::Instant::now();
    let mut rows = Vec::new();
    let (mut prefill_tokens, mut prefill_secs, mut decode_tokens) = (0usize, 0f64, 0usize);
    let mut decode_secs = 0f64;
    let mut kv = KvSummary::default();
    let (mut truncated, mut unanswered) = (0usize, 0usize);
    let mut records = Vec::new();
    let template_hash = args.data.prompt.template_hash(model.template);
    let mut per_problem: Vec<ProblemSamples> = problems
        .iter()
        .map(|p| ProblemSamples {
            gold: p.answer.clone(),
            ..Default::default()
        })
        .collect();
    for chunk in units.chunks(args.batch_size) {
        let mut requests = Vec::with_capacity(chunk.len());
        for &(i, s) in chunk {
            let text = args
                .data
                .prompt
                .render(model.template, &problems[i].problem);
            let prompt = model.tokenizer.encode(&text)?;
            requests.push(Request {
                prompt,
                sampling: SamplingParams {
                    temperature,
                    top_p,
                    seed: args.seed + (i * args.samples + s) as u64,
                },
                max_new_tokens: max_new,
                policy: spec.build(&ctx),
                trace: trace_out.is_some(),
            });
        }
        let mut finished_len = vec![0u64; chunk.len()];
        let gens = generate_batch(
            &model.transformer,
            requests,
            &model.tokenizer.eos_ids,
            &mut |k, _| {
                finished_len[k] += 1;
                bar.inc(1);
            },
        )?;
        // Count the unused token allowance of sequences that stopped early as done.
        let unused: u64 = gens.iter().map(|g| (max_new - g.tokens.len()) as u64).sum();
        bar.inc(unused);
        let batch_decode = gens
            .iter()
            .map(|g| g.decode_time.as_secs_f64())
            .fold(0.0, f64::max);
        decode_secs += batch_decode;
        for (&(i, s), g) in chunk.iter().zip(gens) {
            let p = &problems[i];
            prefill_tokens += g.prompt_tokens;
            prefill_secs += g.prefill_time.as_secs_f64();
            decode_tokens += g.tokens.len().saturating_sub(1);
            kv.add(&g);
            if let (Some(w), Some(events)) = (&mut trace_out, &g.trace) {
                w.write(&format!("{}#{s}", p.id), events)?;
            }
            let text = model.tokenizer.decode(&g.tokens)?;
            let mut record = SampleRecord {
                problem_id: p.id.clone(),
                sample: s,
                seed: args.seed + (i * args.samples + s) as u64,
                gold: p.answer.clone(),
                output: text.clone(),
                thinking: model.template.opens_thinking(),
                extracted: None,
                normalized_pred: None,
                normalized_gold: String::new(),
                verdict: Verdict::NoAnswer,
                correct: false,
                grader: String::new(),
                lenient: false,
                tokens: g.tokens.len(),
                finish: g.finish,
                policy: spec.describe(),
                prompt: format!("{:?}", args.data.prompt),
                template_hash: template_hash.clone(),
                dataset: set.source.clone(),
            };
            record.grade(args.lenient);
            let (answer, verdict, correct) = (
                record.extracted.clone(),
                record.verdict.clone(),
                record.correct,
            );
            records.push(record);
            truncated += usize::from(verdict == Verdict::Truncated);
            unanswered += usize::from(verdict == Verdict::NoAnswer);
            if args.show_output {
                bar.suspend(|| println!("--- {} sample {s} ---\n{text}\n", p.id));
            }
            per_problem[i].answers.push(answer.clone());
            per_problem[i].correct.push(correct);
            rows.push((
                format!("{} #{s}", p.id),
                answer,
                p.answer.clone(),
                correct,
                g.tokens.len(),
                g.finish,
            ));
        }
    }
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();

    println!("| problem | answer | gold | correct | tokens | finish |");
    println!("|---|---|---|---|---|---|");
    for (id, answer, gold, correct, n, finish) in &rows {
        let finish = match finish {
            FinishReason::Eos => "eos",
            FinishReason::Length => "length",
        };
        let answer = answer.as_deref().unwrap_or("(none)").replace('|', "\\|");
        println!(
            "| {id} | {answer} | {gold} | {} | {n} | {finish} |",
            if *correct { "yes" } else { "no" }
        );
    }
    let n_correct = rows.iter().filter(|r| r.3).count();
    let acc = accuracy(&per_problem);
    println!();
    println!(
        "accuracy: pass@1 {:.1}% ± {:.1} (standard error over {} problems; {}/{} samples correct){}; grader {}; {} truncated (thinking never closed), {} without an answer",
        100.0 * acc.pass_at_1,
        100.0 * acc.stderr,
        acc.problems,
        n_correct,
        rows.len(),
        if args.samples > 1 {
            format!(
                ", pass@{n} {:.1}%, cons@{n} {:.1}%",
                100.0 * mean_pass_at_k(&per_problem, args.samples),
                100.0 * acc.cons,
                n = args.samples
            )
        } else {
            String::new()
        },
        kvbench::eval::grade::GRADER_VERSION,
        truncated,
        unanswered
    );
    println!(
        "prefill {:.1} tokens/s, decode {:.1} tokens/s (batch {}), {} generated tokens in {:.1} s wall",
        prefill_tokens as f64 / prefill_secs.max(1e-9),
        decode_tokens as f64 / decode_secs.max(1e-9),
        args.batch_size,
        rows.iter().map(|r| r.4).sum::<usize>(),
        wall
    );
    println!(
        "peak RSS {}, machine: {}",
        metrics::peak_rss_bytes().map_or("n/a".into(), |b| format!(
            "{:.0} MiB",
            b as f64 / (1 << 20) as f64
        )),
        metrics::machine()
    );
    kv.print(&spec, decode_secs);
    if let Some(path) = &args.out {
        kvbench::results::sample::write_records(path, &records)?;
        println!(
            "samples: {} records written to {}",
            records.len(),
            path.display()
        );
    }
    if let (Some(w), Some(path)) = (trace_out, &args.trace) {
        let events = w.finish()?;
        println!(
            "trace: {events} compression events written to {}",
            path.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Retained-entry figures of a run, summed over its sequences.
#[derive(Default)]
struct KvSummary {
    sequences: usize,
    /// Per layer: the largest peak over sequences, and sums of time-averaged entries.
    peak: Vec<usize>,
    mean: Vec<f64>,
    full_mean: f64,
    events: usize,
    bytes_peak: usize,
    bytes_full: usize,
    policy_secs: f64,
}

impl KvSummary {
    fn add(&mut self, g: &kvbench::generate::Generation) {
        let c = &g.cache;
        self.peak.resize(c.peak_entries.len(), 0);
        self.mean.resize(c.mean_entries.len(), 0.0);
        for (p, &x) in self.peak.iter_mut().zip(&c.peak_entries) {
            *p = (*p).max(x);
        }
        for (m, &x) in self.mean.iter_mut().zip(&c.mean_entries) {
            *m += x;
        }
        self.full_mean += c.full_mean_entries;
        self.events += c.events();
        self.bytes_peak = self.bytes_peak.max(g.kv_bytes_peak);
        self.bytes_full = self.bytes_full.max(g.kv_bytes_full);
        self.policy_secs += g.policy_time.as_secs_f64();
        self.sequences += 1;
    }

    fn print(&self, spec: &PolicySpec, decode_secs: f64) {
        let n = self.sequences.max(1) as f64;
        let layers = self.mean.len().max(1) as f64;
        let mean = self.mean.iter().sum::<f64>() / n / layers;
        let full = self.full_mean / n;
        if spec.name() == "full" {
            println!("budget rule: none (full cache)");
        } else {
            println!("budget rule: {}", spec.budget().rule());
        }
        println!(
            "retained entries per layer and head: time-averaged {:.1} vs {:.1} for a full cache (achieved ratio {:.3}); peak {} (largest layer), {} compression events per sequence",
            mean,
            full,
            mean / full.max(1e-9),
            self.peak.iter().max().copied().unwrap_or(0),
            self.events / self.sequences.max(1),
        );
        let per_layer: Vec<String> = self
            .peak
            .iter()
            .zip(&self.mean)
            .map(|(p, m)| format!("{p}/{:.0}", m / n))
            .collect();
        if per_layer.windows(2).any(|w| w[0] != w[1]) {
            println!("per layer peak/mean: {}", per_layer.join(" "));
        }
        println!(
            "peak KV {:.2} MiB vs {:.2} MiB full at the longest sequence's end; policy time {:.2} s ({:.1}% of decode)",
            self.bytes_peak as f64 / (1 << 20) as f64,
            self.bytes_full as f64 / (1 << 20) as f64,
            self.policy_secs,
            100.0 * self.policy_secs / decode_secs.max(1e-9)
        );
    }
}

/// The `--trace` file: one JSON object per compression event and head, written as sequences finish.
struct TraceWriter {
    file: kvbench::results::AtomicFile,
    events: usize,
}

impl TraceWriter {
    fn create(path: &std::path::Path) -> anyhow::Result<Self> {
        Ok(Self {
            file: kvbench::results::AtomicFile::create(path)?,
            events: 0,
        })
    }

    fn write(
        &mut self,
        sequence: &str,
        events: &[kvbench::model::TraceEvent],
    ) -> anyhow::Result<()> {
        use std::io::Write;
        for e in events {
            let line = serde_json::json!({
                "sequence": sequence,
                "generated": e.generated,
                "seen": e.seen,
                "layer": e.layer,
                "head": e.head,
                "kept": e.kept,
            });
            writeln!(self.file, "{line}")?;
        }
        self.events += events.len();
        Ok(())
    }

    fn finish(self) -> anyhow::Result<usize> {
        self.file.commit()?;
        Ok(self.events)
    }
}
