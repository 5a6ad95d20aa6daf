//! The cache's storage type (`--kv-type`) composed with every policy: a 16-bit cache holds exactly
//! half the bytes of the f32 reference for the same entries, Q8_0 and Q4_0 the bytes of their blocks
//! (34 and 18 per 32 values, scales included), keys and values in two types their own bytes each,
//! the logits stay near the reference's (differing: the
//! storage is real, and coarser storage differs more), and the path a GPU takes reads every type as
//! the CPU's loop does.

mod common;

use common::tiny_random;
use kvbench::cache::KvType;
use kvbench::model::Model;
use kvbench::policy::PolicySpec;
use rand::{Rng, SeedableRng};

/// [`common::teacher_forced`]'s logits, with the cache's bytes and entries (all layers) at the end.
fn teacher_forced(
    m: &Model,
    spec: &PolicySpec,
    kv: KvType,
    prompt: &[u32],
    tokens: &[u32],
) -> (Vec<Vec<f32>>, usize, usize) {
    let (logits, state) = common::teacher_forced(m, spec, kv, prompt, tokens);
    let entries = (0..state.cache.num_layers())
        .map(|l| state.cache.layer(l).len())
        .sum();
    (logits, state.cache.bytes(), entries)
}

fn inputs() -> (Vec<u32>, Vec<u32>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let prompt: Vec<u32> = (0..40).map(|_| rng.random_range(0..4096)).collect();
    let tokens: Vec<u32> = (0..72).map(|_| rng.random_range(0..4096)).collect();
    (prompt, tokens)
}

fn kv(name: &str) -> KvType {
    name.parse().unwrap()
}

fn worst_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0f32, f32::max)
}

#[test]
fn every_storage_type_holds_its_exact_bytes_under_every_policy_and_stays_near_f32() {
    kvbench::init_threads(None).unwrap();
    let m = tiny_random(false);
    let (prompt, tokens) = inputs();
    for spec in common::compressing_specs() {
        let name = spec.describe();
        let (exact, exact_bytes, exact_entries) =
            teacher_forced(&m, &spec, KvType::F32, &prompt, &tokens);
        let mut full_error: Vec<(KvType, f32)> = Vec::new();
        for (kv, bytes_per_32) in [
            (KvType::F16, 64),
            (KvType::BF16, 64),
            (KvType::Q8_0, 34),
            (KvType::Q4_0, 18),
            // Keys and values each in their own type: the mean of the two types' bytes.
            (kv("q8_0/f16"), 49),
            (kv("q4_0/q8_0"), 26),
        ] {
            let (got, bytes, entries) = teacher_forced(&m, &spec, kv, &prompt, &tokens);
            // The policy decides what stays, the storage how it is held: the same entries, in
            // the type's bytes (the engine checked the policy's bound at every step).
            assert_eq!(entries, exact_entries, "{name} {kv}: entries held");
            assert_eq!(
                bytes * 128,
                exact_bytes * bytes_per_32,
                "{name} {kv}: bytes held"
            );
            let worst = worst_difference(&exact, &got);
            assert!(
                worst > 0.0,
                "{name} {kv}: the logits equal f32's: nothing was rounded"
            );
            if spec.name() == "full" {
                // Storage alone: rounding to 10 (f16) or 7 (bf16) bits of mantissa, or to 255
                // (Q8_0) or 16 (Q4_0) steps a block.
                let bound = match kv {
                    KvType::F16 => 1e-3,
                    KvType::BF16 | KvType::Q8_0 => 1e-2,
                    _ => 0.2,
                };
                assert!(
                    worst < bound,
                    "{name} {kv}: logits differ from f32 by {worst}"
                );
                full_error.push((kv, worst));
            } else {
                // A policy scores what attention used: rounding moves near ties, and then it keeps
                // other entries (this random model's flat logits have many: 62–100% of steps keep
                // the reference's top-1), so only that the run stays a number is asserted here.
                assert!(got.iter().flatten().all(|x| x.is_finite()), "{name} {kv}");
            }
        }
        if spec.name() == "full" {
            // Coarser storage, larger error: f16 below bf16, Q8_0 below Q4_0.
            let e = |t: KvType| full_error.iter().find(|(k, _)| *k == t).unwrap().1;
            assert!(e(KvType::F16) < e(KvType::BF16), "{full_error:?}");
            assert!(e(KvType::Q8_0) < e(KvType::Q4_0), "{full_error:?}");
        }
    }
}

