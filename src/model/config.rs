//! The shape of a decoder model, as the forward pass needs it. Reading it from a file (GGUF metadata,
//! a Hugging Face `config.json`) is [`crate::loading`]'s.
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

    /// Refuses a forward pass over `tokens` new tokens at once (a prompt, or a teacher-forced text)
    /// whose widest activation, `[tokens, width]`, would hold more elements than candle's CUDA kernels
    /// count ([`crate::cache::pool::KERNEL_ELEMENTS`]; past it a kernel covers part of a tensor,
    /// silently): the joined gate and up projections (`2 · intermediate`), the heads' queries, keys
    /// and values, and the logits of every token where `all_logits`. Attention's scores are chunked
    /// apart (`prefill_chunk`). Held on every device, as the pool's bound is.
    pub fn check_pass_elements(&self, tokens: usize, all_logits: bool) -> Result<(), String> {
        let heads = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim;
        let widths = [
            (
                "the MLP's gate and up projections",
                2 * self.intermediate_size,
            ),
            ("the attention's queries, keys and values", heads),
            ("the hidden states", self.hidden_size),
            (
                "the logits of every token",
                if all_logits { self.vocab_size } else { 0 },
            ),
        ];
        let limit = crate::cache::pool::KERNEL_ELEMENTS;
        let (what, width) = widths
            .into_iter()
            .max_by_key(|&(_, w)| w)
            .expect("four widths");
        match tokens.checked_mul(width) {
            Some(e) if e <= limit => Ok(()),
            _ => Err(format!(
                "{tokens} tokens in one pass: {what} would hold {tokens} × {width} elements, more than \
                 the {limit} candle's CUDA kernels count (at most {} tokens at once for this model)",
                limit / width.max(1)
            )),
        }
    }

    /// Parameters of the model's matrices and embeddings (an untied output head counted apart); the
    /// norms and biases, a few per ten thousand, are left out. Saturates rather than overflows (a
    /// shape is checked before it is used, not before it is counted).
    pub fn matrix_parameters(&self) -> u64 {
        let [layers, hidden, heads, kv_heads, head_dim, inter, vocab] = [
            self.num_layers,
            self.hidden_size,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.intermediate_size,
            self.vocab_size,
        ]
        .map(|x| x as u64);
        let attention = hidden
            .saturating_mul(heads.saturating_add(kv_heads.saturating_mul(2)))
            .saturating_mul(head_dim)
            .saturating_add(heads.saturating_mul(head_dim).saturating_mul(hidden));
        let mlp = hidden.saturating_mul(inter).saturating_mul(3);
        let embeddings = vocab
            .saturating_mul(hidden)
            .saturating_mul(if self.tie_word_embeddings { 1 } else { 2 });
        layers
            .saturating_mul(attention.saturating_add(mlp))
            .saturating_add(embeddings)
    }

    /// Bytes of keys and values a full cache of `entries` tokens holds across all layers, stored
    /// as `kv` (the reference of every KV ratio): entries times a token's bytes, except under KIVI,
    /// whose full-precision window costs more than its packed entries.
    pub fn kv_bytes(&self, kv: crate::cache::KvType, entries: usize) -> usize {
        self.num_layers * self.num_kv_heads * kv.head_bytes(entries, self.head_dim)
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// At R1-Distill-Qwen-7B's shapes (vocabulary 152,064, MLP 18,944) the logits of more than
    /// 28,244 tokens pass the kernels' count, the MLP's of more than 113,359 (within its context of
    /// 131,072): each refused one token past its bound, named, and accepted at it.
    #[test]
    fn a_pass_wider_than_the_kernels_count_is_refused_by_its_widest_tensor() {
        let spec = crate::loading::random::RandomSpec::parse("random:r1-distill-qwen-7b")
            .unwrap()
            .unwrap();
        let c = spec.config();
        let limit = crate::cache::pool::KERNEL_ELEMENTS;
        let (logits, mlp) = (limit / c.vocab_size, limit / (2 * c.intermediate_size));
        assert!(
            logits < mlp && mlp < c.max_position_embeddings,
            "{logits} {mlp}"
        );
        c.check_pass_elements(logits, true).unwrap();
        let e = c.check_pass_elements(logits + 1, true).unwrap_err();
        assert!(e.contains("the logits of every token"), "{e}");
        assert!(e.contains(&format!("at most {logits} tokens")), "{e}");
        c.check_pass_elements(mlp, false).unwrap();
        let e = c.check_pass_elements(mlp + 1, false).unwrap_err();
        assert!(e.contains("gate and up"), "{e}");
        assert!(c.check_pass_elements(usize::MAX, false).is_err());
    }
}
