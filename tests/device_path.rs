//! The path a GPU takes, checked on the CPU: attention through candle's operations (what `--device
//! cuda` runs) against the CPU's own decoding loop, under every policy, with the same weights. The
//! policies then receive their probabilities as device tensors and gather on them, as on a GPU; the
//! logits of every step must agree to float rounding, whatever the policy evicts.

mod common;

use common::{teacher_forced, tiny_random};
use kvbench::cache::KvType;
use rand::{Rng, SeedableRng};

#[test]
fn every_policy_gives_the_same_logits_on_the_device_path_as_on_the_cpu_loop() {
    kvbench::init_threads(None).unwrap();
    let (cpu, device_path) = (tiny_random(false), tiny_random(true));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    let prompt: Vec<u32> = (0..40).map(|_| rng.random_range(0..4096)).collect();
    let tokens: Vec<u32> = (0..72).map(|_| rng.random_range(0..4096)).collect();
    for spec in common::compressing_specs() {
        let name = spec.name().to_string();
        let (a, _) = teacher_forced(&cpu, &spec, KvType::F32, &prompt, &tokens);
        let (b, _) = teacher_forced(&device_path, &spec, KvType::F32, &prompt, &tokens);
        let mut worst = 0f32;
        for (x, y) in a.iter().zip(&b) {
            for (p, q) in x.iter().zip(y) {
                worst = worst.max((p - q).abs());
            }
        }
        let agree = a
            .iter()
            .zip(&b)
            .filter(|(x, y)| kvbench::model::llama::argmax(x) == kvbench::model::llama::argmax(y))
            .count();
        assert!(worst < 1e-3, "{name}: logits differ by {worst}");
        assert_eq!(
            agree,
            a.len(),
            "{name}: top-1 differs at {} steps",
            a.len() - agree
        );
    }
}
