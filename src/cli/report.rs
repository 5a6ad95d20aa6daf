//! `kvbench report [DIR...]`: merges result directories (shards included), prints the summary table,
//! writes it as CSV and JSON with the plots, and lists the units still missing with the command that
//! runs only those.

use clap::Args;
use kvbench::report::pairs::RowSelector;
use kvbench::report::{collect, plot, resume_command, summarize, table};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Result directories (written by `kvbench sweep` or `kvbench run`) [default: every directory
    /// under results/ with a sweep manifest].
    pub dirs: Vec<PathBuf>,
    /// Where to write report.md, report.csv, report.json and the plots [default: DIR/report for one
    /// directory, results/report for several].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Tables only, no plots.
    #[arg(long)]
    pub no_plots: bool,
    /// Compare two rows problem by problem, `A,B` with each `POLICY@BUDGET` or `full` (repeatable):
    /// Δ pass@1 of B over A with its paired bootstrap interval, the problems only one solved, and
    /// the exact McNemar p. Written to pairs.md, pairs.csv and pairs.json.
    #[arg(long, value_name = "A,B")]
    pub pair: Vec<String>,
}

fn default_dirs() -> anyhow::Result<Vec<PathBuf>> {
    let root = Path::new("results");
    let none = || {
        super::UsageError(
            "no result directories under results/: name some, or run `kvbench sweep` first".into(),
        )
    };
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        // No results/ here (another working directory, nothing run yet): the same advice.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(none().into()),
        Err(e) => return Err(kvbench::Error::io(root, e).into()),
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("sweep.json").is_file())
        .collect();
    dirs.sort();
    if dirs.is_empty() {
        return Err(none().into());
    }
    Ok(dirs)
}

fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    let mut f = kvbench::results::AtomicFile::create(path)?;
    f.write_all(text.as_bytes())
        .map_err(|e| kvbench::Error::io(path, e))?;
    f.commit()?;
    Ok(())
}

/// Every trace of a record the report has, read through (a damaged one refused) and planned for its
/// heat maps.
fn read_traces(c: &kvbench::report::Collection) -> anyhow::Result<Vec<plot::TracePlan>> {
    let mut out = Vec::new();
    for t in &c.traces {
        let unit = t.file_stem().map(|s| s.to_string_lossy().to_string());
        let Some(rec) = c.records.iter().find(|r| Some(&r.unit) == unit.as_ref()) else {
            continue;
        };
        let label = match rec.budget {
            Some(b) => format!("{} at budget {b}", rec.policy_name),
            None => rec.policy_name.clone(),
        };
        // The most tokens its events can have seen: the sample's prompt and output (a record of a
        // kvbench without metrics: a context of 2^24, far beyond any traced run).
        let most_seen = rec
            .metrics
            .as_ref()
            .map_or(1 << 24, |m| m.prompt_tokens + rec.tokens);
        out.push(plot::plan_heatmaps(t, most_seen, label)?);
    }
    Ok(out)
}

