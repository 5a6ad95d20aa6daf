//! Evaluation datasets: the built-in manifests (`datasets/*.toml`), loading (JSON Lines or Parquet,
//! [`super::rows`]) with field names that can be overridden, resolution (`--data PATH`, then the hub
//! through hf-hub, then kvbench's cache), and subset selection (`--ids`, `--shuffle-seed`, `--limit`).
//!
//! A row without a problem or an answer is an error naming the file and line; a row count or sha256
//! that differs from the manifest is a warning naming the file (the data may be a newer revision).

pub use super::rows::Fields;
use super::Problem;
use crate::error::{Error, Result};
use rand::{RngCore, SeedableRng};
use std::path::{Path, PathBuf};

/// A dataset's manifest, from `datasets/NAME.toml`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Manifest {
    pub name: String,
    pub description: String,
    pub rows: usize,
    /// sha256 of the JSON Lines file in kvbench's layout.
    pub sha256: String,
    /// The max-new-tokens default for this dataset.
    pub max_new_tokens: usize,
    pub hub: Option<HubSource>,
}

/// Where the dataset lives on the Hugging Face hub.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct HubSource {
    pub repo: String,
    pub file: String,
    pub id_field: String,
    pub problem_field: String,
    pub answer_field: String,
}

const MANIFESTS: [&str; 4] = [
    include_str!("../../datasets/math500.toml"),
    include_str!("../../datasets/aime24.toml"),
    include_str!("../../datasets/aime25.toml"),
    include_str!("../../datasets/amc23.toml"),
];

/// The built-in dataset names.
pub fn names() -> Vec<String> {
    manifests().into_iter().map(|m| m.name).collect()
}

fn manifests() -> Vec<Manifest> {
    MANIFESTS
        .iter()
        .map(|t| toml::from_str(t).expect("built-in manifests parse (a unit test checks)"))
        .collect()
}

/// The name records give a file of problems read without a problem set's name: its file name, commas
/// replaced (a report reads a record's problem set up to the first comma); `None` for a path with no
/// file name.
pub fn file_label(path: &Path) -> Option<String> {
    path.file_name()
        .map(|f| f.to_string_lossy().replace(',', " "))
}

/// A problem set's name as kvbench spells it, whatever its case, hyphens, underscores or spaces, and
/// with the year written out (`MATH-500`, `AIME 2024`, `AMC2023`); a name kvbench does not know is kept
/// as written (with a file of problems it labels the file, and without one it is refused by name).
pub fn canonical_name(name: &str) -> String {
    let key = crate::name_key(name);
    let key = match key.as_str() {
        "aime2024" => "aime24",
        "aime2025" => "aime25",
        "amc2023" => "amc23",
        k => k,
    };
    if key == "builtin" || manifest(key).is_some() {
        key.to_string()
    } else {
        name.to_string()
    }
}

/// The manifest of a built-in dataset.
pub fn manifest(name: &str) -> Option<Manifest> {
    manifests().into_iter().find(|m| m.name == name)
}

/// A loaded dataset with where it came from.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub name: String,
    pub problems: Vec<Problem>,
    pub path: PathBuf,
    pub sha256: String,
    /// Mismatches with the manifest, each naming the file.
    pub warnings: Vec<String>,
}

/// Reads a problem file: JSON Lines, or Parquet when the name ends in `.parquet` ([`super::rows`]).
pub fn load(path: &Path, fields: &Fields) -> Result<Vec<Problem>> {
    super::rows::load(path, fields)
}

pub use super::rows::Want;

/// The rows a selection needs from a file: the listed ids, or the first `limit`, or (with a
/// shuffle, which needs every row) all of them.
pub fn want(ids: &[String], shuffle_seed: Option<u64>, limit: Option<usize>) -> Want {
    match (shuffle_seed, ids.is_empty(), limit) {
        (Some(_), _, _) => Want::All,
        (None, false, _) => Want::Ids(ids.iter().cloned().collect()),
        (None, true, Some(n)) if n > 0 => Want::First(n),
        _ => Want::All,
    }
}

