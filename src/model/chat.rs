//! Chat templates, rendered by hand exactly as each model family's Jinja template renders one user turn
//! with the generation prompt. Chosen from the vocabulary, overridable with `--chat-template`.

use crate::model::tokenizer::Tokenizer;

/// How a single-turn prompt is wrapped before tokenisation.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum ChatTemplate {
    /// `<|im_start|>system\n…<|im_end|>\n<|im_start|>user\n…<|im_end|>\n<|im_start|>assistant\n` (SmolLM2, Qwen2.5).
    Chatml,
    /// `<｜begin▁of▁sentence｜><｜User｜>…<｜Assistant｜><think>\n` (DeepSeek-R1 distills): the output starts inside a thinking block.
    R1,
    /// `<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n…<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n`.
    Llama3,
    /// The text as is, no template.
    Raw,
}

/// SmolLM2's template inserts this system turn when the conversation has none.
const SMOLLM_DEFAULT_SYSTEM: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

impl ChatTemplate {
    /// Picks the template a model's vocabulary implies.
    pub fn detect(tokenizer: &Tokenizer) -> ChatTemplate {
        if tokenizer.token_to_id("<｜User｜>").is_some() {
            ChatTemplate::R1
        } else if tokenizer.token_to_id("<|start_header_id|>").is_some() {
            ChatTemplate::Llama3
        } else if tokenizer.token_to_id("<|im_start|>").is_some() {
            ChatTemplate::Chatml
        } else {
            ChatTemplate::Raw
        }
    }

    /// Whether the rendered prompt opens a thinking block (the answer then follows `</think>`).
    pub fn opens_thinking(self) -> bool {
        self == ChatTemplate::R1
    }

    /// Renders one user turn plus the assistant generation prompt. `system`: `None` keeps the
    /// template's own default (SmolLM2's built-in system turn for ChatML; nothing for the others).
    pub fn render(self, user: &str, system: Option<&str>) -> String {
        match self {
            ChatTemplate::Chatml => {
                let sys = system.unwrap_or(SMOLLM_DEFAULT_SYSTEM);
                format!("<|im_start|>system\n{sys}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
            }
            ChatTemplate::R1 => {
                let sys = system.unwrap_or("");
                format!("<｜begin▁of▁sentence｜>{sys}<｜User｜>{user}<｜Assistant｜><think>\n")
            }
            ChatTemplate::Llama3 => {
                let sys = match system {
                    Some(s) => {
                        format!("<|start_header_id|>system<|end_header_id|>\n\n{s}<|eot_id|>")
                    }
                    None => String::new(),
                };
                format!("<|begin_of_text|>{sys}<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
            }
            ChatTemplate::Raw => user.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r1_template_ends_inside_a_thinking_block() {
        let s = ChatTemplate::R1.render("What is 2+2?", None);
        assert_eq!(
            s,
            "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜><think>\n"
        );
        assert!(ChatTemplate::R1.opens_thinking());
        assert!(!ChatTemplate::Chatml.opens_thinking());
    }

    #[test]
    fn chatml_uses_smollm_default_system_turn() {
        let s = ChatTemplate::Chatml.render("hi", None);
        assert!(s.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"));
        assert!(s.ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
    }
}
