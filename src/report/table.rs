//! Summary tables: Markdown for the terminal, CSV and JSON for other tools. The three carry the same
//! rows; CSV and JSON keep full precision and raw units (bytes, seconds, fractions).

use super::{Row, Summary};
use crate::error::{Error, Result};
use std::fmt::Write;

const MIB: f64 = (1 << 20) as f64;

fn pct(x: f64) -> String {
    format!("{:.1}", 100.0 * x)
}

fn opt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map_or_else(|| "-".into(), f)
}

/// A paired difference (a fraction) with its 95% interval, in hundredths (percentage points, or
/// percent with `unit` "%"), marked `≈` when the interval contains 0.
fn interval(estimate: Option<f64>, lo: Option<f64>, hi: Option<f64>, unit: &str) -> String {
    match (estimate, lo, hi) {
        (Some(e), Some(lo), Some(hi)) => {
            let mark = if lo <= 0.0 && hi >= 0.0 { " ≈" } else { "" };
            format!(
                "{:+.1}{unit} [{:+.1}, {:+.1}]{mark}",
                100.0 * e,
                100.0 * lo,
                100.0 * hi
            )
        }
        (Some(e), ..) => format!("{:+.1}{unit}", 100.0 * e),
        _ => "-".into(),
    }
}

/// Label of a row's policy: the name, with its parameters when they are not the defaults the table
/// shows elsewhere (the full description is in CSV and JSON).
fn budget_label(r: &Row) -> String {
    match (r.budget, r.budget_entries, r.full_mean_tokens) {
        (None, ..) => "-".into(),
        (Some(b), Some(entries), Some(mean)) if b <= 1.0 => {
            format!("{b} (B = {entries}, full mean {mean:.0})")
        }
        (Some(b), None, Some(mean)) => format!("{b} (full mean {mean:.0})"),
        (Some(b), ..) => format!("{b}"),
    }
}

/// The distinct batch sizes of the rows, when there is more than one.
fn mixed_batches(s: &Summary) -> Option<Vec<String>> {
    let mut sizes: Vec<String> = s.rows.iter().filter_map(|r| r.batch.clone()).collect();
    sizes.sort();
    sizes.dedup();
    (sizes.len() > 1).then_some(sizes)
}

