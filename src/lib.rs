//! kvbench: measure what KV-cache compression does to reasoning language models.
//!
//! Layers, from the bottom: [`loading`] (a model name to verified files, files to tensors),
//! [`kernels`] (matrix products from quantized blocks), [`model`] (weights, tokenizer, the forward pass
//! over a cache kvbench owns), [`cache`] (the per-layer, per-KV-head cache), [`policy`] (the compression contract),
//! [`generate`] (prefill, batched decoding, sampling), [`eval`] (problem sets and grading),
//! [`metrics`] (memory and time measurements), [`parallel`] (a spinning team for decoding's short
//! parallel steps), and the command line in `cli`.

pub mod cache;
pub mod device;
pub mod error;
pub mod eval;
pub mod files;
pub mod flags;
pub mod generate;
pub mod host_copy;
pub mod kernels;
pub mod loading;
pub mod metrics;
pub mod model;
pub mod parallel;
pub mod policy;
pub mod report;
pub mod results;
pub mod sweep;
pub mod switches;
pub mod temps;

pub use error::{Error, Result};

/// Writes a line to standard error like `eprintln!`, but a failed write (a closed pipe, `2>/dev/full`)
/// is ignored instead of panicking: standard error carries only diagnostics, and losing them must not
/// stop the work they describe, whose results go to files and standard output.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// The most compute threads kvbench accepts: four per logical core. More only adds scheduling (and
/// `--threads 100000` would start thousands of OS threads).
pub fn max_threads() -> usize {
    4 * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The key a name is looked up by, so that names match whatever their case, hyphens, underscores or
/// spaces (`R-KV` and `rkv`, `MATH-500` and `math500`): lower case, without those.
pub fn name_key(name: &str) -> String {
    name.chars()
        .filter(|c| !matches!(c, '-' | '_') && !c.is_whitespace())
        .collect::<String>()
        .to_ascii_lowercase()
}

/// Parses a count that must be at least 1 (tokens, batch sizes, samples, repeats, lengths): clap then
/// names the flag and its value when it is 0, before any model is loaded.
pub fn parse_positive(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("expected a whole number from 1".into()),
    }
}

/// Parses a flag naming a file to read (`--tokenizer`, `--token-file`): it must be one, checked as
/// the flags are parsed, before a model is fetched or loaded.
pub fn parse_file(s: &str) -> std::result::Result<std::path::PathBuf, String> {
    let path = std::path::PathBuf::from(s);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => Ok(path),
        Ok(_) => Err("not a file".into()),
        Err(e) => Err(format!("cannot read it: {e}")),
    }
}

/// Parses `--threads`: a whole number from 1 to [`max_threads`].
pub fn parse_threads(s: &str) -> std::result::Result<usize, String> {
    let max = max_threads();
    match s.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a number of threads from 1 to {max} (four per logical core)"
        )),
    }
}

/// Sets the thread count once at start-up, by one rule whatever its source: `--threads`, else
/// `RAYON_NUM_THREADS`, else every logical core; a value outside 1 to [`max_threads`] is an error
/// naming its source (`RAYON_NUM_THREADS=100000` would start a hundred thousand threads). Without
/// `RAYON_NUM_THREADS` candle re-reads /proc/cpuinfo on every matrix product (about a fifth of
/// decode time), so it is always set.
pub fn init_threads(threads: Option<usize>) -> Result<()> {
    let n = match (threads, std::env::var_os("RAYON_NUM_THREADS")) {
        (Some(n), _) => n,
        (None, Some(v)) => {
            let text = v.to_string_lossy();
            parse_threads(text.trim())
                .map_err(|e| Error::Input(format!("RAYON_NUM_THREADS={text}: {e}")))?
        }
        (None, None) => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    };
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    Ok(())
}
