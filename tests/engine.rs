//! The engine on the real default model: batch against single runs, positions after an eviction, and the
//! tokenizer against known ids. (Parity with candle-transformers is in `parity.rs`.)

mod common;

use common::{max_abs_diff, model};
use kvbench::cache::LayerCache;
use kvbench::generate::{generate_batch, Request, SamplingParams};
use kvbench::model::weights::WeightFormat;
use kvbench::model::SeqInput;
use kvbench::policy::{AttentionView, Capabilities, Full, Policy, StepInfo};

fn chat_prompt(m: &kvbench::model::Model, text: &str) -> Vec<u32> {
    m.tokenizer.encode(&m.template.render(text, None)).unwrap()
}

fn greedy(prompt: &[u32], n: usize) -> Request {
    Request {
        prompt: prompt.to_vec(),
        sampling: SamplingParams::greedy(),
        max_new_tokens: n,
        policy: Box::new(Full),
        trace: false,
        kv_type: None,
    }
}

/// Generates `n` greedy tokens for every prompt in one batch and alone; asserts the tokens agree and
/// returns the prompts.
fn assert_batch_equals_single(
    m: &kvbench::model::Model,
    texts: &[&str],
    n: usize,
) -> Vec<Vec<u32>> {
    let prompts: Vec<Vec<u32>> = texts.iter().map(|t| chat_prompt(m, t)).collect();
    let batch = generate_batch(
        &m.transformer,
        prompts.iter().map(|p| greedy(p, n)).collect(),
        &[],
        &mut |_, _| {},
    )
    .unwrap();
    for (p, b) in prompts.iter().zip(&batch) {
        let single =
            generate_batch(&m.transformer, vec![greedy(p, n)], &[], &mut |_, _| {}).unwrap();
        assert_eq!(
            single[0].tokens, b.tokens,
            "batched tokens differ from the single run"
        );
        assert_eq!(b.tokens.len(), n);
    }
    prompts
}

#[test]
fn batch_gives_the_same_tokens_and_logits_as_single_runs() {
    let m = model(WeightFormat::F32);
    let prompts = assert_batch_equals_single(
        &m,
        &[
            "What is 12 + 30?",
            "Name three prime numbers and explain why.",
            "Hi",
        ],
        24,
    );
    // Logits of one batched step against the same sequences stepped alone.
    let mut states: Vec<_> = (0..3)
        .map(|_| m.transformer.new_state(Box::new(Full)).unwrap())
        .collect();
    let mut alone = Vec::new();
    for (p, s) in prompts.iter().zip(states.iter_mut()) {
        m.transformer
            .forward(&mut [SeqInput {
                tokens: p,
                state: s,
            }])
            .unwrap();
    }
    let mut solo_states: Vec<_> = (0..3)
        .map(|_| m.transformer.new_state(Box::new(Full)).unwrap())
        .collect();
    for (p, s) in prompts.iter().zip(solo_states.iter_mut()) {
        m.transformer
            .forward(&mut [SeqInput {
                tokens: p,
                state: s,
            }])
            .unwrap();
        let l = m
            .transformer
            .forward(&mut [SeqInput {
                tokens: &[42],
                state: s,
            }])
            .unwrap();
        alone.push(l.squeeze(0).unwrap().to_vec1::<f32>().unwrap());
    }
    let toks = [[42u32]; 3];
    let mut inputs: Vec<SeqInput> = states
        .iter_mut()
        .zip(&toks)
        .map(|(s, t)| SeqInput {
            tokens: t,
            state: s,
        })
        .collect();
    let together = m
        .transformer
        .forward(&mut inputs)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    for (a, b) in alone.iter().zip(&together) {
        let d = max_abs_diff(a, b);
        eprintln!("batch vs single max |logit difference|: {d:e}");
        assert!(d < 1e-3, "batch logits differ from single by {d}");
    }
}

/// At generated step `at`, keeps every other entry plus the last four, or (with `permute_only`) all
/// entries in reversed order.
struct ForcedGather {
    at: usize,
    permute_only: bool,
    fired: Vec<bool>,
}

