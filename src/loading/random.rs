//! Random-weight models at real models' shapes: `--model random:NAME[@SEED]`.
//!
//! Speed and memory depend on a model's shapes, not on its weights, and the models the papers use
//! (DeepSeek-R1-Distill at 1.5B to 8B, Qwen3-8B) are 3 to 16 GB that a GPU machine without network
//! cannot fetch. A random model has the real shapes (layers, heads, GQA groups, head size, vocabulary,
//! RoPE) and bf16 weights drawn from a seed: every tensor is a function of (seed, tensor name) only,
//! counter-based, so any machine and any device gets the same bits and tensors generate in parallel.
//! Its outputs are noise: records of a random model carry no accuracy, and say so.
//!
//! The weights follow Hugging Face's initialisation scale (uniform with standard deviation 0.02 for
//! matrices, norms near 1, small biases), so activations and logits stay in bf16's range over any
//! depth. The tokenizer is byte-level over the model's whole vocabulary (see
//! [`crate::model::tokenizer::Tokenizer::byte_level`]), so any text encodes and any id decodes.

use crate::error::{Error, Result};
use crate::model::config::{Arch, Llama3RopeScaling, ModelConfig};
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

/// A random model as named: its shapes' name and the seed of its weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RandomSpec {
    pub name: String,
    pub seed: u64,
}

/// The seed of `random:NAME` without `@SEED`.
pub const DEFAULT_SEED: u64 = 0;

