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
    /// The sweep work unit's id (empty in records of older versions).
    #[serde(default)]
    pub unit: String,
    /// The policy's name and budget value (`full` has none), for grouping in reports.
    #[serde(default)]
    pub policy_name: String,
    #[serde(default)]
    pub budget: Option<f64>,
    /// The fixed budget `B` (entries per layer and KV head) the policy ran with, when it had one, and
    /// the full run's mean generation length a ratio budget was resolved from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_entries: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_mean_tokens: Option<f64>,
    #[serde(default)]
    pub model: String,
    /// Speed and memory of the generation.
    #[serde(default)]
    pub metrics: Option<SampleMetrics>,
    /// Teacher-forced divergence from the full cache (when the study asked for it).
    #[serde(default)]
    pub fidelity: Option<crate::generate::fidelity::Fidelity>,
    /// The weights were random (`--model random:NAME`): the record measures speed and memory only,
    /// and its grade means nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub random_weights: bool,
    /// The engine that generated the record (records of kvbench 0.5 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<Engine>,
}

/// What generated a record, as far as it can change the tokens: kvbench's version and commit, the
/// device, the weights' format, the kernel path, the batch size and the threads. Two records of one
/// unit with the same engine have the same tokens (greedy decoding gives a sequence the same tokens
/// whatever its batch on the CPU kernels; the figures are kept so a reader need not take it on trust).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Engine {
    pub kvbench: String,
    pub commit: String,
    /// `cpu (CPU model …)` or `cuda:N (GPU name, driver, CUDA version, memory)`.
    pub device: String,
    pub weights: String,
    /// The CPU kernel path (AVX-512, AVX2, portable).
    pub kernels: String,
    /// Sequences decoded together, as configured.
    pub batch_size: usize,
    pub threads: usize,
    /// How the cache stored keys and values (`f32` in records before the choice existed).
    #[serde(default = "reference_kv_type")]
    pub kv_type: String,
    /// The activations' type between operations (`f32` in records before the choice existed).
    #[serde(default = "reference_activations")]
    pub activations: String,
}

fn reference_kv_type() -> String {
    crate::cache::KvType::F32.to_string()
}

fn reference_activations() -> String {
    candle_core::DType::F32.as_str().into()
}

impl Engine {
    /// The engine of this process on `device`.
    pub fn current(
        device: &str,
        weights: String,
        batch_size: usize,
        kv_type: crate::cache::KvType,
        activations: candle_core::DType,
    ) -> Self {
        Engine {
            kvbench: env!("CARGO_PKG_VERSION").into(),
            commit: env!("KVBENCH_GIT_COMMIT").into(),
            device: device.into(),
            weights,
            kernels: crate::metrics::kernel_path().into(),
            batch_size,
            threads: rayon::current_num_threads(),
            kv_type: kv_type.to_string(),
            activations: activations.as_str().into(),
        }
    }

    /// The commit, shortened, with the version: `0.5.0@1a2b3c4`.
    pub fn short(&self) -> String {
        format!(
            "{}@{}",
            self.kvbench,
            &self.commit[..self.commit.len().min(7)]
        )
    }
}

