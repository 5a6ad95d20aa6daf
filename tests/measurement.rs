//! Measurements with known answers on the default model: teacher-forced fidelity (a policy whose
//! budget covers the sequence has KL 0 and agreement 1; the first divergence is where free-running
//! greedy outputs part), and KV bytes (a full cache of known shape holds a known number of bytes).

mod common;

use kvbench::generate::fidelity::teacher_forced;
use kvbench::generate::{generate_batch, Request, SamplingParams};
use kvbench::model::weights::WeightFormat;
use kvbench::policy::PolicySpec;
use std::collections::BTreeMap;

fn prompt(m: &kvbench::model::Model) -> Vec<u32> {
    let p = &kvbench::eval::builtin::problems(1, 7)[0];
    let text = kvbench::eval::prompt::PromptVariant::R1.render(m.template, &p.problem);
    m.tokenizer.encode(&text).unwrap()
}

fn spec(name: &str, budget: f64, args: &[(&str, &str)]) -> PolicySpec {
    let map: BTreeMap<String, String> = args
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    PolicySpec::new(name, budget, map).unwrap()
}

#[test]
fn a_budget_covering_the_sequence_has_kl_zero_and_full_agreement() {
    let m = common::model(WeightFormat::F32);
    let prompt = prompt(&m);
    for s in [
        spec("streaming", 100_000.0, &[]),
        spec("rkv", 100_000.0, &[]),
    ] {
        let ctx = m.policy_context(&s, 40);
        let f = teacher_forced(
            &m.transformer,
            &prompt,
            s.build(&ctx).unwrap(),
            None,
            SamplingParams::greedy(),
            40,
            &m.tokenizer.eos_ids,
            16,
        )
        .unwrap();
        assert!(f.steps > 10, "{}: {} steps", s.name(), f.steps);
        assert_eq!(f.mean_kl, 0.0, "{}", s.name());
        assert_eq!(f.top1_agreement, 1.0, "{}", s.name());
        assert_eq!(f.mean_rank, 0.0);
        assert_eq!(f.first_divergence, None);
        assert!(f.kl_by_position.iter().all(|&k| k == 0.0));
    }
}

#[test]
fn first_divergence_is_where_free_running_greedy_outputs_part() {
    let m = common::model(WeightFormat::F32);
    let prompt = prompt(&m);
    let steps = 48;
    // A tight budget with small buffers: the policy compresses often and the model drifts.
    let s = spec("streaming", 12.0, &[("buffer", "4"), ("sinks", "2")]);
    let ctx = m.policy_context(&s, steps);
    let f = teacher_forced(
        &m.transformer,
        &prompt,
        s.build(&ctx).unwrap(),
        None,
        SamplingParams::greedy(),
        steps,
        &[],
        16,
    )
    .unwrap();
    assert_eq!(f.steps, steps);
    assert!(f.mean_kl > 0.0 && f.mean_kl.is_finite());
    assert!(f.top1_agreement < 1.0);
    let d = f.first_divergence.expect("a 12-entry cache diverges");
    // Free-running greedy decoding, one sequence at a time.
    let run = |policy| {
        let r = Request {
            prompt: prompt.clone(),
            sampling: SamplingParams::greedy(),
            max_new_tokens: steps,
            policy,
            trace: false,
            kv_type: None,
        };
        generate_batch(&m.transformer, vec![r], &[], &mut |_, _| {})
            .unwrap()
            .remove(0)
            .tokens
    };
    let full = run(Box::new(kvbench::policy::Full));
    let other = run(s.build(&ctx).unwrap());
    assert_eq!(
        full[..d],
        other[..d],
        "identical up to the first divergence"
    );
    assert_ne!(full[d], other[d], "and different at it");
}

