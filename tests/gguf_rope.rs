//! RoPE as GGUF files carry it. llama.cpp's converter stores Llama 3.1 scaling (the DeepSeek-R1-Distill-Llama
//! models') as a tensor of per-pair factors, `rope_freqs.weight`, not as metadata: the model must turn
//! exactly as Llama 3 scaling says. RoPE variants kvbench does not compute (partial rotation, linear or
//! YaRN scaling) are refused by name rather than run wrong.

mod common;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use common::{max_abs_diff, run_greedy, tiny_gguf, tiny_gguf_with};
use kvbench::model::{LoadOptions, Model};
use kvbench::policy::Full;
use std::path::PathBuf;

const THETA: f64 = 10_000.0;
const HEAD_DIM: usize = 16;
// Llama 3 scaling with a short original context, so that the tiny model's pairs fall in all three bands.
const FACTOR: f64 = 8.0;
const LOW: f64 = 1.0;
const HIGH: f64 = 4.0;
const ORIGINAL_CONTEXT: u32 = 64;

/// The factors llama.cpp's converter writes for Llama 3 scaling, computed here from the published
/// rule, independently of kvbench: 1 for short wavelengths, `factor` for long ones, a blend between.
fn converter_factors() -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (
        f64::from(ORIGINAL_CONTEXT) / LOW,
        f64::from(ORIGINAL_CONTEXT) / HIGH,
    );
    (0..HEAD_DIM / 2)
        .map(|i| {
            let freq = 1.0 / THETA.powf((2 * i) as f64 / HEAD_DIM as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                FACTOR
            } else {
                let smooth = (f64::from(ORIGINAL_CONTEXT) / wavelen - LOW) / (HIGH - LOW);
                1.0 / ((1.0 - smooth) / FACTOR + smooth)
            };
            f as f32
        })
        .collect()
}

fn factors_tensor(values: &[f32]) -> (String, QTensor) {
    let t = Tensor::from_vec(values.to_vec(), values.len(), &Device::Cpu).unwrap();
    (
        "rope_freqs.weight".into(),
        QTensor::quantize(&t, GgmlDType::F32).unwrap(),
    )
}

fn llama3_metadata() -> Vec<(&'static str, gguf_file::Value)> {
    vec![
        (
            "llama.rope.scaling.type",
            gguf_file::Value::String("llama3".into()),
        ),
        (
            "llama.rope.scaling.factor",
            gguf_file::Value::F32(FACTOR as f32),
        ),
        (
            "llama.rope.scaling.low_freq_factor",
            gguf_file::Value::F32(LOW as f32),
        ),
        (
            "llama.rope.scaling.high_freq_factor",
            gguf_file::Value::F32(HIGH as f32),
        ),
        (
            "llama.rope.scaling.original_context_length",
            gguf_file::Value::U32(ORIGINAL_CONTEXT),
        ),
    ]
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("kvbench-rope-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Self(d)
    }

    fn load(&self, name: &str, bytes: &[u8]) -> kvbench::Result<Model> {
        let path = self.0.join(name);
        std::fs::write(&path, bytes).unwrap();
        Model::load(path.to_str().unwrap(), &LoadOptions::default())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn rope_freqs_factors_turn_the_model_as_llama3_scaling_does() {
    let dir = Scratch::new("factors");
    let plain = dir.load("plain.gguf", &tiny_gguf().0).unwrap();
    let by_metadata = dir
        .load(
            "metadata.gguf",
            &tiny_gguf_with(llama3_metadata(), vec![]).0,
        )
        .unwrap();
    let factors = converter_factors();
    assert!(factors[0] == 1.0 && factors[7] == FACTOR as f32);
    assert!(
        factors[1] > 1.0 && factors[1] < FACTOR as f32,
        "a blended pair"
    );
    let by_tensor = dir
        .load(
            "tensor.gguf",
            &tiny_gguf_with(vec![], vec![factors_tensor(&factors)]).0,
        )
        .unwrap();

    // Each pair turns at the base frequency over the converter's factor, by either spelling.
    let (a, b) = (
        by_metadata.transformer.rope_inv_freq(),
        by_tensor.transformer.rope_inv_freq(),
    );
    let p = plain.transformer.rope_inv_freq();
    for i in 0..HEAD_DIM / 2 {
        let base = 1.0 / THETA.powf((2 * i) as f64 / HEAD_DIM as f64);
        let want = (base / f64::from(factors[i])) as f32;
        assert!(
            (p[i] - base as f32).abs() <= 1e-6 * p[i],
            "pair {i}: plain {}",
            p[i]
        );
        for (how, got) in [("metadata", a[i]), ("rope_freqs.weight", b[i])] {
            assert!(
                (got - want).abs() <= 2e-6 * want,
                "pair {i} by {how}: {got}, expected {want}"
            );
        }
    }

    // And the forward pass gives the same logits by either spelling.
    let prompt = plain
        .tokenizer
        .encode("12 + 30 = 42, so 42 - 30 =")
        .unwrap();
    let run = |m: &Model| run_greedy(m, &prompt, Box::new(Full), 6).1.concat();
    let same = max_abs_diff(&run(&by_metadata), &run(&by_tensor));
    assert!(
        same < 1e-5,
        "the two spellings of Llama 3 scaling differ by {same}"
    );
}

/// A refused file: its tag, extra metadata, extra tensors, and what the error must say.
type Case = (
    &'static str,
    Vec<(&'static str, gguf_file::Value)>,
    Vec<(String, QTensor)>,
    &'static str,
);

#[test]
fn rope_variants_kvbench_does_not_compute_are_refused_by_name() {
    let dir = Scratch::new("refused");
    let s = |x: &str| gguf_file::Value::String(x.into());
    let f = gguf_file::Value::F32;
    let cases: Vec<Case> = vec![
        (
            "yarn",
            vec![
                ("llama.rope.scaling.type", s("yarn")),
                ("llama.rope.scaling.factor", f(4.0)),
            ],
            vec![],
            "'yarn' (llama.rope.scaling.type)",
        ),
        (
            "linear",
            vec![("llama.rope.scaling.factor", f(2.0))],
            vec![],
            "RoPE scaling linear (factor 2)",
        ),
        (
            "partial",
            vec![("llama.rope.dimension_count", gguf_file::Value::U32(8))],
            vec![],
            "llama.rope.dimension_count is 8",
        ),
        (
            "short",
            vec![],
            vec![factors_tensor(&[1.0; 4])],
            "rope_freqs.weight has 4 factors, the head needs 8",
        ),
        (
            "zero",
            vec![],
            vec![factors_tensor(&[1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])],
            "rope_freqs.weight holds 0",
        ),
        (
            "both",
            llama3_metadata(),
            vec![factors_tensor(&converter_factors())],
            "would both scale RoPE",
        ),
    ];
    for (tag, metadata, tensors, expected) in cases {
        let name = format!("{tag}-rope.gguf");
        let e = match dir.load(&name, &tiny_gguf_with(metadata, tensors).0) {
            Ok(_) => panic!("{tag}: loaded"),
            Err(e) => e,
        };
        let msg = e.to_string();
        assert!(e.is_input_error(), "{tag}: {msg}");
        assert!(
            msg.contains(&name) && msg.contains(expected),
            "{tag}: {msg}"
        );
    }
    // What llama.cpp writes for no scaling loads.
    let none = vec![
        ("llama.rope.scaling.type", s("none")),
        ("llama.rope.dimension_count", gguf_file::Value::U32(16)),
    ];
    dir.load("none.gguf", &tiny_gguf_with(none, vec![]).0)
        .unwrap();
}
