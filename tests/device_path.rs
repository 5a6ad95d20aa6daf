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
    // Every policy with an f32 cache; RocketKV also in f16 and bf16, whose new keys the device path
    // reads from the host copy each cache keeps rounded as it stores them (`keep_host_keys`), the CPU
    // loop from its buffers: the same summaries, so the same selections.
    let rocket = kvbench::policy::PolicySpec::from_args("rocket", 24.0, &[]).unwrap();
    let cases = common::compressing_specs()
        .into_iter()
        .map(|spec| (spec, KvType::F32))
        .chain([(rocket.clone(), KvType::F16), (rocket, KvType::BF16)]);
    for (spec, kv) in cases {
        let name = format!("{} ({kv:?})", spec.name());
        let (a, _) = teacher_forced(&cpu, &spec, kv, &prompt, &tokens);
        let (b, _) = teacher_forced(&device_path, &spec, kv, &prompt, &tokens);
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

/// Teacher-forced logits of a batch decoded together: prefill each prompt, then feed every
/// sequence its next token in one forward call per step. Sequence `drop.0` leaves the batch after
/// `drop.1` steps (as a sequence that met its end does), which rebuilds the pooled caches.
fn batch_teacher_forced(
    m: &kvbench::model::Model,
    spec: &kvbench::policy::PolicySpec,
    prompts: &[Vec<u32>],
    tokens: &[Vec<u32>],
    drop: (usize, usize),
) -> Vec<Vec<Vec<f32>>> {
    batch_run(m, spec, prompts, tokens, drop, KvType::F32).0
}

/// [`batch_teacher_forced`]'s logits with the caches stored as `kv`, and every sequence's state at
/// the end.
fn batch_run(
    m: &kvbench::model::Model,
    spec: &kvbench::policy::PolicySpec,
    prompts: &[Vec<u32>],
    tokens: &[Vec<u32>],
    drop: (usize, usize),
    kv: KvType,
) -> (Vec<Vec<Vec<f32>>>, Vec<kvbench::model::state::SeqState>) {
    let specs = vec![spec; prompts.len()];
    let active = |i: usize, step: usize| i != drop.0 || step < drop.1;
    batch_run_with(m, &specs, prompts, tokens, &active, kv)
}

/// [`batch_run`] with a policy per sequence, sequence `i` fed at step `s` when `active(i, s)` (every
/// prompt is prefilled first).
fn batch_run_with(
    m: &kvbench::model::Model,
    specs: &[&kvbench::policy::PolicySpec],
    prompts: &[Vec<u32>],
    tokens: &[Vec<u32>],
    active: &dyn Fn(usize, usize) -> bool,
    kv: KvType,
) -> (Vec<Vec<Vec<f32>>>, Vec<kvbench::model::state::SeqState>) {
    use kvbench::model::SeqInput;
    let steps = tokens[0].len();
    let mut states: Vec<_> = specs
        .iter()
        .map(|spec| {
            let ctx = m.policy_context(spec, steps);
            m.transformer
                .new_state_with(spec.build(&ctx).unwrap(), kv)
                .unwrap()
        })
        .collect();
    let mut out: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .zip(states.iter_mut())
        .map(|(p, st)| vec![common::logits_of(m, st, p)])
        .collect();
    // Each step's token of every sequence.
    let columns: Vec<Vec<[u32; 1]>> = (0..steps)
        .map(|s| tokens.iter().map(|t| [t[s]]).collect())
        .collect();
    for (step, column) in columns.iter().enumerate() {
        let active: Vec<usize> = (0..prompts.len()).filter(|&i| active(i, step)).collect();
        let inputs: &mut Vec<SeqInput<'_>> = &mut states
            .iter_mut()
            .zip(column)
            .enumerate()
            .filter(|(i, _)| active.contains(i))
            .map(|(_, (st, tok))| SeqInput {
                tokens: tok,
                state: st,
            })
            .collect();
        let logits = m
            .transformer
            .forward(inputs)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (&i, row) in active.iter().zip(logits) {
            out[i].push(row);
        }
    }
    (out, states)
}

/// Three prompts of different lengths (40, 29 and 47 ids, so that a pool pads two of them) and 72
/// tokens to feed each.
fn batch_inputs(rng: &mut impl Rng) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let prompts = [40, 29, 47]
        .iter()
        .map(|&n| (0..n).map(|_| rng.random_range(0..4096)).collect())
        .collect();
    let tokens = (0..3)
        .map(|_| (0..72).map(|_| rng.random_range(0..4096)).collect())
        .collect();
    (prompts, tokens)
}

