//! `kvbench run`: one policy at one budget on a problem set, with answers, grades and speed.

use super::{ModelArgs, UsageError};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kvbench::eval::{builtin, exact, r1_prompt};
use kvbench::generate::{generate_batch, FinishReason, Request, SamplingParams};
use kvbench::metrics;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Compression policy.
    #[arg(long, default_value = "full")]
    pub policy: String,
    /// KV budget: at most 1 is a fraction of the tokens seen so far, above 1 an absolute number of
    /// entries per layer and KV head.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub budget: f64,
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
    kvbench::policy::build(&args.policy, args.budget)?;
    let model = args.model.load()?;
    let mut problems = builtin::problems(BUILTIN_PROBLEMS, args.problem_seed);
    if let Some(n) = args.limit {
        problems.truncate(n);
    }
    eprintln!(
        "kvbench run: {} on {} problems (built-in set, seed {}), policy {} budget {}, template {:?}, weights {:?}",
        model.name,
        problems.len(),
        args.problem_seed,
        args.policy,
        args.budget,
        model.template,
        args.model.weights
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
    let mut peak_kv = 0usize;
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
                policy: kvbench::policy::build(&args.policy, args.budget)?,
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
            peak_kv = peak_kv.max(g.kv_bytes_peak);
            let text = model.tokenizer.decode(&g.tokens)?;
            let answer = exact::extract_answer(&text);
            let correct = answer
                .as_deref()
                .is_some_and(|a| exact::is_correct(a, &p.answer));
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
        "accuracy {}/{} = {:.1}% (exact match)",
        n_correct,
        rows.len(),
        100.0 * n_correct as f64 / rows.len().max(1) as f64
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
        "peak KV cache {:.2} MiB per sequence, peak RSS {}, machine: {}",
        peak_kv as f64 / (1 << 20) as f64,
        metrics::peak_rss_bytes().map_or("n/a".into(), |b| format!(
            "{:.0} MiB",
            b as f64 / (1 << 20) as f64
        )),
        metrics::machine()
    );
    Ok(ExitCode::SUCCESS)
}
