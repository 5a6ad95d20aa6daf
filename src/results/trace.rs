//! Trace files: one JSON object per compression event and cache head (the step, the tokens seen, the
//! layer, the head and the original positions kept), for `run --trace` and the report's heat maps.
//!
//! Compact: a policy that evicts every step (H2O) changes one or two entries of each head a step, and
//! writing every head's whole kept list each time made its traces of 640 tokens 11 MB. The events of
//! one step whose head had an event before are written together on one [`ChangeLine`] instead: per
//! head what changed since (positions dropped, and positions added after the remaining ones, in
//! storage order), used only where applying it to the previous list gives the new one exactly (order
//! included) and it is shorter. [`read_trace`] rebuilds every head's `kept`.

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

/// One step's changes of the heads that had an event before: `(layer, head, dropped, added)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeLine {
    pub sequence: String,
    pub generated: usize,
    pub seen: usize,
    pub changes: Vec<(usize, usize, Vec<u32>, Vec<u32>)>,
}

/// A line of a trace file: a head's whole list, or a step's changes.
#[derive(Deserialize)]
#[serde(untagged)]
enum AnyLine {
    Full(TraceLine),
    Changes(ChangeLine),
}

/// `prev` without `dropped`, then `added`: a compact line applied.
fn apply(prev: &[u32], dropped: &[u32], added: &[u32]) -> Vec<u32> {
    let gone: std::collections::HashSet<u32> = dropped.iter().copied().collect();
    prev.iter()
        .copied()
        .filter(|p| !gone.contains(p))
        .chain(added.iter().copied())
        .collect()
}

/// The change from `prev` to `now` when it is exact and shorter than `now` itself.
fn delta(prev: &[u32], now: &[u32]) -> Option<(Vec<u32>, Vec<u32>)> {
    let now_set: std::collections::HashSet<u32> = now.iter().copied().collect();
    let prev_set: std::collections::HashSet<u32> = prev.iter().copied().collect();
    let dropped: Vec<u32> = prev
        .iter()
        .copied()
        .filter(|p| !now_set.contains(p))
        .collect();
    let added: Vec<u32> = now
        .iter()
        .copied()
        .filter(|p| !prev_set.contains(p))
        .collect();
    (dropped.len() + added.len() < now.len() && apply(prev, &dropped, &added) == now)
        .then_some((dropped, added))
}

/// A trace file being written; it appears only on [`finish`](TraceWriter::finish).
pub struct TraceWriter {
    file: AtomicFile,
    path: std::path::PathBuf,
    events: usize,
    /// The last kept list of each (sequence, layer, head), for compact lines.
    last: std::collections::HashMap<(String, usize, usize), Vec<u32>>,
}

impl TraceWriter {
    pub fn create(path: &Path) -> Result<Self> {
        Ok(Self {
            file: AtomicFile::create(path)?,
            path: path.to_path_buf(),
            events: 0,
            last: std::collections::HashMap::new(),
        })
    }

    /// Appends a sequence's events: a head's first event (and any the changes cannot express
    /// shortly) whole, the rest of each step as one line of changes.
    pub fn write(&mut self, sequence: &str, events: &[TraceEvent]) -> Result<()> {
        let mut start = 0;
        while start < events.len() {
            // The events of one step.
            let (g, seen) = (events[start].generated, events[start].seen);
            let end = start
                + events[start..]
                    .iter()
                    .take_while(|e| e.generated == g && e.seen == seen)
                    .count();
            let mut changes = Vec::new();
            for e in &events[start..end] {
                let key = (sequence.to_string(), e.layer, e.head);
                match self.last.get(&key).and_then(|prev| delta(prev, &e.kept)) {
                    Some((d, a)) => changes.push((e.layer, e.head, d, a)),
                    None => self.line(&TraceLine {
                        sequence: sequence.to_string(),
                        generated: e.generated,
                        seen: e.seen,
                        layer: e.layer,
                        head: e.head,
                        kept: e.kept.clone(),
                    })?,
                }
                self.last.insert(key, e.kept.clone());
            }
            if !changes.is_empty() {
                self.line(&ChangeLine {
                    sequence: sequence.to_string(),
                    generated: g,
                    seen,
                    changes,
                })?;
            }
            start = end;
        }
        self.events += events.len();
        Ok(())
    }

    fn line(&mut self, value: &impl Serialize) -> Result<()> {
        let text = serde_json::to_string(value).map_err(|e| Error::Input(e.to_string()))?;
        writeln!(self.file, "{text}").map_err(|e| Error::io(&self.path, e))
    }

    /// Commits the file; returns the number of events written.
    pub fn finish(self) -> Result<usize> {
        self.file.commit()?;
        Ok(self.events)
    }
}

/// Reads a trace file, every line with its whole `kept` list (compact lines rebuilt): [`visit_trace`]
/// collected.
pub fn read_trace(path: &Path, most_seen: usize) -> Result<Vec<TraceLine>> {
    let mut out = Vec::new();
    visit_trace(path, most_seen, |t| out.push(t))?;
    Ok(out)
}

