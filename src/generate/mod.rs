//! Generation: prefill the sequences (one a pass on the CPU, several a pass elsewhere), then decode
//! all of them together, one token per sequence per step, until each meets an end-of-sequence token
//! or its token limit.
//!
//! Batching is across sequences with their own caches and lengths: the projections and MLP of all
//! active sequences run as one matrix product; attention runs per sequence on the CPU and for the
//! whole batch at once over pooled caches elsewhere (`cache::pool`). For greedy decoding a batch gives
//! the same tokens as running each sequence alone (a test checks it on f32 weights). Copies of one
//! request can share its prefill ([`generate_copies`]).

pub mod device_greedy;
pub mod fidelity;
pub mod sampler;

use crate::error::Result;
use crate::model::{SeqInput, SeqState, Transformer};
use crate::policy::Policy;
pub use sampler::{Sampler, SamplingParams};
use std::time::{Duration, Instant};

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token was produced (it is not part of the output).
    Eos,
    /// The max-new-tokens limit was reached.
    Length,
}

/// One sequence to generate.
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_new_tokens: usize,
    pub policy: Box<dyn Policy>,
    /// Record every compression event (`--trace`).
    pub trace: bool,
    /// How this sequence's cache stores keys and values (`None`: the model's type).
    pub kv_type: Option<crate::cache::KvType>,
}

/// What one sequence produced, with its timings and cache figures.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    /// Wall time of the pass that prefilled this sequence (with others, off the CPU: see
    /// [`Transformer::set_prefill_batch_tokens`]); its first token is drawn right after.
    pub prefill_time: Duration,
    /// This sequence's share of that pass by prompt tokens (its whole time when it went alone): the
    /// shares of a pass add up to its wall time, so prompt tokens over summed shares is the
    /// throughput.
    #[serde(default)]
    pub prefill_share: Duration,
    /// Wall time from the end of prefill to this sequence's last token (shared with the batch).
    pub decode_time: Duration,
    /// Time spent inside the policy's hooks, all of it and at prefill (the rest is decode's).
    pub policy_time: Duration,
    #[serde(default)]
    pub policy_prefill_time: Duration,
    pub cache: crate::cache::CacheStats,
    /// KV bytes held at the end, and the most held at any moment (inside steps too).
    pub kv_bytes_final: usize,
    pub kv_bytes_peak: usize,
    /// Bytes decode steps read for attention (every entry, or a sparse policy's choice and what it
    /// read to choose).
    #[serde(default)]
    pub decode_bytes_read: u64,
    /// The most bytes of KV buffers allocated (capacity: buffers double and never shrink).
    #[serde(default)]
    pub kv_bytes_capacity_peak: usize,
    /// KV bytes a full cache would hold at the end (the peak of the full cache).
    pub kv_bytes_full: usize,
    /// KV bytes held, averaged over forward steps (prefill included), and the same for a full cache.
    pub kv_bytes_mean: f64,
    pub kv_bytes_full_mean: f64,
    /// The most bytes of policy side state held after a step (`SeqState::side_state_bytes`).
    #[serde(default)]
    pub policy_state_bytes_peak: usize,
    /// Wall time of each decode step this sequence took part in (shared with its batch), seconds.
    #[serde(default)]
    pub step_secs: Vec<f32>,
    /// Compression events with the positions kept, when traced.
    #[serde(skip)]
    pub trace: Option<Vec<crate::model::TraceEvent>>,
    /// The most device memory in use after any step, on a GPU (shared with the batch).
    #[serde(default)]
    pub device_memory_peak: Option<u64>,
    /// Copies to the host from the end of prefill to the batch's last token (`crate::host_copy`,
    /// counted process-wide: exact when nothing else generates meanwhile, as in `perf`), and the
    /// decoding steps they span (shared with the batch).
    #[serde(skip)]
    pub decode_host_copies: (crate::host_copy::Copies, usize),
}

