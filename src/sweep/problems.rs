//! The problems a study's options name: the built-in set, a dataset (hub or local file) or `data`,
//! then the selection (`ids`, `shuffle_seed`, `limit`) and the length limit that goes with the data.

use crate::error::{Error, Result};
use crate::eval::dataset;
use crate::sweep::options::StudyOptions;

/// The problems of a run with where they came from.
pub struct ProblemSet {
    pub problems: Vec<crate::eval::Problem>,
    /// A description for logs: name, file and sha256.
    pub source: String,
    pub max_new_tokens: usize,
}

/// Size of the built-in problem set.
const BUILTIN_PROBLEMS: usize = 30;

/// Loads the problems a study's options name: the built-in set, `data`, or the dataset's resolution.
pub fn load_problems(o: &StudyOptions) -> Result<ProblemSet> {
    let seed = o.problem_seed.unwrap_or(crate::eval::builtin::DEFAULT_SEED);
    let (problems, source, max_new_tokens) = if o.dataset() == "builtin" && o.data.is_none() {
        (
            crate::eval::builtin::problems(BUILTIN_PROBLEMS, seed),
            format!("built-in set, seed {seed}"),
            512,
        )
    } else {
        let field = |f: &Option<String>, d: &str| f.clone().unwrap_or_else(|| d.to_string());
        let fields = dataset::Fields {
            id: field(&o.id_field, "id"),
            problem: field(&o.problem_field, "problem"),
            answer: field(&o.answer_field, "answer"),
            id_required: o.id_field.is_some(),
        };
        // Only the rows the selection needs are read and held (a file may hold millions).
        let want = dataset::want(&o.ids, o.shuffle_seed, o.limit);
        let named = |e: Error| match o.data.as_deref() {
            Some(data) => e.naming(
                data,
                format!(
                    "problems file {} (--data, or `data` in a sweep config)",
                    data.display()
                ),
            ),
            None => e,
        };
        let d = dataset::resolve(o.dataset(), o.data.as_deref(), &fields, &want).map_err(named)?;
        for w in &d.warnings {
            crate::say!("warning: {w}");
        }
        let max_new = dataset::manifest(o.dataset()).map_or(512, |m| m.max_new_tokens);
        // A file given without a problem set's name is named by its file name, not `builtin`
        // (a report shows the part before the first comma as the problem set).
        let name = match (&o.data, o.dataset.is_none() || o.dataset() == "builtin") {
            (Some(data), true) => {
                dataset::file_label(data).unwrap_or_else(|| "problems file".to_string())
            }
            _ => d.name.clone(),
        };
        let source = format!(
            "{}, {} (sha256 {})",
            name,
            d.path.display(),
            &d.sha256[..16]
        );
        (d.problems, source, max_new)
    };
    let problems = dataset::select(problems, &o.ids, o.shuffle_seed, o.limit)?;
    Ok(ProblemSet {
        problems,
        source,
        max_new_tokens: o.max_new_tokens.unwrap_or(max_new_tokens),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of problems is named by its file name, or by the problem set named with it, never
    /// as the built-in set it is not.
    #[test]
    fn a_file_of_problems_is_named_by_its_file_not_builtin() {
        let dir = std::env::temp_dir().join(format!("kvbench-problems-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("my, set.jsonl");
        std::fs::write(&file, "{\"problem\":\"1+1?\",\"answer\":\"2\"}\n").unwrap();
        let named = |dataset: Option<&str>| {
            let o = StudyOptions {
                data: Some(file.clone()),
                dataset: dataset.map(str::to_string),
                ..Default::default()
            };
            let set = load_problems(&o).unwrap();
            assert_eq!(set.problems.len(), 1);
            crate::report::short_dataset(&set.source).to_string()
        };
        assert_eq!(named(None), "my  set.jsonl");
        assert_eq!(named(Some("builtin")), "my  set.jsonl");
        assert_eq!(named(Some("mine")), "mine");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