/// kvbench's dataset cache: `$KVBENCH_CACHE/datasets` or `~/.cache/kvbench/datasets`.
pub fn cache_dir() -> Result<PathBuf> {
    Ok(crate::loading::resolve::cache_dir()?.join("datasets"))
}

/// Resolves a dataset: `data` when given (with `fields`), else the built-in `name` from the hub
/// (hf-hub, which reads its own cache first) or kvbench's cache.
pub fn resolve(name: &str, data: Option<&Path>, fields: &Fields, want: &Want) -> Result<Dataset> {
    let manifest = manifest(name);
    let (path, read, own_layout) = match data {
        Some(p) => (p.to_path_buf(), super::rows::read(p, fields, want)?, true),
        None => {
            let m = manifest.as_ref().ok_or_else(|| {
                Error::Input(format!(
                    "unknown dataset '{name}' (--dataset); built in: builtin, {}; or pass --data FILE (.jsonl or .parquet)",
                    names().join(", ")
                ))
            })?;
            fetch(m, want)?
        }
    };
    // The digest of the bytes read (a stream cannot be read twice).
    let sha256 = read.sha256;
    let problems = read.problems;
    let mut warnings = Vec::new();
    if let Some(m) = &manifest {
        if read.rows != m.rows {
            warnings.push(format!(
                "{}: {} rows, the {} manifest expects {}",
                path.display(),
                read.rows,
                m.name,
                m.rows
            ));
        }
        // The manifest's hash is of kvbench's layout; a hub file has the upstream layout.
        if own_layout && sha256 != m.sha256 {
            warnings.push(format!(
                "{}: sha256 {sha256} differs from the {} manifest's {} (another revision or layout?)",
                path.display(),
                m.name,
                m.sha256
            ));
        }
    }
    Ok(Dataset {
        name: name.to_string(),
        problems,
        path,
        sha256,
        warnings,
    })
}

/// The hub first (when the manifest names a source), then kvbench's cache. The flag says
/// whether the file is in kvbench's layout (the cache) rather than the upstream one (the hub).
fn fetch(m: &Manifest, want: &Want) -> Result<(PathBuf, super::rows::Read, bool)> {
    let cached = cache_dir()?.join(format!("{}.jsonl", m.name));
    let hub_error = match &m.hub {
        Some(h) => match fetch_hub(h) {
            Ok(path) => {
                let fields = Fields {
                    id: h.id_field.clone(),
                    problem: h.problem_field.clone(),
                    answer: h.answer_field.clone(),
                    id_required: false,
                };
                let read = super::rows::read(&path, &fields, want)?;
                return Ok((path, read, false));
            }
            Err(e) => e.to_string(),
        },
        None => "the manifest names no hub source".to_string(),
    };
    if cached.is_file() {
        let read = super::rows::read(&cached, &Fields::default(), want)?;
        return Ok((cached, read, true));
    }
    Err(Error::Input(format!(
        "dataset '{}': hub: {hub_error}; not in kvbench's cache ({}); pass --data FILE (.jsonl or .parquet; fields id, problem, answer)",
        m.name,
        cached.display()
    )))
}

#[cfg(feature = "hub")]
fn fetch_hub(h: &HubSource) -> Result<PathBuf> {
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(false)
        .build()
        .map_err(|e| Error::Input(format!("cannot start the hub client: {e}")))?;
    let path = api
        .dataset(h.repo.clone())
        .get(&h.file)
        .map_err(|e| Error::Input(format!("{}/{}: {e}", h.repo, h.file)))?;
    crate::loading::hub::verify_blob(&path)?;
    Ok(path)
}

#[cfg(not(feature = "hub"))]
fn fetch_hub(_: &HubSource) -> Result<PathBuf> {
    Err(Error::Input("built without the `hub` feature".into()))
}

/// Where the ids asked for are written, for errors: a flag or a config's key.
const IDS: &str = "--ids (or `ids` in a sweep config)";

