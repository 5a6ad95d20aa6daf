//! Property tests of the three parsers that read what a user (or a crash) hands kvbench: the GGUF
//! header and metadata, the sweep config, and the samples file. Whatever the bytes, each returns a
//! value or an input error naming the file, within a bounded time, and never panics or aborts.

mod common;

use common::tiny_gguf;

use kvbench::generate::{generate_batch, Request, SamplingParams};
use kvbench::model::{LoadOptions, Model};
use kvbench::policy::Full;
use kvbench::results::dir::read_samples;
use kvbench::sweep::config::SweepConfig;
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvbench-hostile-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Loads `path` as a model: an input error that names the file, or a model that tokenizes and
/// decodes a few steps through the engine; in bounded time. A header edit can move where tensors
/// are read from (the alignment, an offset) and so load garbage that no reader can tell from
/// weights: such a model must then stop with the non-finite-logit error, never record garbage
/// tokens as a result.
fn load_is_clean(path: &Path) -> Result<(), TestCaseError> {
    let started = Instant::now();
    match Model::load(path.to_str().unwrap(), &LoadOptions::default()) {
        Ok(m) => {
            let prompt = m.tokenizer.encode("1 + 1 =").unwrap();
            let request = Request {
                prompt,
                sampling: SamplingParams::greedy(),
                max_new_tokens: 4,
                policy: Box::new(Full),
                trace: false,
                kv_type: None,
            };
            match generate_batch(&m.transformer, vec![request], &[], &mut |_, _| {}) {
                Ok(g) => prop_assert!(g[0].tokens.len() <= 4),
                Err(e) => prop_assert!(
                    matches!(e, kvbench::Error::NonFiniteLogits { .. }),
                    "generation failed otherwise: {e}"
                ),
            }
        }
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(e.is_input_error(), "not an input error: {msg}");
            prop_assert!(msg.contains("hostile"), "the file is not named: {msg}");
            prop_assert!(msg.lines().count() == 1, "more than the reason: {msg}");
        }
    }
    prop_assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    Ok(())
}

