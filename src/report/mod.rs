//! Reports: result directories merged into one summary row per (model, dataset, policy with its
//! parameters and budget), compared with the `full` row of the same model and data; rendered as
//! tables ([`table`]) and plots ([`plot`]).
//!
//! Merging ([`collect()`]): records from every directory (and every shard file in it) are deduplicated
//! by unit id, and the planned units of each directory's manifest that have no record are listed as
//! missing. Speeds are pooled only over records of one machine: with records from several machines the speed
//! columns use the machine with the most records and the report says so.

mod collect;
pub mod paired;
pub mod pairs;
pub mod plot;
pub mod table;
mod ticks;

pub use collect::{collect, resume_command, Collection};
pub use paired::{paired, Interval, Paired};

use crate::cache::KvType;
use crate::eval::accuracy::{accuracy, ProblemSamples};
use crate::eval::grade::Verdict;
use crate::generate::FinishReason;
use crate::results::sample::SampleRecord;
use std::collections::{BTreeMap, HashMap};

/// One summary row: a policy at a budget on one model and dataset.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    pub model: String,
    pub dataset: String,
    pub policy: String,
    pub budget: Option<f64>,
    /// The fixed budget B the policy ran with (entries per layer and KV head), and for a ratio
    /// budget the full run's mean generation length it was resolved from.
    pub budget_entries: Option<usize>,
    pub full_mean_tokens: Option<f64>,
    /// The policy with every parameter (`PolicySpec::describe`).
    pub config: String,
    pub problems: usize,
    pub samples: usize,
    /// None for a row of random weights (`random_weights`): its outputs are noise, and so would be
    /// every accuracy figure (these, `cons` and the comparisons with full are all left out).
    pub pass_at_1: Option<f64>,
    pub stderr: Option<f64>,
    /// Majority vote, when some problem has more than one sample.
    pub cons: Option<f64>,
    /// Comparisons with the `full` row of the same model and data, over the problems both have
    /// (`shared_problems`): pass@1 over full's (None without a full row or when full scores 0 there),
    /// and mean output tokens over full's, minus one.
    pub shared_problems: Option<usize>,
    pub accuracy_vs_full: Option<f64>,
    /// pass@1 minus full's on the shared problems (a fraction) with its 95% paired bootstrap
    /// interval ([`paired()`]), and the problems only full solved and only this row solved.
    pub delta_pass: Option<f64>,
    pub delta_pass_lo: Option<f64>,
    pub delta_pass_hi: Option<f64>,
    pub only_full: Option<usize>,
    pub only_policy: Option<usize>,
    pub mean_tokens: f64,
    /// Mean output tokens over full's on the shared problems, minus one, with its interval.
    pub tokens_change_vs_full: Option<f64>,
    pub tokens_change_lo: Option<f64>,
    pub tokens_change_hi: Option<f64>,
    /// Samples that stopped at the length limit (`max_new_tokens`), and samples whose thinking block
    /// never closed (graded "truncated": no answer can follow): two different counts.
    pub length_limit_rate: f64,
    pub thinking_unclosed_rate: f64,
    pub no_answer_rate: f64,
    /// The row's weights were random (`--model random:NAME`): it carries no accuracy figure.
    pub random_weights: bool,
    /// Mean over samples of the most device memory in use (on a GPU).
    pub device_memory_peak_bytes: Option<f64>,
    /// Mean over samples (those with metrics; None when none has) of the per-sample peak (the most
    /// held at any moment), allocated capacity peak and time-averaged KV bytes, and the KV ratio in
    /// bytes: time-averaged bytes over a full cache's for the same tokens.
    pub kv_peak_bytes: Option<f64>,
    pub kv_capacity_peak_bytes: Option<f64>,
    pub kv_mean_bytes: Option<f64>,
    pub kv_ratio: Option<f64>,
    /// Mean over samples of the entries held per layer and cache head, time-averaged (the papers'
    /// measure of a budget), and whether a cache head is a query head (per-query-head storage: each
    /// entry then costs the GQA group's size in bytes, as the KV columns show).
    pub held_entries: Option<f64>,
    pub per_query_head: bool,
    /// Mean over samples of the peak bytes of policy side state (not in the KV figures).
    pub policy_state_peak_bytes: Option<f64>,
    pub events: Option<f64>,
    /// Aggregate decode tokens/s and end-to-end seconds (prefill plus decode shares), from the
    /// speed machine's records only; None when it has none in this row.
    pub decode_tokens_per_s: Option<f64>,
    /// How the cache stored keys and values (`f32`, `f16`, `bf16`).
    pub kv_type: String,
    /// The activations' type between operations (`f32`, or the weights' `bf16`/`f16`).
    pub activations: String,
    /// The batch sizes (sequences decoded together) of the speed records, ascending, joined by "/":
    /// aggregate speed depends on them, so rows of different batch sizes do not compare.
    pub batch: Option<String>,
    pub end_to_end_s: Option<f64>,
    /// Median time to first token (prefill), seconds.
    pub ttft_s: Option<f64>,
    /// The policy's work at prefill over prefill time, and its work while decoding over decode time.
    pub policy_prefill_share: Option<f64>,
    pub policy_decode_share: Option<f64>,
    /// Median over samples of each sample's median and 90th-percentile time per output token, seconds.
    pub tpot_p50_s: Option<f64>,
    pub tpot_p90_s: Option<f64>,
    /// Mean share of repeated 4-gram windows in the last 512 output tokens.
    pub repetition: Option<f64>,
    /// Teacher-forced fidelity against full, pooled over the steps of the samples that measured it:
    /// mean KL (nats), top-1 agreement, mean rank of full's token, and the median first divergence
    /// (a sample that never diverges counts its length).
    pub mean_kl: Option<f64>,
    pub top1_agreement: Option<f64>,
    pub mean_rank: Option<f64>,
    pub first_divergence: Option<f64>,
    /// Mean KL per bucket of positions (`fidelity_bucket` positions each), pooled over samples.
    #[serde(skip)]
    pub kl_by_position: Vec<f64>,
    #[serde(skip)]
    pub fidelity_bucket: usize,
}

