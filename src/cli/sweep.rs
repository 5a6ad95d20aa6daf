//! `kvbench sweep CONFIG.toml`: plans every (policy, budget, problem, sample) of a config and runs
//! the units no process has finished, into a results directory (see `kvbench::results::dir`).
//! `--dry-run` prints the plan only; `--shard i/n` runs one shard; `--emit slurm` prints a job-array
//! script that runs every shard on a cluster.

use clap::{Args, ValueEnum};
use kvbench::flags::{ModelFlags, PolicyFlags, RuntimeFlags};
use kvbench::report::{summarize, table};
use kvbench::sweep::config::{Overrides, SweepConfig};
use kvbench::sweep::options::StudyOptions;
use kvbench::sweep::shard::Shard;
use kvbench::sweep::study::{check_out, execute_plan, plan, ExecFlags};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct SweepArgs {
    /// The sweep configuration (TOML): `name`, the options below as keys, `budgets`, and
    /// `[[policy]]` tables (`name`, `budgets`, `args`).
    pub config: PathBuf,
    /// The model's keys, overridden by these flags.
    #[command(flatten)]
    pub model: ModelFlags,
    /// Options overriding the config's keys of the same names.
    #[command(flatten)]
    pub options: StudyOptions,
    /// Policies, budgets and parameters: any of them replaces the config's grid (`--budget-rule` alone
    /// its rule).
    #[command(flatten)]
    pub policy: PolicyFlags,
    #[command(flatten)]
    pub runtime: RuntimeFlags,
    /// Print the plan (units, their ids, tokens at most) without running anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Run only shard i of n (1-based): the units whose id hashes to it, into the same directory.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<Shard>,
    /// Run only the full-cache units (`full`) or only the others (`policies`): ratio budgets are
    /// resolved from the full run, so on a cluster the full phase runs first.
    #[arg(long, value_enum, ignore_case = true, default_value = "all")]
    pub phase: kvbench::sweep::study::Phase,
    /// Print a script that runs the sweep on a cluster instead of running it.
    #[arg(long, value_enum, ignore_case = true)]
    pub emit: Option<Emit>,
    /// Shards of the emitted script (one array task each).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub shards: u32,
    /// Array tasks of the emitted script running at once (Slurm's `%K`).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,
    /// Lenient answer extraction (never the default).
    #[arg(long)]
    pub lenient: bool,
}

/// Scripts `--emit` writes.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Emit {
    Slurm,
}

pub fn run(args: SweepArgs) -> anyhow::Result<ExitCode> {
    let cfg = SweepConfig::load_with(
        &args.config,
        &Overrides {
            model: args.model.clone(),
            options: args.options.clone(),
            policy: args.policy.clone(),
        },
    )?;
    for w in cfg.warnings() {
        kvbench::say!("warning: {}: {w}", args.config.display());
    }
    // A results directory that cannot be made and a device that cannot be used are refused before
    // anything is fetched (the plan resolves the model: a first run downloads it), printed or
    // written. A dry run needs neither; an emitted script runs this binary on the cluster's GPUs, so
    // the build must drive one, but no GPU is needed here.
    let device = cfg.model.device();
    let setting = match args.model.device {
        Some(_) => device.as_flag(),
        None => device.as_config_key(&args.config),
    };
    let out = cfg
        .options
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(&cfg.name));
    if !args.dry_run {
        check_out(&out)?;
    }
    match (args.dry_run, args.emit) {
        (true, _) => {}
        (false, Some(Emit::Slurm)) => device.check_built(&format!(
            "{setting}: the emitted script runs this kvbench ({})",
            std::env::current_exe()
                .unwrap_or_else(|_| PathBuf::from("kvbench"))
                .display()
        ))?,
        (false, None) => {
            device.open(&setting)?;
        }
    }
    let p = plan(cfg)?;
    if args.dry_run {
        println!("{}", p.describe(&out));
        println!("dry run: nothing was run");
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(Emit::Slurm) = args.emit {
        // The directory keeps the resolved config that every array task runs.
        let dir = kvbench::sweep::study::open_out(&out, None)?;
        dir.bind(&p.manifest(), &p.config_toml())?;
        let abs = |x: &std::path::Path| std::path::absolute(x).unwrap_or_else(|_| x.to_path_buf());
        let out_abs = abs(&out);
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("kvbench"));
        let script = kvbench::sweep::slurm::script(&kvbench::sweep::slurm::SlurmJob {
            name: &p.cfg.name,
            kvbench: &exe,
            config: &out_abs.join("config.toml"),
            out: &out_abs,
            shards: args.shards,
            concurrency: args.concurrency,
            full_first: p.plan.needs_full_mean(),
            gpu: !p.cfg.model.device().is_cpu(),
        })
        .map_err(super::UsageError)?;
        print!("{script}");
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}", p.describe(&out));
    let done = execute_plan(
        &p,
        &ExecFlags {
            out: out.clone(),
            shard: args.shard,
            phase: args.phase,
            lenient: args.lenient,
            tokenizer: args.runtime.tokenizer.as_deref(),
            trace_file: None,
            show_output: false,
        },
    )?;
    let summary = summarize(&done.records);
    println!();
    print!("{}", table::markdown(&summary));
    println!(
        "\n{} units run in {:.1} s ({} finished earlier); results in {}; `kvbench report {}` writes CSV, JSON and plots",
        done.ran,
        done.wall_secs,
        done.already,
        out.display(),
        out.display()
    );
    if done.failures.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        kvbench::say!(
            "{} units failed (listed above); rerun the same command to retry them",
            done.failures.len()
        );
        Ok(ExitCode::from(1))
    }
}