#[test]
fn a_batch_attending_through_pooled_caches_gives_each_sequence_its_own_logits() {
    // Sequences of different lengths (so attention masks the pool's padding), under every policy,
    // one of them leaving the batch part-way: the pooled path against one sequence at a time, both
    // through candle's operations. The arithmetic is the same row for row; only the products'
    // blocking over a longer, padded row may round differently.
    let (pooled, per_sequence) = pooled_and_per_sequence();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let (prompts, tokens) = batch_inputs(&mut rng);
    for spec in common::compressing_specs() {
        let name = spec.name().to_string();
        let a = batch_teacher_forced(&pooled, &spec, &prompts, &tokens, (1, 30));
        let b = batch_teacher_forced(&per_sequence, &spec, &prompts, &tokens, (1, 30));
        assert_same_batch_logits(&name, &a, &b);
    }
}

/// H2O and LazyEviction in a pooled batch on the path a GPU takes keep their per-entry scores in
/// the pool (H2O's accumulated attention, LazyEviction's `TS` and `MRI`) and update them there
/// (`Policy::accumulation`; H2O's evictions chosen there too); one sequence at a time they keep them
/// themselves on the host. Both must keep the same entries with the same scores: on a random
/// model's near-uniform attention a wrong score (an evicted entry's left in a new one's slot, a
/// sequence's scores not handed over, a tie broken the other way) barely moves the logits, so the
/// entries and the scores are compared. LazyEviction's threshold is set near the attention's mean,
/// so that about half the entries count as important at each step. One batch shrinks to a single
/// sequence part-way, which attends alone from then on and takes its scores back from the cache.
/// The pool's gathers move member by member (the CPU's default) and for the pool at once (a GPU's).
#[test]
fn scores_kept_in_the_pool_keep_what_each_sequence_keeps_alone() {
    let (mut pooled, per_sequence) = pooled_and_per_sequence();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
    let (prompts, tokens) = batch_inputs(&mut rng);
    let specs: [(&str, &[&str]); 7] = [
        ("h2o", &[]),
        ("h2o", &["gqa=mean-prob"]),
        ("h2o", &["gqa=per-query-head"]),
        ("h2o", &["heavy_ratio=0.25"]),
        ("lazy", &["window=8", "alpha=0.035"]),
        (
            "lazy",
            &["window=8", "alpha=0.035", "init=paper", "order=positional"],
        ),
        ("lazy", &["window=8", "alpha=0.1", "gqa=mean-prob"]),
    ];
    for ((name, args), together) in specs.iter().flat_map(|s| [(s, false), (s, true)]) {
        pooled.transformer.set_batch_compressions(together);
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let spec = kvbench::policy::PolicySpec::from_args(name, 24.0, &args).unwrap();
        for (batch, drop) in [(3, (1, 30)), (2, (0, 40))] {
            let label = format!("{name} {args:?}, batch {batch}, together {together}");
            let run = |m| {
                batch_run(
                    m,
                    &spec,
                    &prompts[..batch],
                    &tokens[..batch],
                    drop,
                    KvType::F32,
                )
            };
            let ((_, mut a), (_, mut b)) = (run(&pooled), run(&per_sequence));
            let mut evicted = false;
            for (i, (x, y)) in a.iter_mut().zip(b.iter_mut()).enumerate() {
                // Pooled sequences hold their scores in the cache (one that left the batch, as it
                // left it); the one that decoded its last steps alone holds them itself.
                let alone = batch == 2 && i == 1;
                for l in 0..x.cache.num_layers() {
                    let (cx, cy) = (x.cache.layer(l), y.cache.layer(l));
                    assert_eq!(cx.has_scores(), !alone, "{label}: sequence {i}, layer {l}");
                    assert!(!cy.has_scores());
                    evicted |= cx.compressions() > 1;
                    for h in 0..cx.kv_heads() {
                        assert_eq!(cx.positions(h), cy.positions(h), "{label}: {i}, {l}, {h}");
                    }
                    let sx = match cx.has_scores() {
                        true => cx.read_scores().unwrap(),
                        false => policy_scores(x, l),
                    };
                    let sy = policy_scores(y, l);
                    assert_eq!(sx.len(), sy.len(), "{label}: sequence {i}, layer {l}");
                    for (p, q) in sx.iter().zip(&sy) {
                        assert!(!p.is_empty());
                        let worst = common::max_abs_diff(p, q);
                        assert!(worst < 1e-5, "{label}: {i}, {l}: scores differ by {worst}");
                    }
                }
            }
            assert!(evicted, "{label}: nothing was evicted while decoding");
        }
    }
}