#[test]
fn kv_bytes_of_a_full_cache_are_entries_times_the_layout() {
    let m = common::model(WeightFormat::Native);
    let prompt = prompt(&m);
    let r = Request {
        prompt: prompt.clone(),
        sampling: SamplingParams::greedy(),
        max_new_tokens: 20,
        policy: Box::new(kvbench::policy::Full),
        trace: false,
        kv_type: None,
    };
    let g = generate_batch(&m.transformer, vec![r], &[], &mut |_, _| {})
        .unwrap()
        .remove(0);
    // SmolLM2-135M: 30 layers × (keys + values) × 3 KV heads × 64 dims × 4 bytes (f32).
    let per_token = 30 * 2 * 3 * 64 * 4;
    let config = &m.transformer.config;
    use kvbench::cache::KvType;
    assert_eq!(config.kv_bytes(KvType::F32, 10), 10 * per_token);
    assert_eq!(config.kv_bytes(KvType::F16, 10), 10 * per_token / 2);
    // Keys in Q8_0 blocks (2 of 34 bytes per 64 values), values in f16 (128 bytes).
    let mixed: KvType = "q8_0/f16".parse().unwrap();
    assert_eq!(config.kv_bytes(mixed, 1), 30 * 3 * (68 + 128));
    // KIVI-2 with a window of 8: at 8 + 32 entries, 32 packed as one group (2 × 64 × 2 / 8 bytes of
    // codes, 2 value groups' scales and minima, a 4-byte group index; the group's 64 channels' f16
    // scale and minimum), 8 in f16.
    let kivi: KvType = "kivi2:8".parse().unwrap();
    let head = 32 * (32 + 2 * 4 + 4) + 64 * 4 + 8 * 64 * 4;
    assert_eq!(config.kv_bytes(kivi, 40), 30 * 3 * head);
    assert_eq!(
        config.kv_bytes(kivi, 39),
        30 * 3 * 39 * 64 * 4,
        "all in the window"
    );
    // The last token is produced, not fed: the cache holds the prompt and the other 19.
    let entries = prompt.len() + 19;
    assert_eq!(g.kv_bytes_peak, entries * per_token);
    assert_eq!(g.kv_bytes_full, entries * per_token);
    // Time-averaged over the prefill step and 19 decode steps.
    let mean = (0..20).map(|i| (prompt.len() + i) as f64).sum::<f64>() / 20.0;
    assert!((g.kv_bytes_mean - mean * per_token as f64).abs() < 1e-6);
    assert!((g.kv_bytes_full_mean - g.kv_bytes_mean).abs() < 1e-6);
    assert_eq!(g.step_secs.len(), 19, "one time per decode step");
}

#[test]
fn fidelity_command_prints_json() {
    common::model(WeightFormat::Native);
    let out = common::ok(&common::kvbench(&[
        "fidelity",
        "--policy",
        "streaming",
        "--budget",
        "100000",
        "--limit",
        "1",
        "--max-new-tokens",
        "12",
        "--kv-type",
        "f32",
        "--json",
    ]));
    // Nothing evicted and the reference's own storage type: exactly the reference.
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["mean_kl"], 0.0);
    assert_eq!(v["top1_agreement"], 1.0);
    assert_eq!(v["sequences"], 1);
}

#[test]
fn policy_side_state_is_counted_apart_from_the_cache() {
    let m = common::model(WeightFormat::Native);
    let prompt = prompt(&m);
    let run = |s: &PolicySpec| {
        let ctx = m.policy_context(s, 20);
        let r = Request {
            prompt: prompt.clone(),
            sampling: SamplingParams::greedy(),
            max_new_tokens: 20,
            policy: s.build(&ctx).unwrap(),
            trace: false,
            kv_type: None,
        };
        generate_batch(&m.transformer, vec![r], &[], &mut |_, _| {})
            .unwrap()
            .remove(0)
    };
    assert_eq!(run(&spec("full", 1.0, &[])).policy_state_bytes_peak, 0);
    // H2O keeps one f32 accumulated score per cached entry, layer and KV head: with a budget that
    // covers the sequence, 30 layers × 3 heads × entries × 4 bytes.
    let g = run(&spec("h2o", 100_000.0, &[]));
    assert_eq!(g.policy_state_bytes_peak, 30 * 3 * (prompt.len() + 19) * 4);
    // SnapKV's side state is the engine's query window: 30 layers × 9 query heads × w × 64 × 4.
    let g = run(&spec("snapkv", 100_000.0, &[("window", "8")]));
    assert_eq!(g.policy_state_bytes_peak, 30 * 9 * 8 * 64 * 4);
}

#[test]
fn scaling_shows_full_growing_linearly_and_a_bounded_policy_flat() {
    common::model(WeightFormat::Native);
    let dir = std::env::temp_dir().join(format!("kvbench-scaling-{}", std::process::id()));
    common::ok(&common::kvbench(&[
        "scaling",
        "--policy",
        "full,streaming",
        "--budget",
        "32",
        "--policy-arg",
        "buffer=8",
        "--lengths",
        "64,128,192",
        "--prompt-tokens",
        "16",
        "--out",
        dir.to_str().unwrap(),
    ]));
    let csv = std::fs::read_to_string(dir.join("scaling.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let kv = |policy: &str| -> Vec<usize> {
        rows.iter()
            .filter(|r| r[col("policy")] == policy)
            .map(|r| r[col("kv_bytes")].parse().unwrap())
            .collect()
    };
    // 30 layers × keys and values × 3 KV heads × 64 values × 2 bytes (f16, the CPU's default).
    let per_token = 30 * 2 * 3 * 64 * 2;
    // The cache holds the prompt and every generated token but the last one.
    assert_eq!(
        kv("full"),
        vec![
            (16 + 63) * per_token,
            (16 + 127) * per_token,
            (16 + 191) * per_token
        ]
    );
    // StreamingLLM with 32 entries and a buffer of 8 holds 32 to 40 entries, whatever the length.
    for b in kv("streaming") {
        assert!((32 * per_token..=40 * per_token).contains(&b), "{b}");
    }
    assert!(dir.join("kv_vs_length.png").is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}
