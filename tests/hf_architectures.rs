//! Hugging Face checkpoints (safetensors + config.json), checked against candle-transformers' own models
//! on small random weights in f32: Qwen2 (q/k/v biases, tied or untied embeddings), Qwen3 (per-head
//! RMSNorm of queries and keys, a head size that is not hidden / heads) and Llama (untied, with Llama 3
//! RoPE scaling, the Hugging Face rotate-half layout).

use candle_core::{DType, Device, Tensor};
use kvbench::loading::source::WeightSource;
use kvbench::model::weights::WeightFormat;
use kvbench::model::{SeqInput, Transformer};
use kvbench::policy::Full;
use std::collections::HashMap;
use std::path::Path;

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const LAYERS: usize = 2;
const VOCAB: usize = 101;
const FFN: usize = 96;

/// What a test checkpoint has besides the common Llama tensors.
#[derive(Clone, Copy)]
struct Extras {
    tied: bool,
    qkv_biases: bool,
    /// Per-head RMSNorm weights of queries and keys (Qwen3).
    qk_norm: bool,
    head_dim: usize,
}

fn write_weights(dir: &Path, x: Extras) {
    let dev = Device::Cpu;
    let (tied, biases, d) = (x.tied, x.qkv_biases, x.head_dim);
    let mut t: HashMap<String, Tensor> = HashMap::new();
    let mut rand = |name: String, shape: &[usize], std: f32| {
        t.insert(name, Tensor::randn(0f32, std, shape, &dev).unwrap());
    };
    rand("model.embed_tokens.weight".into(), &[VOCAB, HIDDEN], 0.5);
    if !tied {
        rand("lm_head.weight".into(), &[VOCAB, HIDDEN], 0.2);
    }
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        rand(
            format!("{p}.self_attn.q_proj.weight"),
            &[HEADS * d, HIDDEN],
            0.2,
        );
        rand(
            format!("{p}.self_attn.k_proj.weight"),
            &[KV_HEADS * d, HIDDEN],
            0.2,
        );
        rand(
            format!("{p}.self_attn.v_proj.weight"),
            &[KV_HEADS * d, HIDDEN],
            0.2,
        );
        if biases {
            rand(format!("{p}.self_attn.q_proj.bias"), &[HEADS * d], 0.5);
            rand(format!("{p}.self_attn.k_proj.bias"), &[KV_HEADS * d], 0.5);
            rand(format!("{p}.self_attn.v_proj.bias"), &[KV_HEADS * d], 0.5);
        }
        rand(
            format!("{p}.self_attn.o_proj.weight"),
            &[HIDDEN, HEADS * d],
            0.2,
        );
        if x.qk_norm {
            rand(format!("{p}.self_attn.q_norm.weight"), &[d], 0.1);
            rand(format!("{p}.self_attn.k_norm.weight"), &[d], 0.1);
        }
        rand(format!("{p}.mlp.gate_proj.weight"), &[FFN, HIDDEN], 0.2);
        rand(format!("{p}.mlp.up_proj.weight"), &[FFN, HIDDEN], 0.2);
        rand(format!("{p}.mlp.down_proj.weight"), &[HIDDEN, FFN], 0.2);
        rand(format!("{p}.input_layernorm.weight"), &[HIDDEN], 0.1);
        rand(
            format!("{p}.post_attention_layernorm.weight"),
            &[HIDDEN],
            0.1,
        );
    }
    rand("model.norm.weight".into(), &[HIDDEN], 0.1);
    // norms near 1
    for (k, v) in t.iter_mut() {
        if k.contains("norm") {
            *v = (v.clone() + 1.0).unwrap();
        }
    }
    candle_core::safetensors::save(&t, dir.join("model.safetensors")).unwrap();
}

/// The written weights as a candle-nn VarBuilder, for the reference models.
fn reference_weights(dir: &Path) -> candle_nn::VarBuilder<'static> {
    // SAFETY: the file was just written by this test and is not modified while mapped.
    unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(
            &[dir.join("model.safetensors")],
            DType::F32,
            &Device::Cpu,
        )
    }
    .unwrap()
}

