//! A results directory: what a sweep (or a run) writes, crash-safe and mergeable.
//!
//! ```text
//! DIR/config.toml                 the resolved config (CLI overrides applied)
//! DIR/sweep.json                  config hash and every planned unit (the report's list of expected units)
//! DIR/provenance.jsonl            one line per process start: versions, hashes, machine
//! DIR/samples.jsonl               one line per finished unit (samples.shard-I-of-N.jsonl per shard)
//! DIR/traces/UNIT.jsonl           compression events of traced units
//! DIR/.lock, DIR/.lock.shard-…    advisory locks of running processes
//! DIR/.lock.holder-PID            who holds them: a running process's command line
//! ```
//!
//! Samples are appended one line per unit, flushed and synced as written, so `kill -9` loses at most
//! the units in flight; a half-written last line is dropped when the file is opened again. A process
//! holds an exclusive lock on `.lock` (unsharded) or a shared lock on it plus an exclusive lock on its
//! shard's lock file, so two processes on one directory are refused unless they run different shards.
//! The operating system releases the locks when a process dies, however it dies. Every command that
//! rewrites a directory's files (`regrade --in-place`) takes `.lock` exclusively, so it is refused
//! while a sweep or run writes there, naming the processes that do.

use super::sample::SampleRecord;
use super::AtomicFile;
use crate::error::{Error, Result};
use crate::sweep::shard::Shard;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};

/// One planned unit, as the report needs it without the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedUnit {
    pub id: String,
    pub policy: String,
    pub policy_name: String,
    pub budget: Option<f64>,
    pub problem_id: String,
    pub sample: usize,
}

/// `sweep.json`: the identity of a results directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub name: String,
    pub config_hash: String,
    /// The hash of the config without its grid ([`crate::sweep::config::SweepConfig::base_hash`]):
    /// a config with the same base may extend the directory. Absent in directories of kvbench 0.4.0
    /// and earlier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_hash: Option<String>,
    pub kvbench: String,
    pub model: String,
    pub model_id: String,
    pub dataset: String,
    pub dataset_id: String,
    pub units: Vec<PlannedUnit>,
}

/// An open results directory, locked for this process.
pub struct ResultsDir {
    pub path: PathBuf,
    shard: Option<Shard>,
    _locks: Vec<File>,
    /// Lock files this process created (removed again when the directory is refused).
    created: Vec<PathBuf>,
    /// The holder file, removed when this is dropped or a signal ends the process.
    _holder: crate::temps::Registered,
}

fn lock(path: &Path, shared: bool, dir: &Path) -> Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let got = if shared {
        f.try_lock_shared()
    } else {
        f.try_lock()
    };
    match got {
        Ok(()) => Ok(f),
        Err(TryLockError::WouldBlock) => Err(Error::Input(format!(
            "{} is in use by another kvbench process{} (lock {}): wait for it, or run different shards with --shard i/n",
            dir.display(),
            holders(dir),
            path.display()
        ))),
        Err(TryLockError::Error(e)) => Err(Error::io(path, e)),
    }
}

/// The running processes that hold a directory's locks, as their holder files name them
/// (`: pid 123 (kvbench sweep …)`), or nothing when none is known.
fn holders(dir: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return String::new();
    };
    let mut found: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let pid = name.strip_prefix(".lock.holder-")?.parse::<u32>().ok()?;
            // A process that died leaves its file behind; only live ones are named.
            Path::new(&format!("/proc/{pid}")).exists().then(|| {
                let cmd = std::fs::read_to_string(e.path()).unwrap_or_default();
                format!(
                    "pid {pid} ({})",
                    crate::error::terminal_safe(cmd.trim())
                        .chars()
                        .take(200)
                        .collect::<String>()
                )
            })
        })
        .collect();
    found.sort();
    if found.is_empty() {
        String::new()
    } else {
        format!(": {}", found.join("; "))
    }
}

/// An exclusive hold on a results directory for a command that rewrites its files: refused while
/// any sweep or run (sharded or not) holds it; released when dropped.
pub struct Exclusive {
    _lock: File,
}

/// Takes `dir`'s `.lock` exclusively, or refuses naming the processes that hold it.
pub fn lock_exclusive(dir: &Path) -> Result<Exclusive> {
    Ok(Exclusive {
        _lock: lock(&dir.join(".lock"), false, dir)?,
    })
}