/// Caches that store a head per query head (`gqa=per-query-head`, LazyEviction's default) pool as
/// one entry per KV head does: each KV head's new entry written to its group's query heads, each
/// query head attending over its own. The same logits and kept entries as one sequence at a time,
/// with the batch's gathers moved member by member and for the pool.
#[test]
fn per_query_head_caches_pool_and_keep_what_each_sequence_keeps_alone() {
    let (mut pooled, per_sequence) = pooled_and_per_sequence();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(14);
    let (prompts, tokens) = batch_inputs(&mut rng);
    let specs = [
        ("lazy", vec!["window=8"]),
        ("h2o", vec!["gqa=per-query-head"]),
        ("snapkv", vec!["buffer=8", "gqa=per-query-head"]),
        ("rkv", vec!["buffer=8", "gqa=per-query-head"]),
    ];
    for ((name, args), together) in specs.iter().flat_map(|s| [(s, false), (s, true)]) {
        pooled.transformer.set_batch_compressions(together);
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let spec = kvbench::policy::PolicySpec::from_args(name, 24.0, &args).unwrap();
        let label = format!("{name} {args:?}, together {together}");
        let run = |m| batch_run(m, &spec, &prompts, &tokens, (1, 30), KvType::F32);
        let ((a, sa), (b, sb)) = (run(&pooled), run(&per_sequence));
        assert_same_batch_logits(&label, &a, &b);
        for (i, (x, y)) in sa.iter().zip(&sb).enumerate() {
            for l in 0..x.cache.num_layers() {
                let (cx, cy) = (x.cache.layer(l), y.cache.layer(l));
                assert_eq!(cx.kv_heads(), pooled.transformer.config.num_heads);
                assert!(cx.in_pool() && !cy.in_pool(), "{label}: {i}, {l}: pooled");
                for h in 0..cx.kv_heads() {
                    assert_eq!(cx.positions(h), cy.positions(h), "{label}: {i}, {l}, {h}");
                }
            }
        }
    }
}

/// The per-entry scores a sequence's policy holds for layer `l`, one vector per head over all its
/// cache's entries, taken from it (`Policy::take_accumulated`, told a step it does not read when it
/// holds every entry).
fn policy_scores(st: &mut kvbench::model::state::SeqState, l: usize) -> Vec<Vec<f32>> {
    let step = kvbench::policy::StepInfo {
        seen_before: 0,
        tokens: &[0],
        generated: 1,
        prompt_len: 0,
        is_prefill: false,
    };
    let (heads, n) = (st.cache.layer(l).kv_heads(), st.cache.layer(l).len());
    st.policy.take_accumulated(&step, l, heads, n)
}

/// A batch whose policies cannot all accumulate in the pool (a full-cache sequence joins two H2O
/// or two LazyEviction ones part-way) reads its probabilities on the host: the sequences whose
/// scores the pool held take them back, all but the step's new entry, whose slot the pooled step
/// did not set. The same kept entries, scores and logits as each sequence alone.
#[test]
fn a_batch_that_stops_accumulating_takes_its_scores_back() {
    let (pooled, per_sequence) = pooled_and_per_sequence();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(15);
    let (prompts, tokens) = batch_inputs(&mut rng);
    let full = kvbench::policy::PolicySpec::from_args("full", 1.0, &[]).unwrap();
    for (name, args) in [("h2o", vec![]), ("lazy", vec!["window=8", "alpha=0.035"])] {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let spec = kvbench::policy::PolicySpec::from_args(name, 24.0, &args).unwrap();
        // The full-cache sequence (the last) joins at step 20.
        let joins = |i: usize, s: usize| i < 2 || s >= 20;
        let run = |m| {
            batch_run_with(
                m,
                &[&spec, &spec, &full],
                &prompts,
                &tokens,
                &joins,
                KvType::F32,
            )
        };
        let ((a, mut sa), (b, mut sb)) = (run(&pooled), run(&per_sequence));
        assert_same_batch_logits(name, &a, &b);
        for (i, (x, y)) in sa.iter_mut().zip(sb.iter_mut()).take(2).enumerate() {
            for l in 0..x.cache.num_layers() {
                let (cx, cy) = (x.cache.layer(l), y.cache.layer(l));
                // Decided on the host since the full-cache sequence joined.
                assert!(cx.in_pool() && !cx.has_scores(), "{name}: {i}, {l}");
                for h in 0..cx.kv_heads() {
                    assert_eq!(cx.positions(h), cy.positions(h), "{name}: {i}, {l}, {h}");
                }
                let (sx, sy) = (policy_scores(x, l), policy_scores(y, l));
                for (p, q) in sx.iter().zip(&sy) {
                    let worst = common::max_abs_diff(p, q);
                    assert!(worst < 1e-5, "{name}: {i}, {l}: scores differ by {worst}");
                }
            }
        }
    }
}

