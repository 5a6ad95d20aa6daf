//! A GGUF file's metadata, read into the [`ModelConfig`] the forward pass uses (llama.cpp's keys,
//! `ARCH.embedding_length` and the rest), and checked against the file's tensors.

use super::shapes::check_shapes;
use crate::error::{Error, Result};
use crate::model::config::{Arch, Llama3RopeScaling, ModelConfig};
use candle_core::quantized::gguf_file;
use std::path::Path;

/// Reads the model shape from a GGUF file's metadata and checks it against the file's tensors.
pub fn model_config(path: &Path, content: &gguf_file::Content) -> Result<ModelConfig> {
    let md = &content.metadata;
    let arch_name = md
        .get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .ok_or_else(|| Error::model(path, "metadata has no general.architecture"))?
        .clone();
    let arch = Arch::parse(&arch_name).ok_or_else(|| {
        Error::model(
            path,
            format!("unsupported architecture '{arch_name}' (kvbench runs llama, qwen2, qwen3)"),
        )
    })?;
    let get_u = |key: &str| -> Result<usize> {
        let full = format!("{arch_name}.{key}");
        md.get(&full)
            .and_then(|v| {
                v.to_u32()
                    .ok()
                    .map(|x| x as usize)
                    .or_else(|| v.to_u64().ok().map(|x| x as usize))
            })
            .ok_or_else(|| {
                Error::model(
                    path,
                    format!("metadata key '{full}' missing or not an integer"),
                )
            })
    };
    let get_f = |key: &str| {
        md.get(&format!("{arch_name}.{key}"))
            .and_then(|v| v.to_f32().ok())
    };
    let hidden_size = get_u("embedding_length")?;
    let num_heads = get_u("attention.head_count")?;
    let num_kv_heads = get_u("attention.head_count_kv").unwrap_or(num_heads);
    let head_dim = get_u("attention.key_length").unwrap_or(hidden_size / num_heads.max(1));
    let tokens = md
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.to_vec().ok())
        .map(|v| v.len());
    let declared = md
        .get(&format!("{arch_name}.vocab_size"))
        .map(|_| get_u("vocab_size"));
    let vocab_size = match (tokens, declared) {
        // A declared size must agree with the token list (the embedding's rows are checked against
        // the vocabulary below): a contradiction marks a damaged or hand-edited file.
        (Some(n), Some(Ok(d))) if d != n => {
            return Err(Error::model(
                path,
                format!("{arch_name}.vocab_size is {d} but tokenizer.ggml.tokens lists {n} tokens"),
            ))
        }
        (_, Some(Err(e))) => return Err(e),
        (Some(n), _) => n,
        (None, Some(Ok(d))) => d,
        (None, None) => get_u("vocab_size")?,
    };
    // RoPE as kvbench computes it: every dimension rotated, frequencies from the base, then Llama 3
    // scaling (from this metadata, or as llama.cpp writes it: the `rope_freqs.weight` factors the
    // forward pass divides by). Anything else would be computed wrong, so it is refused by name.
    let key = |k: &str| format!("{arch_name}.{k}");
    let scaling_type = md
        .get(&key("rope.scaling.type"))
        .map(|v| v.to_string().cloned().unwrap_or_else(|_| format!("{v:?}")));
    let factor = get_f("rope.scaling.factor").or_else(|| get_f("rope.scale_linear"));
    let rope_scaling = match (scaling_type.as_deref(), factor) {
        (Some("llama3"), Some(factor)) => Some(Llama3RopeScaling {
            factor,
            low_freq_factor: get_f("rope.scaling.low_freq_factor").unwrap_or(1.0),
            high_freq_factor: get_f("rope.scaling.high_freq_factor").unwrap_or(4.0),
            original_max_position_embeddings: get_u("rope.scaling.original_context_length")
                .unwrap_or(8192),
        }),
        (Some("none"), _) | (None, None) => None,
        // llama.cpp reads a factor without a type as linear scaling; 0 and 1 mean none.
        (None, Some(f)) if f == 0.0 || f == 1.0 => None,
        (kind, factor) => {
            return Err(Error::model(
                path,
                format!(
                    "RoPE scaling {} (factor {}) is not supported: kvbench computes plain RoPE and Llama 3 scaling only",
                    kind.map_or("linear".to_string(), |k| format!("'{k}' ({})", key("rope.scaling.type"))),
                    factor.map_or("unset".to_string(), |f| f.to_string()),
                ),
            ))
        }
    };
    let config = ModelConfig {
        arch,
        hidden_size,
        intermediate_size: get_u("feed_forward_length")?,
        num_layers: get_u("block_count")?,
        num_heads,
        num_kv_heads,
        head_dim,
        vocab_size,
        rms_norm_eps: get_f("attention.layer_norm_rms_epsilon").unwrap_or(1e-5) as f64,
        rope_theta: get_f("rope.freq_base").unwrap_or(10_000.0),
        rope_scaling,
        // llama.cpp permutes Llama q/k rows for the interleaved rotation; Qwen keeps the HF layout.
        rope_interleaved: arch == Arch::Llama,
        qkv_bias: content.tensor_infos.contains_key("blk.0.attn_q.bias"),
        qk_norm: content
            .tensor_infos
            .contains_key("blk.0.attn_q_norm.weight"),
        tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
        max_position_embeddings: get_u("context_length").unwrap_or(4096),
    };
    config.validate().map_err(|e| Error::model(path, e))?;
    let shape = |n: &str| content.tensor_infos.get(n).map(|t| t.shape.dims().to_vec());
    check_shapes(&config, &shape, &|n: &str| n.to_string()).map_err(|e| Error::model(path, e))?;
    // After the shapes, which name the tensor when the head size itself is wrong.
    if let Ok(n) = get_u("rope.dimension_count") {
        if n != head_dim {
            return Err(Error::model(
                path,
                format!("{} is {n} but the head size is {head_dim}: partial rotary embeddings are not supported", key("rope.dimension_count")),
            ));
        }
    }
    Ok(config)
}
