//! Problem rows from a file: JSON Lines (kvbench's own layout and most local copies) or Parquet (the
//! layout the Hugging Face hub keeps most datasets in, AIME and AMC among them).
//!
//! Both formats become one JSON object per row, then one rule turns a row into a [`Problem`], so a
//! field means the same in either: a missing id becomes `line-N` or `row-N` (unless the user named the id
//! field: then it is an error, as a misspelt name would be), a missing or empty problem
//! or answer is an error naming the file and the line or row, and a numeric answer is written as text
//! (`27.0` as `27`).

use super::Problem;
use crate::error::{Error, Result};
use std::path::Path;

/// Field names of a problem file.
#[derive(Debug, Clone)]
pub struct Fields {
    pub id: String,
    pub problem: String,
    pub answer: String,
    /// Whether every row must hold `id` (the user named the field: a row without it is more likely
    /// a misspelt name than a row to number), rather than a missing id becoming `line-N`.
    pub id_required: bool,
}

impl Default for Fields {
    fn default() -> Self {
        Self {
            id: "id".into(),
            problem: "problem".into(),
            answer: "answer".into(),
            id_required: false,
        }
    }
}

/// Which rows of a file a study needs, known before the file is read: reading stops early where
/// the order allows, and only the rows kept are held (the file may hold millions).
#[derive(Debug, Clone, Default)]
pub enum Want {
    /// Every row (a shuffle needs them all).
    #[default]
    All,
    /// The first `n` rows.
    First(usize),
    /// The rows with these ids (every other row is dropped once its id is read).
    Ids(std::collections::HashSet<String>),
}

impl Want {
    /// Whether a row read so far may still be wanted, given the rows kept.
    fn done(&self, kept: &[Problem]) -> bool {
        match self {
            Want::All => false,
            Want::First(n) => kept.len() >= *n,
            Want::Ids(ids) => kept.len() >= ids.len(),
        }
    }

    fn keeps(&self, p: &Problem) -> bool {
        match self {
            Want::Ids(ids) => ids.contains(&p.id),
            _ => true,
        }
    }
}

/// The rows kept so far and where each id was read, to name both lines of a repeated id.
struct Kept<'a> {
    path: &'a Path,
    unit: &'static str,
    problems: Vec<Problem>,
    first_seen: std::collections::HashMap<String, usize>,
}

impl<'a> Kept<'a> {
    fn new(path: &'a Path, unit: &'static str) -> Self {
        Self {
            path,
            unit,
            problems: Vec::new(),
            first_seen: Default::default(),
        }
    }

    /// Keeps `p`, read at line (or row) `n`, unless another kept row has its id: two problems under
    /// one id would merge as samples of one problem (cons@n voting across different gold answers).
    fn push(&mut self, p: Problem, n: usize) -> Result<()> {
        if let Some(first) = self.first_seen.insert(p.id.clone(), n) {
            return Err(Error::Input(format!(
                "{}: {}s {first} and {n} share the id '{}': ids must be unique",
                self.path.display(),
                self.unit,
                p.id
            )));
        }
        self.problems.push(p);
        Ok(())
    }
}

/// What a read gave: the rows kept, in file order, how many rows the file has, and the sha256 of
/// the bytes read (of a stream too, which cannot be read twice).
#[derive(Debug, Clone)]
pub struct Read {
    pub problems: Vec<Problem>,
    pub rows: usize,
    pub sha256: String,
}

/// The longest line (one problem) a JSON Lines problem file may have: 64 MiB. A longer one is refused
/// naming its line before it is held.
pub const MAX_LINE: usize = 64 << 20;

/// Reads the problems of `path`: Parquet when its name ends in `.parquet`, else JSON Lines.
pub fn load(path: &Path, fields: &Fields) -> Result<Vec<Problem>> {
    Ok(read(path, fields, &Want::All)?.problems)
}

/// Reads the rows `want` names from `path` (Parquet when its name ends in `.parquet`, else JSON
/// Lines), streamed: memory follows the rows kept, not the file.
pub fn read(path: &Path, fields: &Fields, want: &Want) -> Result<Read> {
    let parquet = path.extension().is_some_and(|e| e == "parquet");
    let r = if parquet {
        parquet_rows(path, fields, want)?
    } else {
        jsonl_rows(path, fields, want)?
    };
    if r.rows == 0 {
        return Err(Error::Input(format!("{}: no problems", path.display())));
    }
    Ok(r)
}

