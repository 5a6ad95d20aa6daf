//! The forward pass against candle-transformers' quantized models on the built-in GGUF files, for a real
//! chat prompt: `quantized_llama` on SmolLM2 (prefill plus five greedy decode steps) and
//! `quantized_qwen2` on Qwen2.5-Coder-1.5B (prefill plus 40 greedy steps).
//!
//! Alone in its test binary because the f32 comparison sets `CANDLE_DEQUANTIZE_ALL`, which candle reads
//! per thread when it builds quantized matrices.

mod common;

use candle_core::{Device, Tensor};
use common::max_abs_diff;
use kvbench::model::weights::WeightFormat;
use kvbench::model::SeqInput;
use kvbench::policy::Full;

/// The reference implementation a model is compared with.
enum Reference {
    Llama(candle_transformers::models::quantized_llama::ModelWeights),
    Qwen2(candle_transformers::models::quantized_qwen2::ModelWeights),
}

impl Reference {
    fn load(path: &std::path::Path) -> Self {
        let mut file = std::fs::File::open(path).unwrap();
        let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
        let arch = content.metadata["general.architecture"]
            .to_string()
            .unwrap()
            .clone();
        match arch.as_str() {
            "qwen2" => Reference::Qwen2(
                candle_transformers::models::quantized_qwen2::ModelWeights::from_gguf(
                    content,
                    &mut file,
                    &Device::Cpu,
                )
                .unwrap(),
            ),
            _ => Reference::Llama(
                candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
                    content,
                    &mut file,
                    &Device::Cpu,
                )
                .unwrap(),
            ),
        }
    }

    fn forward(&mut self, input: &Tensor, pos: usize) -> Tensor {
        match self {
            Reference::Llama(m) => m.forward(input, pos).unwrap(),
            Reference::Qwen2(m) => m.forward(input, pos).unwrap(),
        }
    }
}

/// Runs both models over the prompt and `steps` greedy steps (kvbench's tokens fed to both); returns
/// the max |logit difference| per step and the number of steps whose greedy tokens agreed.
fn compare_model(m: &kvbench::model::Model, steps: usize) -> (Vec<f32>, usize) {
    let prompt = m
        .tokenizer
        .encode(
            &m.template
                .render("What is the sum of the first ten odd numbers?", None),
        )
        .unwrap();
    let mut reference = Reference::load(m.files.path().expect("a model file"));
    let mut state = m.transformer.new_state(Box::new(Full)).unwrap();
    let mut tokens = prompt.clone();
    let (mut diffs, mut agree) = (Vec::new(), 0);
    for step in 0..=steps {
        let (new, pos) = if step == 0 {
            (&tokens[..], 0)
        } else {
            (&tokens[tokens.len() - 1..], tokens.len() - 1)
        };
        let ours = m
            .transformer
            .forward(&mut [SeqInput {
                tokens: new,
                state: &mut state,
            }])
            .unwrap();
        let ours = ours.squeeze(0).unwrap().to_vec1::<f32>().unwrap();
        let input = Tensor::new(new, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let theirs = reference
            .forward(&input, pos)
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let theirs = &theirs[theirs.len() - ours.len()..]; // the last position's logits
        diffs.push(max_abs_diff(&ours, theirs));
        let next = kvbench::model::llama::argmax(&ours);
        agree += usize::from(next == kvbench::model::llama::argmax(theirs));
        tokens.push(next);
    }
    (diffs, agree)
}

/// SmolLM2 in `format` against `quantized_llama`, prefill and five steps.
fn compare(format: WeightFormat) -> (Vec<f32>, bool) {
    let (diffs, agree) = compare_model(&common::model(format), 5);
    (diffs, agree == 6)
}

#[test]
fn logits_match_candle_quantized_llama() {
    // Same Q4_1 weights and kernels: prefill goes through the same candle ops (equal logits); decode steps
    // use kvbench's own attention loop, whose last-bit differences the Q8 activation rounding inside the
    // Q4_1 kernel amplifies, as any quantized comparison does.
    let (diffs, agree) = compare(WeightFormat::Native);
    eprintln!("native Q4_1: max |logit difference| per step {diffs:?}");
    assert_eq!(diffs[0], 0.0, "prefill logits differ");
    assert!(agree, "greedy tokens differ");
    assert!(
        diffs.iter().all(|&d| d < 1.0),
        "decode logits differ by more than 1: {diffs:?}"
    );

    // The default format runs kvbench's kernels on the same blocks (activations rounded per block as
    // ggml does): the same greedy tokens, logits within what quantized products' rounding moves them
    // (the kernels themselves are checked against candle's dequantization in tests/kernels.rs).
    let (diffs, agree) = compare(WeightFormat::Auto);
    eprintln!("auto: max |logit difference| per step {diffs:?}");
    assert!(agree, "greedy tokens differ");
    assert!(
        diffs.iter().all(|&d| d < 1.5),
        "auto logits differ by more than 1.5: {diffs:?}"
    );

    // Both dequantized to f32: the computations must agree to float rounding.
    // candle reads the variable once per thread, so the reference is built on a fresh thread.
    std::env::set_var("CANDLE_DEQUANTIZE_ALL", "1");
    let (diffs, agree) = std::thread::spawn(|| compare(WeightFormat::F32))
        .join()
        .unwrap();
    eprintln!("f32: max |logit difference| per step {diffs:?}");
    assert!(agree, "greedy tokens differ");
    assert!(
        diffs.iter().all(|&d| d < 1e-3),
        "f32 logits differ: {diffs:?}"
    );
}

#[test]
fn qwen_logits_match_candle_quantized_qwen2() {
    // Qwen2.5-Coder-1.5B Q4_K_M (Q4_K and Q6_K blocks, q/k/v biases, untied output head): kvbench's
    // kernels against candle's k-quant kernels. Both round activations to 8 bits (candle per 256 with
    // Q8_K, kvbench per 256 as well for k-quant matrices, but with its own rounding rule), so logits
    // differ by quantization noise; greedy tokens must agree over 40 steps.
    kvbench::init_threads(None).expect("a valid RAYON_NUM_THREADS");
    let m = kvbench::model::Model::load(
        common::builtin_gguf("qwen2.5-coder-1.5b").to_str().unwrap(),
        &kvbench::model::LoadOptions::default(),
    )
    .unwrap();
    let (diffs, agree) = compare_model(&m, 40);
    let worst = diffs.iter().fold(0f32, |a, &d| a.max(d));
    eprintln!("qwen2.5-coder-1.5b auto: max |logit difference| {worst}, per step {diffs:?}");
    assert_eq!(
        agree,
        41,
        "greedy tokens differ in {} of 41 steps",
        41 - agree
    );
    assert!(worst < 1.5, "logits differ by {worst}");
}