/// What one sample cost: timings, KV memory (from the cache itself) and compression.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleMetrics {
    pub prompt_tokens: usize,
    /// Prefill wall time; the first token is sampled right after it (time to first token). Where
    /// several sequences were prefilled in one pass (off the CPU), that pass's time.
    pub prefill_secs: f64,
    /// This sequence's share of that pass by prompt tokens, where it was prefilled with others (the
    /// shares of a pass add up to its wall time); absent when it went alone (the share is then
    /// `prefill_secs`: see [`SampleMetrics::prefill_cost_secs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_share_secs: Option<f64>,
    /// From the end of prefill to this sequence's last token.
    pub decode_secs: f64,
    /// This sequence's share of its batch's decode wall time (by tokens): the shares of a batch add
    /// up to its wall time, so tokens over summed shares is the aggregate throughput.
    pub decode_share_secs: f64,
    /// Sequences decoded together.
    pub batch: usize,
    /// Time inside the policy's hooks: all of it, and the part spent at prefill (records of kvbench
    /// 0.3 and older have no split).
    pub policy_secs: f64,
    #[serde(default)]
    pub policy_prefill_secs: Option<f64>,
    /// KV bytes held: the most at any moment (inside steps too, since kvbench 0.4; at the end of a
    /// step before) and time-averaged, and what a full cache holds for the same tokens; the most
    /// bytes of buffers allocated.
    pub kv_bytes_peak: usize,
    #[serde(default)]
    pub kv_bytes_capacity_peak: Option<usize>,
    pub kv_bytes_mean: f64,
    pub kv_bytes_full_peak: usize,
    pub kv_bytes_full_mean: f64,
    /// Entries per layer and head: time-averaged (mean over layers), for a full cache, and the
    /// largest layer's peak.
    pub entries_mean: f64,
    pub entries_full_mean: f64,
    pub entries_peak: usize,
    /// Compression events of the layer that compressed most often.
    pub events: usize,
    /// Time per output token over this sample's decode steps (shared with its batch): median and
    /// 90th percentile, seconds.
    #[serde(default)]
    pub tpot_p50_secs: f64,
    #[serde(default)]
    pub tpot_p90_secs: f64,
    /// The most bytes of policy side state (scores, trackers, query windows) held, apart from the
    /// KV cache.
    #[serde(default)]
    pub policy_state_bytes_peak: usize,
    /// Share of repeated 4-gram windows in the last 512 output tokens.
    #[serde(default)]
    pub repetition: f64,
    /// CPU model and cores (`metrics::machine`): speeds are pooled only across equal machines.
    pub machine: String,
    /// The most device memory in use (the GPU's own counter, sampled after each step; all
    /// processes on the device), on a GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_memory_peak_bytes: Option<u64>,
}

impl SampleMetrics {
    /// The prefill time this sample accounts for: its share of a pass shared with others, else the
    /// pass's whole time. Summed over samples, the prefill's wall time.
    pub fn prefill_cost_secs(&self) -> f64 {
        self.prefill_share_secs.unwrap_or(self.prefill_secs)
    }
}

/// The most tokens a record may count in a prompt or an output: no model's context comes near 2³².
const MAX_RECORD_TOKENS: usize = u32::MAX as usize;

/// The longest time a record may count: a year (one sample's generation takes minutes to hours).
const MAX_RECORD_SECS: f64 = 365.25 * 24.0 * 3600.0;

