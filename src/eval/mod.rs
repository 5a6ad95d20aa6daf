//! Evaluation: problem sets, prompts and grading.

pub mod accuracy;
pub mod builtin;
pub mod dataset;
pub mod grade;
pub mod prompt;
pub mod rows;

/// One problem with its reference answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Problem {
    pub id: String,
    pub problem: String,
    pub answer: String,
}
