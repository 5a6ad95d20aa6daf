//! Reading the files a user names (configs, problem sets, tokenizers, results) within bounds: a path
//! that is a directory or a device, or a file far larger than its kind ever is, must be an error
//! naming it, not an endless read (`/dev/zero`) or an allocation that aborts the process. Pipes stay
//! allowed (`kvbench sweep <(generate-config)`), up to the same limit.

use crate::error::{Error, Result};
use std::io::Read;
use std::path::Path;

/// The most a sweep config, a model's `config.json` or a hub index may hold.
pub const CONFIG_LIMIT: u64 = 16 << 20;
/// The most a problem set, a grading-case file, a tokenizer or a results file may hold.
pub const DATA_LIMIT: u64 = 4 << 30;

/// Opens `path` for reading, refusing directories, devices and sockets. A FIFO is opened without
/// waiting for a writer (a named pipe nobody writes to would otherwise block the open forever); reads
/// then wait for data as usual, and end at once when no writer has the pipe open.
pub fn open(path: &Path) -> Result<(std::fs::File, std::fs::Metadata)> {
    let file = open_nonblocking(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    check_kind(path, &meta)?;
    Ok((file, meta))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    // SAFETY: fcntl on a descriptor this function owns, with flags read from it just before.
    unsafe {
        let fd = file.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(file)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

/// The bytes of `path`, refusing directories, devices and anything over `limit` bytes.
pub fn read_bytes(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let (file, meta) = open(path)?;
    let too_large = || {
        Error::Input(format!(
            "{}: larger than {} MiB, the most kvbench reads from such a file",
            path.display(),
            limit >> 20
        ))
    };
    if meta.is_file() && meta.len() > limit {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(if meta.is_file() {
        meta.len() as usize
    } else {
        0
    });
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    if bytes.is_empty() && is_pipe(&meta) {
        return Err(empty_pipe(path));
    }
    Ok(bytes)
}

/// The error of a pipe that gave no bytes at all: said as such, not as the empty file's own error
/// ("no problems", a missing key), since a named pipe that no process has open for writing reads as
/// empty at once ([`open`]).
pub fn empty_pipe(path: &Path) -> Error {
    Error::Input(format!(
        "{}: a pipe that gave no bytes (a named pipe reads as empty unless a process has it open \
         for writing: start its writer first, or pass the data by process substitution)",
        path.display()
    ))
}

/// Whether `meta` is a pipe's (named or not).
pub fn is_pipe(meta: &std::fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        meta.file_type().is_fifo()
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        false
    }
}

/// The UTF-8 byte order mark some editors and Windows tools write at a file's start.
const BOM: &str = "\u{feff}";

/// `text` without a leading byte order mark: JSON parsers refuse one ("expected value at line 1
/// column 1"), though the file is valid UTF-8 text.
pub fn without_bom(text: &str) -> &str {
    text.strip_prefix(BOM).unwrap_or(text)
}

/// Why a line of a JSON Lines file is not the object it should hold, for an error message: the
/// parser's complaint, or what the line holds instead (an array, a string...), with the format
/// expected, so that a pretty-printed JSON file or a JSON array of objects is recognised as such.
pub fn not_a_json_object(
    line: std::result::Result<&serde_json::Value, &serde_json::Error>,
) -> String {
    use serde_json::Value;
    let what = match line {
        Err(e) => format!(": {e}"),
        Ok(Value::Array(_)) => " but an array".into(),
        Ok(Value::String(_)) => " but a string".into(),
        Ok(Value::Number(_)) => " but a number".into(),
        Ok(Value::Bool(_)) => " but a boolean".into(),
        Ok(Value::Null) => " but null".into(),
        Ok(Value::Object(_)) => String::new(),
    };
    format!("not a JSON object{what} (JSON Lines: one object a line)")
}

/// The text of `path` (UTF-8, a leading byte order mark left out), with [`read_bytes`]'s bounds;
/// invalid UTF-8 names the line.
pub fn read_text(path: &Path, limit: u64) -> Result<String> {
    let mut bytes = read_bytes(path, limit)?;
    if bytes.starts_with(BOM.as_bytes()) {
        bytes.drain(..BOM.len());
    }
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let line = 1 + e.as_bytes()[..valid]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        Error::Input(format!("{}:{line}: not UTF-8 text", path.display()))
    })
}

/// Refuses `path` unless it is a regular file (or a link to one) of at most `limit` bytes: for
/// readers that open the file themselves (the tokenizer and Parquet libraries, appenders).
pub fn check_readable(path: &Path, limit: u64) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    check_kind(path, &meta)?;
    if !meta.is_file() || meta.len() > limit {
        return Err(Error::Input(format!(
            "{}: not a regular file of at most {} MiB",
            path.display(),
            limit >> 20
        )));
    }
    Ok(())
}

fn check_kind(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    let kind = if meta.is_dir() {
        Some("a directory")
    } else {
        device(meta)
    };
    match kind {
        Some(k) => Err(Error::Input(format!(
            "{}: is {k}, not a file",
            path.display()
        ))),
        None => Ok(()),
    }
}

#[cfg(unix)]
fn device(meta: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    (t.is_char_device() || t.is_block_device() || t.is_socket()).then_some("a device or socket")
}

#[cfg(not(unix))]
fn device(_: &std::fs::Metadata) -> Option<&'static str> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_directories_and_oversized_files_are_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("kvbench-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = read_text(&dir, CONFIG_LIMIT).unwrap_err().to_string();
        assert!(err.contains("is a directory"), "{err}");
        #[cfg(unix)]
        {
            let err = read_bytes(Path::new("/dev/zero"), DATA_LIMIT)
                .unwrap_err()
                .to_string();
            assert!(err.contains("/dev/zero") && err.contains("device"), "{err}");
        }
        let big = dir.join("big.toml");
        std::fs::write(&big, vec![b'#'; 2048]).unwrap();
        let err = read_text(&big, 1024).unwrap_err().to_string();
        assert!(
            err.contains("big.toml") && err.contains("larger than"),
            "{err}"
        );
        assert_eq!(read_text(&big, 4096).unwrap().len(), 2048);
        std::fs::write(&big, b"a = 1\n\xff\n").unwrap();
        let err = read_text(&big, 4096).unwrap_err().to_string();
        assert!(err.contains("big.toml:2") && err.contains("UTF-8"), "{err}");
        std::fs::write(&big, "\u{feff}a = 1\n\u{feff}").unwrap();
        assert_eq!(read_text(&big, 4096).unwrap(), "a = 1\n\u{feff}");
        assert!(check_readable(&dir, DATA_LIMIT).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