/// Per-step callback: `(sequence index, token)`.
pub type OnToken<'a> = dyn FnMut(usize, u32) + 'a;

/// Generates all requests, decoding those still active together. `eos` lists end tokens.
pub fn generate_batch(
    model: &Transformer,
    requests: Vec<Request>,
    eos: &[u32],
    on_token: &mut OnToken<'_>,
) -> Result<Vec<Generation>> {
    generate(model, requests, false, eos, on_token)
}

/// Like [`generate_batch`] for requests that are copies of one another (the same prompt, storage
/// type and policy specification: the caller's promise; prompts and types are checked; sampling may
/// differ): the first is prefilled, and the others start from a copy of its state after prefill
/// (cache copied, policy forked), each drawing its first token from the same logits with its own
/// sampler. Every copy reports the shared prefill's time. Where the policy cannot be forked each
/// request is prefilled. For measuring decoding at large batches (`kvbench perf`), where prefilling
/// every copy of a long prompt took minutes.
pub fn generate_copies(
    model: &Transformer,
    requests: Vec<Request>,
    eos: &[u32],
    on_token: &mut OnToken<'_>,
) -> Result<Vec<Generation>> {
    if let Some(first) = requests.first() {
        if requests
            .iter()
            .any(|r| r.prompt != first.prompt || r.kv_type != first.kv_type)
        {
            return Err(crate::Error::Input(
                "generate_copies: the requests' prompts or storage types differ".into(),
            ));
        }
    }
    generate(model, requests, true, eos, on_token)
}

