//! The shape of a decoder model, read from GGUF metadata or a Hugging Face `config.json`.
//!
//! One struct serves every architecture kvbench runs (Llama, Qwen2, Qwen3); the differences are flags
//! (q/k/v biases, QK-norm, RoPE pairing, tied embeddings), so the forward pass reads them instead of
//! branching on a model name.

use serde::Deserialize;

/// Which family the weights belong to. Decides tensor names and defaults, nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
}

impl Arch {
    pub fn parse(name: &str) -> Option<Arch> {
        match name.to_ascii_lowercase().as_str() {
            "llama" | "llamaforcausallm" | "mistral" | "mistralforcausallm" => Some(Arch::Llama),
            "qwen2" | "qwen2forcausallm" => Some(Arch::Qwen2),
            "qwen3" | "qwen3forcausallm" => Some(Arch::Qwen3),
            _ => None,
        }
    }
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f32,
    /// Llama 3 style frequency scaling, when the model uses it.
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// true: pairs (2i, 2i+1) are rotated together (GGUF Llama, whose q/k rows llama.cpp permuted);
    /// false: pairs (i, i + d/2) (Hugging Face layout, all Qwen models).
    pub rope_interleaved: bool,
    /// q, k and v projections carry a bias (Qwen2).
    pub qkv_bias: bool,
    /// per-head RMSNorm on queries and keys before RoPE (Qwen3).
    pub qk_norm: bool,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize, serde::Serialize)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: usize,
}

impl ModelConfig {
    /// Query heads per KV head (the GQA group size `g`).
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Bytes of keys and values one cached token costs across all layers, for an element size.
    pub fn kv_bytes_per_token(&self, elem_bytes: usize) -> usize {
        self.num_layers * 2 * self.num_kv_heads * self.head_dim * elem_bytes
    }

    /// Checks the invariants the forward pass relies on.
    pub fn validate(&self) -> Result<(), String> {
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            return Err(format!(
                "head counts {} / {} are not a valid GQA layout",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "head dimension {} must be even and positive",
                self.head_dim
            ));
        }
        if self.num_layers == 0 || self.hidden_size == 0 || self.vocab_size == 0 {
            return Err("layer count, hidden size and vocabulary size must be positive".into());
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return Err(format!(
                "RMSNorm epsilon {} must be a finite number in (0, 1)",
                self.rms_norm_eps
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(format!(
                "RoPE frequency base {} must be a finite number above 1",
                self.rope_theta
            ));
        }
        if let Some(s) = self.rope_scaling {
            let ok = [s.factor, s.low_freq_factor, s.high_freq_factor]
                .iter()
                .all(|x| x.is_finite() && *x > 0.0)
                && s.high_freq_factor != s.low_freq_factor
                && s.original_max_position_embeddings > 0;
            if !ok {
                return Err(format!(
                    "Llama 3 RoPE scaling (factor {}, low_freq_factor {}, high_freq_factor {}, \
                     original_max_position_embeddings {}) needs finite positive values and two \
                     different frequency factors",
                    s.factor,
                    s.low_freq_factor,
                    s.high_freq_factor,
                    s.original_max_position_embeddings
                ));
            }
        }
        if self.max_position_embeddings == 0 {
            return Err("the context length must be positive".into());
        }
        Ok(())
    }

    /// Inverse frequencies of the rotary embedding, with Llama 3 scaling applied when configured.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim;
        let base: Vec<f32> = (0..d)
            .step_by(2)
            .map(|i| 1.0 / self.rope_theta.powf(i as f32 / d as f32))
            .collect();
        let Some(s) = self.rope_scaling else {
            return base;
        };
        let low_wavelen = s.original_max_position_embeddings as f32 / s.low_freq_factor;
        let high_wavelen = s.original_max_position_embeddings as f32 / s.high_freq_factor;
        base.into_iter()
            .map(|f| {
                let wavelen = 2.0 * std::f32::consts::PI / f;
                if wavelen < high_wavelen {
                    f
                } else if wavelen > low_wavelen {
                    f / s.factor
                } else {
                    let smooth = (s.original_max_position_embeddings as f32 / wavelen
                        - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    (1.0 - smooth) * f / s.factor + smooth * f
                }
            })
            .collect()
    }
}

/// Divides the rotary frequencies by per-pair factors, as llama.cpp does with a GGUF's
/// `rope_freqs.weight` (how its converter stores Llama 3.1 scaling): pair `i` turns at
/// `inv_freq[i] / factors[i]`.
pub fn apply_rope_freq_factors(inv_freq: &mut [f32], factors: &[f32]) -> Result<(), String> {
    if factors.len() != inv_freq.len() {
        return Err(format!(
            "rope_freqs.weight has {} factors, the head needs {} (half the head size)",
            factors.len(),
            inv_freq.len()
        ));
    }
    if let Some(bad) = factors.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
        return Err(format!(
            "rope_freqs.weight holds {bad}; every factor must be finite and positive"
        ));
    }
    for (f, k) in inv_freq.iter_mut().zip(factors) {
        *f /= k;
    }
    Ok(())
}

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

    #[test]
    fn freq_factors_divide_each_pair_and_bad_ones_are_refused() {
        let mut f = vec![1.0f32, 0.5, 0.25];
        apply_rope_freq_factors(&mut f, &[1.0, 2.0, 8.0]).unwrap();
        assert_eq!(f, [1.0, 0.25, 0.03125]);
        assert!(apply_rope_freq_factors(&mut f, &[1.0, 2.0]).is_err());
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let e = apply_rope_freq_factors(&mut f, &[1.0, bad, 1.0]).unwrap_err();
            assert!(e.contains("finite and positive"), "{e}");
        }
    }
}