impl RandomSpec {
    /// Reads `random:NAME` or `random:NAME@SEED`, the name in any case (kept as kvbench spells it:
    /// it is part of the model's identity); `None` when `s` does not start with `random:`.
    pub fn parse(s: &str) -> Option<Result<Self>> {
        let rest = s
            .get(..7)
            .filter(|p| p.eq_ignore_ascii_case("random:"))
            .map(|_| &s[7..])?;
        let (name, seed) = match rest.split_once('@') {
            Some((n, seed)) => match seed.parse::<u64>() {
                Ok(v) => (n, v),
                Err(_) => {
                    return Some(Err(Error::Input(format!(
                        "model '{s}': the seed after '@' must be a whole number from 0 to 2^64 - 1"
                    ))))
                }
            },
            None => (rest, DEFAULT_SEED),
        };
        let Some(model) = RANDOM_MODELS
            .iter()
            .find(|m| m.name.eq_ignore_ascii_case(name.trim()))
        else {
            return Some(Err(Error::Input(format!(
                "model '{s}': no random model named {name:?}; available: {}",
                RANDOM_MODELS
                    .iter()
                    .map(|m| m.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))));
        };
        Some(Ok(RandomSpec {
            name: model.name.to_string(),
            seed,
        }))
    }

    /// The model's shape.
    pub fn config(&self) -> ModelConfig {
        shape(&self.name).expect("checked when parsed")
    }

    /// `random:NAME@SEED`, the name that loads it again.
    pub fn label(&self) -> String {
        format!("random:{}@{}", self.name, self.seed)
    }

    /// The identity a results directory records for the model (what a file's sha256 is for others).
    pub fn id(&self) -> String {
        let digest = Sha256::digest(format!(
            "kvbench random weights v1 {} {}",
            self.label(),
            serde_json::to_string(&self.config()).unwrap_or_default()
        ));
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The tensor `gguf_name` (kvbench's GGUF naming) as bf16 on `device`, or `None` when the shape
    /// has no such tensor.
    pub fn tensor(&self, gguf_name: &str, device: &Device) -> Result<Option<Tensor>> {
        let c = self.config();
        let Some((dims, kind)) = tensor_shape(&c, gguf_name) else {
            return Ok(None);
        };
        let n: usize = dims.iter().product();
        let seed = tensor_seed(self.seed, gguf_name);
        let (center, half_width) = match kind {
            // Uniform with standard deviation 0.02: half-width 0.02·√3.
            Kind::Matrix => (0.0, 0.02 * 3f32.sqrt()),
            Kind::Norm => (1.0, 0.1),
            Kind::Bias => (0.0, 0.02),
        };
        let mut values = vec![half::bf16::ZERO; n];
        values
            .par_chunks_mut(1 << 16)
            .enumerate()
            .for_each(|(c, chunk)| {
                let base = (c << 16) as u64;
                for (i, v) in chunk.iter_mut().enumerate() {
                    let u = unit(seed, base + i as u64);
                    *v = half::bf16::from_f32(center + half_width * u);
                }
            });
        let t = Tensor::from_vec(values, dims, &Device::Cpu)?;
        let t = if device.is_cpu() {
            t
        } else {
            t.to_device(device)?
        };
        debug_assert_eq!(t.dtype(), DType::BF16);
        Ok(Some(t))
    }
}

/// What a tensor is, which decides the scale of its values.
#[derive(Clone, Copy)]
enum Kind {
    Matrix,
    Norm,
    Bias,
}

/// Shape `[rows, cols]` (or `[n]`) and kind of a tensor by its GGUF name.
fn tensor_shape(c: &ModelConfig, name: &str) -> Option<(Vec<usize>, Kind)> {
    let (h, q, kv, ffn, v) = (
        c.hidden_size,
        c.num_heads * c.head_dim,
        c.num_kv_heads * c.head_dim,
        c.intermediate_size,
        c.vocab_size,
    );
    match name {
        "token_embd.weight" => return Some((vec![v, h], Kind::Matrix)),
        "output.weight" if !c.tie_word_embeddings => return Some((vec![v, h], Kind::Matrix)),
        "output_norm.weight" => return Some((vec![h], Kind::Norm)),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    if layer.parse::<usize>().ok()? >= c.num_layers {
        return None;
    }
    Some(match tail {
        "attn_norm.weight" | "ffn_norm.weight" => (vec![h], Kind::Norm),
        "attn_q.weight" => (vec![q, h], Kind::Matrix),
        "attn_k.weight" | "attn_v.weight" => (vec![kv, h], Kind::Matrix),
        "attn_output.weight" => (vec![h, q], Kind::Matrix),
        "ffn_gate.weight" | "ffn_up.weight" => (vec![ffn, h], Kind::Matrix),
        "ffn_down.weight" => (vec![h, ffn], Kind::Matrix),
        "attn_q.bias" if c.qkv_bias => (vec![q], Kind::Bias),
        "attn_k.bias" | "attn_v.bias" if c.qkv_bias => (vec![kv], Kind::Bias),
        "attn_q_norm.weight" | "attn_k_norm.weight" if c.qk_norm => (vec![c.head_dim], Kind::Norm),
        _ => return None,
    })
}

/// Every tensor name of a shape, in GGUF naming (for exporting).
pub fn tensor_names(c: &ModelConfig) -> Vec<String> {
    let mut names = vec!["token_embd.weight".to_string()];
    let per_layer = [
        "attn_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_q.bias",
        "attn_k.bias",
        "attn_v.bias",
        "attn_q_norm.weight",
        "attn_k_norm.weight",
        "attn_output.weight",
        "ffn_norm.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
    ];
    for l in 0..c.num_layers {
        for t in per_layer {
            let n = format!("blk.{l}.{t}");
            if tensor_shape(c, &n).is_some() {
                names.push(n);
            }
        }
    }
    names.push("output_norm.weight".into());
    if !c.tie_word_embeddings {
        names.push("output.weight".into());
    }
    names
}

/// A tensor's own seed: the model's seed and the tensor's name, hashed.
fn tensor_seed(seed: u64, name: &str) -> u64 {
    let d = Sha256::digest(format!("{seed}/{name}"));
    u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
}

/// Element `i`'s value, uniform in [-1, 1): SplitMix64 of the counter (Steele, Lea and Flood), its top
/// 24 bits as a float, exact in f32.
fn unit(seed: u64, i: u64) -> f32 {
    let mut z = seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z >> 40) as f32) * (2.0 / (1u64 << 24) as f32) - 1.0
}

/// A named shape.
pub struct RandomModel {
    pub name: &'static str,
    pub about: &'static str,
    config: fn() -> ModelConfig,
}

impl RandomModel {
    pub fn config(&self) -> ModelConfig {
        (self.config)()
    }
}

fn qwen2(
    hidden: usize,
    ffn: usize,
    layers: usize,
    heads: usize,
    kv: usize,
    vocab: usize,
) -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen2,
        hidden_size: hidden,
        intermediate_size: ffn,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv,
        head_dim: hidden / heads,
        vocab_size: vocab,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        rope_scaling: None,
        rope_interleaved: false,
        qkv_bias: true,
        qk_norm: false,
        tie_word_embeddings: false,
        max_position_embeddings: 131_072,
    }
}