fn generate(
    model: &Transformer,
    requests: Vec<Request>,
    share_prefill: bool,
    eos: &[u32],
    on_token: &mut OnToken<'_>,
) -> Result<Vec<Generation>> {
    struct Active {
        state: SeqState,
        sampler: Sampler,
        out: Vec<u32>,
        max_new: usize,
        finish: Option<FinishReason>,
        next: u32,
        prefill_time: Duration,
        prefill_share: Duration,
        policy_prefill_time: Duration,
        decode_start: Instant,
        decode_time: Duration,
        /// Sum of bytes held after each forward step, and the number of steps.
        bytes_steps: (f64, usize),
        /// Sum of the bytes a full cache of the same type would hold after each step.
        full_bytes_steps: f64,
        step_secs: Vec<f32>,
        side_peak: usize,
    }
    let mut device_memory = crate::device::PeakMemory::default();
    let prefilled = prefill_all(model, requests, share_prefill, &mut device_memory)?;
    let mut seqs: Vec<Active> = Vec::with_capacity(prefilled.len());
    for (i, pre) in prefilled.into_iter().enumerate() {
        let Prefilled {
            state,
            sampler,
            next,
            time: prefill_time,
            share: prefill_share,
            max_new_tokens,
        } = pre;
        let held = state.cache.bytes();
        let full_held = model
            .config
            .kv_bytes(state.cache.kv_type(), state.cache.seen());
        let policy_prefill_time = state.policy_time;
        let mut a = Active {
            state,
            sampler,
            out: Vec::new(),
            max_new: max_new_tokens,
            finish: None,
            next,
            prefill_time,
            prefill_share,
            policy_prefill_time,
            decode_start: Instant::now(),
            decode_time: Duration::ZERO,
            bytes_steps: (held as f64, 1),
            full_bytes_steps: full_held as f64,
            step_secs: Vec::new(),
            side_peak: 0,
        };
        a.side_peak = a.state.side_state_bytes();
        if accept(&mut a.out, &mut a.finish, next, a.max_new, eos) {
            on_token(i, next);
        }
        seqs.push(a);
    }
    /// Records a sampled token; returns whether it became part of the output.
    fn accept(
        out: &mut Vec<u32>,
        finish: &mut Option<FinishReason>,
        tok: u32,
        max_new: usize,
        eos: &[u32],
    ) -> bool {
        if max_new == 0 {
            *finish = Some(FinishReason::Length);
            return false;
        }
        if eos.contains(&tok) {
            *finish = Some(FinishReason::Eos);
            return false;
        }
        out.push(tok);
        if out.len() >= max_new {
            *finish = Some(FinishReason::Length);
        }
        true
    }
    /// Each active sequence's next token, in order. A draw at a temperature costs about 0.7 ms over a
    /// 152k vocabulary (an exp per id), so several run in parallel; greedy draws (microseconds) stay
    /// on this thread, where a wake-up of the pool would cost more than they do.
    fn draw_all(seqs: &mut [Active], logits: &[Vec<f32>]) -> Vec<Result<u32>> {
        let mut samplers: Vec<&mut Sampler> = seqs
            .iter_mut()
            .filter(|s| s.finish.is_none())
            .map(|s| &mut s.sampler)
            .collect();
        if samplers.len() > 1 && samplers.iter().any(|s| !s.is_greedy()) {
            use rayon::prelude::*;
            samplers
                .par_iter_mut()
                .zip(logits.par_iter())
                .map(|(s, l)| s.sample(l))
                .collect()
        } else {
            samplers
                .iter_mut()
                .zip(logits)
                .map(|(s, l)| s.sample(l))
                .collect()
        }
    }
    let greedy_on_device = model.greedy_on_device();
    let decode_start = Instant::now();
    for s in seqs.iter_mut() {
        s.decode_start = decode_start;
    }
    let (copies_before, mut steps) = (crate::host_copy::counted(), 0usize);
    loop {
        let active: Vec<usize> = (0..seqs.len())
            .filter(|&i| seqs[i].finish.is_none())
            .collect();
        if active.is_empty() {
            break;
        }
        let step_start = Instant::now();
        let toks: Vec<[u32; 1]> = active.iter().map(|&i| [seqs[i].next]).collect();
        let logits = {
            let mut inputs: Vec<SeqInput<'_>> = Vec::with_capacity(active.len());
            let mut rest: &mut [Active] = &mut seqs;
            let mut base = 0;
            for (k, &i) in active.iter().enumerate() {
                let (_, tail) = rest.split_at_mut(i - base);
                let (one, tail) = tail.split_at_mut(1);
                inputs.push(SeqInput {
                    tokens: &toks[k],
                    state: &mut one[0].state,
                });
                rest = tail;
                base = i + 1;
            }
            model.forward(&mut inputs)?
        };
        // Greedy sequences off the CPU's loop have their tokens chosen on the device (only the ids
        // are copied); otherwise, or where a logit is not finite, the logits come to the host.
        enum Choice {
            Tokens(Vec<u32>),
            Logits(Vec<Vec<f32>>),
        }
        let all_greedy = active.iter().all(|&i| seqs[i].sampler.is_greedy());
        let choice = match all_greedy && greedy_on_device {
            true => device_greedy::greedy_tokens(&logits)?.map(Choice::Tokens),
            false => None,
        };
        let choice = match choice {
            Some(c) => c,
            None => Choice::Logits(crate::host_copy::rows::<f32>(&logits)?),
        };
        let step = step_start.elapsed().as_secs_f32();
        steps += 1;
        device_memory.sample(model.device());
        let mut drawn = match choice {
            Choice::Tokens(tokens) => tokens.into_iter().map(Ok).collect(),
            Choice::Logits(l) => draw_all(&mut seqs, &l),
        }
        .into_iter();
        for &i in &active {
            seqs[i].step_secs.push(step);
            let s = &mut seqs[i];
            let bytes = s.state.cache.bytes();
            s.bytes_steps.0 += bytes as f64;
            s.bytes_steps.1 += 1;
            s.full_bytes_steps += model
                .config
                .kv_bytes(s.state.cache.kv_type(), s.state.cache.seen())
                as f64;
            s.side_peak = s.side_peak.max(s.state.side_state_bytes());
            let tok = drawn.next().expect("one draw per active sequence")?;
            s.next = tok;
            if accept(&mut s.out, &mut s.finish, tok, s.max_new, eos) {
                on_token(i, tok);
            }
            if s.finish.is_some() {
                s.decode_time = s.decode_start.elapsed();
            }
        }
    }
    let decode_host_copies = (crate::host_copy::counted() - copies_before, steps);
    Ok(seqs
        .into_iter()
        .map(|mut s| {
            let stats = s.state.cache.stats();
            // A full cache of the sequence's own storage type: a KV ratio is eviction's saving.
            let kv_type = s.state.cache.kv_type();
            Generation {
                prompt_tokens: s.state.prompt_len,
                tokens: s.out,
                finish: s.finish.unwrap_or(FinishReason::Length),
                prefill_time: s.prefill_time,
                prefill_share: s.prefill_share,
                decode_time: s.decode_time,
                policy_time: s.state.policy_time,
                policy_prefill_time: s.policy_prefill_time,
                decode_bytes_read: s.state.decode_bytes_read,
                kv_bytes_final: s.state.cache.bytes(),
                kv_bytes_peak: s.state.cache.peak_bytes(),
                kv_bytes_capacity_peak: s.state.cache.peak_capacity_bytes(),
                kv_bytes_full: model.config.kv_bytes(kv_type, stats.full_final_entries),
                kv_bytes_mean: s.bytes_steps.0 / s.bytes_steps.1 as f64,
                kv_bytes_full_mean: s.full_bytes_steps / s.bytes_steps.1 as f64,
                cache: stats,
                step_secs: std::mem::take(&mut s.step_secs),
                policy_state_bytes_peak: s.side_peak,
                trace: s.state.trace.take(),
                device_memory_peak: device_memory.peak_bytes,
                decode_host_copies,
            }
        })
        .collect())
}

