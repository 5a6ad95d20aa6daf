//! Whether a file that a flag names for writing may be replaced. kvbench writes its files whole, by
//! renaming a finished temporary file over the path; a typo (`--trace samples.jsonl`, `--json
//! config.toml`, `--export-json /etc/hosts`) would then destroy a file the user keeps, and a device or
//! a link (`/dev/null`, `/dev/stdout`) would itself be replaced by a plain file. So an existing path
//! is replaced only when it is a regular file that is empty or holds what that flag writes.

use crate::files;
use std::io::Read;
use std::path::Path;

/// What a flag writes: the kinds of file kvbench replaces when asked to write over one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A policy's compression events, JSON Lines (`run --trace`).
    Trace,
    /// Sample records, JSON Lines (`regrade --out`).
    Samples,
    /// `perf --export-json`'s document.
    PerfJson,
    /// `forward --json`'s document.
    ForwardJson,
    /// `forward --logits`: safetensors holding a tensor `logits`.
    Logits,
}

/// The most of a file read to recognise it: a JSON document whole, or a JSON Lines file's first line.
const RECOGNISE_LIMIT: u64 = 64 << 20;
/// The most of a safetensors file read to recognise it: its header, not its tensors (a 256-token
/// prompt's logits over Qwen's vocabulary are 156 MB).
const HEADER_LIMIT: u64 = 1 << 20;

impl Output {
    /// The kind of file, as an error names it.
    pub fn what(self) -> &'static str {
        match self {
            Output::Trace => "a kvbench trace (JSON Lines of compression events)",
            Output::Samples => "a kvbench samples file (JSON Lines of sample records)",
            Output::PerfJson => "a `kvbench perf --export-json` document",
            Output::ForwardJson => "a `kvbench forward --json` document",
            Output::Logits => "a safetensors file of `logits` (`kvbench forward --logits`)",
        }
    }

    /// Whether `bytes` (the start of a file, at most [`RECOGNISE_LIMIT`] or [`HEADER_LIMIT`]) are this
    /// kind's.
    fn recognises(self, bytes: &[u8]) -> bool {
        let object = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).ok();
        let has = |v: &serde_json::Value, keys: &[&str]| keys.iter().all(|k| v.get(k).is_some());
        let first_line = |b: &[u8]| match b.iter().position(|&c| c == b'\n') {
            Some(end) => object(&b[..end]),
            None => object(b),
        };
        match self {
            Output::Trace => first_line(bytes).is_some_and(|v| has(&v, &["sequence", "seen"])),
            Output::Samples => {
                first_line(bytes).is_some_and(|v| has(&v, &["problem_id", "verdict"]))
            }
            Output::PerfJson => {
                object(bytes).is_some_and(|v| has(&v, &["rows", "copy_bandwidth_bytes_per_s"]))
            }
            Output::ForwardJson => {
                object(bytes).is_some_and(|v| has(&v, &["prompt", "argmax", "logits_secs"]))
            }
            Output::Logits => {
                let Some((len, rest)) = bytes.split_first_chunk::<8>() else {
                    return false;
                };
                let len = u64::from_le_bytes(*len);
                len <= rest.len() as u64
                    && object(&rest[..len as usize]).is_some_and(|v| has(&v, &["logits"]))
            }
        }
    }
}

/// `Ok` when `path` may be written as `kind`: it does not exist, or it is a regular file (not a link,
/// a directory or a device) that is empty or holds `kind`'s content. Otherwise why not, for an error
/// that names the flag.
pub fn check_replaceable(path: &Path, kind: Output) -> Result<(), String> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    let kvbench_replaces = "kvbench writes its files whole, replacing the path";
    if meta.file_type().is_symlink() {
        return Err(format!(
            "a symbolic link; {kvbench_replaces}: name the file itself"
        ));
    }
    if meta.is_dir() {
        return Err("a directory; give the path of a file to write".into());
    }
    if !meta.is_file() {
        return Err(format!(
            "not a regular file (a device, pipe or socket); {kvbench_replaces}: name a plain file"
        ));
    }
    if meta.len() == 0 {
        return Ok(());
    }
    let mut start = Vec::new();
    files::open(path)
        .map_err(|e| e.to_string())?
        .0
        .take(match kind {
            Output::Logits => HEADER_LIMIT,
            _ => RECOGNISE_LIMIT,
        })
        .read_to_end(&mut start)
        .map_err(|e| e.to_string())?;
    match kind.recognises(&start) {
        true => Ok(()),
        false => Err(format!(
            "exists and is not {}: kvbench replaces only its own output there; remove the file or \
             name another",
            kind.what()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str, content: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kvbench-replace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn only_empty_files_and_the_kinds_own_output_are_replaced() {
        let trace = br#"{"sequence":"p#0","generated":0,"seen":9,"layer":0,"head":0,"kept":[1]}
"#;
        let sample = br#"{"problem_id":"p","verdict":"correct","grader":"kvbench-grader-5"}"#;
        let perf = br#"{"copy_bandwidth_bytes_per_s":1.0,"rows":[]}"#;
        let forward = br#"{"prompt":[1],"argmax":[2],"logits_secs":0.1}"#;
        let header = br#"{"logits":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]}}"#;
        let mut logits = (header.len() as u64).to_le_bytes().to_vec();
        logits.extend_from_slice(header);
        logits.extend_from_slice(&[0; 4]);
        let files: [(Output, &[u8]); 5] = [
            (Output::Trace, trace),
            (Output::Samples, sample),
            (Output::PerfJson, perf),
            (Output::ForwardJson, forward),
            (Output::Logits, &logits),
        ];
        for (i, (kind, own)) in files.iter().enumerate() {
            let path = scratch(&format!("own-{i}"), own);
            assert_eq!(check_replaceable(&path, *kind), Ok(()), "{kind:?}");
            // Another kind's output, a user's text, an empty file, a missing one.
            let other = files[(i + 1) % files.len()].1;
            let path = scratch(&format!("other-{i}"), other);
            let err = check_replaceable(&path, *kind).unwrap_err();
            assert!(err.contains(kind.what()), "{kind:?}: {err}");
            let path = scratch(&format!("text-{i}"), b"root:x:0:0:root:/root:/bin/bash\n");
            assert!(check_replaceable(&path, *kind).is_err(), "{kind:?}");
            let path = scratch(&format!("empty-{i}"), b"");
            assert_eq!(check_replaceable(&path, *kind), Ok(()));
            let missing = path.with_file_name(format!("missing-{i}"));
            assert_eq!(check_replaceable(&missing, *kind), Ok(()));
        }
        // A truncated safetensors header is not one.
        let path = scratch("short", &logits[..12]);
        assert!(check_replaceable(&path, Output::Logits).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn links_devices_and_directories_are_never_replaced() {
        let target = scratch("link-target", b"");
        let link = target.with_file_name("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = check_replaceable(&link, Output::Trace).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        let err = check_replaceable(Path::new("/dev/null"), Output::Trace).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
        let dir = target.parent().unwrap();
        let err = check_replaceable(dir, Output::Trace).unwrap_err();
        assert!(err.contains("a directory"), "{err}");
    }
}
