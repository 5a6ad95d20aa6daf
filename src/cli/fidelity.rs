//! `kvbench fidelity`: what a policy does to the model's next-token distribution, with no grader in
//! the way. For each problem the full-cache model generates, and the policy's copy is fed the same
//! tokens in lockstep (`kvbench::generate::fidelity`): mean KL from full, top-1 agreement, the rank of
//! full's token, and where a greedy run under the policy would first leave full's output.

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kvbench::flags::{ModelFlags, PolicyFlags, RuntimeFlags};
use kvbench::generate::fidelity::{teacher_forced, Fidelity, Pooled};
use kvbench::generate::SamplingParams;
use kvbench::sweep::config::SweepConfig;
use kvbench::sweep::execute::FIDELITY_BUCKET;
use kvbench::sweep::options::StudyOptions;
use kvbench::sweep::study::{load_model, plan};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct FidelityArgs {
    /// The compressing policy (one) and its budget.
    #[command(flatten)]
    pub policy: PolicyFlags,
    #[command(flatten)]
    pub model: ModelFlags,
    #[command(flatten)]
    pub options: StudyOptions,
    #[command(flatten)]
    pub runtime: RuntimeFlags,
    /// Print one JSON object (mean_kl, top1_agreement, mean_rank, first divergences, by-position
    /// curves, per problem) instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: FidelityArgs) -> anyhow::Result<ExitCode> {
    if args.policy.policy.is_empty() {
        return Err(super::UsageError(
            "--policy: name the compressing policy to compare with the full cache".into(),
        )
        .into());
    }
    // Options of a study that a teacher-forced comparison has no use for are refused, not ignored:
    // it runs one sequence at a time and prints its figures (`--json` for JSON).
    let o = &args.options;
    for (flag, given) in [
        ("--out", o.out.is_some()),
        ("--batch-size", o.batch_size.is_some()),
        ("--fidelity", o.fidelity.is_some()),
    ] {
        if given {
            return Err(super::UsageError(format!(
                "{flag}: not used by `fidelity`, which runs one sequence at a time and prints its figures (--json for JSON); `kvbench run --fidelity` keeps them in a results directory"
            ))
            .into());
        }
    }
    let spec = args.policy.single("full", "fidelity")?;
    let budget = spec.budget_as_written();
    if spec.needs_full_mean() {
        return Err(super::UsageError(format!(
            "--budget {budget}: {}'s budget is resolved from the full run's mean generation length, which `fidelity` does not run; use `kvbench run --policy {} --budget {budget} --fidelity` (it runs full first), or {}",
            spec.name(),
            spec.name(),
            spec.full_mean_remedy()
        ))
        .into());
    }
    let p = plan(SweepConfig::from_specs(
        format!("fidelity-{}-{}", spec.name(), budget),
        args.model.clone(),
        args.options.clone(),
        args.policy.budget_rule,
        std::slice::from_ref(&spec),
    )?)?;
    let model = load_model(&p, args.runtime.tokenizer.as_deref())?;
    kvbench::sweep::execute::check_context(&model, &p.plan)?;
    let ctx = model.policy_context(&spec, p.plan.decoding.max_new_tokens);
    let d = &p.plan.decoding;
    let bar = ProgressBar::new(p.plan.units.len() as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} sequences",
        )
        .expect("static template"),
    );
    let mut per_problem: Vec<(String, usize, Fidelity)> = Vec::new();
    for u in &p.plan.units {
        let problem = &p.plan.problems[u.problem];
        let prompt = model
            .tokenizer
            .encode(&d.prompt.render(model.template, &problem.problem))?;
        let f = teacher_forced(
            &model.transformer,
            &prompt,
            spec.build(&ctx)?,
            None,
            SamplingParams {
                temperature: d.temperature,
                top_p: d.top_p,
                seed: u.seed,
            },
            d.max_new_tokens,
            match o.ignore_eos {
                Some(true) => &[],
                _ => &model.tokenizer.eos_ids,
            },
            FIDELITY_BUCKET,
        )?;
        per_problem.push((problem.id.clone(), u.sample, f));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let all: Vec<&Fidelity> = per_problem.iter().map(|x| &x.2).collect();
    let pooled =
        Pooled::of(&all).ok_or_else(|| super::UsageError("no problems to measure".into()))?;
    if args.json {
        let rows: Vec<_> = per_problem
            .iter()
            .map(|(id, s, f)| serde_json::json!({ "problem": id, "sample": s, "fidelity": f }))
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "policy": spec.describe(),
                "model": model.name,
                "dataset": p.set.source,
                "sequences": pooled.sequences,
                "steps": pooled.steps,
                "mean_kl": pooled.mean_kl,
                "top1_agreement": pooled.top1_agreement,
                "mean_rank": pooled.mean_rank,
                "first_divergence_median": pooled.first_divergence_median,
                "never_diverged": pooled.never_diverged,
                "per_sequence": rows,
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("policy: {}", spec.describe());
    println!("| problem | steps | mean KL (nats) | top-1 agreement % | mean rank of full's token | first divergence |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (id, s, f) in &per_problem {
        println!(
            "| {id} #{s} | {} | {:.4} | {:.1} | {:.2} | {} |",
            f.steps,
            f.mean_kl,
            100.0 * f.top1_agreement,
            f.mean_rank,
            f.first_divergence
                .map_or("never".to_string(), |d| d.to_string())
        );
    }
    println!(
        "\nover {} sequences and {} steps: mean KL {:.4} nats, top-1 agreement {:.1}%, mean rank {:.2}; first divergence median {} ({} never diverged)",
        pooled.sequences,
        pooled.steps,
        pooled.mean_kl,
        100.0 * pooled.top1_agreement,
        pooled.mean_rank,
        pooled
            .first_divergence_median
            .map_or("-".into(), |d| format!("{d:.0}")),
        pooled.never_diverged,
    );
    Ok(ExitCode::SUCCESS)
}