#[test]
fn a_sparse_attention_batch_pooled_attends_as_each_sequence_alone() {
    // RocketKV's per-step selections gathered from the pool at once: a 5-token prompt attends to
    // its whole cache while it is within the selection's size (its rows padded and masked to the
    // others' selections), then selects as the 29- and 40-token ones do from the start; under
    // f32, f16 and bf16 caches, one sequence leaving part-way.
    let (pooled, per_sequence) = pooled_and_per_sequence();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
    let prompts: Vec<Vec<u32>> = [5, 29, 40]
        .iter()
        .map(|&n| (0..n).map(|_| rng.random_range(0..4096)).collect())
        .collect();
    let tokens: Vec<Vec<u32>> = (0..3)
        .map(|_| (0..40).map(|_| rng.random_range(0..4096)).collect())
        .collect();
    let spec = kvbench::policy::PolicySpec::new("rocket", 24.0, Default::default()).unwrap();
    for kv in [KvType::F32, KvType::F16, KvType::BF16] {
        let run = |m| batch_run(m, &spec, &prompts, &tokens, (2, 25), kv).0;
        assert_same_batch_logits(&format!("rocket, {kv}"), &run(&pooled), &run(&per_sequence));
    }
}

/// The tiny random model twice, on the path a GPU takes: pooling a batch's attention, and attending
/// one sequence at a time.
fn pooled_and_per_sequence() -> (kvbench::model::Model, kvbench::model::Model) {
    kvbench::init_threads(None).unwrap();
    let mut per_sequence = tiny_random(true);
    per_sequence.transformer.set_batched_attention(false);
    (tiny_random(true), per_sequence)
}

/// Every sequence's logits at every step of two runs of a batch within 1e-4, with the same largest,
/// `label` naming the run in a failure.
fn assert_same_batch_logits(label: &str, a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) {
    assert_eq!(a.len(), b.len());
    for (i, (sa, sb)) in a.iter().zip(b).enumerate() {
        assert_eq!(sa.len(), sb.len());
        for (s, (x, y)) in sa.iter().zip(sb).enumerate() {
            let worst = common::max_abs_diff(x, y);
            assert!(
                worst < 1e-4,
                "{label}: sequence {i} step {s}: logits differ by {worst}"
            );
            assert_eq!(
                kvbench::model::llama::argmax(x),
                kvbench::model::llama::argmax(y),
                "{label}: sequence {i} step {s}: top-1 differs"
            );
        }
    }
}

#[test]
fn window_compressions_scored_for_the_batch_at_once_keep_what_each_policy_keeps() {
    // SnapKV, PyramidKV and R-KV on a pooled batch, their compressions scored together with the
    // device's operations and their gathers moved together (what a GPU does), against each policy
    // scoring and gathering on its own. At a budget of 36 the 29-token prompt is not compressed at
    // prefill and the others are: at the decoding compressions two sequences share a cache length
    // and one has its own, so the batch is scored in a group picked out of the pool and a group of
    // one, and all keep 36 (one gather for the pool). At 40 the short sequence's first decoding
    // compression finds it within the budget: the others gather member by member. Sequence 1
    // leaves part-way.
    kvbench::init_threads(None).unwrap();
    let mut together = tiny_random(true);
    together.transformer.set_batch_compressions(true);
    let mut alone = tiny_random(true);
    alone.transformer.set_batch_compressions(false);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
    let (prompts, tokens) = batch_inputs(&mut rng);
    let windows = ["snapkv", "pyramidkv", "rkv"]
        .into_iter()
        .flat_map(|name| [(name, 36.0), (name, 40.0)])
        .map(|(name, budget)| {
            let args = vec!["buffer=8".to_string()];
            kvbench::policy::PolicySpec::from_args(name, budget, &args).unwrap()
        });
    // Every other policy gathers together too (H2O at every step once at its budget).
    for spec in windows.chain(common::compressing_specs()) {
        let label = format!("{} at {}", spec.name(), spec.budget_as_written());
        let a = batch_teacher_forced(&together, &spec, &prompts, &tokens, (1, 30));
        let b = batch_teacher_forced(&alone, &spec, &prompts, &tokens, (1, 30));
        assert_same_batch_logits(&label, &a, &b);
    }
}

