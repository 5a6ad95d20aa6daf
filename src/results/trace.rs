//! Trace files: one JSON object per compression event and cache head (the step, the tokens seen, the
//! layer, the head and the original positions kept), for `run --trace` and the report's heat maps.

use super::AtomicFile;
use crate::error::{Error, Result};
use crate::model::TraceEvent;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

/// One line of a trace file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceLine {
    /// Which sequence: `problem#sample`.
    pub sequence: String,
    /// Generated tokens fed when the event happened (0: at prefill).
    pub generated: usize,
    pub seen: usize,
    pub layer: usize,
    pub head: usize,
    pub kept: Vec<u32>,
}

/// A trace file being written; it appears only on [`finish`](TraceWriter::finish).
pub struct TraceWriter {
    file: AtomicFile,
    path: std::path::PathBuf,
    events: usize,
}

impl TraceWriter {
    pub fn create(path: &Path) -> Result<Self> {
        Ok(Self {
            file: AtomicFile::create(path)?,
            path: path.to_path_buf(),
            events: 0,
        })
    }

    /// Appends a sequence's events.
    pub fn write(&mut self, sequence: &str, events: &[TraceEvent]) -> Result<()> {
        for e in events {
            let line = TraceLine {
                sequence: sequence.to_string(),
                generated: e.generated,
                seen: e.seen,
                layer: e.layer,
                head: e.head,
                kept: e.kept.clone(),
            };
            let text = serde_json::to_string(&line).map_err(|e| Error::Input(e.to_string()))?;
            writeln!(self.file, "{text}").map_err(|e| Error::io(&self.path, e))?;
        }
        self.events += events.len();
        Ok(())
    }

    /// Commits the file; returns the number of events written.
    pub fn finish(self) -> Result<usize> {
        self.file.commit()?;
        Ok(self.events)
    }
}

/// Reads a trace file; a bad line is an error naming the file and line.
pub fn read_trace(path: &Path) -> Result<Vec<TraceLine>> {
    let text = crate::files::read_text(path, crate::files::DATA_LIMIT)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| {
                Error::Input(format!(
                    "{}:{}: not a trace line: {e}",
                    path.display(),
                    i + 1
                ))
            })
        })
        .collect()
}
