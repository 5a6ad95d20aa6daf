//! `kvbench scaling`: the memory-scaling benchmark. One sequence per policy decodes to the longest
//! length (no end token), and at each checkpoint the KV bytes held (from the cache itself), the bytes a
//! full cache would hold, the policy's side state and the process's resident memory are recorded: a
//! full cache grows linearly, a bounded policy must stay flat. Writes a CSV and the curves.
//!
//! Compressing policies run first and `full` last, so that the resident memory of the bounded
//! policies is not inflated by memory the allocator kept from the full cache.

use super::perf::prompt_of;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kvbench::flags::{ModelFlags, PolicyFlags, RuntimeFlags};
use kvbench::metrics;
use kvbench::model::SeqInput;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct ScalingArgs {
    #[command(flatten)]
    pub model: ModelFlags,
    #[command(flatten)]
    pub runtime: RuntimeFlags,
    /// Policies (default: every policy), each at every budget; a ratio budget is resolved against the
    /// longest length (the one sequence's full generation length).
    #[command(flatten)]
    pub policy: PolicyFlags,
    /// Generated lengths at which to record, comma separated, each from 2 (the first new token
    /// comes from the prefill; the decoding rate is timed from there).
    #[arg(long, value_delimiter = ',', default_value = "512,1024,2048,4096,8192", value_parser = super::parse_generated_length)]
    pub lengths: Vec<usize>,
    /// Prompt length.
    #[arg(long, default_value_t = 64, value_parser = super::parse_positive)]
    pub prompt_tokens: usize,
    /// Where to write scaling.csv and the plots.
    #[arg(long, value_name = "DIR", default_value = "results/scaling")]
    pub out: PathBuf,
    /// Draw the plots again from a scaling.csv this command wrote, without measuring.
    #[arg(long, value_name = "CSV")]
    pub replot: Option<PathBuf>,
}

/// One row of `scaling.csv`.
#[derive(serde::Serialize, serde::Deserialize)]
struct Point {
    #[serde(default)]
    model: String,
    policy: String,
    budget: f64,
    generated: usize,
    kv_bytes: usize,
    full_cache_bytes: usize,
    policy_state_bytes: usize,
    rss_bytes: u64,
    tokens_per_s: f64,
}

