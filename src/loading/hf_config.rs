//! A Hugging Face `config.json`, read into the [`ModelConfig`] the forward pass uses. What kvbench
//! would compute differently from the checkpoint's own model (another activation, sliding-window
//! attention, RoPE scaling other than Llama 3's) is refused by name.

use crate::model::config::{Arch, ModelConfig};
use serde::Deserialize;

/// The subset of a Hugging Face `config.json` kvbench reads.
#[derive(Debug, Deserialize)]
pub struct HfConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    #[serde(default)]
    pub model_type: Option<String>,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub vocab_size: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub torch_dtype: Option<String>,
    /// The MLP's activation: kvbench computes SwiGLU with SiLU, so any other is refused.
    #[serde(default)]
    pub hidden_act: Option<String>,
    /// Qwen2's sliding-window attention, which kvbench does not compute: refused when on.
    #[serde(default)]
    pub use_sliding_window: Option<bool>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f32 {
    10_000.0
}
fn default_max_pos() -> usize {
    4096
}

impl HfConfig {
    pub fn to_model_config(&self) -> Result<ModelConfig, String> {
        let arch = self
            .model_type
            .as_deref()
            .and_then(Arch::parse)
            .or_else(|| self.architectures.iter().find_map(|a| Arch::parse(a)))
            .ok_or_else(|| {
                format!(
                    "unsupported architecture {:?} / model_type {:?} (kvbench runs llama, qwen2 and qwen3)",
                    self.architectures, self.model_type
                )
            })?;
        // What kvbench would otherwise compute differently from the checkpoint's own model.
        if let Some(act) = self.hidden_act.as_deref() {
            if !matches!(act, "silu" | "swish") {
                return Err(format!(
                    "hidden_act {act:?} is not supported (kvbench computes SiLU, \"silu\")"
                ));
            }
        }
        if self.use_sliding_window == Some(true) {
            return Err(
                "use_sliding_window is true: sliding-window attention is not supported".into(),
            );
        }
        // transformers names the kind `rope_type` (older configs: `type`); "default" is no scaling.
        let kind = |v: &serde_json::Value| {
            v.get("rope_type")
                .or_else(|| v.get("type"))
                .and_then(|t| t.as_str())
                .map(str::to_owned)
        };
        let rope_scaling = match &self.rope_scaling {
            Some(v) if v.is_null() => None,
            Some(v) => match kind(v).as_deref() {
                Some("llama3") => Some(
                    serde_json::from_value(v.clone()).map_err(|e| format!("rope_scaling: {e}"))?,
                ),
                Some("default") => None,
                _ => {
                    return Err(format!(
                        "rope_scaling {v} is not supported (only rope_type = llama3)"
                    ))
                }
            },
            None => None,
        };
        let config = ModelConfig {
            arch,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads: self.num_attention_heads,
            num_kv_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim: self
                .head_dim
                .unwrap_or(self.hidden_size / self.num_attention_heads.max(1)),
            vocab_size: self.vocab_size,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            rope_scaling,
            rope_interleaved: false,
            qkv_bias: self.attention_bias.unwrap_or(arch == Arch::Qwen2),
            qk_norm: arch == Arch::Qwen3,
            tie_word_embeddings: self.tie_word_embeddings,
            max_position_embeddings: self.max_position_embeddings,
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_rope_scaling(scaling: serde_json::Value) -> Result<ModelConfig, String> {
        let hf: HfConfig = serde_json::from_value(serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 100, "rope_scaling": scaling,
        }))
        .map_err(|e| e.to_string())?;
        hf.to_model_config()
    }

    #[test]
    fn hf_rope_scaling_by_either_key_and_unknown_kinds_refused() {
        let llama3 = |key: &str| {
            let mut v = serde_json::json!({"factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
            v[key] = "llama3".into();
            v
        };
        for key in ["rope_type", "type"] {
            let c = with_rope_scaling(llama3(key)).unwrap();
            assert_eq!(c.rope_scaling.map(|s| s.factor), Some(8.0), "{key}");
        }
        for none in [
            serde_json::Value::Null,
            serde_json::json!({"rope_type": "default"}),
        ] {
            assert_eq!(with_rope_scaling(none).unwrap().rope_scaling, None);
        }
        for kind in ["yarn", "linear", "dynamic"] {
            let e = with_rope_scaling(serde_json::json!({"rope_type": kind, "factor": 4.0}))
                .unwrap_err();
            assert!(e.contains("not supported") && e.contains(kind), "{e}");
        }
    }
}
