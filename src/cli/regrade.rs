//! `kvbench regrade`: grades stored samples again with this kvbench's grader, without generating, and
//! says which verdicts changed.

use super::UsageError;
use clap::Args;
use kvbench::results::sample::{read_records, write_records};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct RegradeArgs {
    /// A samples file written by `kvbench run --out`.
    pub samples: PathBuf,
    /// Where to write the regraded samples (atomically).
    #[arg(long, value_name = "FILE", conflicts_with = "in_place")]
    pub out: Option<PathBuf>,
    /// Replace the samples file (atomically: a crash leaves the old file).
    #[arg(long)]
    pub in_place: bool,
    /// Lenient extraction (never the default).
    #[arg(long)]
    pub lenient: bool,
}

/// The results directory a samples file belongs to (one with a `sweep.json`), if any.
fn results_dir_of(file: &std::path::Path) -> Option<PathBuf> {
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty())?;
    dir.join("sweep.json").is_file().then(|| dir.to_path_buf())
}

pub fn run(args: RegradeArgs) -> anyhow::Result<ExitCode> {
    // Rewriting a results directory's file while a sweep appends to it would lose its new lines:
    // the directory is taken exclusively, or the rewrite refused naming who holds it.
    let target = match (&args.out, args.in_place) {
        (Some(p), _) => Some(p.clone()),
        (None, true) => Some(args.samples.clone()),
        (None, false) => None,
    };
    if let Some(out) = &args.out {
        super::check_output_file("--out", out, kvbench::results::replace::Output::Samples)?;
    }
    let _exclusive = match target.as_deref().and_then(results_dir_of) {
        Some(dir) => Some(kvbench::results::dir::lock_exclusive(&dir)?),
        None => None,
    };
    let mut records = read_records(&args.samples).map_err(|e| {
        e.naming(
            &args.samples,
            format!("samples file {}", args.samples.display()),
        )
    })?;
    if records.is_empty() {
        return Err(UsageError(format!(
            "{}: no sample records to regrade; nothing was written",
            args.samples.display()
        ))
        .into());
    }
    let before: Vec<_> = records.iter().map(|r| r.verdict.clone()).collect();
    let old_correct = records.iter().filter(|r| r.correct).count();
    for r in records.iter_mut() {
        r.grade(args.lenient);
    }
    let mut changed = 0;
    for (r, old) in records.iter().zip(&before) {
        if r.verdict != *old {
            changed += 1;
            println!(
                "{} #{}: {old:?} -> {:?} (extracted {}, gold {})",
                kvbench::error::cell(&r.problem_id),
                r.sample,
                r.verdict,
                r.extracted
                    .as_deref()
                    .map_or("none".into(), |e| format!("{:?}", kvbench::error::cell(e))),
                kvbench::error::cell(&format!("{:?}", r.gold))
            );
        }
    }
    let new_correct = records.iter().filter(|r| r.correct).count();
    println!(
        "{} samples regraded with {}: {changed} verdicts changed; correct {old_correct} -> {new_correct}",
        records.len(),
        kvbench::eval::grade::GRADER_VERSION
    );
    match target {
        Some(p) => {
            write_records(&p, &records)?;
            println!("written to {}", p.display());
        }
        None if changed > 0 => {
            return Err(UsageError(
                "verdicts changed: pass --out FILE or --in-place to keep them".into(),
            )
            .into())
        }
        None => {}
    }
    Ok(ExitCode::SUCCESS)
}
