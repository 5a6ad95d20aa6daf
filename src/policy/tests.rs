//! Policies on hand-made caches: what StreamingLLM, H2O and R-KV keep, computed by hand.

use super::*;
use crate::cache::LayerCache;
use candle_core::{DType, Device, Tensor};

/// Seeded values in [-0.5, 0.5) (a linear congruential generator: the same on every platform).
pub(super) fn random(len: usize, seed: u32) -> Vec<f32> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn ctx() -> BuildContext {
    BuildContext {
        num_layers: 1,
        head_dim: 3,
        max_new_tokens: 256,
        qwen: false,
        delimiters: None,
    }
}

fn policy(name: &str, budget: f64, args: &[(&str, &str)]) -> Box<dyn Policy> {
    let args = args
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    PolicySpec::new(name, budget, args)
        .unwrap()
        .build(&ctx())
        .unwrap()
}

/// A one-head cache holding `keys` (`[n][3]`) at positions 0..n.
fn cache(keys: &[[f32; 3]]) -> LayerCache {
    let dev = Device::Cpu;
    let mut c = LayerCache::new(1, 3, crate::cache::KvType::F32, &dev).unwrap();
    let flat: Vec<f32> = keys.iter().flatten().copied().collect();
    let k = Tensor::from_vec(flat, (1, keys.len(), 3), &dev).unwrap();
    c.append(&k, &k, 0).unwrap();
    c
}

fn decode_step(generated: usize, seen_before: usize) -> StepInfo<'static> {
    StepInfo {
        seen_before,
        tokens: &[0],
        generated,
        prompt_len: 1,
        is_prefill: false,
    }
}

fn view<'a>(q: &'a Tensor, probs: Option<&'a Tensor>) -> AttentionView<'a> {
    AttentionView {
        layer: 0,
        queries: q,
        query_window: Some(q),
        probs,
        scores: None,
        accumulated: None,
    }
}

#[test]
fn streaming_keeps_sinks_and_the_most_recent() {
    let keys: Vec<[f32; 3]> = (0..20).map(|j| [j as f32, 0.0, 0.0]).collect();
    let mut c = cache(&keys);
    let mut p = policy("streaming", 8.0, &[]);
    let q = Tensor::zeros((1, 1, 3), DType::F32, &Device::Cpu).unwrap();
    // Not a trigger step: nothing happens.
    p.after_attention(&decode_step(127, 19), &view(&q, None), &mut c)
        .unwrap();
    assert_eq!(c.len(), 20);
    p.after_attention(&decode_step(128, 19), &view(&q, None), &mut c)
        .unwrap();
    assert_eq!(c.positions(0), &[0, 1, 2, 3, 16, 17, 18, 19]);
}

#[test]
fn h2o_accumulates_and_carries_scores() {
    let keys = [[0.0f32; 3]; 6];
    let mut c = cache(&keys);
    let mut p = policy("h2o", 4.0, &[]);
    let q = Tensor::zeros((1, 1, 3), DType::F32, &Device::Cpu).unwrap();
    let probs = |v: Vec<f32>| {
        let n = v.len();
        Tensor::from_vec(v, (1, 1, 1, n), &Device::Cpu).unwrap()
    };
    // Heavy 2 + recent 2: the two highest sums among the first four, then the last two.
    let pr = probs(vec![0.5, 0.1, 0.3, 0.05, 0.03, 0.02]);
    p.after_attention(&decode_step(1, 5), &view(&q, Some(&pr)), &mut c)
        .unwrap();
    assert_eq!(c.positions(0), &[0, 2, 4, 5]);
    // A new entry; sums are carried: [0.5, 0.3, 0.03, 0.02, 0] + this step's.
    let k = Tensor::zeros((1, 1, 3), DType::F32, &Device::Cpu).unwrap();
    c.append(&k, &k, 6).unwrap();
    let pr = probs(vec![0.0, 0.0, 0.0, 0.9, 0.1]);
    p.after_attention(&decode_step(2, 6), &view(&q, Some(&pr)), &mut c)
        .unwrap();
    // Old entries 0, 2, 4 with sums 0.5, 0.3, 0.03 keep the first two; 5 and 6 are recent.
    assert_eq!(c.positions(0), &[0, 2, 5, 6]);
}

#[test]
fn rkv_keeps_by_importance_or_by_redundancy() {
    // The keys of spec §8.2: idx0 e1, idx1 e2, idx2 e1, idx3 e3, idx4 (e1+e2)/√2 (the window).
    let r = 0.5f32.sqrt();
    let keys = [
        [1.0, 0.0, 0.0],
        [0.0, 1.0, 0.0],
        [1.0, 0.0, 0.0],
        [0.0, 0.0, 1.0],
        [r, r, 0.0],
    ];
    let q = Tensor::from_vec(vec![1.0f32, 0.0, 0.0], (1, 1, 3), &Device::Cpu).unwrap();
    let args = [("window", "1"), ("pool", "none")];
    // λ = 1, importance only: the query points along e1, so entries 0 and 2 (tie: lower index first).
    let mut c = cache(&keys);
    let mut p = policy("rkv", 3.0, &[args[0], args[1], ("lambda", "1")]);
    p.after_attention(&decode_step(128, 4), &view(&q, None), &mut c)
        .unwrap();
    assert_eq!(c.positions(0), &[0, 2, 4]);
    // λ = 0, redundancy only: R = [0.2434, 0.1993, 0.2113, 0.1730] over candidates, the least
    // redundant first: 3, then 1; score order, then the window.
    let mut c = cache(&keys);
    let mut p = policy("rkv", 3.0, &[args[0], args[1], ("lambda", "0")]);
    p.after_attention(&decode_step(128, 4), &view(&q, None), &mut c)
        .unwrap();
    assert_eq!(c.positions(0), &[3, 1, 4]);
}

#[test]
fn policies_are_named_whatever_the_case_and_by_their_papers_names() {
    for (written, name) in [
        ("R-KV", "rkv"),
        ("SnapKV", "snapkv"),
        ("H2O", "h2o"),
        ("PyramidKV", "pyramidkv"),
        ("StreamingLLM", "streaming"),
        ("LazyEviction", "lazy"),
        ("RocketKV", "rocket"),
        ("Kara", "kara"),
        (" Full ", "full"),
    ] {
        assert_eq!(canonical_name(written), Some(name), "{written}");
        let spec = PolicySpec::new(written, 64.0, Default::default()).unwrap();
        assert_eq!(spec.name(), name, "{written}: recorded as kvbench names it");
    }
    for no in ["", "rkvv", "snap.kv", "r/kv", "streamingllm2"] {
        assert_eq!(canonical_name(no), None, "{no:?}");
        let err = PolicySpec::new(no, 64.0, Default::default()).unwrap_err();
        assert!(err.to_string().contains("unknown policy"), "{err}");
    }
}
