//! `kvbench perf`: the engine's speed on this machine, measured honestly: warm-up runs first, then
//! several repeats, reporting the median and the range, with the machine and thread count recorded.

use super::{ModelArgs, UsageError};
use clap::Args;
use kvbench::eval::builtin;
use kvbench::generate::{generate_batch, Request, SamplingParams};
use kvbench::metrics;
use kvbench::model::{Model, SeqInput};
use kvbench::policy::{Full, PolicySpec};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct PerfArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt length of the prefill measurement.
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Prompt length of each sequence in the decode measurement.
    #[arg(long, default_value_t = 64)]
    pub decode_prompt_tokens: usize,
    /// Tokens decoded per sequence in the decode measurement.
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: usize,
    /// Batch sizes of the decode measurement, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub batch: Vec<usize>,
    /// Measured repeats (after the warm-up).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Unmeasured warm-up runs.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Policies measured one after another in the decode measurement, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "full")]
    pub policy: Vec<String>,
    /// KV budget of the compressing policies (see `kvbench run --help`).
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    pub budget: f64,
    /// A policy parameter, `key=value` (repeatable; applies to every policy that has the key).
    #[arg(long = "policy-arg", value_name = "KEY=VALUE")]
    pub policy_args: Vec<String>,
}

/// A prompt of exactly `n` tokens made from built-in problem text.
fn prompt_of(model: &Model, n: usize) -> anyhow::Result<Vec<u32>> {
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

fn summary(xs: &[f64]) -> String {
    let med = metrics::median(xs).unwrap_or(f64::NAN);
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{med:>8.1} | {lo:>7.1} … {hi:<7.1}")
}

pub fn run(args: PerfArgs) -> anyhow::Result<ExitCode> {
    if args.repeats == 0
        || args.prompt_tokens == 0
        || args.decode_tokens == 0
        || args.batch.contains(&0)
    {
        return Err(UsageError(
            "--repeats, --prompt-tokens, --decode-tokens and --batch must be positive".into(),
        )
        .into());
    }
    let specs = args
        .policy
        .iter()
        .map(|p| {
            let budget = if p == "full" { 1.0 } else { args.budget };
            PolicySpec::from_args(p, budget, &args.policy_args)
        })
        .collect::<kvbench::Result<Vec<_>>>()?;
    let load_start = Instant::now();
    let model = args.model.load()?;
    let load_secs = load_start.elapsed().as_secs_f64();
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_default();
    println!(
        "model {} ({:?} weights, {:.0} MiB of weights, loaded in {:.1} s), {} threads, machine: {}",
        model.name,
        args.model.weights,
        model.transformer.weight_bytes() as f64 / (1 << 20) as f64,
        load_secs,
        threads,
        metrics::machine()
    );
    println!(
        "warm-up {} run(s), then median of {} repeats (min … max)\n",
        args.warmup, args.repeats
    );
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
        if i >= args.warmup {
            rates.push(prompt.len() as f64 / t.elapsed().as_secs_f64());
        }
    }
    println!(
        "| prefill, {}-token prompt | {} |",
        args.prompt_tokens,
        summary(&rates)
    );

    let decode_prompt = prompt_of(&model, args.decode_prompt_tokens)?;
    for spec in &specs {
        let ctx = model.policy_context(spec, args.decode_tokens);
        for &b in &args.batch {
            let mut rates = Vec::new();
            let (mut policy_share, mut ratio) = (Vec::new(), Vec::new());
            for i in 0..args.warmup + args.repeats {
                let requests = (0..b)
                    .map(|_| Request {
                        prompt: decode_prompt.clone(),
                        sampling: SamplingParams::greedy(),
                        max_new_tokens: args.decode_tokens,
                        policy: spec.build(&ctx),
                        trace: false,
                    })
                    .collect();
                // No end tokens: every sequence decodes exactly --decode-tokens tokens.
                let gens = generate_batch(&model.transformer, requests, &[], &mut |_, _| {})?;
                let secs = gens
                    .iter()
                    .map(|g| g.decode_time.as_secs_f64())
                    .fold(0.0, f64::max);
                // The first token comes from the prefill logits; decode steps produce the rest.
                let decoded: usize = gens.iter().map(|g| g.tokens.len() - 1).sum();
                if i >= args.warmup {
                    rates.push(decoded as f64 / secs);
                    let policy: f64 = gens.iter().map(|g| g.policy_time.as_secs_f64()).sum();
                    policy_share.push(100.0 * policy / (secs * b as f64));
                    ratio.push(gens[0].cache.achieved_ratio());
                }
            }
            println!(
            "| decode, {} budget {}, batch {b} ({}-token prompts, {} new tokens each), aggregate; policy {:.1}% of time, KV ratio {:.3} | {} |",
            spec.name(),
            spec.budget(),
            args.decode_prompt_tokens,
            args.decode_tokens,
            metrics::median(&policy_share).unwrap_or(0.0),
            metrics::median(&ratio).unwrap_or(1.0),
            summary(&rates)
        );
        }
    }
    println!(
        "\npeak RSS {}",
        metrics::peak_rss_bytes().map_or("n/a".into(), |b| format!(
            "{:.0} MiB",
            b as f64 / (1 << 20) as f64
        ))
    );
    Ok(ExitCode::SUCCESS)
}
