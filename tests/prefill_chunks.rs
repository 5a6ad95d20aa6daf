//! A prefill whose attention scores pass the chunk bound is attended in chunks of tokens, each over
//! the entries it sees (`model::llama::dense`): the logits and every policy's evictions must be what
//! one pass gives, on the CPU's own path and on the path a GPU takes.

mod common;

use common::{compressing_specs, teacher_forced, tiny_random};
use kvbench::cache::KvType;
use rand::{Rng, SeedableRng};

#[test]
fn a_prefill_in_chunks_of_tokens_gives_what_one_pass_gives() {
    kvbench::init_threads(None).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
    let prompt: Vec<u32> = (0..40).map(|_| rng.random_range(0..4096)).collect();
    let tokens: Vec<u32> = (0..24).map(|_| rng.random_range(0..4096)).collect();
    for generic in [false, true] {
        let whole = tiny_random(generic);
        let cfg = &whole.transformer.config;
        let g = cfg.num_heads / cfg.num_kv_heads;
        // Chunks of one token, and of seven (the last one shorter), over the 40-token prompt.
        for per_chunk in [1, 7] {
            let mut chunked = tiny_random(generic);
            chunked
                .transformer
                .set_prefill_score_bytes(per_chunk * g * prompt.len() * 4);
            for spec in compressing_specs() {
                let name = format!("{} (generic {generic}, chunks of {per_chunk})", spec.name());
                let (a, sa) = teacher_forced(&whole, &spec, KvType::F32, &prompt, &tokens);
                let (b, sb) = teacher_forced(&chunked, &spec, KvType::F32, &prompt, &tokens);
                let worst = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| common::max_abs_diff(x, y))
                    .fold(0f32, f32::max);
                assert!(worst < 1e-5, "{name}: logits differ by {worst}");
                for (x, y) in a.iter().zip(&b) {
                    assert_eq!(
                        kvbench::model::llama::argmax(x),
                        kvbench::model::llama::argmax(y),
                        "{name}"
                    );
                }
                for l in 0..cfg.num_layers {
                    let (ca, cb) = (sa.cache.layer(l), sb.cache.layer(l));
                    for h in 0..ca.kv_heads() {
                        assert_eq!(
                            ca.positions(h),
                            cb.positions(h),
                            "{name}: layer {l} head {h}"
                        );
                    }
                }
            }
        }
    }
}