#[test]
fn copies_of_one_prefill_decode_as_sequences_prefilled_apart() {
    // `generate_copies` (one prefill, the others' states copied and their policies forked) against
    // `generate_batch` (every sequence prefilled), under every policy, on the CPU's loop and through
    // pooled caches. Each copy samples with its own seed, so the copies part after their first
    // tokens: a copy sharing buffers with another would overwrite its entries and change its tokens.
    use kvbench::generate::{generate_batch, generate_copies, Request, SamplingParams};
    kvbench::init_threads(None).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
    let prompt: Vec<u32> = (0..40).map(|_| rng.random_range(0..4096)).collect();
    for generic in [false, true] {
        let m = tiny_random(generic);
        for spec in common::compressing_specs() {
            let name = spec.name().to_string();
            let ctx = m.policy_context(&spec, 40);
            let requests = || -> Vec<Request> {
                (0..3)
                    .map(|i| Request {
                        prompt: prompt.clone(),
                        sampling: SamplingParams {
                            temperature: 1.0,
                            top_p: 1.0,
                            seed: 100 + i,
                        },
                        max_new_tokens: 40,
                        policy: spec.build(&ctx).unwrap(),
                        trace: false,
                        kv_type: None,
                    })
                    .collect()
            };
            let copies = generate_copies(&m.transformer, requests(), &[], &mut |_, _| {}).unwrap();
            let apart = generate_batch(&m.transformer, requests(), &[], &mut |_, _| {}).unwrap();
            assert_ne!(
                copies[0].tokens, copies[1].tokens,
                "{name}: the copies never parted"
            );
            for (i, (a, b)) in copies.iter().zip(&apart).enumerate() {
                assert_eq!(
                    a.tokens, b.tokens,
                    "{name} (generic {generic}): copy {i}'s tokens"
                );
                assert_eq!(
                    a.cache.final_entries, b.cache.final_entries,
                    "{name}: copy {i}"
                );
                assert_eq!(
                    a.cache.compressions, b.cache.compressions,
                    "{name}: copy {i}"
                );
                assert_eq!(a.kv_bytes_peak, b.kv_bytes_peak, "{name}: copy {i}");
                assert_eq!(a.decode_bytes_read, b.decode_bytes_read, "{name}: copy {i}");
            }
        }
    }
}

#[test]
fn prefill_passes_of_several_sequences_give_what_each_alone_gives() {
    // `generate_batch` with prompts of four lengths prefilled in passes of several sequences (what a
    // GPU does: 29 + 40 tokens, then 35 + 52, at 90 a pass; all four at once at 4,096) against one
    // sequence a pass, under every policy (those that compress at prefill do so here: the prompts
    // pass their budgets), on the CPU's loop and through pooled caches. Each sequence samples with
    // its own seed at temperature 1: a logit changed by another sequence of its pass, a policy
    // acting on another's cache or on the pass's tokens would change its tokens.
    use kvbench::generate::{generate_batch, Request, SamplingParams};
    kvbench::init_threads(None).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(14);
    let prompts: Vec<Vec<u32>> = [29, 40, 35, 52]
        .iter()
        .map(|&n| (0..n).map(|_| rng.random_range(0..4096)).collect())
        .collect();
    for generic in [false, true] {
        let mut m = tiny_random(generic);
        for spec in common::compressing_specs() {
            let name = format!("{} (generic {generic})", spec.name());
            let ctx = m.policy_context(&spec, 24);
            let requests = || -> Vec<Request> {
                prompts
                    .iter()
                    .enumerate()
                    .map(|(i, prompt)| Request {
                        prompt: prompt.clone(),
                        sampling: SamplingParams {
                            temperature: 1.0,
                            top_p: 1.0,
                            seed: 200 + i as u64,
                        },
                        max_new_tokens: 24,
                        policy: spec.build(&ctx).unwrap(),
                        trace: false,
                        kv_type: None,
                    })
                    .collect()
            };
            let mut run = |tokens: usize| {
                m.transformer.set_prefill_batch_tokens(tokens);
                generate_batch(&m.transformer, requests(), &[], &mut |_, _| {}).unwrap()
            };
            let alone = run(0);
            for passes in [90, 4096] {
                let together = run(passes);
                for (i, (a, b)) in together.iter().zip(&alone).enumerate() {
                    let at = format!("{name}, {passes} tokens a pass: sequence {i}");
                    assert_eq!(a.tokens, b.tokens, "{at}: tokens");
                    assert_eq!(a.prompt_tokens, prompts[i].len(), "{at}");
                    assert_eq!(a.cache.final_entries, b.cache.final_entries, "{at}");
                    assert_eq!(a.cache.compressions, b.cache.compressions, "{at}");
                    assert_eq!(a.kv_bytes_peak, b.kv_bytes_peak, "{at}");
                    assert_eq!(a.kv_bytes_mean, b.kv_bytes_mean, "{at}");
                    assert_eq!(a.decode_bytes_read, b.decode_bytes_read, "{at}");
                }
                // A pass's sequences share its time, and their shares add up to it.
                let pairs: &[&[usize]] = match passes {
                    90 => &[&[0, 1], &[2, 3]],
                    _ => &[&[0, 1, 2, 3]],
                };
                for pass in pairs {
                    let time = together[pass[0]].prefill_time;
                    assert!(
                        pass.iter().all(|&i| together[i].prefill_time == time),
                        "{name}"
                    );
                    let shares: std::time::Duration =
                        pass.iter().map(|&i| together[i].prefill_share).sum();
                    let gap = shares.abs_diff(time);
                    assert!(gap < std::time::Duration::from_micros(5), "{name}: {gap:?}");
                }
            }
            assert!(alone.iter().all(|g| g.prefill_share == g.prefill_time));
        }
    }
}