impl SampleRecord {
    /// What every record kvbench writes satisfies, checked where one is read back: the grade agrees
    /// with its verdict, budgets are positive, token counts fit a context, every time, byte count,
    /// mean and share is finite and not negative (a share at most 1), and no time passes a year. A record that fails
    /// was damaged or edited, and a report built on it would print its numbers as measured.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.correct != self.verdict.is_correct() {
            return Err(format!(
                "`correct` is {} but `verdict` is {:?}",
                self.correct, self.verdict
            ));
        }
        if let Some(b) = self.budget {
            if !(b.is_finite() && b > 0.0) {
                return Err(format!("`budget` {b} is not a positive number"));
            }
        }
        // Quantities that are finite and not negative; of them, times (at most a year).
        let mut values: Vec<(&str, f64)> = Vec::new();
        let mut secs: Vec<(&str, f64)> = Vec::new();
        values.extend(self.full_mean_tokens.map(|t| ("full_mean_tokens", t)));
        let mut counts = vec![("tokens", self.tokens)];
        if let Some(m) = &self.metrics {
            counts.push(("metrics.prompt_tokens", m.prompt_tokens));
            if m.batch == 0 {
                return Err("`metrics.batch` is 0".into());
            }
            secs.extend([
                ("metrics.prefill_secs", m.prefill_secs),
                ("metrics.decode_secs", m.decode_secs),
                ("metrics.decode_share_secs", m.decode_share_secs),
                ("metrics.policy_secs", m.policy_secs),
                ("metrics.tpot_p50_secs", m.tpot_p50_secs),
                ("metrics.tpot_p90_secs", m.tpot_p90_secs),
            ]);
            secs.extend(
                m.prefill_share_secs
                    .map(|s| ("metrics.prefill_share_secs", s)),
            );
            secs.extend(
                m.policy_prefill_secs
                    .map(|s| ("metrics.policy_prefill_secs", s)),
            );
            values.extend([
                ("metrics.kv_bytes_mean", m.kv_bytes_mean),
                ("metrics.kv_bytes_full_mean", m.kv_bytes_full_mean),
                ("metrics.entries_mean", m.entries_mean),
                ("metrics.entries_full_mean", m.entries_full_mean),
                ("metrics.repetition", m.repetition),
            ]);
            if !(0.0..=1.0).contains(&m.repetition) {
                return Err(format!(
                    "`metrics.repetition` {} is not a share",
                    m.repetition
                ));
            }
        }
        if let Some(f) = &self.fidelity {
            values.extend([
                ("fidelity.mean_rank", f.mean_rank),
                ("fidelity.top1_agreement", f.top1_agreement),
            ]);
            if !(0.0..=1.0).contains(&f.top1_agreement) || !f.mean_kl.is_finite() {
                return Err(format!(
                    "`fidelity` has agreement {} and mean KL {}",
                    f.top1_agreement, f.mean_kl
                ));
            }
        }
        let mut all = values.iter().chain(&secs);
        if let Some((name, v)) = all.find(|(_, v)| !(v.is_finite() && *v >= 0.0)) {
            return Err(format!("`{name}` {v:?} is not a finite number at least 0"));
        }
        if let Some((name, v)) = secs.iter().find(|(_, v)| *v > MAX_RECORD_SECS) {
            return Err(format!("`{name}` {v:?} is more seconds than a year"));
        }
        if let Some((name, n)) = counts.iter().find(|(_, n)| *n > MAX_RECORD_TOKENS) {
            return Err(format!(
                "`{name}` {n} is more tokens than any model's context"
            ));
        }
        Ok(())
    }

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

/// The longest line a sample record may take (its output and fidelity curves included): 64 MiB.
pub const MAX_RECORD: usize = 64 << 20;

/// Records of one samples file, read a line at a time.
pub struct FileRecords {
    pub records: Vec<SampleRecord>,
    /// The file ends in a partial record (a process is writing it, or was killed writing it).
    pub torn_last_line: bool,
}

/// Reads a JSON Lines samples file, streamed: a line at a time, each at most [`MAX_RECORD`] bytes.
/// With `allow_torn`, a last line without its newline that begins as a record does (`{`) is a record
/// being written, or cut by a kill: it is left out and reported. Anything else that is not a record
/// (NUL bytes, text, a line too long) is an error naming the file and line.
pub fn read_file(path: &std::path::Path, allow_torn: bool) -> crate::Result<FileRecords> {
    use std::io::BufRead;
    let bad =
        |line: usize, why: String| crate::Error::Input(format!("{}:{line}: {why}", path.display()));
    crate::files::check_readable(path, crate::files::DATA_LIMIT)?;
    let (file, _) = crate::files::open(path)?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut out = FileRecords {
        records: Vec::new(),
        torn_last_line: false,
    };
    let mut buf = Vec::new();
    let mut n = 0;
    loop {
        buf.clear();
        let got = std::io::Read::take(&mut reader, MAX_RECORD as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|e| crate::Error::io(path, e))?;
        if got == 0 {
            break;
        }
        n += 1;
        let complete = buf.ends_with(b"\n");
        if !complete && buf.len() > MAX_RECORD {
            return Err(bad(
                n,
                format!(
                    "a line longer than {} MiB is not a sample record",
                    MAX_RECORD >> 20
                ),
            ));
        }
        let starts_as_record = buf
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|&b| b == b'{');
        if !complete && allow_torn && starts_as_record && !buf.contains(&0) {
            out.torn_last_line = true;
            break;
        }
        let text = std::str::from_utf8(&buf).map_err(|_| {
            bad(
                n,
                "not UTF-8 text (a sample record is one line of JSON)".into(),
            )
        })?;
        if text.trim().is_empty() {
            continue;
        }
        let r: SampleRecord =
            serde_json::from_str(text).map_err(|e| bad(n, format!("not a sample record: {e}")))?;
        r.check()
            .map_err(|e| bad(n, format!("a damaged sample record: {e}")))?;
        out.records.push(r);
    }
    Ok(out)
}

