//! `kvbench sweep CONFIG.toml --dry-run`: parses the config, resolves the model files and the data, and
//! prints the plan (work units with their stable ids, tokens at most) without running anything.
//! Executing, resuming and sharding the plan are the next step of the sweep issue.

use super::{DataArgs, UsageError};
use clap::Args;
use kvbench::sweep::config::SweepConfig;
use kvbench::sweep::plan::{content_id, Decoding, Plan};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct SweepArgs {
    /// The sweep configuration (TOML).
    pub config: PathBuf,
    /// Print the plan without running it (required for now: execution is not in this version).
    #[arg(long, required = true)]
    pub dry_run: bool,
}

pub fn run(args: SweepArgs) -> anyhow::Result<ExitCode> {
    let cfg = SweepConfig::load(&args.config)?;
    let specs = cfg.policy_specs()?;
    let data = DataArgs {
        dataset: cfg.dataset.clone(),
        data: cfg.data.clone(),
        id_field: "id".into(),
        problem_field: "problem".into(),
        answer_field: "answer".into(),
        ids: cfg.ids.clone(),
        shuffle_seed: cfg.shuffle_seed,
        limit: cfg.limit,
        problem_seed: kvbench::eval::builtin::DEFAULT_SEED,
        prompt: cfg.prompt,
    };
    let set = data.load()?;
    let files = kvbench::model::resolve::resolve(&cfg.model)?;
    let model_id = match &files {
        kvbench::model::resolve::ModelFiles::Gguf(p) => kvbench::model::resolve::sha256_file(p)?,
        kvbench::model::resolve::ModelFiles::HfDir(p) => content_id(&serde_json::json!({
            "dir": p.display().to_string(),
        })),
    };
    let (t, p) = cfg.preset.sampling();
    let decoding = Decoding {
        temperature: cfg.temperature.unwrap_or(t),
        top_p: cfg.top_p.unwrap_or(p),
        max_new_tokens: cfg.max_new_tokens.unwrap_or(set.max_new_tokens),
        seed: cfg.seed,
        prompt: format!("{:?}", cfg.prompt),
    };
    if !(decoding.top_p > 0.0 && decoding.top_p <= 1.0) || decoding.temperature < 0.0 {
        return Err(UsageError(format!(
            "{}: top_p must be in (0, 1] and temperature at least 0",
            args.config.display()
        ))
        .into());
    }
    // The data's identity is its content, wherever the file lies.
    let dataset_id = content_id(&serde_json::to_value(&set.problems)?);
    let plan = Plan::new(
        specs,
        set.problems,
        cfg.samples,
        decoding,
        &model_id,
        &dataset_id,
    );
    let out = cfg
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(&cfg.name));
    println!(
        "sweep '{}': model {} ({}), data {}, {} problems × {} samples, output {}",
        cfg.name,
        cfg.model,
        files.path().display(),
        set.source,
        plan.problems.len(),
        plan.samples,
        out.display()
    );
    println!(
        "decoding: temperature {}, top-p {}, max {} new tokens, seed {}, prompt {}",
        plan.decoding.temperature,
        plan.decoding.top_p,
        plan.decoding.max_new_tokens,
        plan.decoding.seed,
        plan.decoding.prompt
    );
    println!("\n| policy | units | first unit id |");
    println!("|---|---:|---|");
    for (i, spec) in plan.specs.iter().enumerate() {
        let units: Vec<_> = plan.units.iter().filter(|u| u.policy == i).collect();
        println!(
            "| {} | {} | {} |",
            spec.describe(),
            units.len(),
            units.first().map_or("-", |u| u.id.as_str())
        );
    }
    println!(
        "\n{} work units, at most {} generated tokens (dry run: nothing was run)",
        plan.units.len(),
        plan.max_tokens()
    );
    Ok(ExitCode::SUCCESS)
}
