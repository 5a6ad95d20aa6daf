//! One generated sample as stored: the raw output and everything needed to grade it again with a newer
//! grader (`kvbench regrade`) without generating again.

use crate::eval::grade::{self, Verdict};
use crate::generate::FinishReason;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    pub problem_id: String,
    pub sample: usize,
    pub seed: u64,
    pub gold: String,
    /// The decoded output, as generated.
    pub output: String,
    /// The prompt opened a thinking block (decides truncation).
    pub thinking: bool,
    pub extracted: Option<String>,
    pub normalized_pred: Option<String>,
    pub normalized_gold: String,
    pub verdict: Verdict,
    pub correct: bool,
    pub grader: String,
    pub lenient: bool,
    pub tokens: usize,
    pub finish: FinishReason,
    /// The policy with its parameters, `PolicySpec::describe`.
    pub policy: String,
    pub prompt: String,
    pub template_hash: String,
    pub dataset: String,
}

impl SampleRecord {
    /// (Re)computes the grading fields from the output and the gold answer with this grader.
    pub fn grade(&mut self, lenient: bool) {
        let (extracted, verdict) =
            grade::grade_output_with(&self.output, &self.gold, self.thinking, lenient);
        self.normalized_pred = extracted
            .as_deref()
            .map(|a| grade::normalize(&grade::extract::tidy(a)));
        self.normalized_gold = grade::normalize(&grade::extract::tidy(&self.gold));
        self.extracted = extracted;
        self.correct = verdict.is_correct();
        self.verdict = verdict;
        self.grader = grade::GRADER_VERSION.to_string();
        self.lenient = lenient;
    }
}

/// Reads a JSON Lines file of records; a bad line is an error naming the file and line.
pub fn read_records(path: &std::path::Path) -> crate::Result<Vec<SampleRecord>> {
    let text = std::fs::read_to_string(path).map_err(|e| crate::Error::io(path, e))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| {
                crate::Error::Input(format!(
                    "{}:{}: not a sample record: {e}",
                    path.display(),
                    i + 1
                ))
            })
        })
        .collect()
}

/// Writes records as JSON Lines, atomically.
pub fn write_records(path: &std::path::Path, records: &[SampleRecord]) -> crate::Result<()> {
    use std::io::Write;
    let mut f = super::AtomicFile::create(path)?;
    for r in records {
        let line = serde_json::to_string(r).map_err(|e| crate::Error::Input(e.to_string()))?;
        writeln!(f, "{line}").map_err(|e| crate::Error::io(path, e))?;
    }
    f.commit()
}
