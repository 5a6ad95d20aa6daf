//! Problem rows from a file: JSON Lines (kvbench's own layout and most local copies) or Parquet (the
//! layout the Hugging Face hub keeps most datasets in, AIME and AMC among them).
//!
//! Both formats become one JSON object per row, then one rule turns a row into a [`Problem`], so a
//! field means the same in either: a missing id becomes `line-N` or `row-N`, a missing or empty problem
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
}

impl Default for Fields {
    fn default() -> Self {
        Self {
            id: "id".into(),
            problem: "problem".into(),
            answer: "answer".into(),
        }
    }
}

/// Reads the problems of `path`: Parquet when its name ends in `.parquet`, else JSON Lines.
pub fn load(path: &Path, fields: &Fields) -> Result<Vec<Problem>> {
    let parquet = path.extension().is_some_and(|e| e == "parquet");
    let rows = if parquet {
        parquet_rows(path)?
    } else {
        jsonl_rows(path)?
    };
    let unit = if parquet { "row" } else { "line" };
    let mut out = Vec::with_capacity(rows.len());
    for (n, row) in rows {
        out.push(problem_of(&row, fields, path, unit, n)?);
    }
    if out.is_empty() {
        return Err(Error::Input(format!("{}: no problems", path.display())));
    }
    Ok(out)
}

/// The non-blank lines of a JSON Lines file, numbered from 1 as an editor numbers them.
fn jsonl_rows(path: &Path) -> Result<Vec<(usize, serde_json::Value)>> {
    let text = crate::files::read_text(path, crate::files::DATA_LIMIT)?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row = serde_json::from_str(line).map_err(|e| {
            Error::Input(format!(
                "{}: line {}: not a JSON object: {e}",
                path.display(),
                i + 1
            ))
        })?;
        rows.push((i + 1, row));
    }
    Ok(rows)
}

/// The rows of a Parquet file (every row group), numbered from 1.
fn parquet_rows(path: &Path) -> Result<Vec<(usize, serde_json::Value)>> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let bad = |e: parquet::errors::ParquetError| {
        Error::Input(format!(
            "{}: not a readable Parquet file: {e}",
            path.display()
        ))
    };
    crate::files::check_readable(path, crate::files::DATA_LIMIT)?;
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let reader = SerializedFileReader::new(file).map_err(bad)?;
    let mut rows = Vec::new();
    for (i, row) in reader.get_row_iter(None).map_err(bad)?.enumerate() {
        rows.push((i + 1, row.map_err(bad)?.to_json_value()));
    }
    Ok(rows)
}

/// Row (or line) `n` of `path` as a problem.
fn problem_of(
    row: &serde_json::Value,
    fields: &Fields,
    path: &Path,
    unit: &str,
    n: usize,
) -> Result<Problem> {
    let at = || format!("{}: {unit} {n}", path.display());
    if !row.is_object() {
        return Err(Error::Input(format!("{}: not a JSON object", at())));
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
    let id = text_of(&fields.id).unwrap_or_else(|| format!("{unit}-{n}"));
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
        let bad = dir.join("bad.jsonl");
        std::fs::write(
            &bad,
            "{\"id\": \"a\", \"problem\": \"x\", \"answer\": \"1\"}\n\n{\"problem\": \"y\"}\n",
        )
        .unwrap();
        let err = load(&bad, &Fields::default()).unwrap_err().to_string();
        assert!(
            err.contains("bad.jsonl: line 3") && err.contains("answer"),
            "{err}"
        );
        std::fs::write(&bad, "{\"problem\": \"y\", \"answer\": 2.5}\n[1]\n").unwrap();
        let err = load(&bad, &Fields::default()).unwrap_err().to_string();
        assert!(
            err.contains("bad.jsonl: line 2: not a JSON object"),
            "{err}"
        );
        std::fs::write(&bad, "{\"problem\": \"y\", \"answer\": 2.5}\n").unwrap();
        let ps = load(&bad, &Fields::default()).unwrap();
        assert_eq!(
            (ps[0].id.as_str(), ps[0].answer.as_str()),
            ("line-1", "2.5")
        );
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
