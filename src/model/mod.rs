//! Models: a loaded model (weights, tokenizer, chat template) and its forward pass. Finding files and
//! reading tensors is [`crate::loading`]'s; the matrix kernels are [`crate::kernels`]'s.

pub mod attention;
pub mod chat;
pub mod config;
pub mod llama;
pub mod ops;
pub mod state;
pub mod tokenizer;
pub mod weights;

use crate::error::{Error, Result};
use crate::loading::resolve::ModelFiles;
use crate::loading::source::WeightSource;
use candle_core::Device;
use chat::ChatTemplate;
use std::path::PathBuf;
use tokenizer::Tokenizer;
use weights::WeightFormat;

pub use llama::{SeqInput, Transformer};
pub use state::{SeqState, TraceEvent};

/// The paths these modules had in kvbench 0.4 (`kvbench::model::resolve::TEST_MODEL`, ...).
pub use crate::loading::{hub, resolve, source};

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
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            format: WeightFormat::Auto,
            template: None,
            tokenizer: None,
            device: Device::Cpu,
        }
    }
}

impl Model {
    /// Resolves `name` (path, built-in name or hub id) and loads it.
    pub fn load(name: &str, opts: &LoadOptions) -> Result<Self> {
        let files = resolve::resolve(name)?;
        Self::load_files(files, opts)
    }

    pub fn load_files(files: ModelFiles, opts: &LoadOptions) -> Result<Self> {
        let (mut source, config, default_tokenizer) = match &files {
            ModelFiles::Gguf(path) => {
                let src = WeightSource::open_gguf(path)?;
                let cfg = src.gguf_config()?;
                let tok = match src.gguf_metadata() {
                    Some(md) if opts.tokenizer.is_none() => Some(Tokenizer::from_gguf(md, path)?),
                    _ => None,
                };
                (src, cfg, tok)
            }
            ModelFiles::HfDir(dir) => {
                let (src, cfg) = WeightSource::open_safetensors(dir)?;
                (src, cfg, None)
            }
        };
        let tokenizer = match (default_tokenizer, &opts.tokenizer, &files) {
            (Some(t), _, _) => t,
            (None, Some(p), _) => Tokenizer::from_file(p, EOS_NAMES)?,
            (None, None, ModelFiles::HfDir(dir)) => {
                Tokenizer::from_file(&dir.join("tokenizer.json"), EOS_NAMES)?
            }
            (None, None, ModelFiles::Gguf(p)) => {
                return Err(Error::model(
                    p,
                    "no tokenizer in the file; pass --tokenizer tokenizer.json",
                ))
            }
        };
        if tokenizer.vocab_size() > config.vocab_size.saturating_add(1024) {
            return Err(Error::model(
                source.path(),
                format!(
                    "tokenizer has {} tokens but the model only {} embeddings: wrong tokenizer?",
                    tokenizer.vocab_size(),
                    config.vocab_size
                ),
            ));
        }
        let template = opts
            .template
            .unwrap_or_else(|| ChatTemplate::detect(&tokenizer));
        let transformer = Transformer::load(&mut source, config, opts.format, &opts.device)?;
        let name = match &files {
            ModelFiles::Gguf(p) => p.file_stem().map(|s| s.to_string_lossy().into_owned()),
            // A hub snapshot (`…/models--owner--name/snapshots/<rev>`) is named after its repository.
            ModelFiles::HfDir(p) => p
                .ancestors()
                .filter_map(|a| {
                    a.file_name()?
                        .to_str()?
                        .strip_prefix("models--")
                        .map(|r| r.replace("--", "/"))
                })
                .next()
                .or_else(|| p.file_name().map(|s| s.to_string_lossy().into_owned())),
        }
        .unwrap_or_else(|| "model".into());
        Ok(Self {
            transformer,
            tokenizer,
            template,
            files,
            name,
        })
    }
}

/// End-of-turn tokens looked up in a `tokenizer.json`.
const EOS_NAMES: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
    "</s>",
];

impl Model {
    /// Refuses a sequence of `prompt` tokens plus `new` generated ones that does not fit the model's
    /// context, naming both numbers and the flags that set them.
    pub fn check_fits(&self, prompt: usize, new: usize, flags: &str) -> Result<()> {
        let context = self.transformer.config.max_position_embeddings;
        match prompt.checked_add(new) {
            Some(total) if total <= context => Ok(()),
            _ => Err(Error::Input(format!(
                "{flags}: a prompt of {prompt} tokens plus {new} new tokens does not fit the model's context of {context} tokens"
            ))),
        }
    }

    /// Refuses a batch whose full caches, at `tokens` each, would need more than this machine's
    /// memory (f32 keys and values), naming the numbers and `flag`; checked before anything is
    /// allocated, where the operating system says how much memory there is.
    pub fn check_batch_memory(&self, batch: usize, tokens: usize, flag: &str) -> Result<()> {
        let Some(total) = crate::metrics::total_memory_bytes() else {
            return Ok(());
        };
        let per_token = self.transformer.config.kv_bytes_per_token(4) as u128;
        let need = batch as u128 * tokens as u128 * per_token;
        if need > total as u128 {
            return Err(Error::Input(format!(
                "{flag}: {batch} sequences of {tokens} tokens need {:.1} GiB of KV cache without compression, more than this machine's {:.1} GiB",
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
