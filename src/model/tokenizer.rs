//! Tokenizers: from a `tokenizer.json`, or built from GGUF metadata for files that carry none.
//!
//! candle's own GGUF-to-tokenizer helper gets SmolLM2 wrong (it adds a leading space and does not
//! split digits), so kvbench builds the byte-level BPE itself from `tokenizer.ggml.tokens`,
//! `tokenizer.ggml.merges` and the `tokenizer.ggml.pre` pre-tokenizer name, matching each model's
//! Hugging Face `tokenizer.json`.

use crate::error::{candle_message, Error, Result};
use candle_core::quantized::gguf_file::Value;
use std::collections::HashMap;
use std::path::Path;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

/// A tokenizer plus the special ids generation needs.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Tokens that end generation.
    pub eos_ids: Vec<u32>,
    pub bos_id: Option<u32>,
}

/// The GPT-2 / Llama 3 style split regex llama.cpp uses for the `llama-bpe` and Qwen pre-tokenizers.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`.
    pub fn from_file(path: &Path, eos_names: &[&str]) -> Result<Self> {
        crate::files::check_readable(path, crate::files::DATA_LIMIT)?;
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Error::model(path, format!("unreadable tokenizer.json: {e}")))?;
        let eos_ids = eos_names
            .iter()
            .filter_map(|n| inner.token_to_id(n))
            .collect();
        Ok(Self {
            inner,
            eos_ids,
            bos_id: None,
        })
    }

    /// Builds a byte-level BPE tokenizer from GGUF metadata (`tokenizer.ggml.model = gpt2`).
    pub fn from_gguf(md: &HashMap<String, Value>, path: &Path) -> Result<Self> {
        let err = |m: String| Error::model(path, format!("tokenizer metadata: {m}"));
        let model = md
            .get("tokenizer.ggml.model")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_default();
        if model != "gpt2" {
            return Err(err(format!(
                "tokenizer model '{model}' is not supported from GGUF metadata (only byte-level BPE, 'gpt2'); pass a tokenizer.json with --tokenizer"
            )));
        }
        let strings = |key: &str| -> Result<Vec<String>> {
            let v = md.get(key).ok_or_else(|| err(format!("missing '{key}'")))?;
            let items = v
                .to_vec()
                .map_err(|e| err(format!("'{key}': {}", candle_message(&e))))?;
            items
                .iter()
                .map(|x| {
                    x.to_string()
                        .cloned()
                        .map_err(|e| err(format!("'{key}': {}", candle_message(&e))))
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        // One type per token, each an integer: a list of another length (or of strings) marks a
        // damaged file, and reading it leniently would make special tokens plain text.
        let types: Vec<i32> = match md.get("tokenizer.ggml.token_type") {
            None => vec![1; tokens.len()],
            Some(v) => {
                let items = v
                    .to_vec()
                    .map_err(|_| err("'tokenizer.ggml.token_type' is not an array".into()))?;
                if items.len() != tokens.len() {
                    return Err(err(format!(
                        "'tokenizer.ggml.token_type' has {} entries for {} tokens",
                        items.len(),
                        tokens.len()
                    )));
                }
                items
                    .iter()
                    .map(|x| {
                        integer(x)
                            .or_else(|| x.to_i32().ok().map(|i| i as u64))
                            .map(|i| i as i32)
                    })
                    .collect::<Option<Vec<i32>>>()
                    .ok_or_else(|| {
                        err(
                            "'tokenizer.ggml.token_type' holds a value that is not an integer"
                                .into(),
                        )
                    })?
            }
        };
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        // A byte-level BPE spells text from the symbols of its bytes; a vocabulary without them drops
        // what it cannot spell, and a prompt would silently lose text. Real vocabularies lack a few
        // (SmolLM2's has no symbol for six control characters, 0xF1 and 0xF2, nor for the bytes UTF-8
        // never uses), so what is required is the symbols of printable ASCII, the space and the newline
        // (GPT-2's byte-to-symbol map keeps '!'..='~' and writes the space as 'Ġ', the newline as 'Ċ').
        let missing: Vec<char> = ('!'..='~')
            .chain(['\u{120}', '\u{10a}'])
            .filter(|c| !vocab.contains_key(&c.to_string()))
            .collect();
        if let Some(first) = missing.first() {
            return Err(err(format!(
                "'tokenizer.ggml.tokens' lacks {} of the 96 byte-level symbols of printable ASCII, space \
                 and newline (the first: {first:?}), so text could not be encoded; pass a tokenizer.json \
                 with --tokenizer",
                missing.len()
            )));
        }
        let merges: Vec<(String, String)> = merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
            })
            .collect::<Option<_>>()
            .ok_or_else(|| err("a merge is not two space-separated tokens".into()))?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(false)
            .build()
            .map_err(|e| err(format!("cannot build BPE: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        let pre = md
            .get("tokenizer.ggml.pre")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_default();
        inner.with_pre_tokenizer(Some(pre_tokenizer(&pre).map_err(err)?));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        // Control tokens (type 3) and user-defined ones (type 4) are matched before BPE.
        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, &t)| t == 3 || t == 4)
            .map(|(s, _)| AddedToken::from(s.clone(), true))
            .collect();
        inner.add_special_tokens(&special);
        // The end-of-sequence id decides where a generation stops: one that is not a token of the
        // vocabulary (or not an integer) marks a damaged file, not a model that never ends.
        // A special token's id, when given: an integer of any width naming a token of the vocabulary.
        let token_id = |key: &str| -> Result<Option<u32>> {
            match md.get(key) {
                None => Ok(None),
                Some(v) => match integer(v) {
                    Some(i) if i < tokens.len() as u64 => Ok(Some(i as u32)),
                    _ => Err(err(format!(
                        "'{key}' is {v:?}, not a token id (the vocabulary has {} tokens)",
                        tokens.len()
                    ))),
                },
            }
        };
        let eos = token_id("tokenizer.ggml.eos_token_id")?;
        let mut eos_ids: Vec<u32> = eos.into_iter().collect();
        // ChatML models end a turn with <|im_end|>; Llama 3 with <|eot_id|>.
        for name in [
            "<|im_end|>",
            "<|eot_id|>",
            "<|endoftext|>",
            "<｜end▁of▁sentence｜>",
        ] {
            if let Some(i) = inner.token_to_id(name) {
                if !eos_ids.contains(&i) {
                    eos_ids.push(i);
                }
            }
        }
        // The beginning-of-sequence id, when given, must be a token too (a template may write it).
        let bos_id = token_id("tokenizer.ggml.bos_token_id")?;
        Ok(Self {
            inner,
            eos_ids,
            bos_id,
        })
    }

    /// A byte-level tokenizer over `vocab_size` ids, for random-weight models: ids 0 to 255 are the
    /// 256 byte symbols (any text encodes, one token per byte), 256 is `<|endoftext|>` (the end of
    /// a sequence) and every other id a filler `<rN>`, so whatever a random model samples decodes.
    pub fn byte_level(vocab_size: usize) -> Result<Self> {
        const EOS: &str = "<|endoftext|>";
        if vocab_size < 257 {
            return Err(Error::Tokenizer(format!(
                "a byte-level vocabulary needs 257 ids, the model has {vocab_size}"
            )));
        }
        let mut symbols: Vec<char> = ByteLevel::alphabet().into_iter().collect();
        symbols.sort_unstable();
        let mut vocab: tokenizers::models::bpe::Vocab = symbols
            .iter()
            .enumerate()
            .map(|(i, c)| (c.to_string(), i as u32))
            .collect();
        vocab.insert(EOS.to_string(), 256);
        for id in 257..vocab_size as u32 {
            vocab.insert(format!("<r{id}>"), id);
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, Vec::new())
            .build()
            .map_err(|e| Error::Tokenizer(format!("cannot build a byte-level vocabulary: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, true, true,
        ))));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        inner.add_special_tokens(&[AddedToken::from(EOS, true)]);
        Ok(Self {
            inner,
            eos_ids: vec![256],
            bos_id: None,
        })
    }

    /// Writes the tokenizer as a Hugging Face `tokenizer.json`.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.inner
            .save(path, false)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The largest id the tokenizer can produce (its vocabulary's and added tokens' alike), if any.
    pub fn max_id(&self) -> Option<u32> {
        self.inner.get_vocab(true).into_values().max()
    }

    /// `table[id]`: token `id` ends a phrase: its text holds a newline, or ends (after trailing
    /// spaces) in `.`, `,`, `;`, `:`, `!` or `?`. Kara's Token2Chunk stops chunks there.
    pub fn delimiter_table(&self) -> Vec<bool> {
        (0..self.vocab_size() as u32)
            .map(|id| {
                let text = self.decode(&[id]).unwrap_or_default();
                text.contains('\n') || text.trim_end().ends_with(['.', ',', ';', ':', '!', '?'])
            })
            .collect()
    }
}