impl Drop for ResultsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.holder_file());
    }
}

/// Why a results directory could not be made at `path`, checked without writing anything: a file in
/// its place, a file where a parent directory should be, or a parent the process may not write.
/// Runs and sweeps check this before loading a model, so that a mistyped `--out` fails at once.
/// (A process with every permission, such as root, is told only when the directory is made.)
pub fn check_creatable(path: &Path) -> std::result::Result<(), String> {
    if path.exists() {
        return match path.is_dir() {
            true => check_writable(path),
            false => Err("exists and is not a directory".into()),
        };
    }
    let mut parent = path.parent();
    while let Some(p) = parent {
        let p = if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        };
        if p.exists() {
            return match p.is_dir() {
                true => check_writable(p),
                false => Err(format!("{} is not a directory", p.display())),
            };
        }
        parent = p.parent();
    }
    Ok(())
}

/// Whether this process may create entries in the directory `dir`.
fn check_writable(dir: &Path) -> std::result::Result<(), String> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    let writable = {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: `c` is a NUL-terminated path that outlives the call; `access` only reads it.
        unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
    };
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let writable = std::fs::metadata(dir).is_ok_and(|m| !m.permissions().readonly());
    match writable {
        true => Ok(()),
        false => Err(format!("{} is not writable", dir.display())),
    }
}

impl ResultsDir {
    fn holder_file(&self) -> PathBuf {
        self.path
            .join(format!(".lock.holder-{}", std::process::id()))
    }

    /// Creates (if needed) and locks `path` for this process.
    pub fn open(path: &Path, shard: Option<Shard>) -> Result<Self> {
        std::fs::create_dir_all(path).map_err(|e| Error::io(path, e))?;
        let mut names = vec![(path.join(".lock"), shard.is_some())];
        if let Some(s) = shard {
            names.push((path.join(format!(".lock.{}", s.tag())), false));
        }
        names.push((path.join(".lock.bind"), true));
        let created: Vec<PathBuf> = names
            .iter()
            .map(|(p, _)| p.clone())
            .filter(|p| !p.exists())
            .collect();
        let mut locks = Vec::new();
        for (p, shared) in names.iter().take(names.len() - 1) {
            locks.push(lock(p, *shared, path)?);
        }
        let holder = path.join(format!(".lock.holder-{}", std::process::id()));
        let dir = Self {
            path: path.to_path_buf(),
            shard,
            _locks: locks,
            created,
            _holder: crate::temps::register(&holder),
        };
        // Who holds the locks, for the message that refuses another process.
        let command: Vec<String> = std::env::args().collect();
        let _ = std::fs::write(dir.holder_file(), command.join(" "));
        Ok(dir)
    }

    /// Writes the manifest and config on first use; afterwards refuses a different config.
    ///
    /// Shards of one sweep start together and share the directory, so binding is serialised by a
    /// blocking lock on `.lock.bind`: the first shard writes, the others then find its manifest.
    pub fn bind(&self, manifest: &Manifest, config_toml: &str) -> Result<()> {
        self.bind_or_extend(manifest, config_toml, |_| Ok(None))
    }

