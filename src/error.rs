//! Library error types. Every variant names what the user must change: the file, flag, key or line.
//!
//! The binary maps these to exit codes: input and usage problems are exit code 2.

use std::path::PathBuf;

/// Errors raised by kvbench's library code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model file or directory could not be used.
    #[error("model {path}: {reason}")]
    Model { path: PathBuf, reason: String },

    /// A model name could not be resolved to files.
    #[error("cannot resolve model '{name}': {reason}")]
    Resolve { name: String, reason: String },

    /// A downloaded or cached file does not match its expected sha256.
    #[error("{path}: sha256 mismatch (expected {expected}, found {found}); the file was not used")]
    Checksum {
        path: PathBuf,
        expected: String,
        found: String,
    },

    /// The tokenizer could not be built or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// Bad user input (a flag value, a TOML key, a data line).
    #[error("{0}")]
    Input(String),

    /// A compression policy broke its contract (for example held more entries than its budget).
    #[error("policy '{policy}': {reason}")]
    Policy { policy: String, reason: String },

    /// The model computed a NaN or infinite logit: damaged weights, or an overflow. Sampling from
    /// it would record garbage as a result, so the generation stops here.
    #[error("the model computed a non-finite logit ({value} for token id {token}); its weights may be damaged")]
    NonFiniteLogits { token: usize, value: f32 },

    #[error("i/o error on {path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    /// A tensor operation failed. Shown by its reason alone ([`candle_message`]): candle attaches a
    /// stack under `RUST_BACKTRACE`, which would otherwise fill a unit's failure line. Not a `source`,
    /// so that a chain printed with `{:#}` does not repeat it with the stack.
    #[error("{}", candle_message(.0))]
    Candle(candle_core::Error),
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Candle(e)
    }
}

impl Error {
    /// True when the error is the user's to fix (bad input, missing file): exit code 2.
    pub fn is_input_error(&self) -> bool {
        matches!(
            self,
            Error::Model { .. }
                | Error::Resolve { .. }
                | Error::Checksum { .. }
                | Error::Input(_)
                | Error::Io { .. }
        )
    }

    /// A model file's problem. The reason often quotes the file (a tensor's name, a metadata string),
    /// so it is made printable: control characters escaped (a damaged name must not move the terminal's
    /// cursor or split the message), and cut after [`REASON_LIMIT`] characters.
    pub fn model(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::Model {
            path: path.into(),
            reason: printable(&reason.into()),
        }
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// This error as `label: why` when it is an i/o error on `path` itself, `label` saying which
    /// file and the flag or config key that named it (`--cases x.jsonl`): the bare error said which
    /// file but not where it came from.
    pub fn naming(self, path: &std::path::Path, label: String) -> Self {
        match self {
            Error::Io { path: p, source } if p == path => {
                Error::Input(format!("{label}: {source}"))
            }
            other => other,
        }
    }
}

/// The most characters of a reason [`Error::model`] keeps.
pub const REASON_LIMIT: usize = 600;

/// `text` with control characters escaped (`\n`, `\u{1b}`) and cut after [`REASON_LIMIT`] characters.
fn printable(text: &str) -> String {
    escape_controls(text, false, REASON_LIMIT)
}

/// An error's text as the binary prints it: control characters that quoted input may carry (an
/// escape sequence in a problem id, a tensor name) escaped, its own line breaks and tabs kept.
pub fn terminal_safe(text: &str) -> String {
    escape_controls(text, true, usize::MAX)
}

/// A string from input (a problem id, an answer, a file name) as one table cell or line: control
/// characters, line breaks and the bidirectional controls that reorder what a terminal shows
/// (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C) escaped, so that it cannot move the
/// cursor, retitle the terminal, add a row to a table or print right to left.
pub fn cell(text: &str) -> String {
    escape_controls(text, false, usize::MAX)
}

/// Characters a terminal acts on rather than shows.
fn acts_on_terminal(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
}

fn escape_controls(text: &str, keep_lines: bool, limit: usize) -> String {
    let mut out = String::with_capacity(text.len().min(limit.saturating_add(16)));
    for (n, c) in text.chars().enumerate() {
        if n == limit {
            out.push_str("… (cut)");
            break;
        }
        if acts_on_terminal(c) && !(keep_lines && matches!(c, '\n' | '\t')) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A candle error's message without the backtrace candle attaches when `RUST_BACKTRACE` is set: what
/// a user reads about a bad file is its reason, not a stack.
pub fn candle_message(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(inner),
        candle_core::Error::Context { inner, context } => {
            format!("{context}: {}", candle_message(inner))
        }
        candle_core::Error::WithPath { inner, path } => {
            format!("{}: {}", path.display(), candle_message(inner))
        }
        e => e.to_string(),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_error_is_its_reason_without_a_stack() {
        // What `.bt()` makes under RUST_BACKTRACE, whether or not it is set here.
        let e = Error::from(candle_core::Error::WithBacktrace {
            inner: Box::new(candle_core::Error::Msg(
                "index-select invalid index 9".into(),
            )),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        });
        assert_eq!(e.to_string(), "index-select invalid index 9");
        assert!(std::error::Error::source(&e).is_none());
        let e = Error::from(candle_core::Error::Msg("odd".into()).context("layer 3"));
        assert_eq!(e.to_string(), "layer 3: odd");
    }

    #[test]
    fn model_reasons_are_one_printable_line_of_bounded_length() {
        let e = Error::model("m.gguf", "tensor 'a\nb\x1b[2J\u{7}' is odd");
        assert_eq!(
            e.to_string(),
            "model m.gguf: tensor 'a\\nb\\u{1b}[2J\\u{7}' is odd"
        );
        let long = Error::model("m.gguf", "é".repeat(5000)).to_string();
        assert!(long.ends_with("… (cut)") && long.chars().count() < REASON_LIMIT + 30);
        assert_eq!(terminal_safe("a\n\tb\x1b[2J\r"), "a\n\tb\\u{1b}[2J\\r");
        assert_eq!(
            cell("id\nrow\u{202e}x\x1b]0;t\x07"),
            "id\\nrow\\u{202e}x\\u{1b}]0;t\\u{7}"
        );
        assert_eq!(terminal_safe("a\u{2066}b"), "a\\u{2066}b");
    }
}