/// Streams a trace file to `f` a line at a time, every line with its whole `kept` list (compact lines
/// rebuilt), holding only each head's latest list: a long run's trace rebuilt whole takes far more
/// than its file (a change line of a few bytes stands for a list of the budget's size). A bad line, a
/// compact line with no earlier event of its head, a line that saw more than `most_seen` tokens (its
/// sample's prompt and output) or kept a position it had not seen, is an error naming the file and
/// line (a heat map holds a column of `seen` shares, and an edited `seen` of 10^15 aborted the report
/// allocating it).
pub fn visit_trace(path: &Path, most_seen: usize, mut f: impl FnMut(TraceLine)) -> Result<()> {
    use std::io::BufRead;
    crate::files::check_readable(path, crate::files::DATA_LIMIT)?;
    let (file, _) = crate::files::open(path)?;
    let reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut last: std::collections::HashMap<(String, usize, usize), Vec<u32>> =
        std::collections::HashMap::new();
    let bad = |i: usize, why: String| Error::Input(format!("{}:{}: {why}", path.display(), i + 1));
    let check = |i: usize, t: &TraceLine| -> Result<()> {
        if t.seen > most_seen {
            return Err(bad(
                i,
                format!(
                    "an event after {} tokens, more than its sample's {most_seen} (prompt and output)",
                    t.seen
                ),
            ));
        }
        match t.kept.iter().find(|&&p| p as usize >= t.seen) {
            Some(p) => Err(bad(
                i,
                format!(
                    "layer {}, head {} keeps position {p} after {} tokens: a position not yet seen",
                    t.layer, t.head, t.seen
                ),
            )),
            None => Ok(()),
        }
    };
    for (i, l) in reader.lines().enumerate() {
        let l = l.map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => bad(i, "not UTF-8 text".into()),
            _ => Error::io(path, e),
        })?;
        if l.trim().is_empty() {
            continue;
        }
        let line: AnyLine = serde_json::from_str(&l).map_err(|e| {
            bad(
                i,
                format!("not a trace line (a head's kept list or a step's changes): {e}"),
            )
        })?;
        match line {
            AnyLine::Full(t) => {
                check(i, &t)?;
                last.insert((t.sequence.clone(), t.layer, t.head), t.kept.clone());
                f(t);
            }
            AnyLine::Changes(c) => {
                for (layer, head, dropped, added) in c.changes {
                    let key = (c.sequence.clone(), layer, head);
                    let prev = last.get(&key).ok_or_else(|| {
                        bad(
                            i,
                            format!("a change of layer {layer}, head {head} with no earlier event"),
                        )
                    })?;
                    let t = TraceLine {
                        sequence: c.sequence.clone(),
                        generated: c.generated,
                        seen: c.seen,
                        layer,
                        head,
                        kept: apply(prev, &dropped, &added),
                    };
                    check(i, &t)?;
                    last.insert(key, t.kept.clone());
                    f(t);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_lines_rebuild_every_kept_list_exactly() {
        let dir = std::env::temp_dir().join(format!("kvbench-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.jsonl");
        let ev = |generated: usize, head: usize, kept: Vec<u32>| TraceEvent {
            generated,
            seen: 300 + generated,
            layer: 0,
            head,
            kept,
        };
        // An evictor that drops one and adds one per step, a reordering, and a second head.
        let mut events = Vec::new();
        let mut kept: Vec<u32> = (0..200).collect();
        for step in 1..30u32 {
            kept.retain(|&p| p != step);
            kept.push(200 + step);
            events.push(ev(step as usize, 0, kept.clone()));
            events.push(ev(step as usize, 1, (0..200).rev().collect()));
        }
        let mut reordered = kept.clone();
        reordered.reverse();
        events.push(ev(30, 0, reordered));
        let mut w = TraceWriter::create(&path).unwrap();
        w.write("p#0", &events).unwrap();
        w.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let back = read_trace(&path, 1 << 20).unwrap();
        assert_eq!(back.len(), events.len());
        // Lines come back grouped by step (whole lists, then changes); compare as sets of events.
        let mut back = back;

        back.sort_by_key(|l| (l.generated, l.layer, l.head));
        events.sort_by_key(|e| (e.generated, e.layer, e.head));
        for (l, e) in back.iter().zip(&events) {
            assert_eq!(
                (l.layer, l.head, l.generated, &l.kept),
                (e.layer, e.head, e.generated, &e.kept)
            );
        }
        // Most lines are compact, and the whole file is far smaller than full lists.
        assert_eq!(text.matches("\"changes\"").count(), 28, "{text}");
        let full: usize = back
            .iter()
            .map(|l| serde_json::to_string(l).unwrap().len() + 1)
            .sum();
        assert!(
            text.len() * 5 < full,
            "{} bytes, {full} in full",
            text.len()
        );
        // A change with nothing before it is refused by line.
        std::fs::write(
            &path,
            "{\"sequence\":\"p\",\"generated\":1,\"seen\":2,\"changes\":[[0,0,[1],[2]]]}\n",
        )
        .unwrap();
        let e = read_trace(&path, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("t.jsonl:1"), "{e}");
        // More tokens than the sample had, and a position not yet seen (a compact line's too).
        for (text, says) in [
            (
                "{\"sequence\":\"p\",\"generated\":1,\"seen\":1000000000000000,\"layer\":0,\"head\":0,\"kept\":[0]}",
                "t.jsonl:1: an event after 1000000000000000 tokens, more than its sample's 100",
            ),
            (
                "{\"sequence\":\"p\",\"generated\":1,\"seen\":5,\"layer\":2,\"head\":1,\"kept\":[0,5]}",
                "t.jsonl:1: layer 2, head 1 keeps position 5 after 5 tokens",
            ),
            (
                "{\"sequence\":\"p\",\"generated\":1,\"seen\":5,\"layer\":0,\"head\":0,\"kept\":[0,4]}\n\
                 {\"sequence\":\"p\",\"generated\":2,\"seen\":6,\"changes\":[[0,0,[0],[9]]]}",
                "t.jsonl:2: layer 0, head 0 keeps position 9 after 6 tokens",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = read_trace(&path, 100).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