    /// As [`ResultsDir::bind`], but a directory of another configuration is first offered to
    /// `extend` (with its manifest): it returns the directory's new identity (a manifest and config
    /// covering both configurations), which replaces the old one, or `None` to refuse. The manifest
    /// is written before the config: a crash between them leaves a manifest that still names the
    /// old config's base, so the next extension repairs the config.
    pub fn bind_or_extend(
        &self,
        manifest: &Manifest,
        config_toml: &str,
        extend: impl FnOnce(&Manifest) -> Result<Option<(Manifest, String)>>,
    ) -> Result<()> {
        let guard_path = self.path.join(".lock.bind");
        let _guard = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&guard_path)
            .and_then(|f| f.lock().map(|()| f))
            .map_err(|e| Error::io(&guard_path, e))?;
        let file = self.path.join("sweep.json");
        if file.exists() {
            let old = read_manifest(&self.path)?;
            if old.config_hash != manifest.config_hash {
                if let Some((m, toml)) = extend(&old)? {
                    self.write_identity(&m, &toml, true)?;
                    return Ok(());
                }
                return Err(Error::Input(format!(
                    "{} holds results of another configuration (config hash {} there, {} now; see {}): \
                     results are never mixed. Use another --out, or remove the directory to start over",
                    self.path.display(),
                    old.config_hash,
                    manifest.config_hash,
                    self.path.join("config.toml").display()
                )));
            }
            return Ok(());
        }
        // Never write into a directory that holds something else: its files could be overwritten.
        let foreign = std::fs::read_dir(&self.path)
            .map_err(|e| Error::io(&self.path, e))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .find(|n| !n.starts_with(".lock") && !is_own_unbound_file(n));
        if let Some(name) = foreign {
            // Leave the foreign directory as it was: no lock files of ours behind.
            for p in self.created.iter().chain([&self.holder_file()]) {
                let _ = std::fs::remove_file(p);
            }
            return Err(Error::Input(format!(
                "{} is not empty and is not a kvbench results directory (it holds {name}): choose another --out",
                self.path.display()
            )));
        }
        // The config first: a directory holding only a config is still unbound (and ours).
        self.write_identity(manifest, config_toml, false)
    }

    /// Writes `sweep.json` and `config.toml`, each atomically, in the order asked.
    fn write_identity(
        &self,
        manifest: &Manifest,
        config_toml: &str,
        manifest_first: bool,
    ) -> Result<()> {
        let write_manifest = || -> Result<()> {
            let file = self.path.join("sweep.json");
            let mut f = AtomicFile::create(&file)?;
            let text =
                serde_json::to_string_pretty(manifest).map_err(|e| Error::Input(e.to_string()))?;
            writeln!(f, "{text}").map_err(|e| Error::io(&file, e))?;
            f.commit()
        };
        let write_config = || -> Result<()> {
            let config = self.path.join("config.toml");
            let mut f = AtomicFile::create(&config)?;
            f.write_all(config_toml.as_bytes())
                .map_err(|e| Error::io(&config, e))?;
            f.commit()
        };
        if manifest_first {
            write_manifest()?;
            write_config()
        } else {
            write_config()?;
            write_manifest()
        }
    }

    /// Appends one provenance line (synced).
    pub fn record_provenance(&self, value: &serde_json::Value) -> Result<()> {
        append_line(&self.path.join("provenance.jsonl"), &value.to_string())
    }

    /// Keeps the config a run wrote into this directory with, verbatim, as `configs/HASH.toml`
    /// (once per config hash): `config.toml` is the union a directory grew into; these are the
    /// stages it grew by. Returns the file's path relative to the directory.
    pub fn keep_stage_config(&self, hash: &str, toml: &str) -> Result<String> {
        let rel = format!("configs/{hash}.toml");
        let path = self.path.join(&rel);
        if !path.exists() {
            let dir = self.path.join("configs");
            std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
            let mut f = AtomicFile::create(&path)?;
            f.write_all(toml.as_bytes())
                .map_err(|e| Error::io(&path, e))?;
            f.commit()?;
        }
        Ok(rel)
    }

    /// This process's samples file.
    pub fn samples_path(&self) -> PathBuf {
        match self.shard {
            Some(s) => self.path.join(format!("samples.{}.jsonl", s.tag())),
            None => self.path.join("samples.jsonl"),
        }
    }

    /// Opens this process's samples file for appending, first dropping a half-written last line left
    /// by a killed process. Returns the appender and a note when a line was dropped.
    pub fn samples_appender(&self) -> Result<(Appender, Option<String>)> {
        let path = self.samples_path();
        let mut note = None;
        if path.exists() {
            crate::files::check_readable(&path, crate::files::DATA_LIMIT)?;
        }
        if let Ok(bytes) = std::fs::read(&path) {
            if !bytes.is_empty() && !bytes.ends_with(b"\n") {
                let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                let f = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|e| Error::io(&path, e))?;
                f.set_len(keep as u64).map_err(|e| Error::io(&path, e))?;
                f.sync_all().map_err(|e| Error::io(&path, e))?;
                note = Some(format!(
                    "{}: dropped a half-written last line ({} bytes) left by an interrupted run",
                    path.display(),
                    bytes.len() - keep
                ));
            }
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        Ok((Appender { file, path }, note))
    }

    /// Ids of the units finished by any process, from every samples file in the directory.
    pub fn finished(&self) -> Result<HashSet<String>> {
        Ok(read_samples(&self.path)?
            .records
            .into_iter()
            .map(|r| r.unit)
            .collect())
    }
}