pub fn run(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let dirs = if args.dirs.is_empty() {
        default_dirs()?
    } else {
        args.dirs.clone()
    };
    let pairs: Vec<(RowSelector, RowSelector)> = args
        .pair
        .iter()
        .map(|p| match p.split_once(',') {
            Some((a, b)) => Ok((RowSelector::parse(a)?, RowSelector::parse(b)?)),
            None => Err(super::UsageError(format!(
                "--pair {p}: expected two rows, A,B (e.g. rkv@256,streaming@256)"
            ))
            .into()),
        })
        .collect::<anyhow::Result<_>>()?;
    let c = collect(&dirs)?;
    if c.records.is_empty() && c.missing.is_empty() {
        return Err(super::UsageError(format!(
            "no samples in {}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .into());
    }
    // The pairs and the output folder first: a selector that matches no row, or several, or a folder
    // that cannot be made is refused before anything is printed or written.
    let pair_rows = kvbench::report::pairs::compare(&c.records, &pairs)?;
    let out = args.out.clone().unwrap_or_else(|| match dirs.as_slice() {
        [one] => one.join("report"),
        _ => PathBuf::from("results").join("report"),
    });
    super::check_dir_flag("--out", &out)?;
    let summary = summarize(&c.records);
    // The traces too: a damaged one is refused before anything is printed or written.
    let traces = match args.no_plots || summary.rows.is_empty() {
        true => Vec::new(),
        false => read_traces(&c)?,
    };
    let md = table::markdown(&summary);
    print!("{md}");
    std::fs::create_dir_all(&out).map_err(|e| kvbench::Error::io(&out, e))?;
    // One report writes a folder at a time (its files are each written atomically).
    let _writing = kvbench::results::dir::lock_exclusive(&out)?;
    let title = format!("# kvbench report: {}\n\n", summary.subject());
    write_atomic(&out.join("report.md"), &format!("{title}{md}"))?;
    write_atomic(&out.join("report.csv"), &table::csv(&summary)?)?;
    write_atomic(&out.join("report.json"), &table::json(&summary)?)?;
    let mut files = vec![
        out.join("report.md"),
        out.join("report.csv"),
        out.join("report.json"),
    ];
    if !pair_rows.is_empty() {
        let pmd = kvbench::report::pairs::markdown(&pair_rows);
        println!("\n{pmd}");
        write_atomic(
            &out.join("pairs.md"),
            &format!("# kvbench pairs: {}\n\n{pmd}", summary.subject()),
        )?;
        let mut w = csv::Writer::from_writer(Vec::new());
        for r in &pair_rows {
            w.serialize(kvbench::report::pairs::FlatPair::from(r))?;
        }
        write_atomic(&out.join("pairs.csv"), &String::from_utf8(w.into_inner()?)?)?;
        write_atomic(
            &out.join("pairs.json"),
            &serde_json::to_string_pretty(&pair_rows)?,
        )?;
        files.extend(["pairs.md", "pairs.csv", "pairs.json"].map(|f| out.join(f)));
    }
    if !args.no_plots && !summary.rows.is_empty() {
        files.extend(plot::summary_plots(&summary, &out)?);
        let subject = summary.subject();
        for plan in &traces {
            files.extend(plot::heatmaps(plan, &subject, &out)?);
        }
    }
    println!();
    if c.duplicates > 0 {
        println!(
            "{} duplicate records (same unit id) were counted once",
            c.duplicates
        );
    }
    for (dir, n) in &c.unplanned {
        println!(
            "note: {n} records in {} belong to no unit planned in its sweep.json; they are left out",
            dir.display()
        );
    }
    for (dir, why) in &c.unchecked {
        // A TOML error spans several lines (the line quoted, a caret): its first says where.
        let first = why.lines().next().unwrap_or_default();
        println!(
            "note: {first}: the settings {} ran with are unknown, so they are not checked against other directories'",
            dir.display()
        );
    }
    for p in &c.partial_lines {
        println!(
            "note: {} ends in a half-written line (a sweep is running, or was killed); it is not counted",
            p.display()
        );
    }
    if c.missing.is_empty() {
        println!("every planned unit has a result");
    } else {
        println!("{} planned units have no result yet:", c.missing.len());
        let mut by_dir: Vec<(&PathBuf, usize)> = Vec::new();
        for (dir, u) in &c.missing {
            match by_dir.iter_mut().find(|(d, _)| *d == dir) {
                Some(e) => e.1 += 1,
                None => by_dir.push((dir, 1)),
            }
            if c.missing.len() <= 20 {
                println!(
                    "  {} {} {} #{}",
                    u.id,
                    kvbench::error::cell(&u.policy),
                    kvbench::error::cell(&u.problem_id),
                    u.sample
                );
            }
        }
        for (dir, n) in by_dir {
            println!(
                "run the {n} missing units of {} with: {}",
                dir.display(),
                resume_command(dir)
            );
        }
    }
    println!("written:");
    for f in &files {
        println!("  {}", f.display());
    }
    Ok(ExitCode::SUCCESS)
}
