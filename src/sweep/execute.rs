//! Execution: runs work units of a plan on a loaded model and hands back one graded
//! [`SampleRecord`] per unit as its batch finishes. Units of one (policy, budget) are decoded together,
//! `batch_size` at a time; a batch that fails (an engine error) fails its units only, and the rest of
//! the plan goes on.

use super::plan::{Plan, WorkUnit};
use crate::error::Result;
use crate::generate::fidelity::teacher_forced;
use crate::generate::{generate_batch, Generation, Request, SamplingParams};
use crate::metrics::divergence::repetition;
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
    /// Measure teacher-forced fidelity against full for every unit of a compressing policy.
    pub fidelity: bool,
}

/// Positions per bucket of the stored fidelity-by-position curves.
pub const FIDELITY_BUCKET: usize = 64;

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

/// Bytes of problem text allowed per token of the model's context: no tokenizer makes fewer than one
/// token of 64 bytes, so a longer text cannot fit and is refused before it is tokenized (a 200 MB
/// problem would otherwise take gigabytes inside the tokenizer).
const MAX_BYTES_PER_TOKEN: usize = 64;

/// Checks, before anything runs, that every problem's prompt plus `max_new_tokens` fits the model's
/// context; the error names the problem and both numbers.
pub fn check_context(model: &Model, plan: &Plan) -> Result<()> {
    let context = model.transformer.config.max_position_embeddings;
    let max_new = plan.decoding.max_new_tokens;
    if max_new >= context {
        return Err(crate::Error::Input(format!(
            "max_new_tokens {max_new} does not fit the model's context of {context} tokens (with any prompt)"
        )));
    }
    for p in &plan.problems {
        let text = plan.decoding.prompt.render(model.template, &p.problem);
        if text.len() > context.saturating_mul(MAX_BYTES_PER_TOKEN) {
            return Err(crate::Error::Input(format!(
                "problem '{}' is {} bytes long: more than the model's context of {context} tokens can hold",
                p.id,
                text.len()
            )));
        }
        let prompt = model.tokenizer.encode(&text)?.len();
        if prompt + max_new > context {
            return Err(crate::Error::Input(format!(
                "problem '{}': a prompt of {prompt} tokens plus max_new_tokens {max_new} is {} tokens, more than the model's context of {context}",
                p.id,
                prompt + max_new
            )));
        }
    }
    Ok(())
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
        let mut prompts = Vec::with_capacity(chunk.len());
        let sampling = |u: &WorkUnit| SamplingParams {
            temperature: plan.decoding.temperature,
            top_p: plan.decoding.top_p,
            seed: u.seed,
        };
        for u in chunk {
            let text = plan
                .decoding
                .prompt
                .render(model.template, &plan.problems[u.problem].problem);
            let prompt = model.tokenizer.encode(&text)?;
            prompts.push(prompt.clone());
            requests.push(Request {
                prompt,
                sampling: sampling(u),
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
        for ((u, mut g), prompt) in chunk.iter().copied().zip(gens).zip(&prompts) {
            let share = batch_wall * g.tokens.len() as f64 / batch_tokens.max(1) as f64;
            let mut record = record(model, plan, u, &g, share, chunk.len(), opts, &machine)?;
            if opts.fidelity && spec.name() != "full" {
                match teacher_forced(
                    &model.transformer,
                    prompt,
                    spec.build(&ctx),
                    sampling(u),
                    plan.decoding.max_new_tokens,
                    &model.tokenizer.eos_ids,
                    FIDELITY_BUCKET,
                ) {
                    Ok(f) => record.fidelity = Some(f),
                    Err(e) => {
                        failures.push(Failure {
                            unit: u.id.clone(),
                            error: format!("fidelity: {e}"),
                        });
                        continue;
                    }
                }
            }
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
            tpot_p50_secs: percentile_f32(&g.step_secs, 50.0),
            tpot_p90_secs: percentile_f32(&g.step_secs, 90.0),
            repetition: repetition(&g.tokens, 4, 512),
            policy_state_bytes_peak: g.policy_state_bytes_peak,
            machine: machine.to_string(),
        }),
        fidelity: None,
    };
    r.grade(opts.lenient);
    Ok(r)
}

fn percentile_f32(xs: &[f32], p: f64) -> f64 {
    let v: Vec<f64> = xs.iter().map(|&x| f64::from(x)).collect();
    crate::metrics::percentile(&v, p).unwrap_or(0.0)
}
