//! The temporary paths this process is writing: a file's hidden `.NAME.tmp-PID` before it is renamed
//! into place, an export's staging directory, pip's download directory. Each owner removes its own
//! when it fails or is dropped, but a signal ends the process without unwinding: the binary's signal
//! thread calls [`remove_all`] before it exits, so that a stopped run leaves no hidden half-written
//! files beside its results.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A temporary path registered until this is dropped (its owner renamed or removed it).
#[derive(Debug)]
pub struct Registered(PathBuf);

/// Registers `path` (a file or a directory) for removal should a signal end the process.
pub fn register(path: &Path) -> Registered {
    LIVE.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(path.to_path_buf());
    Registered(path.to_path_buf())
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = live.iter().rposition(|p| *p == self.0) {
            live.swap_remove(i);
        }
    }
}

/// Removes every registered path (files, and directories with what they hold). For a process about
/// to exit on a signal: the registry stays locked, so no path is registered after.
pub fn remove_all() {
    let live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    for path in live.iter() {
        let removed = match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
            Ok(_) => std::fs::remove_file(path),
            Err(e) => Err(e),
        };
        drop(removed);
    }
    std::mem::forget(live);
}

/// The paths registered now.
#[cfg(test)]
fn live() -> Vec<PathBuf> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_registered_while_its_guard_lives() {
        let path = std::env::temp_dir().join(format!("kvbench-temps-{}", std::process::id()));
        {
            let _guard = register(&path);
            assert!(live().contains(&path));
        }
        assert!(!live().contains(&path));
    }
}
