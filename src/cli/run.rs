//! `kvbench run`: one policy at one budget on a problem set, with answers, grades, speed and KV
//! memory next to the full-cache baseline. It is a one-policy sweep built from flags, written to the
//! same results layout (so rerunning the same command resumes).

use clap::Args;
use kvbench::error::cell;
use kvbench::eval::accuracy::{accuracy, mean_pass_at_k};
use kvbench::eval::grade::Verdict;
use kvbench::flags::{ModelFlags, PolicyFlags, RuntimeFlags};
use kvbench::generate::FinishReason;
use kvbench::metrics;
use kvbench::policy::PolicySpec;
use kvbench::report::{summarize, table};
use kvbench::results::sample::{SampleMetrics, SampleRecord};
use kvbench::sweep::config::{PolicyEntry, SweepConfig};
use kvbench::sweep::options::StudyOptions;
use kvbench::sweep::study::{check_out, execute_plan, plan, ExecFlags};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The policy (one; default `full`) and its budget.
    #[command(flatten)]
    pub policy: PolicyFlags,
    #[command(flatten)]
    pub model: ModelFlags,
    /// Do not run the full-cache baseline next to the policy.
    #[arg(long)]
    pub no_baseline: bool,
    /// Write every compression event of the policy (step, layer, head, original positions kept) as
    /// JSON Lines.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub options: StudyOptions,
    #[command(flatten)]
    pub runtime: RuntimeFlags,
    /// Lenient extraction (never the default): search unclosed thinking blocks, fall back to the
    /// last number.
    #[arg(long)]
    pub lenient: bool,
    /// Print each full output.
    #[arg(long)]
    pub show_output: bool,
}

/// The one-policy sweep `run` stands for: the policy at the budget, and `full` unless told not to.
/// The policy is parsed here, once (and so checked before anything is loaded).
fn config(args: &RunArgs) -> anyhow::Result<SweepConfig> {
    let spec = args.policy.single("full", "run")?;
    if args.no_baseline && spec.needs_full_mean() {
        return Err(super::UsageError(format!(
            "--budget {} is resolved from the full run's mean generation length (a budget at most 1 is a ratio of it; Kara's ρ is always B over it), and --no-baseline drops the full run: drop --no-baseline, or {}",
            spec.budget_as_written(),
            spec.full_mean_remedy()
        ))
        .into());
    }
    let mut policies = vec![PolicyEntry::of(&spec, true)];
    if !args.no_baseline && spec.name() != "full" {
        let full = PolicySpec::new("full", 1.0, Default::default())?;
        policies.push(PolicyEntry::of(&full, false));
    }
    Ok(SweepConfig::from_tables(
        format!("run-{}-{}", spec.name(), spec.budget_as_written()),
        args.model.clone(),
        args.options.clone(),
        args.policy.budget_rule,
        policies,
    )?)
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.trace {
        super::check_output_file("--trace", path, kvbench::results::replace::Output::Trace)?;
    }
    let cfg = config(&args)?;
    // A results directory that cannot be made and a device that cannot be used are refused before
    // anything is fetched, printed or written (the plan resolves the model: a first run downloads
    // it). The default directory's name needs the plan; its parent is checked here.
    check_out(cfg.options.out.as_deref().unwrap_or(Path::new("results")))?;
    let device = cfg.model.device();
    device.open(&device.as_flag())?;
    let p = plan(cfg)?;
    // Default directory: named after the policy and the config hash, so that rerunning the same
    // command resumes (and reuses finished samples) and another command gets another directory.
    let out = p.cfg.options.out.clone().unwrap_or_else(|| {
        PathBuf::from("results").join(format!("{}-{}", p.cfg.name, &p.hash[..8]))
    });
    // The policy's index (the plan puts `full` first).
    let mine_index = p
        .plan
        .specs
        .iter()
        .position(|s| s.name() != "full" || p.plan.specs.len() == 1)
        .unwrap_or(0);
    let spec = p.plan.specs[mine_index].clone();
    kvbench::say!(
        "kvbench run: {} on {} problems × {} samples ({}), prompt {}\npolicy: {}{}\ndecoding: temperature {}, top-p {}, max {} new tokens, seed {}, weights {}, KV cache {}, activations {}",
        p.cfg.model.model(),
        p.plan.problems.len(),
        p.plan.samples,
        cell(&p.set.source),
        kvbench::flags::spelled(&p.plan.decoding.prompt),
        cell(&spec.describe()),
        if p.plan.specs.len() > 1 { " (and the full-cache baseline)" } else { "" },
        p.plan.decoding.temperature,
        p.plan.decoding.top_p,
        p.plan.decoding.max_new_tokens,
        p.plan.decoding.seed,
        kvbench::flags::spelled(&p.plan.decoding.weights),
        p.cfg.model.kv_type(),
        p.cfg.model.activations(),
    );
    let done = execute_plan(
        &p,
        &ExecFlags {
            out: out.clone(),
            shard: None,
            phase: kvbench::sweep::study::Phase::All,
            lenient: args.lenient,
            tokenizer: args.runtime.tokenizer.as_deref(),
            trace_file: args.trace.clone().map(|t| (t, mine_index)),
            show_output: args.show_output,
        },
    )?;
    // This run's units, in plan order, from the directory (earlier runs' included).
    let by_unit: HashMap<&str, &SampleRecord> =
        done.records.iter().map(|r| (r.unit.as_str(), r)).collect();
    let mine: Vec<&SampleRecord> = p
        .plan
        .units_of(mine_index)
        .filter_map(|u| by_unit.get(u.id.as_str()).copied())
        .collect();
    if mine.is_empty() {
        // Means over no samples would print as zeros (and -0.0): say there is nothing instead.
        println!("\nno sample of this policy finished: no accuracy, speed or memory to report");
    } else {
        print_samples(&mine);
        print_accuracy(&mine, p.plan.samples);
        print_speed(&mine, done.wall_secs);
        print_kv(&mine, &spec);
        print_fidelity(&mine);
    }
    let ours: Vec<SampleRecord> = p
        .plan
        .units
        .iter()
        .filter_map(|u| by_unit.get(u.id.as_str()).map(|r| (*r).clone()))
        .collect();
    if p.plan.specs.len() > 1 && !ours.is_empty() {
        println!("\nagainst the full-cache baseline:\n");
        print!("{}", table::markdown(&summarize(&ours)));
    }
    let shown = cell(&out.display().to_string());
    println!(
        "\nresults: {shown} ({} units run now, {} reused); `kvbench report {shown}` writes CSV, JSON and plots",
        done.ran, done.already,
    );
    if done.failures.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        kvbench::say!("{} units failed (listed above)", done.failures.len());
        Ok(ExitCode::from(1))
    }
}