/// The shapes kvbench knows, from each model's published `config.json`, and a tiny one for tests.
pub const RANDOM_MODELS: &[RandomModel] = &[
    RandomModel {
        name: "tiny",
        about: "a tiny Qwen2-layout model for tests: 4 layers, 4 query / 2 KV heads of 32, vocabulary 4096",
        config: || ModelConfig {
            max_position_embeddings: 4096,
            ..qwen2(128, 256, 4, 4, 2, 4096)
        },
    },
    RandomModel {
        name: "r1-distill-qwen-1.5b",
        about: "DeepSeek-R1-Distill-Qwen-1.5B: Qwen2, 28 layers, 12 query / 2 KV heads of 128",
        config: || qwen2(1536, 8960, 28, 12, 2, 151_936),
    },
    RandomModel {
        name: "r1-distill-qwen-7b",
        about: "DeepSeek-R1-Distill-Qwen-7B: Qwen2, 28 layers, 28 query / 4 KV heads of 128",
        config: || qwen2(3584, 18_944, 28, 28, 4, 152_064),
    },
    RandomModel {
        name: "r1-distill-qwen-14b",
        about: "DeepSeek-R1-Distill-Qwen-14B: Qwen2, 48 layers, 40 query / 8 KV heads of 128",
        config: || ModelConfig {
            rms_norm_eps: 1e-5,
            rope_theta: 1_000_000.0,
            ..qwen2(5120, 13_824, 48, 40, 8, 152_064)
        },
    },
    RandomModel {
        name: "r1-distill-llama-8b",
        about: "DeepSeek-R1-Distill-Llama-8B: Llama 3.1, 32 layers, 32 query / 8 KV heads of 128",
        config: || ModelConfig {
            arch: Arch::Llama,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: Some(Llama3RopeScaling {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            }),
            qkv_bias: false,
            ..qwen2(4096, 14_336, 32, 32, 8, 128_256)
        },
    },
    RandomModel {
        name: "qwen3-8b",
        about: "Qwen3-8B: 36 layers, 32 query / 8 KV heads of 128, QK-norm",
        config: || ModelConfig {
            arch: Arch::Qwen3,
            head_dim: 128,
            rope_theta: 1_000_000.0,
            qkv_bias: false,
            qk_norm: true,
            max_position_embeddings: 40_960,
            ..qwen2(4096, 12_288, 36, 32, 8, 151_936)
        },
    },
    RandomModel {
        name: "qwen2.5-coder-1.5b",
        about: "the built-in Qwen2.5-Coder-1.5B's shape: 28 layers, 12 query / 2 KV heads, tied",
        config: || ModelConfig {
            rope_theta: 1_000_000.0,
            tie_word_embeddings: true,
            max_position_embeddings: 32_768,
            ..qwen2(1536, 8960, 28, 12, 2, 151_936)
        },
    },
    RandomModel {
        name: "qwen2.5-coder-0.5b",
        about: "the built-in Qwen2.5-Coder-0.5B's shape: 24 layers, 14 query / 2 KV heads, tied",
        config: || ModelConfig {
            rope_theta: 1_000_000.0,
            tie_word_embeddings: true,
            max_position_embeddings: 32_768,
            ..qwen2(896, 4864, 24, 14, 2, 151_936)
        },
    },
    RandomModel {
        name: "smollm2-135m",
        about: "the built-in SmolLM2-135M's shape: Llama, 30 layers, 9 query / 3 KV heads, tied",
        config: || ModelConfig {
            arch: Arch::Llama,
            rms_norm_eps: 1e-5,
            rope_theta: 100_000.0,
            qkv_bias: false,
            tie_word_embeddings: true,
            max_position_embeddings: 8192,
            ..qwen2(576, 1536, 30, 9, 3, 49_152)
        },
    },
];

