//! `kvbench grade`: one grader decision, or a file of them, as JSON objects, so that users can check
//! what the grader extracted, how it normalised both sides, and its verdict.

use super::UsageError;
use clap::{Args, ValueEnum};
use kvbench::eval::grade::{self, Extracted};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// An already extracted answer.
    Answer,
    /// A whole model output (the answer is extracted first).
    Output,
}

#[derive(Args, Debug)]
pub struct GradeArgs {
    /// The prediction (with --gold). May start with a hyphen (`-5`, `-\infty`).
    #[arg(
        long,
        requires = "gold",
        conflicts_with = "cases",
        allow_hyphen_values = true
    )]
    pub pred: Option<String>,
    /// The gold answer. May start with a hyphen.
    #[arg(long, requires = "pred", allow_hyphen_values = true)]
    pub gold: Option<String>,
    #[arg(long, value_enum, ignore_case = true, default_value_t = Kind::Answer)]
    pub kind: Kind,
    /// The prompt opened a thinking block (an R1-style template): without `</think>` the output is
    /// truncated.
    #[arg(long)]
    pub thinking: bool,
    /// Lenient extraction (never the default): search unclosed thinking blocks, fall back to the last
    /// number.
    #[arg(long)]
    pub lenient: bool,
    /// A JSON Lines file of cases: `id`, `kind` (answer | output), `pred`, `gold`.
    #[arg(long, value_name = "FILE")]
    pub cases: Option<PathBuf>,
}

/// Whether an answer normalises to nothing.
fn blank(answer: &str) -> bool {
    grade::normalize(&grade::extract::tidy(answer)).is_empty()
}

/// A gold answer that normalises to nothing grades every prediction wrong (or a blank one right):
/// refused, naming where it came from.
fn check_gold(gold: &str, at: &str) -> anyhow::Result<()> {
    if blank(gold) {
        return Err(
            kvbench::Error::Input(format!("{at}: the gold answer {gold:?} is empty")).into(),
        );
    }
    Ok(())
}

fn decide(id: &str, kind: Kind, pred: &str, gold: &str, args: &GradeArgs) -> serde_json::Value {
    let (extracted, verdict) = match kind {
        // An answer that is nothing once tidied (blank, `$$`, a bare period) is none, as an output's
        // empty `\boxed{}` is.
        Kind::Answer if blank(pred) => (None, "no_answer"),
        Kind::Answer => {
            let ok = grade::equivalent(pred, gold);
            (
                Some(pred.to_string()),
                if ok { "correct" } else { "incorrect" },
            )
        }
        Kind::Output => match grade::extract::extract_with(pred, args.thinking, args.lenient) {
            Extracted::Answer(a) => {
                let ok = grade::equivalent(&a, gold);
                (Some(a), if ok { "correct" } else { "incorrect" })
            }
            Extracted::Truncated => (None, "truncated"),
            Extracted::NoAnswer => (None, "no_answer"),
        },
    };
    serde_json::json!({
        "id": id,
        "correct": verdict == "correct",
        "verdict": verdict,
        "extracted": extracted,
        "normalized_pred": extracted.as_deref().map(|a| grade::normalize(&grade::extract::tidy(a))),
        "normalized_gold": grade::normalize(&grade::extract::tidy(gold)),
        "grader": grade::GRADER_VERSION,
    })
}

pub fn run(args: GradeArgs) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if let (Some(pred), Some(gold)) = (&args.pred, &args.gold) {
        check_gold(gold, "--gold")?;
        writeln!(out, "{}", decide("-", args.kind, pred, gold, &args))?;
        return Ok(ExitCode::SUCCESS);
    }
    let Some(path) = &args.cases else {
        return Err(UsageError("give --pred and --gold, or --cases FILE".into()).into());
    };
    let text = kvbench::files::read_text(path, kvbench::files::DATA_LIMIT)
        .map_err(|e| e.naming(path, format!("--cases {}", path.display())))?;
    // Every line is read and checked before the first verdict is printed: a bad line prints nothing.
    let cases = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, line)| Case::parse(line, i + 1, path))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if cases.is_empty() {
        return Err(kvbench::Error::Input(format!(
            "{}: no cases (one JSON object per line: id, kind, pred, gold)",
            path.display()
        ))
        .into());
    }
    for c in &cases {
        writeln!(out, "{}", decide(&c.id, c.kind, &c.pred, &c.gold, &args))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One line of a cases file.
struct Case {
    id: String,
    kind: Kind,
    pred: String,
    gold: String,
}

impl Case {
    /// Line `number` of `path`: a JSON object with string fields `pred` and `gold`, optionally `kind`
    /// (answer, the default when absent or null, or output) and `id` (the line's number when absent).
    fn parse(line: &str, number: usize, path: &std::path::Path) -> anyhow::Result<Self> {
        let at = format!("{}:{number}", path.display());
        let bad = |what: String| -> anyhow::Error {
            kvbench::Error::Input(format!("{at}: {what}")).into()
        };
        let not_object = kvbench::files::not_a_json_object;
        let row: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(not_object(Err(&e))))?;
        if !row.is_object() {
            return Err(bad(not_object(Ok(&row))));
        }
        let field = |k: &str| -> anyhow::Result<String> {
            row.get(k)
                .and_then(|v| v.as_str())
                .map(String::from)
                .ok_or_else(|| bad(format!("no string field '{k}'")))
        };
        let kind = match row.get("kind").filter(|v| !v.is_null()) {
            None => Kind::Answer,
            Some(v) => match v.as_str() {
                Some("answer") => Kind::Answer,
                Some("output") => Kind::Output,
                _ => return Err(bad(format!("kind {v} (expected \"answer\" or \"output\")"))),
            },
        };
        let id = row
            .get("id")
            .map(|v| v.as_str().map_or(v.to_string(), String::from))
            .unwrap_or_else(|| format!("line-{number}"));
        let gold = field("gold")?;
        check_gold(&gold, &format!("{at}: 'gold'"))?;
        Ok(Self {
            id,
            kind,
            pred: field("pred")?,
            gold,
        })
    }
}