fn print_samples(records: &[&SampleRecord]) {
    println!("| problem | answer | gold | correct | tokens | finish |");
    println!("|---|---|---|---|---|---|");
    for r in records {
        let finish = match r.finish {
            FinishReason::Eos => "eos",
            FinishReason::Length => "length",
        };
        let answer = r
            .extracted
            .as_deref()
            .unwrap_or("(none)")
            .replace('|', "\\|");
        println!(
            "| {} #{} | {} | {} | {} | {} | {finish} |",
            cell(&r.problem_id),
            r.sample,
            cell(&answer),
            cell(&r.gold.replace('|', "\\|")),
            if r.correct { "yes" } else { "no" },
            r.tokens
        );
    }
}

fn print_accuracy(records: &[&SampleRecord], samples: usize) {
    let per_problem = kvbench::report::per_problem(records);
    let acc = accuracy(&per_problem);
    let count = |v: Verdict| records.iter().filter(|r| r.verdict == v).count();
    let at_limit = records
        .iter()
        .filter(|r| r.finish == FinishReason::Length)
        .count();
    println!();
    if records.iter().any(|r| r.random_weights) {
        println!(
            "accuracy: none: the weights are random (speed and memory only); {at_limit} of {} samples stopped at the length limit",
            records.len()
        );
        return;
    }
    println!(
        "accuracy: pass@1 {:.1}% ± {:.1} (standard error over {} problems; {}/{} samples correct){}; grader {}; {at_limit} stopped at the length limit, {} with thinking never closed, {} without an answer",
        100.0 * acc.pass_at_1,
        100.0 * acc.stderr,
        acc.problems,
        records.iter().filter(|r| r.correct).count(),
        records.len(),
        if samples > 1 {
            format!(
                ", pass@{samples} {:.1}%, cons@{samples} {:.1}%",
                100.0 * mean_pass_at_k(&per_problem, samples),
                100.0 * acc.cons,
            )
        } else {
            String::new()
        },
        kvbench::eval::grade::GRADER_VERSION,
        count(Verdict::Truncated),
        count(Verdict::NoAnswer)
    );
}

fn print_speed(records: &[&SampleRecord], wall: f64) {
    let m: Vec<&SampleMetrics> = records.iter().filter_map(|r| r.metrics.as_ref()).collect();
    let sum = |f: &dyn Fn(&SampleMetrics) -> f64| m.iter().map(|x| f(x)).sum::<f64>();
    let decode_tokens: usize = records.iter().map(|r| r.tokens.saturating_sub(1)).sum();
    let ttft: Vec<f64> = m.iter().map(|x| x.prefill_secs).collect();
    println!(
        "prefill {:.1} tokens/s, time to first token {:.3} s (median), decode {:.1} tokens/s (batches of up to {}), {} generated tokens; this process ran {:.1} s",
        sum(&|x| x.prompt_tokens as f64) / sum(&|x| x.prefill_cost_secs()).max(1e-9),
        metrics::median(&ttft).unwrap_or(0.0),
        decode_tokens as f64 / sum(&|x| x.decode_share_secs).max(1e-9),
        m.iter().map(|x| x.batch).max().unwrap_or(0),
        records.iter().map(|r| r.tokens).sum::<usize>(),
        wall
    );
    let p50: Vec<f64> = m.iter().map(|x| x.tpot_p50_secs).collect();
    let p90: Vec<f64> = m.iter().map(|x| x.tpot_p90_secs).collect();
    println!(
        "time per output token: {:.1} ms median, {:.1} ms 90th percentile (medians over samples of each sample's decode steps)",
        1e3 * metrics::median(&p50).unwrap_or(0.0),
        1e3 * metrics::median(&p90).unwrap_or(0.0),
    );
    println!(
        "peak RSS {}, machine: {}",
        metrics::peak_rss_bytes().map_or("n/a".into(), |b| format!(
            "{:.0} MiB",
            b as f64 / (1 << 20) as f64
        )),
        metrics::machine()
    );
}