/// Summary rows and the facts a reader needs to trust them.
pub struct Summary {
    pub rows: Vec<Row>,
    /// The machine whose records give the speed columns, and the other machines seen.
    pub speed_machine: Option<String>,
    pub other_machines: Vec<(String, usize)>,
    /// The engines that wrote the records, with their counts (`Engine::short`, device, batch).
    pub engines: Vec<(String, usize)>,
}

impl Summary {
    /// Models and datasets of the rows, for titles.
    pub fn subject(&self) -> String {
        if self.rows.is_empty() {
            return "no finished samples yet".into();
        }
        let mut models: Vec<&str> = self.rows.iter().map(|r| r.model.as_str()).collect();
        let mut data: Vec<std::borrow::Cow<'_, str>> = self
            .rows
            .iter()
            .map(|r| short_dataset(&r.dataset))
            .collect();
        models.sort();
        models.dedup();
        data.sort();
        data.dedup();
        format!("{} on {}", models.join(", "), data.join(", "))
    }
}

/// A record's data as rows group it: the dataset's name and content hash without the file's path
/// (`"math500, /path/math500.jsonl (sha256 …)"` → `"math500 (sha256 …)"`), so that one file read from
/// two places (another checkout, another machine) pools and pairs, and two revisions never do.
pub fn dataset_identity(source: &str) -> String {
    match (source.split_once(", "), source.rfind(" (sha256 ")) {
        (Some((name, _)), Some(at)) if at > name.len() => {
            format!("{}{}", short_dataset(source), &source[at..])
        }
        _ => source.to_string(),
    }
}

/// The dataset's name: the part of a record's source before the first comma. Records written before
/// a file of problems given without a problem set's name was named by its file (kvbench 0.5.0) call
/// it `builtin` (`"builtin, /path/f.jsonl (sha256 …)"`): read as the file's name, as written now
/// (`sweep::problems`), so that such records pool and pair with newer ones of the same file.
pub fn short_dataset(source: &str) -> std::borrow::Cow<'_, str> {
    let name = source.split(',').next().unwrap_or(source).trim();
    let old_file = source
        .strip_prefix("builtin, ")
        .zip(source.rfind(" (sha256 "))
        .map(|(rest, at)| &rest[..at.saturating_sub("builtin, ".len())]);
    match old_file.and_then(|path| crate::eval::dataset::file_label(std::path::Path::new(path))) {
        Some(file) => file.into(),
        None => name.into(),
    }
}