/// Appends sample records, one synced line each.
pub struct Appender {
    file: File,
    path: PathBuf,
}

impl Appender {
    pub fn append(&mut self, record: &SampleRecord) -> Result<()> {
        let mut line = serde_json::to_string(record).map_err(|e| Error::Input(e.to_string()))?;
        line.push('\n');
        // One write call per line: a kill can cut the line short but never interleave it.
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.sync_data())
            .map_err(|e| Error::io(&self.path, e))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What a bind that died before writing `sweep.json` can leave: its config and temporary files.
/// They are kvbench's own and are overwritten by the next bind.
fn is_own_unbound_file(name: &str) -> bool {
    name == "config.toml"
        || name.starts_with(".config.toml.tmp-")
        || name.starts_with(".sweep.json.tmp-")
}

fn append_line(path: &Path, line: &str) -> Result<()> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    f.write_all(format!("{line}\n").as_bytes())
        .and_then(|()| f.sync_data())
        .map_err(|e| Error::io(path, e))
}

/// Reads `DIR/sweep.json`.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join("sweep.json");
    // A results file is kvbench's own: a pipe or device in its place is refused, never waited on.
    crate::files::check_readable(&path, crate::files::DATA_LIMIT)?;
    let text = crate::files::read_text(&path, crate::files::DATA_LIMIT)?;
    serde_json::from_str(&text).map_err(|e| {
        Error::Input(format!(
            "{}: not a kvbench sweep manifest: {e}",
            path.display()
        ))
    })
}

/// Every sample record of a directory, from all its samples files.
pub struct DirSamples {
    pub records: Vec<SampleRecord>,
    /// Half-written last lines seen (a process was killed, or is writing now).
    pub partial_lines: Vec<PathBuf>,
}

