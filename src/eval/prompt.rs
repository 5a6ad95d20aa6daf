//! Prompt wordings (grading spec, "User-prompt wordings in use") and decoding presets. The wording is
//! the only user turn; the chat template is the model's. Results record the variant and a hash of the
//! rendered template, so numbers from different prompts are never mixed silently.

use crate::model::chat::ChatTemplate;
use sha2::{Digest, Sha256};

/// Which wording wraps the problem.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum PromptVariant {
    /// DeepSeek's recommendation: the problem, then "Please reason step by step, and put your final
    /// answer within \boxed{}." (no system prompt).
    R1,
    /// open-r1 / lighteval's `aime24` wording ("Therefore, the final answer is: $\boxed{ANSWER}$").
    Lighteval,
    /// DeepScaleR / rllm: "… Let's think step by step and output the final answer within \boxed{}."
    Rllm,
    /// The bare problem (for instruct models with their own habits).
    Plain,
}

impl PromptVariant {
    /// The user turn for `problem`.
    pub fn user_text(self, problem: &str) -> String {
        match self {
            PromptVariant::R1 => format!(
                "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
            ),
            PromptVariant::Lighteval => format!(
                "Solve the following math problem efficiently and clearly.  The last line of your response should be of the following format: 'Therefore, the final answer is: $\\boxed{{ANSWER}}$. I hope it is correct' (without quotes) where ANSWER is just the final number or expression that solves the problem. Think step by step before answering.\n\n{problem}"
            ),
            PromptVariant::Rllm => format!(
                "{problem} Let's think step by step and output the final answer within \\boxed{{}}."
            ),
            PromptVariant::Plain => problem.to_string(),
        }
    }

    /// The whole rendered prompt.
    pub fn render(self, template: ChatTemplate, problem: &str) -> String {
        template.render(&self.user_text(problem), None)
    }

    /// sha256 (first 16 hex digits) of the prompt rendered around the placeholder `{problem}`:
    /// identifies wording and template together.
    pub fn template_hash(self, template: ChatTemplate) -> String {
        let text = self.render(template, "{problem}");
        let digest = Sha256::digest(text.as_bytes());
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }
}

/// Sampling presets (grading spec, "Decoding settings").
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum DecodingPreset {
    /// Temperature 0.6, top-p 0.95 (DeepSeek-R1's evaluation setting).
    R1,
    /// Greedy decoding.
    Greedy,
}

impl DecodingPreset {
    /// `(temperature, top_p)`.
    pub fn sampling(self) -> (f32, f32) {
        match self {
            DecodingPreset::R1 => (0.6, 0.95),
            DecodingPreset::Greedy => (0.0, 1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wordings_and_hashes() {
        let r1 = PromptVariant::R1.render(ChatTemplate::R1, "What is 1+1?");
        assert!(r1.ends_with("<｜Assistant｜><think>\n"), "{r1}");
        assert!(r1.contains("What is 1+1?\nPlease reason step by step"));
        let a = PromptVariant::R1.template_hash(ChatTemplate::R1);
        assert_eq!(a.len(), 16);
        assert_ne!(a, PromptVariant::Rllm.template_hash(ChatTemplate::R1));
        assert_ne!(a, PromptVariant::R1.template_hash(ChatTemplate::Chatml));
    }
}