/// Groups records into rows, `full` first, then by policy name and budget.
pub fn summarize(records: &[SampleRecord]) -> Summary {
    let mut machines: HashMap<&str, usize> = HashMap::new();
    for r in records {
        if let Some(m) = &r.metrics {
            *machines.entry(m.machine.as_str()).or_default() += 1;
        }
    }
    let mut by_count: Vec<(String, usize)> = machines
        .into_iter()
        .map(|(m, n)| (m.to_string(), n))
        .collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let speed_machine = by_count.first().map(|(m, _)| m.clone());
    let other_machines = by_count.into_iter().skip(1).collect();

    type GroupKey = (String, String, String, String, String);
    let mut groups: BTreeMap<GroupKey, Vec<&SampleRecord>> = BTreeMap::new();
    for r in records {
        groups
            .entry((
                r.model.clone(),
                dataset_identity(&r.dataset),
                r.policy.clone(),
                kv_type_of(r),
                activations_of(r),
            ))
            .or_default()
            .push(r);
    }
    let groups: Vec<Vec<&SampleRecord>> = groups.into_values().collect();
    // The full records of each model and data, for the comparisons: the full cache of the finest
    // storage type there is (f32, the exact reference, where there are some; else 16 bits; ...), and
    // among those f32 activations (the exact arithmetic) where there are some, so that a row of a
    // coarser type or in 16-bit activations, full ones included, shows what they cost too. Among
    // types equally fine, the row's own, else the first.
    let mut fulls: HashMap<(String, String), Vec<&Vec<&SampleRecord>>> = HashMap::new();
    for rs in groups.iter().filter(|rs| is_full(rs[0])) {
        let key = (rs[0].model.clone(), dataset_identity(&rs[0].dataset));
        fulls.entry(key).or_default().push(rs);
    }
    let bits = |r: &SampleRecord| {
        let kv = kv_type_of(r)
            .parse::<KvType>()
            .map_or(0, KvType::nominal_bits);
        (kv, activations_of(r) == REFERENCE_ACTIVATIONS)
    };
    let full_for = |rs: &[&SampleRecord]| -> Option<&Vec<&SampleRecord>> {
        let candidates = fulls.get(&(rs[0].model.clone(), dataset_identity(&rs[0].dataset)))?;
        let finest = candidates.iter().map(|f| bits(f[0])).max()?;
        let finest: Vec<_> = candidates.iter().filter(|f| bits(f[0]) == finest).collect();
        let own = (kv_type_of(rs[0]), activations_of(rs[0]));
        finest
            .iter()
            .find(|f| (kv_type_of(f[0]), activations_of(f[0])) == own)
            .or_else(|| finest.first())
            .map(|f| **f)
    };
    let rows: Vec<Row> = groups
        .iter()
        .map(|rs| {
            let mut r = row(rs, speed_machine.as_deref());
            if let Some(full) = full_for(rs) {
                let p = paired(full, rs);
                r.shared_problems = Some(p.problems);
                // Random weights (either side: the model is one key of the pairing) carry no
                // accuracy, so no comparison of it; output lengths are still measured.
                let accuracy = !r.random_weights;
                r.accuracy_vs_full = (accuracy && p.full_pass > 0.0).then(|| p.pass / p.full_pass);
                // A full row compared with a full cache of another type: what its storage costs.
                if !is_full(rs[0]) || !std::ptr::eq(full, rs) {
                    r.tokens_change_vs_full = p.tokens_change.map(|i| i.estimate);
                    r.tokens_change_lo = p.tokens_change.map(|i| i.lo);
                    r.tokens_change_hi = p.tokens_change.map(|i| i.hi);
                    if accuracy {
                        r.delta_pass = p.delta_pass.map(|i| i.estimate);
                        r.delta_pass_lo = p.delta_pass.map(|i| i.lo);
                        r.delta_pass_hi = p.delta_pass.map(|i| i.hi);
                        r.only_full = Some(p.only_full);
                        r.only_policy = Some(p.only_policy);
                    }
                }
            }
            r
        })
        .collect();
    let mut rows = rows;
    rows.sort_by(|a, b| {
        (&a.model, &a.dataset, a.policy != "full", &a.policy)
            .cmp(&(&b.model, &b.dataset, b.policy != "full", &b.policy))
            .then(a.budget.unwrap_or(0.0).total_cmp(&b.budget.unwrap_or(0.0)))
            .then(a.config.cmp(&b.config))
            .then(a.kv_type.cmp(&b.kv_type))
            .then(a.activations.cmp(&b.activations))
    });
    // Which engines wrote the records (records before kvbench 0.5 name none).
    let mut engines: Vec<(String, usize)> = Vec::new();
    for r in records {
        let e = r.engine.as_ref().map_or_else(
            || "unrecorded (kvbench before 0.5)".to_string(),
            |e| format!("{}, {}, batch {}", e.short(), e.device, e.batch_size),
        );
        match engines.iter_mut().find(|(x, _)| *x == e) {
            Some((_, n)) => *n += 1,
            None => engines.push((e, 1)),
        }
    }
    Summary {
        rows,
        speed_machine,
        other_machines,
        engines,
    }
}