/// Reads every `samples*.jsonl` of `dir`, in name order. A line that does not end in a newline at the
/// end of a file is skipped (a process is writing it, or was killed while writing it); any other bad
/// line is an error naming the file and line.
pub fn read_samples(dir: &Path) -> Result<DirSamples> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("samples") && n.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    let mut out = DirSamples {
        records: Vec::new(),
        partial_lines: Vec::new(),
    };
    for path in files {
        let f = super::sample::read_file(&path, true)?;
        if f.torn_last_line {
            out.partial_lines.push(path.clone());
        }
        out.records.extend(f.records);
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvbench-dir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_torn_last_line_inside_a_multibyte_character_is_dropped() {
        let d = temp_dir("utf8");
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("samples.jsonl");
        // No complete line, then a line cut in the middle of "é" (0xC3 0xA9).
        std::fs::write(&path, b"{\"problem_id\":\"caf\xc3").unwrap();
        let s = read_samples(&d).unwrap();
        assert!(s.records.is_empty());
        assert_eq!(s.partial_lines, vec![path.clone()]);
        // Invalid bytes inside a complete line are an error naming the file and line.
        std::fs::write(&path, b"\n\xff\xfe\n").unwrap();
        let err = read_samples(&d).err().unwrap().to_string();
        assert!(
            err.contains("samples.jsonl:2") && err.contains("UTF-8"),
            "{err}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn second_process_is_refused_unless_shards_differ() {
        let d = temp_dir("lock");
        let a = ResultsDir::open(&d, None).unwrap();
        let err = ResultsDir::open(&d, None).err().unwrap().to_string();
        assert!(err.contains("in use by another kvbench process"), "{err}");
        assert!(ResultsDir::open(&d, Some("1/2".parse().unwrap())).is_err());
        drop(a);
        let s1 = ResultsDir::open(&d, Some("1/2".parse().unwrap())).unwrap();
        let s2 = ResultsDir::open(&d, Some("2/2".parse().unwrap())).unwrap();
        assert!(ResultsDir::open(&d, Some("2/2".parse().unwrap())).is_err());
        assert!(ResultsDir::open(&d, None).is_err());
        assert_ne!(s1.samples_path(), s2.samples_path());
        drop((s1, s2));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A manifest of config hash `hash` planning no unit.
    pub(crate) fn manifest(hash: &str) -> Manifest {
        Manifest {
            name: "t".into(),
            config_hash: hash.into(),
            base_hash: None,
            kvbench: "0".into(),
            model: "m".into(),
            model_id: "m".into(),
            dataset: "d".into(),
            dataset_id: "d".into(),
            units: Vec::new(),
        }
    }

    #[test]
    fn a_directory_is_bound_to_one_config_and_foreign_ones_are_left_alone() {
        let d = temp_dir("bind");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("notes.txt"), "mine").unwrap();
        let dir = ResultsDir::open(&d, None).unwrap();
        let err = dir.bind(&manifest("a"), "x").unwrap_err().to_string();
        assert!(err.contains("not a kvbench results directory"), "{err}");
        assert_eq!(
            std::fs::read_to_string(d.join("notes.txt")).unwrap(),
            "mine"
        );
        // Nothing of ours is left in the refused directory.
        let names: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["notes.txt".to_string()]);
        std::fs::remove_file(d.join("notes.txt")).unwrap();
        dir.bind(&manifest("a"), "name = 't'\n").unwrap();
        dir.bind(&manifest("a"), "ignored").unwrap();
        let err = dir.bind(&manifest("b"), "x").unwrap_err().to_string();
        assert!(err.contains("another configuration"), "{err}");
        assert_eq!(read_manifest(&d).unwrap(), manifest("a"));
        drop(dir);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn shards_binding_at_once_all_succeed() {
        // Regression: a shard saw the other's temporary config file and refused the directory.
        for round in 0..20 {
            let d = temp_dir(&format!("race-{round}"));
            let handles: Vec<_> = (1..=4)
                .map(|i| {
                    let d = d.clone();
                    std::thread::spawn(move || {
                        let shard = format!("{i}/4").parse().unwrap();
                        let dir = ResultsDir::open(&d, Some(shard))?;
                        dir.bind(&manifest("a"), "name = 't'\n")
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap().unwrap();
            }
            assert_eq!(read_manifest(&d).unwrap(), manifest("a"));
            std::fs::remove_dir_all(&d).unwrap();
        }
    }

    #[test]
    fn a_bind_that_died_half_way_is_completed_by_the_next() {
        let d = temp_dir("half");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("config.toml"), "name = 't'\n").unwrap();
        std::fs::write(d.join(".config.toml.tmp-1"), "").unwrap();
        let dir = ResultsDir::open(&d, None).unwrap();
        dir.bind(&manifest("a"), "name = 't'\n").unwrap();
        assert_eq!(read_manifest(&d).unwrap(), manifest("a"));
        drop(dir);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_half_written_last_line_is_dropped_and_the_rest_kept() {
        let d = temp_dir("torn");
        let dir = ResultsDir::open(&d, None).unwrap();
        let rec: SampleRecord = serde_json::from_value(serde_json::json!({
            "problem_id": "p1", "sample": 0, "seed": 0, "gold": "1", "output": "\\boxed{1}",
            "thinking": false, "extracted": "1", "normalized_pred": "1", "normalized_gold": "1",
            "verdict": "correct", "correct": true, "grader": "g", "lenient": false, "tokens": 3,
            "finish": "eos", "policy": "full", "prompt": "R1", "template_hash": "h",
            "dataset": "d", "unit": "u1"
        }))
        .unwrap();
        let (mut app, note) = dir.samples_appender().unwrap();
        assert!(note.is_none());
        app.append(&rec).unwrap();
        // A killed writer leaves half a line.
        let mut f = OpenOptions::new().append(true).open(app.path()).unwrap();
        f.write_all(b"{\"problem_id\": \"p2\", \"sam").unwrap();
        drop(f);
        let seen = read_samples(&d).unwrap();
        assert_eq!(seen.records.len(), 1);
        assert_eq!(seen.partial_lines.len(), 1);
        let (mut app, note) = dir.samples_appender().unwrap();
        assert!(note.unwrap().contains("half-written"));
        let mut rec2 = rec.clone();
        rec2.unit = "u2".into();
        app.append(&rec2).unwrap();
        let seen = read_samples(&d).unwrap();
        assert_eq!(seen.records, vec![rec, rec2]);
        assert!(seen.partial_lines.is_empty());
        assert_eq!(
            dir.finished().unwrap(),
            HashSet::from(["u1".to_string(), "u2".to_string()])
        );
        // A bad line in the middle is an error naming the file and line.
        let path = dir.samples_path();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{{oops\n{text}")).unwrap();
        let err = read_samples(&d).err().unwrap().to_string();
        assert!(err.contains("samples.jsonl:1"), "{err}");
        drop(dir);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
