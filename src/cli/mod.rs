//! The command line: argument definitions (their doc comments are the `--help`) and dispatch.

mod fidelity;
mod forward;
mod grade;
mod models;
mod perf;
mod regrade;
mod report;
mod run;
mod scaling;
mod sweep;

use clap::{Parser, Subcommand};
use kvbench::flags::{ModelFlags, RuntimeFlags};
use kvbench::model::Model;
use std::process::ExitCode;

/// A usage error found after parsing (a flag value out of range): exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

pub use kvbench::parse_positive;

/// A number of generated tokens whose decoding is timed: from 2, since the first new token comes from
/// the prefill's logits (with one, no decoding step is timed: a rate of 0 tokens over 0 s).
pub fn parse_generated_length(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 2 => Ok(n),
        _ => Err("expected a whole number from 2 (the first new token comes from the prefill's logits; decoding steps make the rest)".into()),
    }
}

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
    Perf(Box<perf::PerfArgs>),
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
    /// One token sequence through the engine: teacher-forced logits and greedy tokens, as JSON (for
    /// checking a device or another engine against kvbench).
    Forward(Box<forward::ForwardArgs>),
    /// List the built-in and random-weight models; export a random one as a Hugging Face checkpoint.
    Models(models::ModelsArgs),
}

/// A usage error when an output file given with `flag` cannot be written: its directory does not
/// exist, or the path holds something kvbench must not replace (a directory, a link, a device, a
/// file that is not `kind`'s output). Checked before any work, so that nothing is computed only to
/// be lost and nothing the user keeps is overwritten.
pub fn check_output_file(
    flag: &str,
    path: &std::path::Path,
    kind: kvbench::results::replace::Output,
) -> Result<(), UsageError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(d) = dir.filter(|d| !d.is_dir()) {
        let why = match d.exists() {
            true => format!("{} is not a directory", d.display()),
            false => "the directory does not exist".to_string(),
        };
        return Err(UsageError(format!("{flag} {}: {why}", path.display())));
    }
    kvbench::results::replace::check_replaceable(path, kind)
        .map_err(|why| UsageError(format!("{flag} {}: {why}", path.display())))
}

/// A usage error when the directory `flag` names cannot be made: a file in its place or in place of
/// a parent, or a parent this process may not write (checked before any work, writing nothing).
pub fn check_dir_flag(flag: &str, path: &std::path::Path) -> Result<(), UsageError> {
    kvbench::results::dir::check_creatable(path)
        .map_err(|why| UsageError(format!("{flag} {}: {why}", path.display())))
}

/// Loads the model `flags` name for a benchmark (`perf`, `scaling`, `forward`), on its device.
pub fn load_model(flags: &ModelFlags, runtime: &RuntimeFlags) -> anyhow::Result<Model> {
    let opts = flags.load_options(runtime.tokenizer.clone())?;
    Ok(Model::load(flags.model(), &opts)?)
}

pub fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            kvbench::init_threads(args.runtime.threads)?;
            run::run(*args)
        }
        Command::Perf(args) => {
            kvbench::init_threads(args.runtime.threads)?;
            perf::run(*args)
        }
        Command::Scaling(args) => {
            kvbench::init_threads(args.runtime.threads)?;
            scaling::run(*args)
        }
        Command::Grade(args) => grade::run(args),
        Command::Regrade(args) => regrade::run(args),
        Command::Sweep(args) => {
            kvbench::init_threads(args.runtime.threads)?;
            sweep::run(*args)
        }
        Command::Report(args) => report::run(args),
        Command::Fidelity(args) => {
            kvbench::init_threads(args.runtime.threads)?;
            fidelity::run(*args)
        }
        Command::Forward(args) => {
            kvbench::init_threads(args.runtime.threads)?;
            forward::run(*args)
        }
        Command::Models(args) => models::run(args),
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

#[cfg(test)]
mod tests {
    /// No command declares a flag twice (a command's own flag and a shared struct's, say): clap
    /// refuses that only when parsing in a debug build, and tests run in release.
    #[test]
    fn no_command_declares_a_flag_twice() {
        use clap::CommandFactory;
        let cli = super::Cli::command();
        let mut checked = 0;
        for sub in cli.get_subcommands() {
            let mut seen = std::collections::HashSet::new();
            for a in sub.get_arguments() {
                if let Some(long) = a.get_long() {
                    assert!(
                        seen.insert(long),
                        "kvbench {} declares --{long} twice",
                        sub.get_name()
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 50, "only {checked} flags found");
    }
}
