//! Hugging Face model repositories: the local HF cache first (no network, no hf-hub needed), then the
//! hub through hf-hub's blocking client when the `hub` feature is on.
//!
//! A downloaded LFS file is named by its sha256 in the cache (`blobs/<sha256>`); kvbench re-hashes every
//! `*.safetensors` it downloads and refuses one whose content does not match that name.

use super::resolve::ModelFiles;
use super::verify::verify;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

const REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];

/// The HF hub cache root: `$HF_HUB_CACHE`, `$HF_HOME/hub`, or `~/.cache/huggingface/hub`.
pub fn hf_cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return PathBuf::from(p).join("hub");
    }
    dirs::home_dir()
        .unwrap_or_default()
        .join(".cache")
        .join("huggingface")
        .join("hub")
}

/// A complete snapshot of `repo` in the local HF cache, if there is one.
pub fn cached_snapshot(repo: &str) -> Option<PathBuf> {
    let dir = hf_cache_root().join(format!("models--{}", repo.replace('/', "--")));
    let revision = crate::files::read_text(&dir.join("refs").join("main"), 4096).ok()?;
    let snap = dir.join("snapshots").join(revision.trim());
    let complete = REQUIRED.iter().all(|f| snap.join(f).is_file()) && has_weights(&snap);
    complete.then_some(snap)
}

fn has_weights(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .any(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        })
        .unwrap_or(false)
}

/// Resolves `owner/name` to a local model directory.
pub fn resolve_repo(repo: &str) -> Result<ModelFiles> {
    if let Some(snap) = cached_snapshot(repo) {
        return Ok(ModelFiles::HfDir(snap));
    }
    download(repo).map(ModelFiles::HfDir)
}

#[cfg(feature = "hub")]
fn download(repo: &str) -> Result<PathBuf> {
    let err = |reason: String| Error::Resolve {
        name: repo.into(),
        reason,
    };
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(true)
        .build()
        .map_err(|e| err(format!("cannot start the hub client: {e}")))?;
    let r = api.model(repo.to_string());
    let mut dir = None;
    for f in REQUIRED {
        let p = r
            .get(f)
            .map_err(|e| err(format!("cannot fetch {f} from the hub: {e}")))?;
        dir = p.parent().map(Path::to_path_buf);
    }
    let weights: Vec<String> = match r.get("model.safetensors.index.json") {
        Ok(index) => {
            let text = crate::files::read_text(&index, crate::files::CONFIG_LIMIT)?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| Error::model(&index, format!("invalid index: {e}")))?;
            let mut files: Vec<String> = v["weight_map"]
                .as_object()
                .map(|m| {
                    m.values()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            files.sort();
            files.dedup();
            files
        }
        Err(_) => vec!["model.safetensors".to_string()],
    };
    for f in &weights {
        let p = r
            .get(f)
            .map_err(|e| err(format!("cannot fetch {f} from the hub: {e}")))?;
        verify_blob(&p)?;
    }
    dir.ok_or_else(|| err("hub returned no files".into()))
}

#[cfg(not(feature = "hub"))]
fn download(repo: &str) -> Result<PathBuf> {
    Err(Error::Resolve {
        name: repo.into(),
        reason: format!(
            "not in the Hugging Face cache ({}) and this kvbench was built without the `hub` feature",
            hf_cache_root().display()
        ),
    })
}

/// Checks a cached LFS file against the sha256 its blob is named after.
pub fn verify_blob(link: &Path) -> Result<()> {
    let target = std::fs::canonicalize(link).map_err(|e| Error::io(link, e))?;
    let Some(name) = target.file_name().and_then(|n| n.to_str()) else {
        return Ok(());
    };
    if name.len() != 64 || !name.chars().all(|c| c.is_ascii_hexdigit()) {
        return Ok(()); // not an LFS blob (small git file): nothing to check against
    }
    // The error names the link: the file the user's cache lists under the repository's path.
    verify(&target, name).map_err(|e| match e {
        Error::Checksum {
            expected, found, ..
        } => Error::Checksum {
            path: link.to_path_buf(),
            expected,
            found,
        },
        e => e,
    })
}
