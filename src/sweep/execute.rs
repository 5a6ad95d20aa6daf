//! Execution: runs work units of a plan on a loaded model and hands back one graded
//! [`SampleRecord`] per unit as its batch finishes. Units of one (policy, budget) are decoded together,
//! `batch_size` at a time; a batch that fails (an engine error) fails its units only, and the rest of
//! the plan goes on.

use super::plan::{Plan, WorkUnit};
use crate::error::Result;
use crate::generate::{generate_batch, Generation, Request, SamplingParams};
use crate::model::{Model, TraceEvent};
use crate::results::sample::{SampleMetrics, SampleRecord};
use std::collections::HashSet;

/// How to execute.
pub struct ExecOptions {
    pub batch_size: usize,
    /// Lenient answer extraction (never the default).
    pub lenient: bool,
    /// Units whose compression events are recorded.
    pub trace: HashSet<String>,
    /// Where the problems came from, for the records.
    pub dataset: String,
}

/// One finished unit.
pub struct UnitResult<'p> {
    pub unit: &'p WorkUnit,
    pub record: SampleRecord,
    pub trace: Option<Vec<TraceEvent>>,
}

/// A unit that did not finish, and why.
#[derive(Debug)]
pub struct Failure {
    pub unit: String,
    pub error: String,
}

/// Runs `units` (all from `plan`, in plan order) on `model`. `on_token` is called for every generated
/// token, `on_done` for every finished unit; an error from `on_done` (the results file cannot be
/// written) stops execution.
pub fn execute<'p>(
    model: &Model,
    plan: &'p Plan,
    units: &[&'p WorkUnit],
    opts: &ExecOptions,
    on_token: &mut dyn FnMut(),
    on_done: &mut dyn FnMut(UnitResult<'p>) -> Result<()>,
) -> Result<Vec<Failure>> {
    let machine = crate::metrics::machine();
    let mut failures = Vec::new();
    let batch = opts.batch_size.max(1);
    let mut rest = units;
    while let Some(first) = rest.first() {
        // The next run of units of one (policy, budget), at most a batch of them.
        let n = rest
            .iter()
            .take(batch)
            .take_while(|u| u.policy == first.policy)
            .count();
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let spec = &plan.specs[first.policy];
        let ctx = model.policy_context(spec, plan.decoding.max_new_tokens);
        let mut requests = Vec::with_capacity(chunk.len());
        for u in chunk {
            let text = plan
                .decoding
                .prompt
                .render(model.template, &plan.problems[u.problem].problem);
            requests.push(Request {
                prompt: model.tokenizer.encode(&text)?,
                sampling: SamplingParams {
                    temperature: plan.decoding.temperature,
                    top_p: plan.decoding.top_p,
                    seed: u.seed,
                },
                max_new_tokens: plan.decoding.max_new_tokens,
                policy: spec.build(&ctx),
                trace: opts.trace.contains(&u.id),
            });
        }
        let gens = match generate_batch(
            &model.transformer,
            requests,
            &model.tokenizer.eos_ids,
            &mut |_, _| on_token(),
        ) {
            Ok(g) => g,
            Err(e) => {
                failures.extend(chunk.iter().map(|u| Failure {
                    unit: u.id.clone(),
                    error: e.to_string(),
                }));
                continue;
            }
        };
        let batch_wall = gens
            .iter()
            .map(|g| g.decode_time.as_secs_f64())
            .fold(0.0, f64::max);
        let batch_tokens: usize = gens.iter().map(|g| g.tokens.len()).sum();
        for (u, mut g) in chunk.iter().copied().zip(gens) {
            let share = batch_wall * g.tokens.len() as f64 / batch_tokens.max(1) as f64;
            let record = record(model, plan, u, &g, share, chunk.len(), opts, &machine)?;
            on_done(UnitResult {
                unit: u,
                record,
                trace: g.trace.take(),
            })?;
        }
    }
    Ok(failures)
}

/// The graded record of one generation.
#[allow(clippy::too_many_arguments)]
fn record(
    model: &Model,
    plan: &Plan,
    u: &WorkUnit,
    g: &Generation,
    decode_share_secs: f64,
    batch: usize,
    opts: &ExecOptions,
    machine: &str,
) -> Result<SampleRecord> {
    let spec = &plan.specs[u.policy];
    let problem = &plan.problems[u.problem];
    let c = &g.cache;
    let mut r = SampleRecord {
        problem_id: problem.id.clone(),
        sample: u.sample,
        seed: u.seed,
        gold: problem.answer.clone(),
        output: model.tokenizer.decode(&g.tokens)?,
        thinking: model.template.opens_thinking(),
        extracted: None,
        normalized_pred: None,
        normalized_gold: String::new(),
        verdict: crate::eval::grade::Verdict::NoAnswer,
        correct: false,
        grader: String::new(),
        lenient: false,
        tokens: g.tokens.len(),
        finish: g.finish,
        policy: spec.describe(),
        prompt: format!("{:?}", plan.decoding.prompt),
        template_hash: plan.decoding.prompt.template_hash(model.template),
        dataset: opts.dataset.clone(),
        unit: u.id.clone(),
        policy_name: spec.name().to_string(),
        budget: (spec.name() != "full").then(|| spec.budget().value()),
        model: model.name.clone(),
        metrics: Some(SampleMetrics {
            prompt_tokens: g.prompt_tokens,
            prefill_secs: g.prefill_time.as_secs_f64(),
            decode_secs: g.decode_time.as_secs_f64(),
            decode_share_secs,
            batch,
            policy_secs: g.policy_time.as_secs_f64(),
            kv_bytes_peak: g.kv_bytes_peak,
            kv_bytes_mean: g.kv_bytes_mean,
            kv_bytes_full_peak: g.kv_bytes_full,
            kv_bytes_full_mean: g.kv_bytes_full_mean,
            entries_mean: c.mean_entries(),
            entries_full_mean: c.full_mean_entries,
            entries_peak: c.max_peak(),
            events: c.events(),
            machine: machine.to_string(),
        }),
    };
    r.grade(opts.lenient);
    Ok(r)
}