/// Takes a subset: the listed ids (in the order given; an unknown id is an error), else all rows, then
/// a deterministic shuffle (Fisher–Yates on a ChaCha8 stream), then the first `limit`.
pub fn select(
    problems: Vec<Problem>,
    ids: &[String],
    shuffle_seed: Option<u64>,
    limit: Option<usize>,
) -> Result<Vec<Problem>> {
    // Two problems under one id would merge as samples of one problem (cons@n voting across different
    // gold answers): refused, as is asking for one id twice.
    let mut seen = std::collections::HashSet::new();
    if let Some(p) = problems.iter().find(|p| !seen.insert(p.id.as_str())) {
        return Err(Error::Input(format!(
            "two problems share the id '{}': ids must be unique",
            p.id
        )));
    }
    if ids.iter().any(String::is_empty) {
        return Err(Error::Input(format!(
            "{IDS}: an empty id (nothing between two commas, or an empty string)"
        )));
    }
    let mut asked = std::collections::HashSet::new();
    if let Some(id) = ids.iter().find(|id| !asked.insert(id.as_str())) {
        return Err(Error::Input(format!("{IDS}: '{id}' is named twice")));
    }
    if limit == Some(0) {
        return Err(Error::Input("--limit 0 selects no problem".into()));
    }
    let mut chosen = if ids.is_empty() {
        problems
    } else {
        // An index by id: looking each id up in the list was quadratic (100,000 ids: 32 s).
        let by_id: std::collections::HashMap<&str, &Problem> =
            problems.iter().map(|p| (p.id.as_str(), p)).collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let p = by_id.get(id.as_str()).ok_or_else(|| {
                Error::Input(format!("{IDS}: no problem with id '{id}' in the dataset"))
            })?;
            out.push((*p).clone());
        }
        out
    };
    if let Some(seed) = shuffle_seed {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        for i in (1..chosen.len()).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            chosen.swap(i, j);
        }
    }
    if let Some(n) = limit {
        chosen.truncate(n);
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(id: &str) -> Problem {
        Problem {
            id: id.into(),
            problem: format!("problem {id}"),
            answer: "1".into(),
        }
    }

    #[test]
    fn duplicate_ids_and_an_empty_limit_are_refused() {
        let set = || vec![problem("a"), problem("b")];
        let err = select(vec![problem("a"), problem("a")], &[], None, None).unwrap_err();
        assert!(err.to_string().contains("'a'"), "{err}");
        let err = select(set(), &["b".into(), "b".into()], None, None).unwrap_err();
        assert!(
            err.to_string().contains("--ids") && err.to_string().contains("'b'"),
            "{err}"
        );
        let err = select(set(), &["a".into(), "".into()], None, None).unwrap_err();
        assert!(err.to_string().contains("an empty id"), "{err}");
        let err = select(set(), &[], None, Some(0)).unwrap_err();
        assert!(err.to_string().contains("--limit"), "{err}");
        assert_eq!(
            select(set(), &["b".into()], None, Some(1)).unwrap()[0].id,
            "b"
        );
    }

    #[test]
    fn manifests_parse() {
        assert_eq!(names(), vec!["math500", "aime24", "aime25", "amc23"]);
        for (written, name) in [
            ("MATH-500", "math500"),
            ("AIME 2024", "aime24"),
            ("aime_2025", "aime25"),
            ("AMC23", "amc23"),
            ("BuiltIn", "builtin"),
            ("my-set", "my-set"),
        ] {
            assert_eq!(canonical_name(written), name, "{written}");
        }
        assert_eq!(manifest("math500").unwrap().rows, 500);
        assert!(names().iter().all(|n| manifest(n).unwrap().hub.is_some()));
    }

    #[test]
    fn selection_is_deterministic() {
        let ps: Vec<Problem> = (0..10)
            .map(|i| Problem {
                id: format!("p{i}"),
                problem: format!("What is {i}?"),
                answer: i.to_string(),
            })
            .collect();
        let a = select(ps.clone(), &[], Some(7), Some(4)).unwrap();
        let b = select(ps.clone(), &[], Some(7), Some(4)).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, ps[..4].to_vec(), "shuffled");
        let picked = select(ps.clone(), &["p5".into(), "p1".into()], None, None).unwrap();
        assert_eq!(
            picked.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
            ["p5", "p1"]
        );
        assert!(select(ps, &["nope".into()], None, None).is_err());
    }
}
