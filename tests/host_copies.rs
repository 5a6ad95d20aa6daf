//! What a decoding step copies to the host on the path a GPU takes (run here on the CPU: candle's
//! operations, the policies handed device tensors), counted by `kvbench::host_copy`. On a GPU each
//! copy is a transfer and a wait for the device; the GPU path's rule is that no decoding step
//! copies the cache or a full attention matrix to the host. One test in this file: the counts are
//! process-wide, and the other test files' threads would add to them.

mod common;

use common::{compressing_specs, tiny_random};
use kvbench::generate::{generate_batch, Request, SamplingParams};

/// Decodes `new` tokens for each of `batch` copies of a prompt under `spec`, greedy, no end token;
/// returns the copies and bytes per decoding step and the bytes a full cache of one sequence holds
/// at the end (f32).
fn per_step(
    m: &kvbench::model::Model,
    spec: &kvbench::policy::PolicySpec,
    batch: usize,
    new: usize,
) -> (f64, f64, f64) {
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 4096).collect();
    let ctx = m.policy_context(spec, new);
    let requests = (0..batch)
        .map(|_| Request {
            prompt: prompt.clone(),
            sampling: SamplingParams::greedy(),
            max_new_tokens: new,
            policy: spec.build(&ctx).unwrap(),
            trace: false,
            kv_type: Some(kvbench::cache::KvType::F32),
        })
        .collect();
    let gens = generate_batch(&m.transformer, requests, &[], &mut |_, _| {}).unwrap();
    let (c, steps) = gens[0].decode_host_copies;
    assert_eq!(steps, new - 1, "{}", spec.name());
    let full = gens[0].kv_bytes_full as f64;
    (
        c.copies as f64 / steps as f64,
        c.bytes as f64 / steps as f64,
        full,
    )
}

#[test]
fn decoding_steps_copy_their_tokens_and_no_cache_to_the_host() {
    // The comparison switches route logits and scores through the host on purpose.
    for var in ["KVBENCH_HOST_LOGITS", "KVBENCH_HOST_SCORES"] {
        if std::env::var(var).is_ok_and(|v| v == "1") {
            eprintln!("skipped: {var}=1 copies to the host on purpose");
            return;
        }
    }
    kvbench::init_threads(None).unwrap();
    let device_path = tiny_random(true);
    let cfg = &device_path.transformer.config;
    for spec in compressing_specs() {
        let name = spec.name().to_string();
        for batch in [1, 3] {
            let (copies, bytes, full) = per_step(&device_path, &spec, batch, 48);
            let per_seq = bytes / batch as f64;
            eprintln!(
                "{name} batch {batch}: {copies:.2} copies, {bytes:.0} bytes per step; a full cache {full:.0}"
            );
            // No step copies the cache (a policy scoring on the host gets a window, a row of
            // probabilities or its new keys; at its compression events, scores).
            assert!(
                per_seq < full / 8.0,
                "{name} batch {batch}: {per_seq:.0} bytes per step and sequence against a full cache of {full:.0}"
            );
            match name.as_str() {
                // Nothing to decide: each step copies only the tokens it chose, one u32 a sequence.
                "full" | "streaming" => assert_eq!(
                    (copies, bytes),
                    (1.0, 4.0 * batch as f64),
                    "{name} batch {batch}"
                ),
                // A pooled batch accumulates H2O's scores on the device: per layer only the
                // evicted entries' indices come back, a u32 per KV head and sequence.
                "h2o" if batch > 1 => assert!(
                    per_seq <= (4 * cfg.num_layers * cfg.num_kv_heads + 4) as f64,
                    "{name} batch {batch}: {per_seq:.0} bytes per step and sequence"
                ),
                _ => {}
            }
        }
    }
}
