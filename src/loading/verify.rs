//! File digests: every file kvbench downloads (wheels, model files, hub blobs, datasets) is checked by
//! its sha256 before use.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

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

/// Fails with [`Error::Checksum`] unless `path` hashes to `expected`.
pub fn verify(path: &Path, expected: &str) -> Result<()> {
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