/// How a record's cache stored keys and values (`f32` for records that do not say).
pub fn kv_type_of(r: &SampleRecord) -> String {
    r.engine
        .as_ref()
        .map_or_else(|| KvType::F32.to_string(), |e| e.kv_type.clone())
}

/// The activations' type of records that do not say (written before the choice existed).
const REFERENCE_ACTIVATIONS: &str = "f32";

/// The type a record's activations were kept in between operations (`f32` for records that do
/// not say).
pub fn activations_of(r: &SampleRecord) -> String {
    r.engine
        .as_ref()
        .map_or_else(|| REFERENCE_ACTIVATIONS.into(), |e| e.activations.clone())
}

fn is_full(r: &SampleRecord) -> bool {
    r.policy_name == "full" || (r.policy_name.is_empty() && r.policy.starts_with("full"))
}

/// Samples grouped by problem, in first-seen order, for the accuracy figures.
pub fn per_problem(rs: &[&SampleRecord]) -> Vec<ProblemSamples> {
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut out: Vec<ProblemSamples> = Vec::new();
    for r in rs {
        let i = *index.entry(r.problem_id.as_str()).or_insert_with(|| {
            out.push(ProblemSamples {
                gold: r.gold.clone(),
                ..Default::default()
            });
            out.len() - 1
        });
        out[i].answers.push(r.extracted.clone());
        out[i].correct.push(r.correct);
    }
    out
}