/// `--activations weights`: a bf16 model's activations kept in bf16 between operations (scores and
/// softmax in f32), as transformers keeps them on a GPU, through the generic path with a bf16 cache.
/// bf16 holds 8 significant bits, so the logits (about 1 in size here) follow f32 activations' to a
/// bf16 step or two where the policy's choices do not depend on scores (full, StreamingLLM), and one
/// sequence's logits do not depend on the batch it is pooled in; a missing mask (prefill's or the
/// pool's padding), a wrong scale or type would move them by far more, or fail the pass. Policies that
/// choose by scores may choose otherwise after bf16 rounding (random weights make near ties): they
/// must run and stay finite and near.
#[test]
fn bf16_activations_follow_f32_activations_to_bf16_precision() {
    use kvbench::model::Activations;
    kvbench::init_threads(None).unwrap();
    let load = |activations, batched| {
        let mut m = kvbench::model::Model::load("random:tiny@4", &Default::default()).unwrap();
        m.transformer.set_generic_attention(true);
        m.transformer.set_batched_attention(batched);
        let dtype = m.transformer.set_activations(activations).unwrap();
        (m, dtype)
    };
    let (wide, t32) = load(Activations::F32, true);
    let (narrow, t16) = load(Activations::Weights, true);
    let (narrow_apart, _) = load(Activations::Weights, false);
    assert_eq!(
        (t32, t16),
        (candle_core::DType::F32, candle_core::DType::BF16)
    );
    // f32 weights have no 16-bit type to keep: f32 activations.
    let mut f32_weights = tiny_random(true);
    let kept = f32_weights
        .transformer
        .set_activations(Activations::Weights)
        .unwrap();
    assert_eq!(kept, candle_core::DType::F32);

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
    let prompt: Vec<u32> = (0..40).map(|_| rng.random_range(0..4096)).collect();
    let tokens: Vec<u32> = (0..72).map(|_| rng.random_range(0..4096)).collect();
    let (prompts, batch_tokens) = batch_inputs(&mut rng);
    // Logits `b` within a bf16 step or two of `a` (by position) or near them (by scores), all finite.
    let check = |a: &[Vec<f32>], b: &[Vec<f32>], by_position: bool, what: String| {
        assert_eq!(a.len(), b.len());
        let scale = a.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| common::max_abs_diff(x, y))
            .fold(0f32, f32::max);
        assert!(b.iter().flatten().all(|x| x.is_finite()), "{what}");
        let bound = if by_position {
            scale / 64.0
        } else {
            scale / 2.0
        };
        assert!(
            worst <= bound,
            "{what}: logits differ by {worst} (of {scale})"
        );
    };
    for spec in common::compressing_specs() {
        let name = spec.name().to_string();
        let by_position = matches!(name.as_str(), "full" | "streaming");
        let (a, _) = teacher_forced(&wide, &spec, KvType::BF16, &prompt, &tokens);
        let (b, _) = teacher_forced(&narrow, &spec, KvType::BF16, &prompt, &tokens);
        check(
            &a,
            &b,
            by_position,
            format!("{name}: bf16 against f32 activations"),
        );
        // The same sequences pooled and one at a time, one leaving the batch part-way.
        let batch = |m| batch_run(m, &spec, &prompts, &batch_tokens, (1, 30), KvType::BF16).0;
        let (pooled, apart) = (batch(&narrow), batch(&narrow_apart));
        for (i, (x, y)) in pooled.iter().zip(&apart).enumerate() {
            check(x, y, by_position, format!("{name}: sequence {i} pooled"));
        }
    }
}

/// A policy that keeps every entry and records what it is shown at each decode step and layer: the
/// layer and the attention probabilities (with `group_sum`, asking for each group's sum only, as H2O
/// does), or (as a sparse-attention policy, attending to everything) the query.
struct Recorder {
    log: std::sync::Arc<std::sync::Mutex<Vec<Vec<f32>>>>,
    queries: bool,
    group_sum: bool,
}

impl kvbench::policy::Policy for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    fn capabilities(&self) -> kvbench::policy::Capabilities {
        kvbench::policy::Capabilities {
            attention_probs: !self.queries,
            sparse_attention: self.queries,
            group_sum_probs: self.group_sum,
            ..Default::default()
        }
    }

    fn reset(&mut self) {}

    fn after_attention(
        &mut self,
        step: &kvbench::policy::StepInfo<'_>,
        view: &kvbench::policy::AttentionView<'_>,
        _cache: &mut kvbench::cache::LayerCache,
    ) -> candle_core::Result<()> {
        if !step.is_prefill && !self.queries {
            let probs = view.probs.expect("the engine hands probabilities over");
            let row = probs
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            let row = std::iter::once(view.layer as f32).chain(row).collect();
            self.log.lock().unwrap().push(row);
        }
        Ok(())
    }

    fn select_attention(
        &mut self,
        _step: &kvbench::policy::StepInfo<'_>,
        _layer: usize,
        query: &[f32],
        _cache: &kvbench::cache::LayerCache,
    ) -> candle_core::Result<Option<Vec<Vec<usize>>>> {
        self.log.lock().unwrap().push(query.to_vec());
        Ok(None)
    }

    fn entry_limit(&self, _layer: usize, _seen: usize, _prompt_len: usize) -> Option<usize> {
        None
    }
}