/// A sequence after its prefill: its state, its sampler and the first token it drew (from the logits
/// of its last prompt token, dropped then: a batch's logits are 600 KB a sequence at a 152K
/// vocabulary), the wall time of the pass that prefilled it and its share of that pass.
struct Prefilled {
    state: SeqState,
    sampler: Sampler,
    next: u32,
    time: Duration,
    share: Duration,
    max_new_tokens: usize,
}

/// A request waiting for its prefill.
struct Pending {
    prompt: Vec<u32>,
    policy: Option<Box<dyn Policy>>,
    kv_type: crate::cache::KvType,
    trace: bool,
    sampling: SamplingParams,
    max_new_tokens: usize,
}

/// Every request's state after its prefill, in order. With `share_prefill` the first request is
/// prefilled and the others start from copies of its state (each prefilled where its policy cannot
/// be forked); the rest go in passes of several sequences, in order, up to the model's
/// [`Transformer::prefill_batch_tokens`] prompt tokens a pass (one a pass where that is 0, as on the
/// CPU). A pass of several sequences gives each the logits and cache it would have alone: the
/// products take every token at once, attention and the policies run per sequence.
fn prefill_all(
    model: &Transformer,
    requests: Vec<Request>,
    share_prefill: bool,
    device_memory: &mut crate::device::PeakMemory,
) -> Result<Vec<Prefilled>> {
    let mut pending: Vec<Pending> = requests
        .into_iter()
        .map(|r| Pending {
            kv_type: r.kv_type.unwrap_or(model.kv_type()),
            prompt: r.prompt,
            policy: Some(r.policy),
            trace: r.trace,
            sampling: r.sampling,
            max_new_tokens: r.max_new_tokens,
        })
        .collect();
    let mut done: Vec<Option<Prefilled>> = pending.iter().map(|_| None).collect();
    let mut pass = |members: &[usize],
                    pending: &mut [Pending],
                    done: &mut [Option<Prefilled>],
                    keep_logits: bool|
     -> Result<Option<Vec<f32>>> {
        let (prefilled, logits) =
            prefill_pass(model, members, pending, device_memory, keep_logits)?;
        for (&i, p) in members.iter().zip(prefilled) {
            done[i] = Some(p);
        }
        Ok(logits)
    };
    // Copies of the first request start from its state where its policy forks, each drawing from
    // its logits with its own sampler.
    if share_prefill && !pending.is_empty() {
        let logits = pass(&[0], &mut pending, &mut done, true)?.expect("logits kept");
        for i in 1..pending.len() {
            let first = done[0].as_ref().expect("just prefilled");
            let Some(mut state) = first.state.fork()? else {
                break;
            };
            if pending[i].trace && state.trace.is_none() {
                state.trace = Some(Vec::new());
            }
            let mut sampler = Sampler::new(pending[i].sampling);
            let next = sampler.sample(&logits)?;
            let copy = Prefilled {
                state,
                sampler,
                next,
                time: first.time,
                share: first.share,
                max_new_tokens: pending[i].max_new_tokens,
            };
            done[i] = Some(copy);
        }
    }
    // The rest in passes of up to the model's prompt tokens (at least one sequence each), each
    // within the widths the engine accepts.
    let limit = model.prefill_batch_tokens();
    let fits = |tokens: usize| model.config.check_pass_elements(tokens, false).is_ok();
    let (mut group, mut tokens) = (Vec::new(), 0);
    for i in 0..pending.len() {
        if done[i].is_some() {
            continue;
        }
        let more = tokens + pending[i].prompt.len();
        if !group.is_empty() && (more > limit || !fits(more)) {
            pass(&group, &mut pending, &mut done, false)?;
            (group, tokens) = (Vec::new(), 0);
        }
        tokens += pending[i].prompt.len();
        group.push(i);
    }
    if !group.is_empty() {
        pass(&group, &mut pending, &mut done, false)?;
    }
    Ok(done
        .into_iter()
        .map(|d| d.expect("every request is prefilled or copied"))
        .collect())
}

