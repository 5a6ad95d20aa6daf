//! Evaluation: problem sets, prompts and grading.

pub mod builtin;
pub mod grade;

/// One problem with its reference answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Problem {
    pub id: String,
    pub problem: String,
    pub answer: String,
}

/// The DeepSeek-R1 wording: the problem, then the boxed-answer directive, as the only user turn.
pub fn r1_prompt(problem: &str) -> String {
    format!("{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}.")
}