impl Policy for ForcedGather {
    fn name(&self) -> &str {
        "forced-gather"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    fn reset(&mut self) {
        self.fired.clear();
    }
    fn after_attention(
        &mut self,
        step: &StepInfo,
        view: &AttentionView<'_>,
        cache: &mut LayerCache,
    ) -> candle_core::Result<()> {
        if self.fired.len() <= view.layer {
            self.fired.resize(view.layer + 1, false);
        }
        if step.generated != self.at || self.fired[view.layer] {
            return Ok(());
        }
        self.fired[view.layer] = true;
        let n = cache.len();
        let keep: Vec<usize> = if self.permute_only {
            (0..n).rev().collect()
        } else {
            (0..n - 4).step_by(2).chain(n - 4..n).collect()
        };
        cache.gather(&vec![keep; cache.kv_heads()])
    }
    fn entry_limit(&self, _: usize, _: usize, _: usize) -> Option<usize> {
        None
    }
}

fn run_with(
    m: &kvbench::model::Model,
    prompt: &[u32],
    policy: Box<dyn Policy>,
    steps: usize,
) -> (Vec<Vec<f32>>, kvbench::model::SeqState) {
    let (_, logits, state) = common::run_greedy(m, prompt, policy, steps);
    (logits, state)
}

#[test]
fn eviction_keeps_logical_positions() {
    let m = model(WeightFormat::F32);
    let prompt = chat_prompt(&m, "Count from one to twenty.");
    let p = prompt.len();
    let at = 10;
    let (_, state) = run_with(
        &m,
        &prompt,
        Box::new(ForcedGather {
            at,
            permute_only: false,
            fired: vec![],
        }),
        16,
    );
    // Entries fed: the prompt plus 15 generated tokens (the 16th forward consumed the 15th token).
    assert_eq!(state.seen, p + 15);
    let layer = state.cache.layer(0);
    let n_before = p + at; // entries held when the gather ran
    let kept_old: Vec<u32> = (0..n_before - 4)
        .step_by(2)
        .chain(n_before - 4..n_before)
        .map(|x| x as u32)
        .collect();
    let positions = layer.positions(0);
    assert_eq!(
        &positions[..kept_old.len()],
        &kept_old[..],
        "kept entries keep their original positions"
    );
    // Entries appended after the gather carry logical positions, not the physical cache length.
    let after: Vec<u32> = (n_before..p + 15).map(|x| x as u32).collect();
    assert_eq!(&positions[kept_old.len()..], &after[..]);
    assert_eq!(layer.len(), kept_old.len() + after.len());
    assert!(layer.len() < state.seen);
}

#[test]
fn permuting_the_cache_leaves_logits_unchanged() {
    let m = model(WeightFormat::F32);
    let prompt = chat_prompt(&m, "Describe a rainbow.");
    let (full, _) = run_with(&m, &prompt, Box::new(Full), 14);
    let (perm, state) = run_with(
        &m,
        &prompt,
        Box::new(ForcedGather {
            at: 5,
            permute_only: true,
            fired: vec![],
        }),
        14,
    );
    assert_eq!(
        state.cache.layer(3).positions(1)[0] as usize,
        prompt.len() + 4,
        "the cache was reversed"
    );
    let worst = full
        .iter()
        .zip(&perm)
        .map(|(a, b)| max_abs_diff(a, b))
        .fold(0.0, f32::max);
    eprintln!("reversed cache vs full max |logit difference|: {worst:e}");
    assert!(
        worst < 1e-4,
        "attention is not permutation invariant: {worst}"
    );
}

#[test]
fn smollm2_tokenizer_matches_reference_ids() {
    let m = model(WeightFormat::Native);
    // The ids Hugging Face's tokenizer.json for SmolLM2 gives for its default system turn.
    let ids = m
        .tokenizer
        .encode("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n")
        .unwrap();
    assert_eq!(
        ids,
        vec![
            1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
            407, 19712, 8182, 2, 198
        ]
    );
    // Digits are split one by one; decoding gives the text back.
    let ids = m.tokenizer.encode("In 2024, 12345 apples").unwrap();
    let pieces: Vec<String> = ids
        .iter()
        .map(|&i| m.tokenizer.id_to_token(i).unwrap())
        .collect();
    assert!(
        pieces.contains(&"1".to_string()) && pieces.contains(&"5".to_string()),
        "{pieces:?}"
    );
    assert_eq!(m.tokenizer.decode(&ids).unwrap(), "In 2024, 12345 apples");
    assert!(
        m.tokenizer.eos_ids.contains(&2),
        "<|im_end|> ends generation"
    );
}

#[test]
fn sampling_is_reproducible_from_the_seed() {
    let m = model(WeightFormat::Auto);
    let prompt = chat_prompt(&m, "Tell me a story.");
    let req = |seed| Request {
        prompt: prompt.clone(),
        sampling: SamplingParams {
            temperature: 0.6,
            top_p: 0.95,
            seed,
        },
        max_new_tokens: 12,
        policy: Box::new(Full),
        trace: false,
        kv_type: None,
    };
    let a = generate_batch(&m.transformer, vec![req(1)], &[], &mut |_, _| {}).unwrap();
    let b = generate_batch(&m.transformer, vec![req(1)], &[], &mut |_, _| {}).unwrap();
    assert_eq!(a[0].tokens, b[0].tokens);
}

#[test]
fn batch_equals_single_with_the_default_quantized_decode_path() {
    // The default `auto` weights decode through kvbench's own Q4_1 kernel (Q8_0 for the
    // embedding) and CPU attention loop, which
    // compute every row in the same order whatever the batch: tokens must match exactly.
    let m = model(WeightFormat::Auto);
    assert_batch_equals_single(
        &m,
        &[
            "Add 7 and 35.",
            "List the planets.",
            "Why is the sky blue?",
            "Hello",
            "2+2=",
        ],
        20,
    );
}