fn row(rs: &[&SampleRecord], speed_machine: Option<&str>) -> Row {
    let first = rs[0];
    let per_problem = per_problem(rs);
    let acc = accuracy(&per_problem);
    let random = rs.iter().any(|r| r.random_weights);
    let n = rs.len() as f64;
    let mean = |f: &dyn Fn(&SampleRecord) -> f64| rs.iter().map(|r| f(r)).sum::<f64>() / n;
    // Metrics: averaged over the records that have them; missing when none has.
    let measured: Vec<&crate::results::sample::SampleMetrics> =
        rs.iter().filter_map(|r| r.metrics.as_ref()).collect();
    let metric = |f: &dyn Fn(&crate::results::sample::SampleMetrics) -> f64| {
        (!measured.is_empty())
            .then(|| measured.iter().map(|m| f(m)).sum::<f64>() / measured.len() as f64)
    };
    let kv_mean = metric(&|m| m.kv_bytes_mean);
    let kv_full_mean = metric(&|m| m.kv_bytes_full_mean);
    let capacities: Vec<f64> = measured
        .iter()
        .filter_map(|m| m.kv_bytes_capacity_peak.map(|c| c as f64))
        .collect();
    let speed: Vec<&crate::results::sample::SampleMetrics> = rs
        .iter()
        .filter_map(|r| r.metrics.as_ref())
        .filter(|m| Some(m.machine.as_str()) == speed_machine)
        .collect();
    let speed_tokens: f64 = rs
        .iter()
        .filter(|r| {
            r.metrics
                .as_ref()
                .is_some_and(|m| Some(m.machine.as_str()) == speed_machine)
        })
        .map(|r| r.tokens.saturating_sub(1) as f64)
        .sum();
    let decode_secs: f64 = speed.iter().map(|m| m.decode_share_secs).sum();
    // The policy's time split (records of kvbench 0.4 on): its prefill part over prefill time, its
    // decode part over decode time.
    let split: Vec<(f64, f64, f64, f64)> = speed
        .iter()
        .filter_map(|m| {
            m.policy_prefill_secs.map(|pre| {
                (
                    pre,
                    m.prefill_cost_secs(),
                    (m.policy_secs - pre).max(0.0),
                    m.decode_secs,
                )
            })
        })
        .collect();
    let sum4 = |f: fn(&(f64, f64, f64, f64)) -> f64| split.iter().map(f).sum::<f64>();
    let share = |num: f64, den: f64| (!split.is_empty() && den > 0.0).then(|| num / den);
    let ttfts: Vec<f64> = speed.iter().map(|m| m.prefill_secs).collect();
    let p50s: Vec<f64> = speed.iter().map(|m| m.tpot_p50_secs).collect();
    let p90s: Vec<f64> = speed.iter().map(|m| m.tpot_p90_secs).collect();
    let fid: Vec<&crate::generate::fidelity::Fidelity> =
        rs.iter().filter_map(|r| r.fidelity.as_ref()).collect();
    let pooled = crate::generate::fidelity::Pooled::of(&fid);
    // KL by position: per bucket, weighted by how many samples reached it.
    let buckets = fid
        .iter()
        .map(|f| f.kl_by_position.len())
        .max()
        .unwrap_or(0);
    let kl_by_position = (0..buckets)
        .map(|b| {
            let v: Vec<f64> = fid
                .iter()
                .filter_map(|f| f.kl_by_position.get(b).copied())
                .collect();
            v.iter().sum::<f64>() / v.len().max(1) as f64
        })
        .collect();
    Row {
        model: first.model.clone(),
        dataset: dataset_identity(&first.dataset),
        policy: if first.policy_name.is_empty() {
            first.policy.split_whitespace().next().unwrap_or("").into()
        } else {
            first.policy_name.clone()
        },
        budget: first.budget,
        budget_entries: rs.iter().find_map(|r| r.budget_entries),
        full_mean_tokens: rs.iter().find_map(|r| r.full_mean_tokens),
        config: first.policy.clone(),
        problems: per_problem.len(),
        samples: per_problem
            .iter()
            .map(|p| p.correct.len())
            .max()
            .unwrap_or(0),
        pass_at_1: (!random).then_some(acc.pass_at_1),
        stderr: (!random).then_some(acc.stderr),
        cons: per_problem
            .iter()
            .any(|p| p.correct.len() > 1 && !random)
            .then_some(acc.cons),
        shared_problems: None,
        accuracy_vs_full: None,
        delta_pass: None,
        delta_pass_lo: None,
        delta_pass_hi: None,
        only_full: None,
        only_policy: None,
        mean_tokens: mean(&|r| r.tokens as f64),
        tokens_change_vs_full: None,
        tokens_change_lo: None,
        tokens_change_hi: None,
        length_limit_rate: mean(&|r| f64::from(u8::from(r.finish == FinishReason::Length))),
        thinking_unclosed_rate: mean(&|r| f64::from(u8::from(r.verdict == Verdict::Truncated))),
        no_answer_rate: mean(&|r| f64::from(u8::from(r.verdict == Verdict::NoAnswer))),
        random_weights: random,
        device_memory_peak_bytes: {
            let v: Vec<f64> = measured
                .iter()
                .filter_map(|m| m.device_memory_peak_bytes.map(|b| b as f64))
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        },
        kv_peak_bytes: metric(&|m| m.kv_bytes_peak as f64),
        kv_capacity_peak_bytes: (!capacities.is_empty())
            .then(|| capacities.iter().sum::<f64>() / capacities.len() as f64),
        kv_mean_bytes: kv_mean,
        kv_ratio: kv_mean.zip(kv_full_mean).map(|(a, b)| a / b.max(1e-9)),
        held_entries: metric(&|m| m.entries_mean),
        per_query_head: first.policy.contains("per-query-head"),
        events: metric(&|m| m.events as f64),
        policy_state_peak_bytes: metric(&|m| m.policy_state_bytes_peak as f64),
        decode_tokens_per_s: (decode_secs > 0.0).then(|| speed_tokens / decode_secs),
        kv_type: kv_type_of(first),
        activations: activations_of(first),
        batch: {
            let sizes: std::collections::BTreeSet<usize> = speed.iter().map(|m| m.batch).collect();
            (!sizes.is_empty()).then(|| {
                sizes
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join("/")
            })
        },
        end_to_end_s: (!speed.is_empty()).then(|| {
            speed
                .iter()
                .map(|m| m.prefill_cost_secs() + m.decode_share_secs)
                .sum()
        }),
        ttft_s: crate::metrics::median(&ttfts),
        policy_prefill_share: share(sum4(|s| s.0), sum4(|s| s.1)),
        policy_decode_share: share(sum4(|s| s.2), sum4(|s| s.3)),
        tpot_p50_s: crate::metrics::median(&p50s),
        tpot_p90_s: crate::metrics::median(&p90s),
        repetition: metric(&|m| m.repetition),
        mean_kl: pooled.as_ref().map(|p| p.mean_kl),
        top1_agreement: pooled.as_ref().map(|p| p.top1_agreement),
        mean_rank: pooled.as_ref().map(|p| p.mean_rank),
        first_divergence: pooled.as_ref().and_then(|p| p.first_divergence_median),
        kl_by_position,
        fidelity_bucket: fid.first().map_or(0, |f| f.bucket),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::results::sample::SampleMetrics;

    /// A directory whose units all failed (or have not run) reports no rows under a title that says
    /// so, not "kvbench report:  on ".
    #[test]
    fn a_summary_of_no_samples_says_so() {
        let s = summarize(&[]);
        assert!(s.rows.is_empty());
        assert_eq!(s.subject(), "no finished samples yet");
    }

    pub(crate) fn record(
        policy: &str,
        problem: &str,
        correct: bool,
        tokens: usize,
        metrics: bool,
    ) -> SampleRecord {
        SampleRecord {
            problem_id: problem.into(),
            sample: 0,
            seed: 0,
            gold: "1".into(),
            output: String::new(),
            thinking: false,
            extracted: Some("1".into()),
            normalized_pred: None,
            normalized_gold: "1".into(),
            verdict: if correct {
                Verdict::Correct
            } else {
                Verdict::Incorrect
            },
            correct,
            grader: String::new(),
            lenient: false,
            tokens,
            finish: crate::generate::FinishReason::Eos,
            policy: policy.into(),
            prompt: String::new(),
            template_hash: String::new(),
            dataset: "d".into(),
            unit: format!("{policy}-{problem}"),
            policy_name: policy.into(),
            budget: (policy != "full").then_some(64.0),
            budget_entries: None,
            full_mean_tokens: None,
            model: "m".into(),
            metrics: metrics.then(|| SampleMetrics {
                prompt_tokens: 10,
                prefill_secs: 1.0,
                prefill_share_secs: None,
                decode_secs: 4.0,
                decode_share_secs: 4.0,
                batch: 1,
                policy_secs: 1.5,
                policy_prefill_secs: Some(0.5),
                kv_bytes_peak: 100,
                kv_bytes_capacity_peak: Some(128),
                kv_bytes_mean: 50.0,
                kv_bytes_full_peak: 200,
                kv_bytes_full_mean: 100.0,
                entries_mean: 1.0,
                entries_full_mean: 2.0,
                entries_peak: 2,
                events: 3,
                tpot_p50_secs: 0.1,
                tpot_p90_secs: 0.2,
                policy_state_bytes_peak: 0,
                repetition: 0.0,
                machine: "x".into(),
                device_memory_peak_bytes: None,
            }),
            fidelity: None,
            random_weights: false,
            engine: None,
        }
    }

    #[test]
    fn vs_full_uses_the_problems_both_rows_have_and_missing_metrics_stay_missing() {
        // Full solved a and b, failed c; the policy ran only a and c (an incomplete sweep), solving a.
        let records = vec![
            record("full", "a", true, 100, true),
            record("full", "b", true, 300, true),
            record("full", "c", false, 100, true),
            record("rkv", "a", true, 150, false),
            record("rkv", "c", false, 250, false),
        ];
        let s = summarize(&records);
        let rkv = s.rows.iter().find(|r| r.policy == "rkv").unwrap();
        // Over a and c: full 1/2, rkv 1/2 (not 0.5 / (2/3)); tokens 200 against 100.
        assert_eq!(rkv.shared_problems, Some(2));
        assert_eq!(rkv.accuracy_vs_full, Some(1.0));
        assert_eq!(rkv.tokens_change_vs_full, Some(1.0));
        // No record has metrics: nothing averages in as zero.
        assert_eq!(rkv.kv_peak_bytes, None);
        assert_eq!(rkv.kv_ratio, None);
        assert_eq!(rkv.policy_decode_share, None);
        let full = s.rows.iter().find(|r| r.policy == "full").unwrap();
        assert_eq!(full.kv_ratio, Some(0.5));
        assert_eq!(full.kv_capacity_peak_bytes, Some(128.0));
        // The policy's time split: 0.5 s of 1 s prefill, 1 s of 4 s decode.
        assert_eq!(full.policy_prefill_share, Some(0.5));
        assert_eq!(full.policy_decode_share, Some(0.25));
        let table = table::markdown(&s);
        assert!(table.contains("| 50.0 / 25.0 |"), "{table}");
    }

    /// Samples prefilled in one pass (off the CPU) each record the pass's time, their time to first
    /// token, and their share of it: the row's end-to-end time and the policy's prefill share count
    /// the shares, so that the pass is counted once, not once per sample.
    #[test]
    fn a_shared_prefill_pass_counts_once_in_end_to_end_time() {
        let mut records = vec![
            record("full", "a", true, 100, true),
            record("full", "b", true, 100, true),
        ];
        for r in &mut records {
            let m = r.metrics.as_mut().unwrap();
            // A 1 s pass, shared half and half; each sample's policy took 0.25 s of it.
            m.prefill_share_secs = Some(0.5);
            m.policy_prefill_secs = Some(0.25);
            m.policy_secs = 0.25 + 1.0;
        }
        let s = summarize(&records);
        let full = &s.rows[0];
        assert_eq!(full.ttft_s, Some(1.0));
        // (0.5 + 4) per sample, not (1 + 4).
        assert_eq!(full.end_to_end_s, Some(9.0));
        assert_eq!(full.policy_prefill_share, Some(0.5));
    }

    /// Rows in 16-bit activations are rows of their own, compared with the full cache in f32
    /// activations (the exact arithmetic) where there is one: a policy in bf16 and the bf16 full
    /// row both carry Δ against it.
    #[test]
    fn rows_in_sixteen_bit_activations_are_their_own_and_compared_with_f32_ones() {
        let in_activations = |mut r: SampleRecord, act: &str| {
            let engine = crate::results::sample::Engine::current(
                "cpu",
                "Auto".into(),
                1,
                crate::cache::KvType::F16,
                candle_core::DType::F32,
            );
            r.engine = Some(crate::results::sample::Engine {
                activations: act.into(),
                ..engine
            });
            r
        };
        let mut records = Vec::new();
        for i in 0..10 {
            let p = format!("p{i}");
            records.push(in_activations(record("full", &p, true, 100, false), "f32"));
            records.push(in_activations(
                record("full", &p, i > 0, 100, false),
                "bf16",
            ));
            records.push(in_activations(record("rkv", &p, i > 1, 100, false), "bf16"));
        }
        // Listed bf16 first: the reference is chosen by its arithmetic, not the order.
        records.reverse();
        let s = summarize(&records);
        let row = |policy: &str, act: &str| {
            s.rows
                .iter()
                .find(|r| r.policy == policy && r.activations == act)
                .unwrap_or_else(|| panic!("no {policy} row in {act}: {:?}", s.rows))
        };
        assert_eq!(s.rows.len(), 3);
        assert!(row("full", "f32").delta_pass.is_none());
        assert!((row("full", "bf16").delta_pass.unwrap() + 0.1).abs() < 1e-12);
        assert!((row("rkv", "bf16").delta_pass.unwrap() + 0.2).abs() < 1e-12);
        let table = table::markdown(&s);
        assert!(table.contains("| activations |"), "{table}");
    }

    #[test]
    fn paired_differences_carry_seeded_intervals_and_discordant_counts() {
        // 30 problems: full solves all; the policy loses the first 12 and is twice as long on each.
        let mut records = Vec::new();
        for i in 0..30 {
            let p = format!("p{i:02}");
            records.push(record("full", &p, true, 100, false));
            records.push(record("rkv", &p, i >= 12, 200, false));
            // A second policy loses one problem and wins none: no difference shown.
            records.push(record("h2o", &p, i != 0, 100, false));
        }
        let s = summarize(&records);
        let rkv = s.rows.iter().find(|r| r.policy == "rkv").unwrap();
        assert!((rkv.delta_pass.unwrap() + 0.4).abs() < 1e-12);
        assert!(rkv.delta_pass_hi.unwrap() < 0.0, "{rkv:?}");
        assert_eq!((rkv.only_full, rkv.only_policy), (Some(12), Some(0)));
        // Every problem doubled: the length change is exactly +100%, and so is its interval.
        assert_eq!(rkv.tokens_change_vs_full, Some(1.0));
        assert_eq!(
            (rkv.tokens_change_lo, rkv.tokens_change_hi),
            (Some(1.0), Some(1.0))
        );
        let h2o = s.rows.iter().find(|r| r.policy == "h2o").unwrap();
        assert!(h2o.delta_pass_lo.unwrap() < 0.0 && h2o.delta_pass_hi.unwrap() >= 0.0);
        let full = s.rows.iter().find(|r| r.policy == "full").unwrap();
        assert_eq!((full.delta_pass, full.only_full), (None, None));
        // The table marks the interval that contains 0 and only that one.
        let table = table::markdown(&s);
        let line = |name: &str| {
            table
                .lines()
                .find(|l| l.starts_with(&format!("| {name} |")))
                .unwrap()
                .to_string()
        };
        assert!(line("rkv").contains("| -40.0 ["), "{table}");
        assert!(!line("rkv").contains('≈'), "{table}");
        assert!(
            line("h2o").contains("| -3.3 [") && line("h2o").contains('≈'),
            "{table}"
        );
        assert!(line("rkv").contains("| 12 / 0 |"), "{table}");
        // The same records give the same report.
        assert_eq!(table::markdown(&summarize(&records)), table);
    }

    #[test]
    fn rows_of_different_batch_sizes_say_so_and_show_their_batch() {
        let mut records = vec![
            record("full", "a", true, 100, true),
            record("rkv", "a", true, 100, true),
        ];
        let table = table::markdown(&summarize(&records));
        assert!(!table.contains("different batch sizes"), "{table}");
        assert!(!table.contains("| batch |"), "{table}");
        let mut other = record("rkv", "b", true, 100, true);
        other.metrics.as_mut().unwrap().batch = 25;
        records.push(other);
        let s = summarize(&records);
        let rkv = s.rows.iter().find(|r| r.policy == "rkv").unwrap();
        assert_eq!(rkv.batch.as_deref(), Some("1/25"));
        let table = table::markdown(&s);
        assert!(table.contains("| batch |"), "{table}");
        assert!(table.contains("different batch sizes (1, 1/25;"), "{table}");
    }

    #[test]
    fn one_data_file_read_from_two_paths_pools_and_pairs_and_two_revisions_do_not() {
        let at = |r: &mut SampleRecord, source: &str| r.dataset = source.into();
        let mut full = record("full", "a", true, 100, true);
        at(&mut full, "math500, /a/math500.jsonl (sha256 00aa)");
        let mut rkv = record("rkv", "a", false, 100, true);
        at(&mut rkv, "math500, /elsewhere/m.jsonl (sha256 00aa)");
        let mut other = record("h2o", "a", false, 100, true);
        at(&mut other, "math500, /a/math500.jsonl (sha256 11bb)");
        let s = summarize(&[full, rkv, other]);
        let row = |p: &str| s.rows.iter().find(|r| r.policy == p).unwrap();
        assert_eq!(row("rkv").delta_pass, Some(-1.0));
        assert_eq!(row("rkv").dataset, "math500 (sha256 00aa)");
        assert_eq!(row("h2o").delta_pass, None);
        assert_eq!(
            dataset_identity("built-in set, seed 7"),
            "built-in set, seed 7"
        );
        // A file of problems as recorded before it was named by its file (kvbench 0.5.0), and now.
        assert_eq!(
            dataset_identity("builtin, /a/my, set.jsonl (sha256 00aa)"),
            "my  set.jsonl (sha256 00aa)"
        );
        assert_eq!(
            dataset_identity("my  set.jsonl, /b/my, set.jsonl (sha256 00aa)"),
            "my  set.jsonl (sha256 00aa)"
        );
        assert_eq!(
            short_dataset("builtin, /a/f.jsonl (sha256 00aa)"),
            "f.jsonl"
        );
        assert_eq!(short_dataset("built-in set, seed 7"), "built-in set");
    }
}
