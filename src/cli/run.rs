//! `kvbench run`: one policy at one budget on a problem set, with answers, grades and speed.

use super::{ModelArgs, UsageError};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kvbench::eval::grade::{grade_output, Verdict};
use kvbench::eval::{builtin, r1_prompt};
use kvbench::generate::{generate_batch, FinishReason, Request, SamplingParams};
use kvbench::metrics;
use kvbench::policy::PolicySpec;
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
    /// Take only the first N problems.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Seed of the built-in problem set.
    #[arg(long, default_value_t = builtin::DEFAULT_SEED)]
    pub problem_seed: u64,
    /// Maximum new tokens per problem.
    #[arg(long, default_value_t = 512)]
    pub max_new_tokens: usize,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Base seed; problem i samples with seed + i.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print each full output.
    #[arg(long)]
    pub show_output: bool,
}

/// Size of the built-in problem set `run` uses.
const BUILTIN_PROBLEMS: usize = 30;

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    if args.batch_size == 0 {
        return Err(UsageError("--batch-size must be at least 1".into()).into());
    }
    if args.max_new_tokens == 0 {
        return Err(UsageError("--max-new-tokens must be at least 1".into()).into());
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) || args.temperature < 0.0 {
        return Err(
            UsageError("--top-p must be in (0, 1] and --temperature at least 0".into()).into(),
        );
    }
    // Validate the policy before loading anything.
    let spec = PolicySpec::from_args(&args.policy, args.budget, &args.policy_args)?;
    let mut trace_out = match &args.trace {
        Some(path) => Some(TraceWriter::create(path)?),
        None => None,
    };
    let model = args.model.load()?;
    let ctx = model.policy_context(&spec, args.max_new_tokens);
    let mut problems = builtin::problems(BUILTIN_PROBLEMS, args.problem_seed);
    if let Some(n) = args.limit {
        problems.truncate(n);
    }
    eprintln!(
        "kvbench run: {} on {} problems (built-in set, seed {}), template {:?}, weights {:?}\npolicy: {}",
        model.name,
        problems.len(),
        args.problem_seed,
        model.template,
        args.model.weights,
        spec.describe()
    );
    let total_tokens = (problems.len() * args.max_new_tokens) as u64;
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
    let mut truncated = 0usize;
    for (chunk_idx, chunk) in problems.chunks(args.batch_size).enumerate() {
        let mut requests = Vec::with_capacity(chunk.len());
        for (j, p) in chunk.iter().enumerate() {
            let text = model.template.render(&r1_prompt(&p.problem), None);
            let prompt = model.tokenizer.encode(&text)?;
            let i = chunk_idx * args.batch_size + j;
            requests.push(Request {
                prompt,
                sampling: SamplingParams {
                    temperature: args.temperature,
                    top_p: args.top_p,
                    seed: args.seed + i as u64,
                },
                max_new_tokens: args.max_new_tokens,
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
        let unused: u64 = gens
            .iter()
            .map(|g| (args.max_new_tokens - g.tokens.len()) as u64)
            .sum();
        bar.inc(unused);
        let batch_decode = gens
            .iter()
            .map(|g| g.decode_time.as_secs_f64())
            .fold(0.0, f64::max);
        decode_secs += batch_decode;
        for (p, g) in chunk.iter().zip(gens) {
            prefill_tokens += g.prompt_tokens;
            prefill_secs += g.prefill_time.as_secs_f64();
            decode_tokens += g.tokens.len().saturating_sub(1);
            kv.add(&g);
            if let (Some(w), Some(events)) = (&mut trace_out, &g.trace) {
                w.write(&p.id, events)?;
            }
            let text = model.tokenizer.decode(&g.tokens)?;
            let (answer, verdict) = grade_output(&text, &p.answer, model.template.opens_thinking());
            let correct = verdict.is_correct();
            truncated += usize::from(verdict == Verdict::Truncated);
            if args.show_output {
                bar.suspend(|| println!("--- {} ---\n{text}\n", p.id));
            }
            rows.push((
                p.id.clone(),
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
    println!();
    println!(
        "accuracy {}/{} = {:.1}% (grader {}), {} truncated (thinking never closed)",
        n_correct,
        rows.len(),
        100.0 * n_correct as f64 / rows.len().max(1) as f64,
        kvbench::eval::grade::GRADER_VERSION,
        truncated
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