/// One pass prefilling the requests `members` (indices into `pending`) together: each one's
/// [`Prefilled`], in order, with the pass's wall time and each one's share of it by prompt tokens;
/// with `keep_logits`, the first one's logits too.
fn prefill_pass(
    model: &Transformer,
    members: &[usize],
    pending: &mut [Pending],
    device_memory: &mut crate::device::PeakMemory,
    keep_logits: bool,
) -> Result<(Vec<Prefilled>, Option<Vec<f32>>)> {
    let mut states = members
        .iter()
        .map(|&i| {
            let p = &mut pending[i];
            let policy = p.policy.take().expect("each request is prefilled once");
            let mut state = model.new_state_with(policy, p.kv_type)?;
            if p.trace {
                state.trace = Some(Vec::new());
            }
            Ok(state)
        })
        .collect::<Result<Vec<SeqState>>>()?;
    let start = Instant::now();
    let logits = {
        let mut inputs: Vec<SeqInput<'_>> = members
            .iter()
            .zip(states.iter_mut())
            .map(|(&i, state)| SeqInput {
                tokens: &pending[i].prompt,
                state,
            })
            .collect();
        model.forward(&mut inputs)?
    };
    // The copy to the host waits for the device: the time is the work's, not its queueing.
    let logits = crate::host_copy::rows::<f32>(&logits)?;
    let time = start.elapsed();
    device_memory.sample(model.device());
    let tokens: usize = members.iter().map(|&i| pending[i].prompt.len()).sum();
    let mut kept = None;
    let mut prefilled = Vec::with_capacity(members.len());
    for (k, ((&i, state), logits)) in members.iter().zip(states).zip(logits).enumerate() {
        let p = &pending[i];
        let mut sampler = Sampler::new(p.sampling);
        let next = sampler.sample(&logits)?;
        if keep_logits && k == 0 {
            kept = Some(logits);
        }
        prefilled.push(Prefilled {
            state,
            sampler,
            next,
            time,
            share: time.mul_f64(p.prompt.len() as f64 / tokens.max(1) as f64),
            max_new_tokens: p.max_new_tokens,
        });
    }
    Ok((prefilled, kept))
}