/// What each sequence's [`Recorder`] saw over 8 decode steps of the three [`batch_inputs`] sequences:
/// decoded together (`together`), or each in a forward call of its own.
fn recorded(
    m: &kvbench::model::Model,
    queries: bool,
    group_sum: bool,
    together: bool,
) -> Vec<Vec<Vec<f32>>> {
    use kvbench::model::SeqInput;
    use std::sync::{Arc, Mutex};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
    let (prompts, tokens) = batch_inputs(&mut rng);
    let logs: Vec<Arc<Mutex<Vec<Vec<f32>>>>> = prompts.iter().map(|_| Arc::default()).collect();
    let mut states: Vec<_> = logs
        .iter()
        .map(|log| {
            let policy = Recorder {
                log: log.clone(),
                queries,
                group_sum,
            };
            m.transformer
                .new_state_with(Box::new(policy), KvType::F32)
                .unwrap()
        })
        .collect();
    for (p, st) in prompts.iter().zip(states.iter_mut()) {
        common::logits_of(m, st, p);
    }
    for step in 0..8 {
        let column: Vec<[u32; 1]> = tokens.iter().map(|t| [t[step]]).collect();
        let mut inputs: Vec<SeqInput<'_>> = states
            .iter_mut()
            .zip(&column)
            .map(|(state, tok)| SeqInput { tokens: tok, state })
            .collect();
        if together {
            m.transformer.forward(&mut inputs).unwrap();
        } else {
            for one in inputs.chunks_mut(1) {
                m.transformer.forward(one).unwrap();
            }
        }
    }
    drop(states);
    logs.iter().map(|l| l.lock().unwrap().clone()).collect()
}

/// Each sequence of a batch is shown its own attention probabilities (pooled: one copy of the
/// batch's for the layer) and its own query (a sparse-attention policy's, from one copy of the
/// layer's queries), at every layer and step, as when it decodes alone. H2O, LazyEviction and
/// RocketKV decide from them, and on a random model's near-uniform attention a mix-up barely changes
/// their choices, so the logits alone would not tell.
#[test]
fn each_sequence_of_a_batch_is_shown_its_own_probabilities_and_query() {
    kvbench::init_threads(None).unwrap();
    let m = tiny_random(true);
    let same = |a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>], what: &str| {
        for (i, (sa, sb)) in a.iter().zip(b).enumerate() {
            assert_eq!(sa.len(), sb.len(), "{what}: sequence {i}: layers × steps");
            assert!(!sa.is_empty());
            for (k, (x, y)) in sa.iter().zip(sb).enumerate() {
                assert_eq!(
                    x.len(),
                    y.len(),
                    "{what}: sequence {i}, record {k}: entries"
                );
                let worst = common::max_abs_diff(x, y);
                assert!(
                    worst < 1e-5,
                    "{what}: sequence {i}, record {k}: differ by {worst}"
                );
            }
        }
    };
    for (queries, group_sum) in [(false, false), (true, false), (false, true)] {
        let (a, b) = (
            recorded(&m, queries, group_sum, true),
            recorded(&m, queries, group_sum, false),
        );
        same(&a, &b, &format!("queries {queries}, group sum {group_sum}"));
    }
    // The device path calls the probabilities' readers at the end of each decoding step, not after
    // each layer (one wait for the device a step): they are shown, layer by layer in order, what the
    // CPU's own loop shows them after each layer.
    let cpu = tiny_random(false);
    let (a, b) = (
        recorded(&m, false, false, true),
        recorded(&cpu, false, false, false),
    );
    same(&a, &b, "deferred against the CPU loop");
    // A reader of each group's sum alone is handed that sum on the device path, computed where the
    // probabilities are (off a GPU, a group's share of the bytes is copied): the whole group's
    // probabilities summed in the group's order, the policies' own order, to the bit; and so within
    // rounding of what the CPU loop shows H2O, which sums the group itself.
    let (hkv, g) = (
        m.transformer.config.num_kv_heads,
        m.transformer.config.num_heads / m.transformer.config.num_kv_heads,
    );
    assert!(g > 1, "the test model has query groups");
    let sum_groups = |logs: &[Vec<Vec<f32>>]| -> Vec<Vec<Vec<f32>>> {
        logs.iter()
            .map(|records| {
                records
                    .iter()
                    .map(|r| {
                        let n = (r.len() - 1) / (hkv * g);
                        let mut out = vec![r[0]];
                        for h in 0..hkv {
                            let mut col = vec![0f32; n];
                            for j in 0..g {
                                let row = &r[1 + (h * g + j) * n..][..n];
                                col.iter_mut().zip(row).for_each(|(c, &x)| *c += x);
                            }
                            out.extend(col);
                        }
                        out
                    })
                    .collect()
            })
            .collect()
    };
    for together in [true, false] {
        let whole = recorded(&m, false, false, together);
        let summed = recorded(&m, false, true, together);
        assert_eq!(
            summed,
            sum_groups(&whole),
            "group sums, together {together}"
        );
        same(
            &summed,
            &sum_groups(&b),
            "group sums against the CPU loop's",
        );
    }
}

