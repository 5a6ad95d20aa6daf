//! The cache's storage type (`--kv-type`) composed with every policy: a 16-bit cache holds exactly
//! half the bytes of the f32 reference for the same entries, its logits stay near the reference's
//! (differing: the storage is real), and the path a GPU takes reads it as the CPU's loop does.

use kvbench::cache::KvType;
use kvbench::model::weights::WeightFormat;
use kvbench::model::{LoadOptions, Model, SeqInput};
use kvbench::policy::PolicySpec;
use rand::{Rng, SeedableRng};

fn load(generic: bool) -> Model {
    let mut m = Model::load(
        "random:tiny@4",
        &LoadOptions {
            format: WeightFormat::F32,
            ..Default::default()
        },
    )
    .unwrap();
    m.transformer.set_generic_attention(generic);
    m
}

/// Logits of every step of `tokens` fed one at a time after `prompt`, under `spec`, with the cache
/// stored as `kv`; and the cache's bytes and entries per layer at the end.
fn teacher_forced(
    m: &Model,
    spec: &PolicySpec,
    kv: KvType,
    prompt: &[u32],
    tokens: &[u32],
) -> (Vec<Vec<f32>>, usize, usize) {
    let ctx = m.policy_context(spec, tokens.len());
    let mut state = m
        .transformer
        .new_state_with(spec.build(&ctx).unwrap(), kv)
        .unwrap();
    let mut out = Vec::new();
    let mut next = prompt.to_vec();
    for &t in tokens.iter().chain([&0]) {
        let l = m
            .transformer
            .forward(&mut [SeqInput {
                tokens: &next,
                state: &mut state,
            }])
            .unwrap();
        out.push(l.squeeze(0).unwrap().to_vec1::<f32>().unwrap());
        next = vec![t];
    }
    let entries = (0..state.cache.num_layers())
        .map(|l| state.cache.layer(l).len())
        .sum();
    (out, state.cache.bytes(), entries)
}

fn specs() -> Vec<PolicySpec> {
    [
        ("full", 1.0, vec![]),
        ("streaming", 24.0, vec!["buffer=8"]),
        ("h2o", 24.0, vec![]),
        ("snapkv", 24.0, vec!["buffer=8"]),
        ("pyramidkv", 24.0, vec!["buffer=8"]),
        ("rkv", 24.0, vec!["buffer=8"]),
        ("lazy", 24.0, vec!["window=8"]),
        ("rocket", 24.0, vec![]),
        ("kara", 0.5, vec!["window=16"]),
    ]
    .into_iter()
    .map(|(name, budget, args)| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        PolicySpec::from_args(name, budget, &args).unwrap()
    })
    .collect()
}

fn inputs() -> (Vec<u32>, Vec<u32>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let prompt: Vec<u32> = (0..40).map(|_| rng.random_range(0..4096)).collect();
    let tokens: Vec<u32> = (0..72).map(|_| rng.random_range(0..4096)).collect();
    (prompt, tokens)
}

fn worst_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0f32, f32::max)
}

fn agreement(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    let same = a
        .iter()
        .zip(b)
        .filter(|(x, y)| kvbench::model::llama::argmax(x) == kvbench::model::llama::argmax(y))
        .count();
    same as f64 / a.len() as f64
}

#[test]
fn a_sixteen_bit_cache_holds_half_the_bytes_under_every_policy_and_stays_near_f32() {
    kvbench::init_threads(None).unwrap();
    let m = load(false);
    let (prompt, tokens) = inputs();
    for spec in specs() {
        let name = spec.describe();
        let (exact, exact_bytes, exact_entries) =
            teacher_forced(&m, &spec, KvType::F32, &prompt, &tokens);
        for kv in [KvType::F16, KvType::Bf16] {
            let (got, bytes, entries) = teacher_forced(&m, &spec, kv, &prompt, &tokens);
            // The policy decides what stays, the storage how it is held: the same entries, half
            // the bytes (the engine checked the policy's bound at every step).
            assert_eq!(entries, exact_entries, "{name} {kv}: entries held");
            assert_eq!(bytes * 2, exact_bytes, "{name} {kv}: bytes held");
            let worst = worst_difference(&exact, &got);
            assert!(
                worst > 0.0,
                "{name} {kv}: the logits equal f32's: nothing was rounded"
            );
            if spec.name() == "full" {
                // Storage alone: rounding to 10 (f16) or 7 (bf16) bits of mantissa.
                let bound = if kv == KvType::F16 { 1e-3 } else { 1e-2 };
                assert!(
                    worst < bound,
                    "{name} {kv}: logits differ from f32 by {worst}"
                );
                assert_eq!(agreement(&exact, &got), 1.0, "{name} {kv}: top-1 differs");
            } else {
                // A policy scores what attention used: rounding may move a near tie, and then it
                // keeps other entries (measured on this model: 81–100% of steps agree).
                let agree = agreement(&exact, &got);
                assert!(
                    agree >= 0.75,
                    "{name} {kv}: top-1 agrees at {agree} of steps"
                );
            }
        }
    }
}

#[test]
fn the_device_path_reads_a_sixteen_bit_cache_as_the_cpu_loop_does() {
    kvbench::init_threads(None).unwrap();
    let (cpu, device_path) = (load(false), load(true));
    let (prompt, tokens) = inputs();
    for spec in specs() {
        for kv in [KvType::F16, KvType::Bf16] {
            let (a, ..) = teacher_forced(&cpu, &spec, kv, &prompt, &tokens);
            let (b, ..) = teacher_forced(&device_path, &spec, kv, &prompt, &tokens);
            let worst = worst_difference(&a, &b);
            assert!(
                worst < 1e-3,
                "{} {kv}: logits differ by {worst}",
                spec.describe()
            );
        }
    }
}