fn write_qwen2(dir: &Path, tied: bool) {
    write_weights(
        dir,
        Extras {
            tied,
            qkv_biases: true,
            qk_norm: false,
            head_dim: HIDDEN / HEADS,
        },
    );
    let config = serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": FFN,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": 512, "sliding_window": 512, "max_window_layers": LAYERS,
        "tie_word_embeddings": tied, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
        "use_sliding_window": false, "hidden_act": "silu", "torch_dtype": "float32"
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

fn check(tied: bool) {
    let dir = std::env::temp_dir().join(format!("kvbench-qwen2-{}-{tied}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_qwen2(&dir, tied);
    let (mut src, config) = WeightSource::open_safetensors(&dir).unwrap();
    assert!(config.qkv_bias && !config.rope_interleaved && config.tie_word_embeddings == tied);
    let ours = Transformer::load(&mut src, config, WeightFormat::F32, &Device::Cpu).unwrap();

    let cfg: candle_transformers::models::qwen2::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let vb = reference_weights(&dir);
    let mut reference =
        candle_transformers::models::qwen2::ModelForCausalLM::new(&cfg, vb).unwrap();

    let worst = compare(&ours, |new, pos| {
        reference
            .forward(&input(new), pos)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    });
    eprintln!("qwen2 (tied = {tied}) max |logit difference| vs candle-transformers: {worst:e}");
    assert!(worst < 1e-4, "logits differ by {worst}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A checkpoint whose tensor disagrees with config.json, in any layer, is refused when it is
/// opened, naming the tensor (Hugging Face name) and config.json.
#[test]
fn a_safetensors_shape_that_disagrees_with_the_config_is_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("kvbench-qwen2-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_qwen2(&dir, false);
    let file = dir.join("model.safetensors");
    let good = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    let last = LAYERS - 1;
    for (name, shape) in [
        (
            format!("model.layers.{last}.mlp.down_proj.weight"),
            vec![HIDDEN, FFN - 1],
        ),
        (
            format!("model.layers.{last}.self_attn.k_proj.bias"),
            vec![HIDDEN],
        ),
        ("lm_head.weight".to_string(), vec![VOCAB - 1, HIDDEN]),
    ] {
        let mut t = good.clone();
        t.insert(
            name.clone(),
            Tensor::zeros(shape.as_slice(), DType::F32, &Device::Cpu).unwrap(),
        );
        candle_core::safetensors::save(&t, &file).unwrap();
        let err = WeightSource::open_safetensors(&dir)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains(&format!("tensor {name} has shape")) && err.contains("config.json"),
            "{name}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn qwen2_untied_matches_candle_transformers() {
    check(false);
}

#[test]
fn qwen2_tied_matches_candle_transformers() {
    check(true);
}

/// Runs a prompt and three greedy steps through ours and a reference; returns the max |logit difference|.
fn compare(ours: &Transformer, mut reference: impl FnMut(&[u32], usize) -> Vec<f32>) -> f32 {
    let mut state = ours.new_state(Box::new(Full)).unwrap();
    let mut tokens: Vec<u32> = vec![3, 17, 42, 99, 5, 8, 60];
    let mut worst = 0f32;
    for step in 0..4 {
        let (new, pos) = if step == 0 {
            (tokens.clone(), 0)
        } else {
            (vec![*tokens.last().unwrap()], tokens.len() - 1)
        };
        let a = ours
            .forward(&mut [SeqInput {
                tokens: &new,
                state: &mut state,
            }])
            .unwrap();
        let a = a.squeeze(0).unwrap().to_vec1::<f32>().unwrap();
        let b = reference(&new, pos);
        worst = worst.max(
            a.iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max),
        );
        tokens.push(kvbench::model::llama::argmax(&a));
    }
    worst
}

fn input(tokens: &[u32]) -> Tensor {
    Tensor::new(tokens, &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap()
}

#[test]
fn llama_with_llama3_rope_scaling_matches_candle_transformers() {
    let dir = std::env::temp_dir().join(format!("kvbench-llama-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_weights(
        &dir,
        Extras {
            tied: false,
            qkv_biases: false,
            qk_norm: false,
            head_dim: HIDDEN / HEADS,
        },
    );
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": FFN,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": 512, "tie_word_embeddings": false, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64, "rope_type": "llama3"}
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let (mut src, cfg) = WeightSource::open_safetensors(&dir).unwrap();
    assert!(!cfg.qkv_bias && !cfg.rope_interleaved && cfg.rope_scaling.is_some());
    let ours = Transformer::load(&mut src, cfg, WeightFormat::F32, &Device::Cpu).unwrap();

    use candle_transformers::models::llama;
    let lc: llama::LlamaConfig = serde_json::from_value(config).unwrap();
    let lc = lc.into_config(false);
    let vb = reference_weights(&dir);
    let reference = llama::Llama::load(vb, &lc).unwrap();
    let mut cache = llama::Cache::new(true, DType::F32, &lc, &Device::Cpu).unwrap();
    let worst = compare(&ours, |new, pos| {
        reference
            .forward(&input(new), pos, &mut cache)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    });
    eprintln!("llama max |logit difference| vs candle-transformers: {worst:e}");
    assert!(worst < 1e-4, "logits differ by {worst}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn qwen3_with_qk_norm_and_its_own_head_size_matches_candle_transformers() {
    let dir = std::env::temp_dir().join(format!("kvbench-qwen3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Qwen3's head size is set on its own (Qwen3-0.6B: 16 heads of 128 over a hidden size of 1024).
    let head_dim = 2 * HIDDEN / HEADS;
    write_weights(
        &dir,
        Extras {
            tied: true,
            qkv_biases: false,
            qk_norm: true,
            head_dim,
        },
    );
    let config = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": FFN,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": head_dim, "attention_bias": false,
        "max_position_embeddings": 512, "sliding_window": null, "max_window_layers": LAYERS,
        "tie_word_embeddings": true, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "use_sliding_window": false, "hidden_act": "silu", "torch_dtype": "float32"
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let (mut src, cfg) = WeightSource::open_safetensors(&dir).unwrap();
    assert!(cfg.qk_norm && !cfg.qkv_bias && cfg.head_dim == head_dim && cfg.tie_word_embeddings);
    let ours = Transformer::load(&mut src, cfg, WeightFormat::F32, &Device::Cpu).unwrap();

    use candle_transformers::models::qwen3;
    let rc: qwen3::Config = serde_json::from_value(config).unwrap();
    let mut reference = qwen3::ModelForCausalLM::new(&rc, reference_weights(&dir)).unwrap();
    let worst = compare(&ours, |new, pos| {
        reference
            .forward(&input(new), pos)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    });
    eprintln!("qwen3 max |logit difference| vs candle-transformers: {worst:e}");
    assert!(worst < 1e-4, "logits differ by {worst}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Rewrites the header of safetensors `file` with `edit` (the data stays where it is, after the header).
fn edit_safetensors_header(file: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let header = header.to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(file, out).unwrap();
}

/// What a checkpoint's config.json says that kvbench would compute differently (another activation,
/// sliding-window attention, degenerate RoPE scaling) or that disagrees with its tensors (the
/// vocabulary), and a weight stored as integers the size of f32 ones (it passes every shape check),
/// are refused when the checkpoint is opened, in one line naming config.json or the tensor. Every
/// numeric key set to each of a table of hostile values opens or is refused so: nothing panics.
#[test]
fn config_values_and_tensor_types_kvbench_cannot_honour_are_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("kvbench-qwen2-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_qwen2(&dir, false);
    let config_path = dir.join("config.json");
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    let with = |key: &str, value: serde_json::Value| {
        let mut c = base.clone();
        c[key] = value;
        std::fs::write(&config_path, c.to_string()).unwrap();
        WeightSource::open_safetensors(&dir).err().map(|e| {
            let msg = e.to_string();
            assert!(e.is_input_error(), "{key}: not an input error: {msg}");
            assert_eq!(msg.lines().count(), 1, "{key}: {msg}");
            msg
        })
    };
    let llama3 = |low: f32, high: f32| {
        serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": low,
                           "high_freq_factor": high, "original_max_position_embeddings": 8192})
    };
    for (key, value, expected) in [
        (
            "vocab_size",
            serde_json::json!(VOCAB - 1),
            "tensor model.embed_tokens.weight has shape [101, 64]",
        ),
        (
            "vocab_size",
            serde_json::json!(u64::MAX),
            "tensor model.embed_tokens.weight has shape [101, 64]",
        ),
        (
            "hidden_act",
            serde_json::json!("gelu"),
            "hidden_act \"gelu\"",
        ),
        (
            "use_sliding_window",
            serde_json::json!(true),
            "use_sliding_window",
        ),
        (
            "rope_scaling",
            llama3(1.0, 1.0),
            "two different frequency factors",
        ),
        ("rope_scaling", llama3(-1.0, 4.0), "low_freq_factor -1"),
        (
            "num_hidden_layers",
            serde_json::json!(LAYERS - 1),
            "the file holds more: tensor model.layers.1.self_attn.q_proj.weight",
        ),
    ] {
        let err = with(key, value.clone()).unwrap_or_else(|| panic!("{key} = {value} was opened"));
        assert!(
            err.contains(expected) && err.contains("config.json"),
            "{key} = {value}: {err}"
        );
    }
    assert!(with("hidden_act", serde_json::json!("swish")).is_none());
    assert!(with("use_sliding_window", serde_json::json!(false)).is_none());
    for key in [
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "rope_theta",
        "rms_norm_eps",
        "tie_word_embeddings",
        "rope_scaling",
        "hidden_act",
    ] {
        for value in serde_json::json!([
            0,
            1,
            3,
            -1,
            1e30,
            u64::MAX,
            4_294_967_296u64,
            2.5,
            "x",
            null,
            true,
            [],
            {}
        ])
        .as_array()
        .unwrap()
        {
            if let Some(err) = with(key, value.clone()) {
                assert!(err.contains("config.json"), "{key} = {value}: {err}");
            }
        }
    }
    std::fs::write(&config_path, base.to_string()).unwrap();

    let file = dir.join("model.safetensors");
    edit_safetensors_header(&file, |h| h["lm_head.weight"]["dtype"] = "I32".into());
    let err = WeightSource::open_safetensors(&dir)
        .err()
        .expect("an I32 output head is refused")
        .to_string();
    assert!(
        err.contains("tensor lm_head.weight is stored as I32"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
