//! Results on disk. Everything kvbench writes is written atomically: to a temporary file beside the
//! target, flushed and synced, then renamed over it, so a crash never leaves a half-written file and
//! an existing file is replaced only by a complete one.

pub mod dir;
pub mod replace;
pub mod sample;
pub mod trace;

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A file that appears at its path only when [`commit`](AtomicFile::commit) succeeds.
pub struct AtomicFile {
    target: PathBuf,
    temp: PathBuf,
    out: Option<BufWriter<File>>,
    /// The temporary file, for removal should a signal end the process first.
    _registered: crate::temps::Registered,
}

impl AtomicFile {
    /// Opens a temporary file beside `target` (the directory must exist).
    pub fn create(target: &Path) -> Result<Self> {
        let name = target
            .file_name()
            .ok_or_else(|| Error::Input(format!("{}: not a file path", target.display())))?;
        let dir = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !dir.is_dir() {
            return Err(Error::Input(format!(
                "{}: directory {} does not exist",
                target.display(),
                dir.display()
            )));
        }
        let temp = temp_beside(&dir, name);
        // Registered before it exists: a signal between the two would otherwise leave it.
        let registered = crate::temps::register(&temp);
        let file = File::create(&temp).map_err(|source| Error::Io {
            path: temp.clone(),
            source,
        })?;
        Ok(Self {
            target: target.to_path_buf(),
            temp,
            out: Some(BufWriter::new(file)),
            _registered: registered,
        })
    }

    /// Flushes, syncs and renames the temporary file over the target. On any failure (a full disk,
    /// a target that cannot be replaced) the temporary file is removed and the target is untouched.
    pub fn commit(mut self) -> Result<()> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { path, source }
        };
        let out = self.out.take().expect("committed once");
        let done = out
            .into_inner()
            .map_err(|e| Error::Io {
                path: self.temp.clone(),
                source: e.into_error(),
            })
            .and_then(|file| file.sync_all().map_err(io(&self.temp)))
            .and_then(|()| std::fs::rename(&self.temp, &self.target).map_err(io(&self.target)));
        if done.is_err() {
            let _ = std::fs::remove_file(&self.temp);
        }
        done
    }
}

/// The hidden temporary file, in `dir`, that becomes the file `name` when it is complete: one per
/// process, so that two writers of one path never share it.
fn temp_beside(dir: &Path, name: &std::ffi::OsStr) -> PathBuf {
    dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ))
}

/// [`AtomicFile`]'s promise for a writer that wants a path of its own (candle's safetensors writer,
/// plotters' bitmap backend): `write` fills a hidden temporary file beside `target`, named with
/// `suffix` last (a writer may choose its format by the extension), which is then synced and
/// renamed over `target`. On any failure the temporary file is removed and `target` is untouched.
pub fn write_through_temp(
    target: &Path,
    suffix: &str,
    write: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let dir = target.parent().filter(|d| !d.as_os_str().is_empty());
    let name = target.file_name().unwrap_or(target.as_os_str());
    let mut temp = temp_beside(dir.unwrap_or(Path::new(".")), name).into_os_string();
    temp.push(suffix);
    let temp = PathBuf::from(temp);
    let _registered = crate::temps::register(&temp);
    let done = write(&temp)
        .and_then(|()| {
            File::open(&temp)
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::io(&temp, e))
        })
        .and_then(|()| std::fs::rename(&temp, target).map_err(|e| Error::io(target, e)));
    if done.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    done
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.out.as_mut().expect("open until committed").write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.as_mut().expect("open until committed").flush()
    }
}

impl Drop for AtomicFile {
    /// An uncommitted file is removed: the target keeps its old content.
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of the entries of `dir`.
    fn names(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn target_changes_only_on_commit() {
        let dir = std::env::temp_dir().join(format!("kvbench-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("out.jsonl");
        std::fs::write(&target, "old\n").unwrap();
        {
            let mut f = AtomicFile::create(&target).unwrap();
            writeln!(f, "new").unwrap();
            // dropped without commit
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old\n");
        let mut f = AtomicFile::create(&target).unwrap();
        writeln!(f, "new").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new\n");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temp file left"
        );
        assert!(AtomicFile::create(&dir.join("missing/x")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_commit_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("kvbench-atomic-fail-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // The target is a non-empty directory: the rename fails.
        std::fs::create_dir_all(dir.join("x")).unwrap();
        std::fs::write(dir.join("x/keep"), "k").unwrap();
        let mut f = AtomicFile::create(&dir.join("x")).unwrap();
        f.write_all(b"new").unwrap();
        assert!(f.commit().is_err());
        assert_eq!(names(&dir), vec!["x".to_string()], "no temporary file left");
        assert_eq!(std::fs::read_to_string(dir.join("x/keep")).unwrap(), "k");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_writer_with_its_own_path_replaces_the_target_whole_or_not_at_all() {
        let dir = std::env::temp_dir().join(format!("kvbench-through-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("plot.png");
        std::fs::write(&target, "old").unwrap();
        // A writer that fails midway: the target keeps its content, no temporary file stays.
        let failed = write_through_temp(&target, ".png", |temp| {
            assert!(
                temp.to_string_lossy().ends_with(".png"),
                "{}",
                temp.display()
            );
            std::fs::write(temp, "half").unwrap();
            Err(Error::Input("drawing failed".into()))
        });
        assert!(failed.is_err());
        assert_eq!(names(&dir), vec!["plot.png".to_string()]);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old");
        write_through_temp(&target, ".png", |temp| {
            std::fs::write(temp, "new").map_err(|e| Error::io(temp, e))
        })
        .unwrap();
        assert_eq!(names(&dir), vec!["plot.png".to_string()]);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