/// The pre-tokenizer a GGUF `tokenizer.ggml.pre` name stands for (llama.cpp's names).
fn pre_tokenizer(name: &str) -> std::result::Result<PreTokenizerWrapper, String> {
    let byte_level =
        |regex: bool| PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, regex));
    let split = |pattern: &str| -> std::result::Result<PreTokenizerWrapper, String> {
        Ok(PreTokenizerWrapper::Split(
            Split::new(
                SplitPattern::Regex(pattern.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| e.to_string())?,
        ))
    };
    Ok(match name {
        // SmolLM / StarCoder: every digit alone, then the GPT-2 regex.
        "smollm" | "starcoder" | "refact" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            byte_level(true),
        ])),
        "gpt2" | "default" | "" => byte_level(true),
        "llama-bpe" | "llama3" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
            split(LLAMA3_SPLIT)?,
            byte_level(false),
        ])),
        "qwen2" | "deepseek-r1-qwen" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
            split(QWEN2_SPLIT)?,
            byte_level(false),
        ])),
        other => {
            return Err(format!(
                "unknown pre-tokenizer '{other}'; pass a tokenizer.json with --tokenizer"
            ))
        }
    })
}

/// A GGUF metadata value of any integer type, when it is a non-negative integer (converters write
/// token ids as u32, but the format allows every width).
fn integer(v: &Value) -> Option<u64> {
    match *v {
        Value::U8(x) => Some(x.into()),
        Value::U16(x) => Some(x.into()),
        Value::U32(x) => Some(x.into()),
        Value::U64(x) => Some(x),
        Value::I8(x) => u64::try_from(x).ok(),
        Value::I16(x) => u64::try_from(x).ok(),
        Value::I32(x) => u64::try_from(x).ok(),
        Value::I64(x) => u64::try_from(x).ok(),
        _ => None,
    }
}