/// Retained entries and KV bytes of the policy's samples.
fn print_kv(records: &[&SampleRecord], spec: &PolicySpec) {
    let m: Vec<&SampleMetrics> = records.iter().filter_map(|r| r.metrics.as_ref()).collect();
    let n = m.len().max(1) as f64;
    let mean = |f: &dyn Fn(&SampleMetrics) -> f64| m.iter().map(|x| f(x)).sum::<f64>() / n;
    if spec.name() == "full" {
        println!("budget rule: none (full cache)");
    } else {
        println!("budget rule: {}", spec.budget().rule());
        let resolved = records
            .iter()
            .find_map(|r| r.budget_entries.zip(r.full_mean_tokens));
        if let Some((b, full_mean)) = resolved {
            println!("resolved: B = {b} entries per layer and KV head (the full run's mean generation length: {full_mean:.1} tokens)");
        } else if let (kvbench::policy::Budget::Held(_), Some(b)) =
            (spec.budget(), records.iter().find_map(|r| r.budget_entries))
        {
            println!("the policy's own budget for that: B = {b} entries per layer and KV head after a compression");
        }
    }
    println!(
        "retained entries per layer and head: time-averaged {:.1} vs {:.1} for a full cache; peak {} (largest layer), {:.1} compression events per sequence",
        mean(&|x| x.entries_mean),
        mean(&|x| x.entries_full_mean),
        m.iter().map(|x| x.entries_peak).max().unwrap_or(0),
        mean(&|x| x.events as f64),
    );
    let mib = |b: f64| b / (1 << 20) as f64;
    let kv_mean = mean(&|x| x.kv_bytes_mean);
    let kv_full_mean = mean(&|x| x.kv_bytes_full_mean);
    println!(
        "KV per sequence: peak {:.2} MiB (the most held at any moment; {:.2} MiB allocated) vs {:.2} MiB full, time-averaged {:.2} MiB vs {:.2} MiB (KV ratio {:.3}, in bytes); policy side state peak {:.1} KiB",
        mib(mean(&|x| x.kv_bytes_peak as f64)),
        mib(mean(&|x| x.kv_bytes_capacity_peak.unwrap_or(0) as f64)),
        mib(mean(&|x| x.kv_bytes_full_peak as f64)),
        mib(kv_mean),
        mib(kv_full_mean),
        kv_mean / kv_full_mean.max(1e-9),
        mean(&|x| x.policy_state_bytes_peak as f64) / 1024.0,
    );
    let sum = |f: &dyn Fn(&SampleMetrics) -> f64| m.iter().map(|x| f(x)).sum::<f64>();
    let pre = sum(&|x| x.policy_prefill_secs.unwrap_or(0.0));
    let dec = sum(&|x| x.policy_secs) - pre;
    println!(
        "policy time: {:.2} s at prefill ({:.1}% of prefill time), {:.2} s while decoding ({:.1}% of decode time)",
        pre,
        100.0 * pre / sum(&|x| x.prefill_cost_secs()).max(1e-9),
        dec,
        100.0 * dec / sum(&|x| x.decode_secs).max(1e-9)
    );
}

/// Teacher-forced fidelity of the policy's samples, when measured (`--fidelity`).
fn print_fidelity(records: &[&SampleRecord]) {
    let f: Vec<&kvbench::generate::fidelity::Fidelity> =
        records.iter().filter_map(|r| r.fidelity.as_ref()).collect();
    if f.is_empty() {
        return;
    }
    let Some(p) = kvbench::generate::fidelity::Pooled::of(&f) else {
        return;
    };
    println!(
        "fidelity against full (teacher-forced, {} steps): mean KL {:.4} nats, top-1 agreement {:.1}%, mean rank of full's token {:.2}, first divergence median {:.0} ({} never diverged)",
        p.steps,
        p.mean_kl,
        100.0 * p.top1_agreement,
        p.mean_rank,
        p.first_divergence_median.unwrap_or(0.0),
        p.never_diverged
    );
}