/// Reads a JSON Lines file of records; a bad line is an error naming the file and line.
pub fn read_records(path: &std::path::Path) -> crate::Result<Vec<SampleRecord>> {
    Ok(read_file(path, false)?.records)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as kvbench writes one, as JSON.
    fn record() -> serde_json::Value {
        serde_json::from_str(
            r#"{"problem_id": "p1", "sample": 0, "seed": 0, "gold": "2", "output": "\\boxed{2}",
            "thinking": false, "extracted": "2", "normalized_pred": "2", "normalized_gold": "2",
            "verdict": "correct", "correct": true, "grader": "g", "lenient": false, "tokens": 5,
            "finish": "eos", "policy": "rkv", "prompt": "R1", "template_hash": "h", "dataset": "d",
            "unit": "u", "policy_name": "rkv", "budget": 0.5, "model": "m",
            "metrics": {
                "prompt_tokens": 10, "prefill_secs": 0.5, "decode_secs": 1.0,
                "decode_share_secs": 1.0, "batch": 1, "policy_secs": 0.1, "kv_bytes_peak": 100,
                "kv_bytes_mean": 80.0, "kv_bytes_full_peak": 200, "kv_bytes_full_mean": 150.0,
                "entries_mean": 8.0, "entries_full_mean": 12.0, "entries_peak": 10, "events": 1,
                "tpot_p50_secs": 0.2, "tpot_p90_secs": 0.3, "repetition": 0.0, "machine": "cpu"}}"#,
        )
        .unwrap()
    }

    /// Edited or damaged records whose every field parses are refused by line and field: a report
    /// printed their numbers (a negative decode time, 1e308 seconds of prefill, `correct` against a
    /// `no_answer` verdict) as measured.
    #[test]
    fn records_that_parse_but_no_run_could_write_are_refused_by_line_and_field() {
        let dir = std::env::temp_dir().join(format!("kvbench-damaged-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("samples.jsonl");
        let good = record();
        let write = |second: &serde_json::Value| {
            std::fs::write(&path, format!("{good}\n{second}\n")).unwrap();
        };
        write(&good);
        assert_eq!(read_records(&path).unwrap().len(), 2);
        let edits: [(&str, &str, serde_json::Value, &str); 9] = [
            (
                "metrics",
                "decode_secs",
                (-1.0).into(),
                "`metrics.decode_secs` -1",
            ),
            (
                "metrics",
                "prefill_secs",
                1e308.into(),
                "`metrics.prefill_secs` 1e308",
            ),
            (
                "metrics",
                "repetition",
                1.5.into(),
                "`metrics.repetition` 1.5",
            ),
            ("metrics", "batch", 0.into(), "`metrics.batch` is 0"),
            (
                "",
                "correct",
                false.into(),
                "`correct` is false but `verdict` is Correct",
            ),
            ("", "budget", (-3.0).into(), "`budget` -3"),
            ("", "budget", 0.0.into(), "`budget` 0"),
            (
                "",
                "tokens",
                10u64.pow(15).into(),
                "`tokens` 1000000000000000",
            ),
            (
                "",
                "full_mean_tokens",
                (-2.0).into(),
                "`full_mean_tokens` -2",
            ),
        ];
        for (table, key, value, says) in edits {
            let mut bad = good.clone();
            match table {
                "" => bad[key] = value,
                t => bad[t][key] = value,
            }
            write(&bad);
            let e = read_records(&path)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                e.contains("samples.jsonl:2: a damaged sample record") && e.contains(says),
                "{key}: {e}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