/// `perf --profile`'s clock on the path a GPU takes, one sequence and a pooled batch: every phase of a
/// decoding step is recorded (RoPE too, which the CPU's own loop does inside attention), the prefill
/// is not, each forward call is one step, and the logits are those of an unprofiled run, bit for bit.
#[test]
fn profiling_a_decoding_step_records_every_phase_and_changes_no_logit() {
    use kvbench::model::profile::Phase;
    kvbench::init_threads(None).unwrap();
    let m = tiny_random(true);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let (prompts, tokens) = batch_inputs(&mut rng);
    let spec = common::compressing_specs()
        .into_iter()
        .find(|s| s.name() == "rkv")
        .unwrap();
    let profiler = m.transformer.profiler();
    let one = |m: &kvbench::model::Model| {
        teacher_forced(m, &spec, KvType::F32, &prompts[0], &tokens[0][..12]).0
    };
    let batch = |m: &kvbench::model::Model| {
        let short: Vec<Vec<u32>> = tokens.iter().map(|t| t[..12].to_vec()).collect();
        batch_teacher_forced(m, &spec, &prompts, &short, (usize::MAX, 0))
    };
    let (plain_one, plain_batch) = (one(&m), batch(&m));
    assert_eq!(profiler.times().steps, 0, "off: nothing recorded");
    for (name, run, plain) in [
        ("one sequence", &one as &dyn Fn(&_) -> _, vec![plain_one]),
        (
            "a pooled batch",
            &|m: &_| batch(m).into_iter().flatten().collect(),
            vec![plain_batch.into_iter().flatten().collect()],
        ),
    ] {
        profiler.set(true);
        let profiled = run(&m);
        let times = profiler.times();
        profiler.set(false);
        assert_eq!(
            vec![profiled],
            plain,
            "{name}: profiling changed the logits"
        );
        // Twelve teacher-forced tokens and the last one's logits: twelve decoding steps, and the
        // prefills (one per sequence) not among them.
        assert_eq!(times.steps, 12, "{name}");
        for p in Phase::ALL {
            assert!(
                times.per_step_secs(p) > 0.0,
                "{name}: {} not recorded",
                p.name()
            );
        }
    }
}

/// Greedy decoding off the CPU's loop chooses each step's tokens on the device
/// (`generate::device_greedy`): a batch decoded so gives the CPU loop's tokens (which samples on the
/// host) under every policy, and so do the greedy sequences of a batch with one sampling sequence in
/// it, which takes the logits to the host for all. (The sampling sequence itself is left out: a draw
/// at a temperature may turn on a logit's last bits, which the two paths round differently.)
#[test]
fn greedy_tokens_chosen_on_the_device_path_are_the_cpu_loop_s() {
    use kvbench::generate::{generate_batch, Request, SamplingParams};
    kvbench::init_threads(None).unwrap();
    let (cpu, device_path) = (tiny_random(false), tiny_random(true));
    assert!(device_path.transformer.greedy_on_device() && !cpu.transformer.greedy_on_device());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let (prompts, _) = batch_inputs(&mut rng);
    for spec in common::compressing_specs() {
        for sampled in [None, Some(1)] {
            let run = |m: &kvbench::model::Model| {
                let ctx = m.policy_context(&spec, 40);
                let requests = prompts
                    .iter()
                    .enumerate()
                    .map(|(i, p)| Request {
                        prompt: p.clone(),
                        sampling: match sampled == Some(i) {
                            true => SamplingParams {
                                temperature: 0.8,
                                top_p: 0.9,
                                seed: 5,
                            },
                            false => SamplingParams::greedy(),
                        },
                        max_new_tokens: 40,
                        policy: spec.build(&ctx).unwrap(),
                        trace: false,
                        kv_type: Some(KvType::F32),
                    })
                    .collect();
                generate_batch(&m.transformer, requests, &[], &mut |_, _| {})
                    .unwrap()
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| sampled != Some(*i))
                    .map(|(_, g)| g.tokens)
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                run(&device_path),
                run(&cpu),
                "{} (sampling sequence: {sampled:?})",
                spec.name()
            );
        }
    }
}
