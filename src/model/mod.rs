//! Models: a loaded model (weights, tokenizer, chat template) and its forward pass. Finding files and
//! reading tensors is [`crate::loading`]'s; the matrix kernels are [`crate::kernels`]'s.

pub mod attention;
pub mod chat;
pub mod config;
pub mod llama;
pub mod matmul;
pub mod ops;
pub mod profile;
pub mod state;
pub mod tokenizer;
pub mod weights;

use crate::error::{Error, Result};
use crate::loading::resolve::ModelFiles;
use candle_core::Device;
use chat::ChatTemplate;
use std::path::PathBuf;
use tokenizer::Tokenizer;
use weights::WeightFormat;

pub use llama::{Activations, SeqInput, Transformer};
pub use state::{SeqState, TraceEvent};

/// A model ready to run: weights, tokenizer, chat template and where it came from.
pub struct Model {
    pub transformer: Transformer,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub files: ModelFiles,
    /// A short human name (file stem or repository name).
    pub name: String,
}

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub format: WeightFormat,
    pub template: Option<ChatTemplate>,
    pub tokenizer: Option<PathBuf>,
    pub device: Device,
    /// How each sequence's cache stores keys and values.
    pub kv_type: crate::cache::KvType,
    /// The activations' type between operations (f32, or the float weights' own).
    pub activations: Activations,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            format: WeightFormat::Auto,
            template: None,
            tokenizer: None,
            device: Device::Cpu,
            kv_type: crate::cache::KvType::F32,
            activations: Activations::F32,
        }
    }
}

impl Model {
    /// Resolves `name` (path, built-in name, `random:NAME`, hub id) and loads it.
    pub fn load(name: &str, opts: &LoadOptions) -> Result<Self> {
        crate::loading::load_model(crate::loading::resolve::resolve(name)?, opts)
    }

    /// Loads a model from files already resolved (see [`crate::loading::load_model`]).
    pub fn load_files(files: ModelFiles, opts: &LoadOptions) -> Result<Self> {
        crate::loading::load_model(files, opts)
    }
}

/// End-of-turn tokens looked up in a `tokenizer.json`.
pub(crate) const EOS_NAMES: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
    "</s>",
];

impl Model {
    /// Refuses a sequence of `prompt` tokens plus `new` generated ones that does not fit the model's
    /// context, or a prompt too wide for one pass
    /// ([`config::ModelConfig::check_pass_elements`]), naming the numbers and the flags that set them.
    pub fn check_fits(&self, prompt: usize, new: usize, flags: &str) -> Result<()> {
        let context = self.transformer.config.max_position_embeddings;
        match prompt.checked_add(new) {
            Some(total) if total <= context => {}
            _ => {
                return Err(Error::Input(format!(
                "{flags}: a prompt of {prompt} tokens plus {new} new tokens does not fit the model's context of {context} tokens"
            )))
            }
        }
        self.transformer
            .config
            .check_pass_elements(prompt, false)
            .map_err(|e| Error::Input(format!("{flags}: a prompt of {e}")))
    }

    /// Refuses a teacher-forced pass of `tokens` whose logits of every token, kept as one tensor,
    /// would be too wide for one pass ([`config::ModelConfig::check_pass_elements`]).
    pub fn check_all_logits_fit(&self, tokens: usize, flags: &str) -> Result<()> {
        self.transformer
            .config
            .check_pass_elements(tokens, true)
            .map_err(|e| Error::Input(format!("{flags}: a text of {e}")))
    }

    /// Refuses a batch whose full caches, at `tokens` each, would need more than the memory of the
    /// device the model runs on (this machine's, or the GPU's), naming the numbers and `flag`;
    /// checked before anything is allocated, where the memory is known. Keys and values in f32.
    pub fn check_batch_memory(&self, batch: usize, tokens: usize, flag: &str) -> Result<()> {
        let Some((total, where_)) = crate::device::memory_capacity(self.transformer.device())
        else {
            return Ok(());
        };
        let per_sequence = self
            .transformer
            .config
            .kv_bytes(self.transformer.kv_type(), tokens) as u128;
        let need = batch as u128 * per_sequence;
        if need > total as u128 {
            return Err(Error::Input(format!(
                "{flag}: {batch} sequences of {tokens} tokens need {:.1} GiB of KV cache without compression, more than {where_} {:.1} GiB",
                need as f64 / (1u64 << 30) as f64,
                total as f64 / (1u64 << 30) as f64
            )));
        }
        Ok(())
    }

    /// What building `spec`'s policy for this model needs (the delimiter table only for Kara).
    pub fn policy_context(
        &self,
        spec: &crate::policy::PolicySpec,
        max_new_tokens: usize,
    ) -> crate::policy::BuildContext {
        let cfg = &self.transformer.config;
        crate::policy::BuildContext {
            num_layers: cfg.num_layers,
            head_dim: cfg.head_dim,
            max_new_tokens,
            qwen: matches!(cfg.arch, config::Arch::Qwen2 | config::Arch::Qwen3),
            delimiters: spec
                .needs_delimiters()
                .then(|| std::sync::Arc::new(self.tokenizer.delimiter_table())),
        }
    }
}