pub fn run(args: ScalingArgs) -> anyhow::Result<ExitCode> {
    super::check_dir_flag("--out", &args.out)?;
    if let Some(csv_path) = &args.replot {
        let mut r = csv::Reader::from_path(csv_path)
            .map_err(|e| super::UsageError(format!("--replot {}: {e}", csv_path.display())))?;
        let points = r
            .deserialize()
            .collect::<Result<Vec<Point>, _>>()
            .map_err(|e| super::UsageError(format!("--replot {}: {e}", csv_path.display())))?;
        if points.is_empty() {
            return Err(super::UsageError(format!(
                "--replot {}: no data rows (expected the scaling.csv that `kvbench scaling` writes)",
                csv_path.display()
            ))
            .into());
        }
        std::fs::create_dir_all(&args.out).map_err(|e| kvbench::Error::io(&args.out, e))?;
        for f in plot_points(&points, &args.out)? {
            println!("{}", f.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut lengths = args.lengths.clone();
    lengths.sort_unstable();
    lengths.dedup();
    let mut specs = args
        .policy
        .grid(&kvbench::policy::policy_names(), args.policy.rule())?;
    specs.sort_by_key(|s| s.name() == "full");
    let longest_length = *lengths.last().unwrap_or(&1);
    for s in specs.iter_mut() {
        *s = s.resolve(longest_length as f64, args.prompt_tokens as f64)?;
    }
    let model = super::load_model(&args.model, &args.runtime)?;
    model.check_fits(
        args.prompt_tokens,
        longest_length,
        "--prompt-tokens and --lengths",
    )?;
    std::fs::create_dir_all(&args.out).map_err(|e| kvbench::Error::io(&args.out, e))?;
    let prompt = prompt_of(&model, args.prompt_tokens)?;
    let (config, kv_type) = (&model.transformer.config, model.transformer.kv_type());
    let longest = *lengths.last().unwrap_or(&1);
    println!(
        "model {} (weights {}, KV cache {}, activations {}), {}-token prompt, machine: {}",
        model.name,
        kvbench::flags::spelled(&args.model.weights()),
        kv_type,
        model.transformer.activation_dtype().as_str(),
        args.prompt_tokens,
        metrics::machine()
    );
    println!(
        "device: {}",
        kvbench::device::describe(args.model.device(), model.transformer.device())
    );
    let bar = ProgressBar::new((specs.len() * longest) as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} tokens {msg}",
        )
        .expect("static template"),
    );
    let mut points = Vec::new();
    for spec in &specs {
        bar.set_message(spec.name().to_string());
        let ctx = model.policy_context(spec, longest);
        let mut state = model.transformer.new_state(spec.build(&ctx)?)?;
        let mut input = prompt.clone();
        let mut segment = (Instant::now(), 0usize);
        for generated in 1..=longest {
            let logits = model.transformer.forward(&mut [SeqInput {
                tokens: &input,
                state: &mut state,
            }])?;
            let logits = logits.squeeze(0)?.to_vec1::<f32>()?;
            input = vec![metrics::divergence::argmax(&logits)];
            bar.inc(1);
            if generated == 1 {
                // The prefill made this token: decoding is timed from here.
                segment = (Instant::now(), 1);
            }
            if lengths.contains(&generated) {
                let secs = segment.0.elapsed().as_secs_f64();
                points.push(Point {
                    model: model.name.clone(),
                    policy: spec.name().to_string(),
                    budget: spec.budget().value(),
                    generated,
                    kv_bytes: state.cache.bytes(),
                    full_cache_bytes: config.kv_bytes(kv_type, state.seen),
                    policy_state_bytes: state.side_state_bytes(),
                    rss_bytes: metrics::current_rss_bytes().unwrap_or(0),
                    tokens_per_s: (generated - segment.1) as f64 / secs.max(1e-9),
                });
                segment = (Instant::now(), generated);
            }
        }
    }
    bar.finish_and_clear();
    let mib = |b: f64| b / (1 << 20) as f64;
    println!("\n| policy | generated | KV MiB | full cache MiB | KV / full | policy state KiB | RSS MiB | decode tok/s since last row |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let csv_path = args.out.join("scaling.csv");
    let mut w = csv::Writer::from_writer(Vec::new());
    for p in &points {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.3} | {:.1} | {:.0} | {:.1} |",
            p.policy,
            p.generated,
            mib(p.kv_bytes as f64),
            mib(p.full_cache_bytes as f64),
            p.kv_bytes as f64 / p.full_cache_bytes.max(1) as f64,
            p.policy_state_bytes as f64 / 1024.0,
            mib(p.rss_bytes as f64),
            p.tokens_per_s
        );
        w.serialize(p)?;
    }
    let mut f = kvbench::results::AtomicFile::create(&csv_path)?;
    f.write_all(&w.into_inner()?)
        .map_err(|e| kvbench::Error::io(&csv_path, e))?;
    f.commit()?;
    let mut files = vec![csv_path];
    files.extend(plot_points(&points, &args.out)?);
    println!("\nwritten:");
    for f in files {
        println!("  {}", f.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The curves of KV bytes and resident memory against length, one line per policy in the order the
/// points give.
fn plot_points(points: &[Point], out: &std::path::Path) -> anyhow::Result<Vec<PathBuf>> {
    let mib = |b: f64| b / (1 << 20) as f64;
    let mut order: Vec<&str> = Vec::new();
    for p in points {
        if !order.contains(&p.policy.as_str()) {
            order.push(&p.policy);
        }
    }
    let series = |y: &dyn Fn(&Point) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
        order
            .iter()
            .map(|name| {
                let pts = points
                    .iter()
                    .filter(|p| p.policy == *name)
                    .map(|p| (p.generated as f64, y(p)))
                    .collect();
                (name.to_string(), pts)
            })
            .collect()
    };
    let budget = points
        .iter()
        .find(|p| p.policy != "full")
        .map_or("-".to_string(), |p| p.budget.to_string());
    let subject = match points.first().map(|p| p.model.as_str()) {
        Some(m) if !m.is_empty() => format!("{m}, budget {budget}"),
        _ => format!("budget {budget}"),
    };
    let mut files = kvbench::report::plot::lines(
        &out.join("kv_vs_length"),
        &format!("KV cache held vs generated length: {subject}"),
        "generated tokens",
        "KV cache held (MiB)",
        series(&|p| mib(p.kv_bytes as f64)),
        false,
    )?;
    files.extend(kvbench::report::plot::lines(
        &out.join("rss_vs_length"),
        &format!("Process resident memory vs generated length: {subject}"),
        "generated tokens",
        "resident memory (MiB)",
        series(&|p| mib(p.rss_bytes as f64)),
        false,
    )?);
    Ok(files)
}