/// JSON Lines, line by line: lines are parsed until `want` is satisfied, the rest only counted and
/// hashed.
fn jsonl_rows(path: &Path, fields: &Fields, want: &Want) -> Result<Read> {
    use sha2::Digest;
    use std::io::BufRead;
    let (file, meta) = crate::files::open(path)?;
    if meta.is_file() && meta.len() > crate::files::DATA_LIMIT {
        return Err(Error::Input(format!(
            "{}: larger than {} MiB, the most kvbench reads from a problem file",
            path.display(),
            crate::files::DATA_LIMIT >> 20
        )));
    }
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut hasher = sha2::Sha256::new();
    let mut kept = Kept::new(path, "line");
    let (mut rows, mut n, mut total) = (0usize, 0usize, 0u64);
    let mut line = Vec::new();
    loop {
        line.clear();
        let got = std::io::Read::take(&mut reader, MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| Error::io(path, e))?;
        if got == 0 {
            break;
        }
        n += 1;
        total += got as u64;
        if total > crate::files::DATA_LIMIT {
            return Err(Error::Input(format!(
                "{}: more than {} MiB, the most kvbench reads from a problem file",
                path.display(),
                crate::files::DATA_LIMIT >> 20
            )));
        }
        if line.len() > MAX_LINE && !line.ends_with(b"\n") {
            return Err(Error::Input(format!(
                "{}: the line is longer than {} MiB, more than any problem",
                place(path, "line", n),
                MAX_LINE >> 20
            )));
        }
        hasher.update(&line);
        let text = std::str::from_utf8(&line)
            .map_err(|_| Error::Input(format!("{}: not UTF-8 text", place(path, "line", n))))?;
        let text = match n {
            1 => crate::files::without_bom(text),
            _ => text,
        };
        if text.trim().is_empty() {
            continue;
        }
        rows += 1;
        if want.done(&kept.problems) {
            continue;
        }
        let row: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            Error::Input(format!(
                "{}: {}",
                place(path, "line", n),
                crate::files::not_a_json_object(Err(&e))
            ))
        })?;
        let p = problem_of(&row, fields, path, "line", n)?;
        if want.keeps(&p) {
            kept.push(p, n)?;
        }
    }
    if total == 0 && crate::files::is_pipe(&meta) {
        return Err(crate::files::empty_pipe(path));
    }
    Ok(Read {
        problems: kept.problems,
        rows,
        sha256: format!("{:x}", hasher.finalize()),
    })
}

/// A Parquet file, row group by row group, reading only the three fields' columns: rows are
/// converted until `want` is satisfied; the row count comes from the file's metadata.
fn parquet_rows(path: &Path, fields: &Fields, want: &Want) -> Result<Read> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::schema::types::Type;
    let bad = |e: parquet::errors::ParquetError| {
        Error::Input(format!(
            "{}: not a readable Parquet file: {e}",
            path.display()
        ))
    };
    crate::files::check_readable(path, crate::files::DATA_LIMIT)?;
    let sha256 = crate::loading::verify::sha256_file(path)?;
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let reader = SerializedFileReader::new(file).map_err(bad)?;
    let meta = reader.metadata().file_metadata();
    let rows = usize::try_from(meta.num_rows()).unwrap_or(0);
    // Only the columns of the three fields (those the file has): a wide file costs what they cost.
    let schema = meta.schema_descr().root_schema();
    let wanted = [&fields.id, &fields.problem, &fields.answer];
    let columns: Vec<std::sync::Arc<Type>> = schema
        .get_fields()
        .iter()
        .filter(|f| wanted.iter().any(|w| *w == f.name()))
        .cloned()
        .collect();
    let projection = Type::group_type_builder(schema.name())
        .with_fields(columns)
        .build()
        .map_err(bad)?;
    let mut kept = Kept::new(path, "row");
    for (i, row) in reader
        .get_row_iter(Some(projection))
        .map_err(bad)?
        .enumerate()
    {
        if want.done(&kept.problems) {
            break;
        }
        let p = problem_of(
            &row.map_err(bad)?.to_json_value(),
            fields,
            path,
            "row",
            i + 1,
        )?;
        if want.keeps(&p) {
            kept.push(p, i + 1)?;
        }
    }
    Ok(Read {
        problems: kept.problems,
        rows,
        sha256,
    })
}

/// Where line (or Parquet row) `n` of `path` is, as errors name it: `FILE:N` for a line (as every
/// line-based file kvbench reads is named), `FILE: row N` for a row.
fn place(path: &Path, unit: &str, n: usize) -> String {
    match unit {
        "line" => format!("{}:{n}", path.display()),
        _ => format!("{}: {unit} {n}", path.display()),
    }
}

