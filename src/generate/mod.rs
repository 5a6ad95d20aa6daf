//! Generation: prefill each sequence, then decode all of them together, one token per sequence per
//! step, until each meets an end-of-sequence token or its token limit.
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
    /// Wall time of this sequence's prefill.
    pub prefill_time: Duration,
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
    let mut seqs: Vec<Active> = Vec::with_capacity(requests.len());
    let mut device_memory = crate::device::PeakMemory::default();
    // A shared prefill's logits and time; its state is the first sequence's, untouched until
    // decoding starts, so the copies fork from it.
    let mut shared: Option<(Vec<f32>, Duration)> = None;
    for (i, req) in requests.into_iter().enumerate() {
        let kv_type = req.kv_type.unwrap_or(model.kv_type());
        let mut sampler = Sampler::new(req.sampling);
        let forked = match (&shared, seqs.first()) {
            (Some((logits, time)), Some(first)) => first
                .state
                .fork()?
                .map(|state| (state, logits.clone(), *time)),
            _ => None,
        };
        let (mut state, logits, prefill_time) = match forked {
            Some(copy) => copy,
            None => {
                let mut state = model.new_state_with(req.policy, kv_type)?;
                if req.trace {
                    state.trace = Some(Vec::new());
                }
                let start = Instant::now();
                let logits = model.forward(&mut [SeqInput {
                    tokens: &req.prompt,
                    state: &mut state,
                }])?;
                // The copy to the host waits for the device: the time is the work's, not its
                // queueing.
                let logits = logits.squeeze(0)?.to_vec1::<f32>()?;
                let prefill_time = start.elapsed();
                if share_prefill && i == 0 {
                    shared = Some((logits.clone(), prefill_time));
                }
                (state, logits, prefill_time)
            }
        };
        if req.trace && state.trace.is_none() {
            state.trace = Some(Vec::new());
        }
        device_memory.sample(model.device());
        let next = sampler.sample(&logits)?;
        let held = state.cache.bytes();
        let full_held = model.config.kv_bytes(kv_type, state.cache.seen());
        let policy_prefill_time = state.policy_time;
        let mut a = Active {
            state,
            sampler,
            out: Vec::new(),
            max_new: req.max_new_tokens,
            finish: None,
            next,
            prefill_time,
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
            None => Choice::Logits(logits.to_vec2::<f32>()?),
        };
        let step = step_start.elapsed().as_secs_f32();
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
            }
        })
        .collect())
}