#[test]
fn the_device_path_reads_every_storage_type_as_the_cpu_loop_does() {
    kvbench::init_threads(None).unwrap();
    let (cpu, device_path) = (tiny_random(false), tiny_random(true));
    let (prompt, tokens) = inputs();
    for spec in common::compressing_specs() {
        for kv in [
            KvType::F16,
            KvType::BF16,
            KvType::Q8_0,
            KvType::Q4_0,
            self::kv("q8_0/f16"),
            self::kv("bf16/q4_0"),
        ] {
            let (a, ..) = teacher_forced(&cpu, &spec, kv, &prompt, &tokens);
            let (b, ..) = teacher_forced(&device_path, &spec, kv, &prompt, &tokens);
            let worst = worst_difference(&a, &b);
            // Q4_0's 16 steps make equal scores common, and the two paths' rounding may break such a
            // tie apart (LazyEviction: 1.8e-3; every other pair within 1.2e-4).
            let blocks = kv.keys.blocks().is_some() || kv.values.blocks().is_some();
            let bound = if blocks { 1e-2 } else { 1e-3 };
            assert!(
                worst < bound,
                "{} {kv}: logits differ by {worst}",
                spec.describe()
            );
        }
    }
}

#[test]
fn kivi_composes_with_every_policy_in_its_exact_bytes_and_its_window_is_f16() {
    kvbench::init_threads(None).unwrap();
    let m = tiny_random(false);
    let (prompt, tokens) = inputs();
    let d = m.transformer.config.head_dim;
    for spec in common::compressing_specs() {
        let name = spec.describe();
        let (exact, _, exact_entries) = teacher_forced(&m, &spec, KvType::F32, &prompt, &tokens);
        let (half, half_bytes, _) = teacher_forced(&m, &spec, KvType::F16, &prompt, &tokens);
        // A window larger than the run: every entry stays in f16, and KIVI's store is read as the
        // f16 cache is, to the bit, under every policy.
        let (wide, wide_bytes, _) = teacher_forced(&m, &spec, kv("kivi2:4096"), &prompt, &tokens);
        assert_eq!(wide, half, "{name}: kivi2:4096 against f16");
        assert_eq!(wide_bytes, half_bytes, "{name}: kivi2:4096 bytes");
        let mut full_error = Vec::new();
        for t in ["kivi2:8", "kivi4:8"] {
            let kv = kv(t);
            let (got, bytes, entries) = teacher_forced(&m, &spec, kv, &prompt, &tokens);
            assert_eq!(entries, exact_entries, "{name} {kv}: entries held");
            // Every entry costs at least a packed entry and at most an f16 one (plus its key group's
            // scales, at most one group per packed entry).
            let (bits, _) = kv.kivi().unwrap();
            let packed = kvbench::cache::kivi::packed_entry_bytes(bits, d);
            assert!(bytes >= entries * packed, "{name} {kv}: {bytes} bytes");
            assert!(
                bytes < half_bytes,
                "{name} {kv}: {bytes} not below f16's {half_bytes}"
            );
            let worst = worst_difference(&exact, &got);
            assert!(worst > 0.0, "{name} {kv}: nothing was rounded");
            assert!(got.iter().flatten().all(|x| x.is_finite()), "{name} {kv}");
            if spec.name() == "full" {
                // Nothing evicted: the bytes of a full KIVI cache of that many entries.
                let (_, state) = common::teacher_forced(&m, &spec, kv, &prompt, &tokens);
                let seen = state.cache.seen();
                assert_eq!(
                    bytes,
                    m.transformer.config.kv_bytes(kv, seen),
                    "{kv}: full bytes"
                );
                full_error.push(worst);
            }
        }
        if spec.name() == "full" {
            // Two bits round more than four.
            assert!(full_error[1] < full_error[0], "{full_error:?}");
            assert!(full_error[0] < 1.0, "{full_error:?}");
        }
    }
}

#[test]
fn kivi_on_the_device_path_reads_as_the_cpu_loop_does() {
    kvbench::init_threads(None).unwrap();
    let (cpu, device_path) = (tiny_random(false), tiny_random(true));
    let (prompt, tokens) = inputs();
    for spec in common::compressing_specs() {
        let kv = kv("kivi2:8");
        let (a, ..) = teacher_forced(&cpu, &spec, kv, &prompt, &tokens);
        let (b, ..) = teacher_forced(&device_path, &spec, kv, &prompt, &tokens);
        let worst = worst_difference(&a, &b);
        assert!(
            worst < 1e-2,
            "{} {kv}: logits differ by {worst}",
            spec.describe()
        );
    }
}