/// Row (or line) `n` of `path` as a problem.
fn problem_of(
    row: &serde_json::Value,
    fields: &Fields,
    path: &Path,
    unit: &str,
    n: usize,
) -> Result<Problem> {
    let at = || place(path, unit, n);
    if !row.is_object() {
        return Err(Error::Input(format!(
            "{}: {}",
            at(),
            crate::files::not_a_json_object(Ok(row))
        )));
    }
    let text_of = |key: &str| -> Option<String> {
        match row.get(key)? {
            serde_json::Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
            serde_json::Value::Number(n) => Some(match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
                _ => n.to_string(),
            }),
            _ => None,
        }
    };
    let problem = text_of(&fields.problem).ok_or_else(|| {
        Error::Input(format!("{}: no '{}' (problem) field", at(), fields.problem))
    })?;
    let answer = text_of(&fields.answer)
        .ok_or_else(|| Error::Input(format!("{}: no '{}' (answer) field", at(), fields.answer)))?;
    let id = match text_of(&fields.id) {
        Some(id) => id,
        None if fields.id_required => {
            return Err(Error::Input(format!(
                "{}: no '{}' field, which --id-field (`id_field`) names",
                at(),
                fields.id
            )))
        }
        None => format!("{unit}-{n}"),
    };
    Ok(Problem {
        id,
        problem,
        answer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kvbench-rows-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn json_lines_name_the_bad_line_and_number_answers_become_text() {
        let dir = temp_dir("jsonl");
        let good = dir.join("good.jsonl");
        let rows: String = (0..10)
            .map(|i| {
                format!("{{\"id\": \"p{i}\", \"problem\": \"What is {i}?\", \"answer\": {i}}}\n")
            })
            .collect();
        std::fs::write(&good, rows).unwrap();
        let ps = load(&good, &Fields::default()).unwrap();
        assert_eq!(ps.len(), 10);
        assert_eq!(ps[3].answer, "3");
        // A byte order mark (as Windows tools write one) is not part of the first row; CRLF ends are
        // fine too.
        let bom = dir.join("bom.jsonl");
        std::fs::write(
            &bom,
            "\u{feff}{\"id\": \"a\", \"problem\": \"x\", \"answer\": 1}\r\n{\"id\": \"b\", \"problem\": \"y\", \"answer\": 2}\r\n",
        )
        .unwrap();
        let ps = load(&bom, &Fields::default()).unwrap();
        assert_eq!((ps[0].id.as_str(), ps[1].answer.as_str()), ("a", "2"));
        let bad = dir.join("bad.jsonl");
        std::fs::write(
            &bad,
            "{\"id\": \"a\", \"problem\": \"x\", \"answer\": \"1\"}\n\n{\"problem\": \"y\"}\n",
        )
        .unwrap();
        let err = load(&bad, &Fields::default()).unwrap_err().to_string();
        assert!(
            err.contains("bad.jsonl:3:") && err.contains("answer"),
            "{err}"
        );
        std::fs::write(&bad, "{\"problem\": \"y\", \"answer\": 2.5}\n[1]\n").unwrap();
        let err = load(&bad, &Fields::default()).unwrap_err().to_string();
        assert!(
            err.contains("bad.jsonl:2: not a JSON object but an array (JSON Lines"),
            "{err}"
        );
        // A pretty-printed JSON file: its first line is no object, and the format is named.
        std::fs::write(&bad, "{\n  \"problem\": \"y\",\n  \"answer\": 2\n}\n").unwrap();
        let err = load(&bad, &Fields::default()).unwrap_err().to_string();
        assert!(
            err.contains("bad.jsonl:1: not a JSON object: EOF")
                && err.contains("one object a line"),
            "{err}"
        );
        // A repeated id among the rows read names both lines (a read that stops early, at `--limit`
        // or the ids asked for, does not look further).
        std::fs::write(
            &bad,
            "{\"id\": \"a\", \"problem\": \"x\", \"answer\": 1}\n\n{\"id\": \"b\", \"problem\": \"y\", \"answer\": 2}\n{\"id\": \"a\", \"problem\": \"z\", \"answer\": 3}\n",
        )
        .unwrap();
        for want in [Want::All, Want::First(3)] {
            let err = read(&bad, &Fields::default(), &want)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("bad.jsonl: lines 1 and 4 share the id 'a'"),
                "{err}"
            );
        }
        std::fs::write(&bad, "{\"problem\": \"y\", \"answer\": 2.5}\n").unwrap();
        let ps = load(&bad, &Fields::default()).unwrap();
        assert_eq!(
            (ps[0].id.as_str(), ps[0].answer.as_str()),
            ("line-1", "2.5")
        );
        // An id field the user named must be there (a misspelt name numbered every row).
        let named = Fields {
            id: "uid".into(),
            id_required: true,
            ..Fields::default()
        };
        let err = load(&bad, &named).unwrap_err().to_string();
        assert!(
            err.contains("bad.jsonl:1: no 'uid' field") && err.contains("--id-field"),
            "{err}"
        );
        std::fs::write(&bad, "{\"uid\": 7, \"problem\": \"y\", \"answer\": 2}\n").unwrap();
        assert_eq!(load(&bad, &named).unwrap()[0].id, "7");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_that_is_not_parquet_is_named() {
        let dir = temp_dir("pq");
        let fake = dir.join("fake.parquet");
        std::fs::write(&fake, "{\"problem\": \"y\", \"answer\": 1}\n").unwrap();
        let err = load(&fake, &Fields::default()).unwrap_err().to_string();
        assert!(
            err.contains("fake.parquet: not a readable Parquet file"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