/// Writes `bytes` as a GGUF file, checks [`load_is_clean`] on it, and removes it.
fn bytes_load_cleanly(tag: &str, bytes: &[u8]) -> Result<(), TestCaseError> {
    let dir = temp_dir(tag);
    let path = dir.join(format!("hostile-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let result = load_is_clean(&path);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Where the value of metadata `key` starts in GGUF `bytes` (after the key and its type).
fn value_at(bytes: &[u8], key: &str) -> usize {
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_bytes())
        .unwrap_or_else(|| panic!("{key} in the tiny model"));
    at + key.len() + 4
}

#[test]
fn the_tiny_model_loads_and_decodes() {
    let dir = temp_dir("tiny");
    let (bytes, _) = tiny_gguf();
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, bytes).unwrap();
    let model = Model::load(path.to_str().unwrap(), &LoadOptions::default()).unwrap();
    assert_eq!(model.transformer.config.num_layers, 2);
    let prompt = model.tokenizer.encode("1 + 1").unwrap();
    assert!(prompt.len() >= 3);
    let (tokens, logits, _) = common::run_greedy(&model, &prompt, Box::new(Full), 3);
    assert_eq!(tokens.len(), 3);
    assert!(logits.iter().flatten().all(|x| x.is_finite()));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Where tensor `name`'s offset (into the data section) is stored in GGUF `bytes`.
fn tensor_offset_at(bytes: &[u8], name: &str, n_dims: usize) -> usize {
    let at = bytes
        .windows(name.len())
        .position(|w| w == name.as_bytes())
        .unwrap_or_else(|| panic!("{name} in the tiny model"));
    at + name.len() + 4 + 8 * n_dims + 4
}

/// A tensor's offset anywhere in 64 bits (near 2^64 it wraps around to the header in unchecked
/// arithmetic), off the alignment, or past the end; an alignment of 0 (a division by zero in candle's
/// reader) or not a power of two: each refused, naming the file and what is wrong.
#[test]
fn tensor_offsets_and_alignments_outside_the_file_are_refused() {
    let dir = temp_dir("extents");
    let path = dir.join("hostile-extent.gguf");
    let (tiny, _) = tiny_gguf();
    let offset_at = tensor_offset_at(&tiny, "token_embd.weight", 2);
    let align_at = value_at(&tiny, "general.alignment");
    let cases: Vec<(usize, Vec<u8>, &str)> = vec![
        (
            offset_at,
            (u64::MAX - 31).to_le_bytes().to_vec(),
            "truncated",
        ),
        (offset_at, (1u64 << 40).to_le_bytes().to_vec(), "truncated"),
        (
            offset_at,
            8u64.to_le_bytes().to_vec(),
            "not a multiple of the alignment 32",
        ),
        (
            align_at,
            0u32.to_le_bytes().to_vec(),
            "general.alignment is 0",
        ),
        (
            align_at,
            24u32.to_le_bytes().to_vec(),
            "general.alignment is 24",
        ),
    ];
    for (at, value, expected) in cases {
        let mut bytes = tiny.clone();
        bytes[at..at + value.len()].copy_from_slice(&value);
        std::fs::write(&path, &bytes).unwrap();
        let e = Model::load(path.to_str().unwrap(), &LoadOptions::default())
            .err()
            .unwrap_or_else(|| panic!("loaded with {expected}"));
        let msg = e.to_string();
        assert!(e.is_input_error(), "{msg}");
        assert!(
            msg.contains("hostile-extent.gguf") && msg.contains(expected),
            "{msg}"
        );
        assert!(
            !msg.contains("backtrace") && msg.lines().count() == 1,
            "{msg}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A GGUF tokenizer that cannot spell every byte (its prompt would silently lose text) or whose
/// end-of-sequence id is not a token (its generations would never stop) is refused in one line naming
/// the file and the key.
#[test]
fn gguf_tokenizers_that_cannot_encode_or_stop_are_refused() {
    use candle_core::quantized::gguf_file::Value;
    let (bytes, _) = tiny_gguf();
    bytes_load_cleanly("tok-ok", &bytes).unwrap();
    let plain: Vec<Value> = (0..257).map(|i| Value::String(format!("t{i}"))).collect();
    for (key, value, expected) in [
        (
            "tokenizer.ggml.tokens",
            Value::Array(plain),
            "lacks 96 of the 96 byte-level symbols of printable ASCII, space and newline (the first: '!')",
        ),
        (
            "tokenizer.ggml.eos_token_id",
            Value::U32(257),
            "'tokenizer.ggml.eos_token_id' is U32(257), not a token id (the vocabulary has 257 tokens)",
        ),
        (
            "tokenizer.ggml.eos_token_id",
            Value::I64(-1),
            "not a token id",
        ),
        (
            "tokenizer.ggml.eos_token_id",
            Value::String("x".into()),
            "not a token id",
        ),
        // Issue 43: metadata that contradicts the vocabulary is refused naming the key.
        (
            "tokenizer.ggml.token_type",
            Value::Array(vec![Value::I32(1); 10]),
            "'tokenizer.ggml.token_type' has 10 entries for 257 tokens",
        ),
        (
            "tokenizer.ggml.token_type",
            Value::Array(vec![Value::String("x".into()); 257]),
            "not an integer",
        ),
        (
            "tokenizer.ggml.bos_token_id",
            Value::U32(4_000_000_000),
            "'tokenizer.ggml.bos_token_id' is U32(4000000000), not a token id",
        ),
        (
            "llama.vocab_size",
            Value::U32(10),
            "llama.vocab_size is 10 but tokenizer.ggml.tokens lists 257 tokens",
        ),
    ] {
        let (bytes, _) = common::tiny_gguf_with(vec![(key, value)], Vec::new());
        let dir = temp_dir("tok");
        let path = dir.join("hostile-tokenizer.gguf");
        std::fs::write(&path, &bytes).unwrap();
        let err = Model::load(path.to_str().unwrap(), &LoadOptions::default())
            .err()
            .unwrap_or_else(|| panic!("{key} was accepted"));
        let _ = std::fs::remove_dir_all(&dir);
        let msg = err.to_string();
        assert!(err.is_input_error(), "{msg}");
        assert!(
            msg.contains("hostile-tokenizer.gguf") && msg.contains(expected),
            "{key}: {msg}"
        );
        assert_eq!(msg.lines().count(), 1, "{msg}");
    }
    // Any integer type holding a token id is read (converters write u32; the format allows others).
    let (bytes, _) = common::tiny_gguf_with(
        vec![("tokenizer.ggml.eos_token_id", Value::I64(256))],
        Vec::new(),
    );
    bytes_load_cleanly("tok-i64", &bytes).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Bytes of the header and metadata overwritten at random (sizes, counts, types, strings), or the
    /// file cut anywhere: the load refuses with an error naming the file, or loads.
    #[test]
    fn gguf_headers_with_random_damage_are_refused_cleanly(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        wide in prop::bool::weighted(0.2),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let (mut bytes, header) = tiny_gguf();
        for (at, v) in &edits {
            let i = at.index(header);
            if wide && i + 8 <= header {
                // A whole little-endian u64 with its high bytes set: counts and lengths near 2^64.
                bytes[i..i + 8].copy_from_slice(&(u64::MAX - u64::from(*v)).to_le_bytes());
            } else {
                bytes[i] = *v;
            }
        }
        if let Some(c) = cut {
            bytes.truncate(c.index(bytes.len()));
        }
        bytes_load_cleanly("gguf", &bytes)?;
    }

    /// One size, count or float of the metadata replaced by any value (0, 2^32 - 1, NaN, negative,
    /// subnormal...): refused naming the file before anything is allocated from it, or a model that
    /// decodes.
    #[test]
    fn gguf_metadata_values_out_of_range_are_refused_cleanly(
        key in prop::sample::select(vec![
            "llama.embedding_length", "llama.attention.head_count", "llama.attention.head_count_kv",
            "llama.feed_forward_length", "llama.block_count", "llama.context_length",
            "llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base",
            "tokenizer.ggml.eos_token_id", "general.alignment",
        ]),
        value in prop_oneof![
            Just(0u32), Just(1), Just(2), Just(16), Just(31), Just(33), Just(64), Just(u32::MAX),
            Just(1 << 31), Just(f32::NAN.to_bits()), Just(f32::INFINITY.to_bits()),
            Just((-1.0f32).to_bits()), Just(1e-45f32.to_bits()), Just(1e30f32.to_bits()), any::<u32>(),
        ],
    ) {
        let (mut bytes, _) = tiny_gguf();
        let at = value_at(&bytes, key);
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        bytes_load_cleanly("gguf-md", &bytes)?;
    }

    /// A valid config with one top-level value replaced by an arbitrary TOML value, or with random
    /// bytes spliced in: the config loads, or the error names the file.
    #[test]
    fn configs_with_random_values_are_refused_cleanly(
        key in prop::sample::select(vec![
            "name", "model", "dataset", "samples", "max_new_tokens", "budgets", "seed", "limit",
            "temperature", "top_p", "batch_size", "shuffle_seed", "ids", "budget_rule", "preset",
            "prompt", "weights", "fidelity", "problem_seed", "unknown_key",
        ]),
        value in prop::sample::select(vec![
            "0", "-1", "1e308", "-1e308", "nan", "inf", "18446744073709551615", "9223372036854775807",
            "\"\"", "\"../../x\"", "\"a/b\"", "[]", "[0, -1, nan]", "[1e308]", "[\"x\", \"x\"]",
            "{}", "true", "1979-05-27", "\"\\u0000\"", "[[1]]", "0.5", "4294967296",
        ]),
        splice in proptest::option::of((any::<prop::sample::Index>(), "\\PC{0,12}")),
    ) {
        let base = "name = \"t\"\nmodel = \"smollm2-135m\"\ndataset = \"builtin\"\nsamples = 1\n\
                    max_new_tokens = 64\nbudgets = [64, 0.25]\n";
        let mut text: String = base
            .lines()
            .filter(|l| !l.starts_with(&format!("{key} =")))
            .map(|l| format!("{l}\n"))
            .collect();
        text.push_str(&format!("{key} = {value}\n[[policy]]\nname = \"full\"\n[[policy]]\nname = \"rkv\"\n"));
        if let Some((at, junk)) = splice {
            let mut i = at.index(text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            text.insert_str(i, &junk);
        }
        let dir = temp_dir("config");
        let path = dir.join(format!("hostile-{}.toml", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        let started = Instant::now();
        let loaded = SweepConfig::load(&path);
        let _ = std::fs::remove_dir_all(&dir);
        match loaded {
            Ok(c) => {
                // What loads also plans its policies without panicking.
                let _ = c.policy_specs();
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(e.is_input_error(), "{msg}");
                prop_assert!(msg.contains("hostile"), "the file is not named: {msg}");
            }
        }
        prop_assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// A samples file of valid records with a torn copy of one more at the end (cut at any byte,
    /// inside a multi-byte character too) reads as exactly the complete records; a damaged line
    /// before the end is an error naming the file and that line.
    #[test]
    fn samples_files_read_their_complete_records_whatever_the_torn_end(
        n in 0usize..6,
        cut in any::<prop::sample::Index>(),
        damage in proptest::option::of((any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<u8>())),
    ) {
        let dir = temp_dir("samples");
        let line = |i: usize| {
            serde_json::json!({
                "problem_id": format!("p{i} é — 数"), "sample": 0, "seed": i, "gold": "1",
                "output": "x ≥ 2 \\boxed{1}", "thinking": false, "extracted": "1",
                "normalized_pred": "1", "normalized_gold": "1", "verdict": "correct",
                "correct": true, "grader": "g", "lenient": false, "tokens": 7, "finish": "eos",
                "policy": "full", "prompt": "R1", "template_hash": "h", "dataset": "d",
            })
            .to_string()
        };
        let mut bytes: Vec<u8> = (0..n).flat_map(|i| format!("{}\n", line(i)).into_bytes()).collect();
        let torn = line(99).into_bytes();
        bytes.extend_from_slice(&torn[..cut.index(torn.len())]);
        let mut damaged_line = None;
        if let Some((which, at, v)) = damage {
            if n > 0 && v != b'\n' {
                let l = which.index(n);
                let start: usize = (0..l).map(|i| line(i).len() + 1).sum();
                let i = start + at.index(line(l).len());
                bytes[i] = v;
                damaged_line = Some(l + 1);
            }
        }
        std::fs::write(dir.join("samples.jsonl"), &bytes).unwrap();
        let read = read_samples(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        match read {
            Ok(s) => {
                // A damaged byte may still leave valid JSON (inside a string, say) but never more
                // or fewer records than complete lines.
                prop_assert_eq!(s.records.len(), n);
                prop_assert_eq!(s.partial_lines.len(), usize::from(cut.index(torn.len()) > 0));
                let _ = kvbench::report::table::markdown(&kvbench::report::summarize(&s.records));
            }
            Err(e) => {
                let msg = e.to_string();
                let l = damaged_line.unwrap_or(0);
                prop_assert!(damaged_line.is_some(), "undamaged file refused: {msg}");
                prop_assert!(msg.contains(&format!("samples.jsonl:{l}")), "{msg}");
            }
        }
    }
}