/// The Markdown table, with a line under it on how to read it.
pub fn markdown(s: &Summary) -> String {
    let mut out = String::new();
    let many_subjects = s
        .rows
        .windows(2)
        .any(|w| w[0].model != w[1].model || w[0].dataset != w[1].dataset);
    let any_cons = s.rows.iter().any(|r| r.cons.is_some());
    let any_fidelity = s.rows.iter().any(|r| r.mean_kl.is_some());
    let any_device = s.rows.iter().any(|r| r.device_memory_peak_bytes.is_some());
    let batches = mixed_batches(s);
    // A column when rows differ in how their caches stored entries; one line below the table otherwise.
    let any_kv_type = s.rows.iter().any(|r| r.kv_type != s.rows[0].kv_type);
    let any_activations = s
        .rows
        .iter()
        .any(|r| r.activations != s.rows[0].activations);
    let mut head = vec![
        "policy",
        "budget",
        "problems × samples",
        "pass@1 % ± se",
        "vs full",
        "Δ pass@1 vs full, points [95% CI]",
        "only full / only policy",
    ];
    if any_cons {
        head.push("cons@n %");
    }
    head.extend([
        "tokens",
        "Δ tokens vs full [95% CI]",
        "at length limit %",
        "thinking unclosed %",
        "repeated 4-grams %",
        "held entries",
        "KV peak MiB",
        "KV mean MiB",
        "KV ratio",
        "policy state KiB",
        "events",
    ]);
    if batches.is_some() {
        head.push("batch");
    }
    head.extend([
        "decode tok/s",
        "ms/token p50 / p90",
        "end-to-end s",
        "policy time % prefill / decode",
    ]);
    if any_device {
        head.push("device peak GiB");
    }
    if any_fidelity {
        head.extend(["KL from full", "top-1 agree %", "first divergence"]);
    }
    if any_activations {
        head.insert(2, "activations");
    }
    if any_kv_type {
        head.insert(2, "KV type");
    }
    if many_subjects {
        head.insert(0, "model / data");
    }
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(
        out,
        "|{}",
        head.iter()
            .enumerate()
            .map(|(i, _)| {
                if i < 2
                    + usize::from(many_subjects)
                    + usize::from(any_kv_type)
                    + usize::from(any_activations)
                {
                    "---|"
                } else {
                    "---:|"
                }
            })
            .collect::<String>()
    );
    for r in &s.rows {
        let mut cells = vec![
            r.policy.clone(),
            budget_label(r),
            format!("{} × {}", r.problems, r.samples),
            match (r.pass_at_1, r.stderr) {
                (Some(p), Some(se)) => format!("{} ± {}", pct(p), pct(se)),
                _ if r.random_weights => "n/a (random weights)".into(),
                _ => "-".into(),
            },
            opt(r.accuracy_vs_full, |x| format!("{x:.2}")),
            interval(r.delta_pass, r.delta_pass_lo, r.delta_pass_hi, ""),
            match (r.only_full, r.only_policy) {
                (Some(a), Some(b)) => format!("{a} / {b}"),
                _ => "-".into(),
            },
        ];
        if any_activations {
            cells.insert(2, r.activations.clone());
        }
        if any_kv_type {
            cells.insert(2, r.kv_type.clone());
        }
        if any_cons {
            cells.push(opt(r.cons, pct));
        }
        cells.extend([
            format!("{:.0}", r.mean_tokens),
            interval(
                r.tokens_change_vs_full,
                r.tokens_change_lo,
                r.tokens_change_hi,
                "%",
            ),
            pct(r.length_limit_rate),
            pct(r.thinking_unclosed_rate),
            opt(r.repetition, pct),
            opt(r.held_entries, |x| {
                if r.per_query_head {
                    format!("{x:.0} per query head")
                } else {
                    format!("{x:.0}")
                }
            }),
            opt(r.kv_peak_bytes, |x| format!("{:.2}", x / MIB)),
            opt(r.kv_mean_bytes, |x| format!("{:.2}", x / MIB)),
            opt(r.kv_ratio, |x| format!("{x:.3}")),
            opt(r.policy_state_peak_bytes, |x| format!("{:.1}", x / 1024.0)),
            opt(r.events, |x| format!("{x:.1}")),
        ]);
        if batches.is_some() {
            cells.push(r.batch.clone().unwrap_or_else(|| "-".into()));
        }
        cells.extend([
            opt(r.decode_tokens_per_s, |x| format!("{x:.1}")),
            match (r.tpot_p50_s, r.tpot_p90_s) {
                (Some(a), Some(b)) => format!("{:.1} / {:.1}", 1e3 * a, 1e3 * b),
                _ => "-".into(),
            },
            opt(r.end_to_end_s, |x| format!("{x:.1}")),
            match (r.policy_prefill_share, r.policy_decode_share) {
                (Some(a), Some(b)) => format!("{} / {}", pct(a), pct(b)),
                _ => "-".into(),
            },
        ]);
        if any_device {
            cells.push(opt(r.device_memory_peak_bytes, |x| {
                format!("{:.2}", x / (1u64 << 30) as f64)
            }));
        }
        if any_fidelity {
            cells.extend([
                opt(r.mean_kl, |x| format!("{x:.4}")),
                opt(r.top1_agreement, pct),
                opt(r.first_divergence, |x| format!("{x:.0}")),
            ]);
        }
        if many_subjects {
            cells.insert(
                0,
                format!("{} / {}", r.model, super::short_dataset(&r.dataset)),
            );
        }
        // Cells come from records (model names, ids, parameters): one row per record, whatever
        // they hold.
        let row = cells.join(" | ").replace('\n', " ");
        let _ = writeln!(out, "| {} |", crate::error::cell(&row));
    }
    let _ = writeln!(
        out,
        "\nbudget: above 1 entries per layer and KV head; at most 1 a ratio, B = ratio × the full run's \
         mean generation length (shown). pass@1: mean over samples, ± standard error across problems; \
         vs full (pass@1 over full's), Δ pass@1 and Δ tokens: over the problems both rows have, \
         paired by problem, with 95% paired bootstrap intervals (10,000 seeded resamples of the \
         problems); ≈ marks an interval that contains 0 (no difference shown). Only full / only \
         policy: problems where that side's pass@1 is higher (with one sample: only it solved). Held entries: \
         per layer and cache head, time-averaged (a cache head is a query head under per-query-head \
         storage, each entry then costing the GQA group's size). KV: bytes held per sequence (peak: \
         the most at any moment; mean: time-averaged), ratio = time-averaged bytes over a full \
         cache's for the same tokens. Policy time: its prefill work over prefill time / its decode \
         work over decode time. Speeds: aggregate decode tokens/s over each row's batches; \
         ms/token: median over samples of each sample's median and 90th-percentile decode step time. \
         Fidelity (when measured): teacher-forced KL(full ‖ policy) in nats and top-1 agreement \
         pooled over steps; first divergence: median output position where the policy's top-1 \
         token first differs from full's (a greedy run leaves full's output there). At length limit: \
         samples that stopped at max_new_tokens; thinking unclosed: samples whose thinking block \
         never closed (graded truncated)."
    );
    if any_kv_type {
        let _ = writeln!(
            out,
            "KV type: how the cache stored keys and values (f32 the exact reference; f16, bf16 converted, q8_0, \
             q4_0, kivi2, kivi4 quantized when appended; KEYS/VALUES when they differ); every row, full ones included, \
             is compared with the full cache of the finest type the report has (f32 where there is one), so Δ \
             includes what the storage costs, and KV bytes are those of the row's own type"
        );
    } else if let Some(r) = s.rows.first() {
        let _ = writeln!(
            out,
            "KV type: every row's cache stored keys and values as {}",
            r.kv_type
        );
    }
    if any_activations {
        let _ = writeln!(
            out,
            "activations: their type between the forward pass's operations (f32 the exact arithmetic; bf16 or \
             f16, the weights' own, as GPU engines keep them); every row is compared with a full cache in f32 \
             activations where the report has one, so Δ includes what 16-bit activations cost"
        );
    } else if let Some(r) = s.rows.first().filter(|r| r.activations != "f32") {
        let _ = writeln!(
            out,
            "activations: every row kept them in {} between operations (the weights' own type; f32 is the exact arithmetic)",
            r.activations
        );
    }
    if s.rows.iter().any(|r| r.random_weights) {
        let _ = writeln!(
            out,
            "random weights (`random:NAME` models): those rows measure speed and memory only; their outputs are noise and carry no accuracy"
        );
    }
    if s.engines.len() > 1 {
        let list: Vec<String> = s
            .engines
            .iter()
            .map(|(e, n)| format!("{e} ({n} samples)"))
            .collect();
        let _ = writeln!(
            out,
            "these records come from {} engines (kvbench version@commit, device, batch size): {}; outputs of one problem may differ between engines",
            s.engines.len(),
            list.join("; ")
        );
    }
    if let Some(m) = &s.speed_machine {
        let _ = writeln!(out, "speed machine: {m}");
    }
    if let Some(sizes) = batches {
        let _ = writeln!(
            out,
            "rows were decoded at different batch sizes ({}; the batch column): aggregate decode tokens/s and \
             ms/token compare only between rows of the same batch size",
            sizes.join(", ")
        );
    }
    if !s.other_machines.is_empty() {
        let others: Vec<String> = s
            .other_machines
            .iter()
            .map(|(m, n)| format!("{m} ({n} samples)"))
            .collect();
        let _ = writeln!(
            out,
            "records from other machines are left out of the speed columns (speeds are pooled only across identical machines): {}",
            others.join("; ")
        );
    }
    out
}

/// The rows as CSV (one header line, raw units).
pub fn csv(s: &Summary) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in &s.rows {
        w.serialize(r).map_err(|e| Error::Input(e.to_string()))?;
    }
    let bytes = w.into_inner().map_err(|e| Error::Input(e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| Error::Input(e.to_string()))
}

/// The rows and machines as pretty JSON.
pub fn json(s: &Summary) -> Result<String> {
    serde_json::to_string_pretty(&serde_json::json!({
        "rows": s.rows,
        "speed_machine": s.speed_machine,
        "other_machines": s.other_machines,
        "engines": s.engines,
    }))
    .map_err(|e| Error::Input(e.to_string()))
}