fn shape(name: &str) -> Option<ModelConfig> {
    RANDOM_MODELS
        .iter()
        .find(|m| m.name == name)
        .map(RandomModel::config)
}

/// The model's `config.json` as Hugging Face transformers writes it, for an exported checkpoint.
pub fn hf_config_json(c: &ModelConfig) -> serde_json::Value {
    let (model_type, arch) = match c.arch {
        Arch::Llama => ("llama", "LlamaForCausalLM"),
        Arch::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
        Arch::Qwen3 => ("qwen3", "Qwen3ForCausalLM"),
    };
    let mut v = serde_json::json!({
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab_size,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "tie_word_embeddings": c.tie_word_embeddings,
        "max_position_embeddings": c.max_position_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "attention_bias": c.qkv_bias,
        "use_sliding_window": false,
        "bos_token_id": 256,
        "eos_token_id": 256,
    });
    if let Some(s) = c.rope_scaling {
        v["rope_scaling"] = serde_json::json!({
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_with_and_without_a_seed_and_unknown_ones_are_listed() {
        let s = RandomSpec::parse("random:smollm2-135m").unwrap().unwrap();
        assert_eq!((s.name.as_str(), s.seed), ("smollm2-135m", DEFAULT_SEED));
        let s = RandomSpec::parse("random:qwen3-8b@42").unwrap().unwrap();
        assert_eq!(s.seed, 42);
        assert!(RandomSpec::parse("smollm2-135m").is_none());
        let e = RandomSpec::parse("random:gpt5").unwrap().unwrap_err();
        assert!(e.is_input_error() && e.to_string().contains("r1-distill-qwen-7b"));
        assert!(RandomSpec::parse("random:qwen3-8b@x").unwrap().is_err());
        // Any case, kept as kvbench spells it: the name is part of the model's identity.
        let s = RandomSpec::parse("Random:R1-Distill-Qwen-7B@3")
            .unwrap()
            .unwrap();
        assert_eq!(s.label(), "random:r1-distill-qwen-7b@3");
        let own = RandomSpec::parse("random:r1-distill-qwen-7b@3")
            .unwrap()
            .unwrap();
        assert_eq!(s.id(), own.id());
    }

    #[test]
    fn every_shape_is_valid_and_weights_are_a_function_of_seed_and_name() {
        for m in RANDOM_MODELS {
            m.config()
                .validate()
                .unwrap_or_else(|e| panic!("{}: {e}", m.name));
        }
        let spec = RandomSpec::parse("random:smollm2-135m@7").unwrap().unwrap();
        let a = spec
            .tensor("blk.3.attn_k.weight", &Device::Cpu)
            .unwrap()
            .unwrap();
        let b = spec
            .tensor("blk.3.attn_k.weight", &Device::Cpu)
            .unwrap()
            .unwrap();
        assert_eq!(a.dims(), &[192, 576]);
        let (a, b) = (
            a.to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            b.to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
        );
        assert_eq!(a, b);
        let other = RandomSpec {
            seed: 8,
            ..spec.clone()
        };
        let c = other
            .tensor("blk.3.attn_k.weight", &Device::Cpu)
            .unwrap()
            .unwrap();
        let c = c
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_ne!(a, c);
        // Standard deviation near 0.02, mean near 0.
        let n = a.len() as f32;
        let mean = a.iter().sum::<f32>() / n;
        let sd = (a.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / n).sqrt();
        assert!(mean.abs() < 1e-3 && (sd - 0.02).abs() < 1e-3, "{mean} {sd}");
        // Tied: no output matrix; SmolLM2 has no biases.
        assert!(spec
            .tensor("output.weight", &Device::Cpu)
            .unwrap()
            .is_none());
        assert!(spec
            .tensor("blk.0.attn_q.bias", &Device::Cpu)
            .unwrap()
            .is_none());
        assert!(spec
            .tensor("blk.30.attn_q.weight", &Device::Cpu)
            .unwrap()
            .is_none());
        assert_eq!(tensor_names(&spec.config()).len(), 1 + 30 * 9 + 1);
    }
}
