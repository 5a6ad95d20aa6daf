//! `kvbench forward`: one sequence through the engine, for checking it against another device or
//! engine (`scripts/gpu_check.sh` compares the CPU with a GPU, and kvbench with Hugging Face
//! transformers): the teacher-forced logits of a prompt, and the greedy tokens that follow it under a
//! policy. The prompt is token ids (drawn from a seed, or read from a file), so no tokenizer decides
//! what is compared.

use super::UsageError;
use clap::Args;
use kvbench::flags::{ModelFlags, PolicyFlags, RuntimeFlags};
use kvbench::generate::{generate_batch, Request, SamplingParams};
use kvbench::model::{SeqInput, Transformer};
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct ForwardArgs {
    #[command(flatten)]
    pub model: ModelFlags,
    #[command(flatten)]
    pub runtime: RuntimeFlags,
    /// The policy the greedy tokens are generated under (one; default `full`); a ratio budget is
    /// resolved against --generate.
    #[command(flatten)]
    pub policy: PolicyFlags,
    /// Prompt length: this many token ids drawn uniformly from the model's vocabulary with
    /// --token-seed (ignored with --token-file).
    #[arg(long, default_value_t = 256, value_parser = super::parse_positive)]
    pub tokens: usize,
    /// Seed of the drawn prompt.
    #[arg(long, default_value_t = 0)]
    pub token_seed: u64,
    /// The prompt's token ids from a JSON file (an array of integers).
    #[arg(long, value_name = "FILE", value_parser = kvbench::parse_file)]
    pub token_file: Option<PathBuf>,
    /// Greedy tokens to generate after the prompt under --policy; end-of-sequence tokens do not stop
    /// it (0: the logits only).
    #[arg(long, default_value_t = 0)]
    pub generate: usize,
    /// Sequences generated together, as one batch (greedy): sequence i's prompt is the prompt's first
    /// (length − 3·i) ids, so their caches differ in length. `generated` is sequence 0's tokens,
    /// `generated_batch` every sequence's.
    #[arg(long, default_value_t = 1, value_parser = super::parse_positive)]
    pub batch: usize,
    /// Write the prompt's teacher-forced logits, `[tokens, vocab]` f32, as tensor `logits` of a
    /// safetensors file.
    #[arg(long, value_name = "FILE")]
    pub logits: Option<PathBuf>,
    /// Write the JSON result here instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// The prompt: from the file, or drawn from the seed.
fn prompt(args: &ForwardArgs, vocab: usize) -> anyhow::Result<Vec<u32>> {
    if let Some(path) = &args.token_file {
        let text = kvbench::files::read_text(path, kvbench::files::CONFIG_LIMIT)
            .map_err(|e| e.naming(path, format!("--token-file {}", path.display())))?;
        let ids: Vec<u64> = serde_json::from_str(&text).map_err(|e| {
            UsageError(format!(
                "--token-file {}: expected a JSON array of token ids: {e}",
                path.display()
            ))
        })?;
        if ids.is_empty() {
            return Err(
                UsageError(format!("--token-file {}: no token ids", path.display())).into(),
            );
        }
        return ids
            .iter()
            .map(|&i| match u32::try_from(i) {
                Ok(id) if (id as usize) < vocab => Ok(id),
                _ => Err(UsageError(format!(
                    "--token-file {}: token id {i} is outside the vocabulary of {vocab}",
                    path.display()
                ))
                .into()),
            })
            .collect();
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.token_seed);
    Ok((0..args.tokens)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect())
}

/// The prompts of a `--batch` of `n`: the prompt's first `len − 3·i` ids for sequence `i`.
fn batch_prompts(ids: &[u32], n: usize) -> anyhow::Result<Vec<Vec<u32>>> {
    const STEP: usize = 3;
    if n == 0 || STEP * (n - 1) >= ids.len() {
        return Err(UsageError(format!(
            "--batch {n}: must be at least 1, and with a prompt of {} tokens at most {} (sequence i's prompt drops 3·i tokens)",
            ids.len(),
            (ids.len() - 1) / STEP + 1
        ))
        .into());
    }
    Ok((0..n)
        .map(|i| ids[..ids.len() - STEP * i].to_vec())
        .collect())
}

/// Teacher-forced logits of `prompt` (full cache), `[tokens, vocab]`, and the seconds they took.
fn logits(t: &Transformer, prompt: &[u32]) -> anyhow::Result<(candle_core::Tensor, f64)> {
    let mut state = t.new_state(Box::new(kvbench::policy::Full))?;
    let started = Instant::now();
    let logits = t.forward_all_logits(&mut [SeqInput {
        tokens: prompt,
        state: &mut state,
    }])?;
    kvbench::device::synchronize(t.device())?;
    Ok((logits, started.elapsed().as_secs_f64()))
}

pub fn run(args: ForwardArgs) -> anyhow::Result<ExitCode> {
    use kvbench::results::replace::Output;
    for (flag, path, kind) in [
        ("--logits", &args.logits, Output::Logits),
        ("--json", &args.json, Output::ForwardJson),
    ] {
        if let Some(p) = path {
            super::check_output_file(flag, p, kind)?;
        }
    }
    let spec = args.policy.single("full", "forward")?;
    let model = super::load_model(&args.model, &args.runtime)?;
    let activations = model.transformer.activation_dtype();
    let t = &model.transformer;
    // The prompt's length against the context (with the new tokens) and the kernels' bound on its
    // logits: a drawn prompt's before it is drawn, a file's (bounded by the file's size) once read.
    let fits = |n: usize, flag: &str| -> anyhow::Result<()> {
        model.check_fits(n, args.generate, &format!("{flag} and --generate"))?;
        model.check_all_logits_fit(n, flag)?;
        Ok(())
    };
    let ids = match &args.token_file {
        None => {
            fits(args.tokens, "--tokens")?;
            prompt(&args, t.config.vocab_size)?
        }
        Some(path) => {
            let ids = prompt(&args, t.config.vocab_size)?;
            fits(ids.len(), &format!("--token-file {}", path.display()))?;
            ids
        }
    };
    // Checked before anything is computed or written.
    if args.batch != 1 && args.generate == 0 {
        return Err(UsageError(format!("--batch {}: needs --generate", args.batch)).into());
    }
    let prompts = batch_prompts(&ids, args.batch)?;
    let spec = spec.resolve(args.generate.max(1) as f64, ids.len() as f64)?;
    let device = kvbench::device::describe(args.model.device(), t.device());
    let (logits, logits_secs) = logits(t, &ids)?;
    let argmax: Vec<u32> = logits
        .to_vec2::<f32>()?
        .iter()
        .map(|row| kvbench::model::llama::argmax(row))
        .collect();
    if let Some(path) = &args.logits {
        let tensors = std::collections::HashMap::from([("logits".to_string(), logits.clone())]);
        kvbench::results::write_through_temp(path, "", |tmp| {
            candle_core::safetensors::save(&tensors, tmp)
                .map_err(|e| kvbench::Error::Input(format!("--logits {}: {e}", path.display())))
        })?;
    }
    drop(logits);
    let mut generated = Vec::new();
    let mut decode_secs = 0.0;
    let mut generated_batch = Vec::new();
    if args.generate > 0 {
        let ctx = model.policy_context(&spec, args.generate);
        let requests = prompts
            .into_iter()
            .map(|prompt| {
                Ok(Request {
                    prompt,
                    sampling: SamplingParams::greedy(),
                    max_new_tokens: args.generate,
                    policy: spec.build(&ctx)?,
                    trace: false,
                    kv_type: None,
                })
            })
            .collect::<kvbench::Result<Vec<_>>>()?;
        let gens = generate_batch(t, requests, &[], &mut |_, _| {})?;
        decode_secs = gens[0].decode_time.as_secs_f64();
        generated_batch = gens.into_iter().map(|g| g.tokens).collect();
        generated = generated_batch[0].clone();
    }
    let doc = serde_json::json!({
        "model": model.name,
        "random_weights": model.files.is_random(),
        "weights": args.model.weights(),
        "activations": format!("{activations:?}").to_lowercase(),
        "device": device,
        "machine": kvbench::metrics::machine(),
        "kvbench": env!("CARGO_PKG_VERSION"),
        "commit": env!("KVBENCH_GIT_COMMIT"),
        "policy": spec.describe_resolved(),
        "prompt": ids,
        "argmax": argmax,
        "logits_file": args.logits,
        "logits_secs": logits_secs,
        "generated": generated,
        "generated_batch": generated_batch,
        "decode_secs": decode_secs,
    });
    let text = serde_json::to_string(&doc)?;
    match &args.json {
        Some(path) => {
            let mut f = kvbench::results::AtomicFile::create(path)?;
            std::io::Write::write_all(&mut f, text.as_bytes())
                .map_err(|e| kvbench::Error::io(path, e))?;
            f.commit()?;
        }
        None => println!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}
