//! The tensors a model's shape implies, checked against a file's before anything is allocated: one
//! check for GGUF files, Hugging Face checkpoints and random-weight models alike.

use crate::model::config::ModelConfig;

/// Checks the metadata's sizes against the tensors before anything is allocated from them: the
/// embedding's width, then every layer's projections, norms, biases and QK-norms, and the output head.
/// `shape` gives a tensor's `[rows, cols]` by its GGUF name (None when absent) and `file_name` the name
/// the file uses, for the error: one check for GGUF files and Hugging Face checkpoints alike.
pub(crate) fn check_shapes(
    c: &ModelConfig,
    shape: &dyn Fn(&str) -> Option<Vec<usize>>,
    file_name: &dyn Fn(&str) -> String,
) -> std::result::Result<(), String> {
    let dims = |name: &str| -> std::result::Result<Vec<usize>, String> {
        shape(name).ok_or_else(|| format!("tensor {} is missing", file_name(name)))
    };
    let expect = |name: &str, want: &[usize]| -> std::result::Result<(), String> {
        let got = dims(name)?;
        if got != want {
            return Err(format!(
                "tensor {} has shape {got:?}, the model's config says {want:?} (hidden size {}, head counts {} / {}, head size {}, feed-forward size {})",
                file_name(name), c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
            ));
        }
        Ok(())
    };
    let embd = dims("token_embd.weight")?;
    if embd != [c.vocab_size, c.hidden_size] {
        return Err(format!(
            "tensor {} has shape {embd:?}, the model's vocabulary and hidden size are [{}, {}]",
            file_name("token_embd.weight"),
            c.vocab_size,
            c.hidden_size
        ));
    }
    // Every layer's tensors, not only the first's: a damaged or inconsistent shape anywhere must be
    // refused here, naming the tensor, rather than fail in the middle of a forward pass.
    let (h, q, kv, ffn) = (
        c.hidden_size,
        c.num_heads * c.head_dim,
        c.num_kv_heads * c.head_dim,
        c.intermediate_size,
    );
    for l in 0..c.num_layers {
        let name = |t: &str| format!("blk.{l}.{t}");
        if shape(&name("attn_q.weight")).is_none() {
            return Err(format!(
                "the model has {} layers, but tensor {} is missing",
                c.num_layers,
                file_name(&name("attn_q.weight"))
            ));
        }
        expect(&name("attn_q.weight"), &[q, h])?;
        expect(&name("attn_k.weight"), &[kv, h])?;
        expect(&name("attn_v.weight"), &[kv, h])?;
        expect(&name("attn_output.weight"), &[h, q])?;
        expect(&name("ffn_gate.weight"), &[ffn, h])?;
        expect(&name("ffn_up.weight"), &[ffn, h])?;
        expect(&name("ffn_down.weight"), &[h, ffn])?;
        expect(&name("attn_norm.weight"), &[h])?;
        expect(&name("ffn_norm.weight"), &[h])?;
        for (t, want) in [
            ("attn_q.bias", q),
            ("attn_k.bias", kv),
            ("attn_v.bias", kv),
            ("attn_q_norm.weight", c.head_dim),
            ("attn_k_norm.weight", c.head_dim),
        ] {
            if shape(&name(t)).is_some() {
                expect(&name(t), &[want])?;
            }
        }
    }
    // A file with more layers than the config says ran silently on the first ones (a config edited
    // or copied from a smaller model of the family): its tensors would go unused.
    let next = format!("blk.{}.attn_q.weight", c.num_layers);
    if shape(&next).is_some() {
        return Err(format!(
            "the model has {} layers, but the file holds more: tensor {} is of layer {}, which \
             would go unused",
            c.num_layers,
            file_name(&next),
            c.num_layers
        ));
    }
    expect("output_norm.weight", &[h])?;
    if let Some(got) = shape("output.weight") {
        if got.len() != 2 || got[1] != h || got[0] != embd[0] {
            return Err(format!(
                "tensor {} has shape {got:?}, expected [{}, {h}] (the embedding's vocabulary and the hidden size)",
                file_name("output.weight"),
                embd[0]
            ));
        }
    }
    Ok(())
}
