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
        let source = format!(
            "{}, {} (sha256 {})",
            d.name,
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
