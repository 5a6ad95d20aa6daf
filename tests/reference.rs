//! Policies against independent slow references written here from `../shared/spec/policies.md`
//! (plain loops over the same keys and queries the engine held), event by event, for 220 decode
//! steps on the real model at budgets where they compress many times: a selection bug (a wrong
//! softmax domain, group aggregation, pooling, tie rule, window or sink) changes some kept set.

mod common;

use common::model;
use kvbench::model::weights::WeightFormat;
use kvbench::model::{Model, SeqInput, SeqState};
use kvbench::policy::{BudgetRule, Full, PolicySpec};
use std::collections::BTreeSet;

const STEPS: usize = 220;

fn spec(name: &str, budget: f64, args: &[(&str, &str)]) -> PolicySpec {
    let args = args
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    PolicySpec::with_rule(name, budget, BudgetRule::Ratio, args).unwrap()
}

/// Keys (`[n][d]` flattened) and original positions of every head of every layer.
type Snapshot = Vec<Vec<(Vec<f32>, Vec<u32>)>>;

fn snapshot(state: &SeqState) -> Snapshot {
    (0..state.cache.num_layers())
        .map(|l| {
            let layer = state.cache.layer(l);
            let d = layer.head_dim();
            layer
                .with_host(|kv| {
                    (0..layer.kv_heads())
                        .map(|h| {
                            (
                                kv.keys(h)[..layer.len() * d].to_vec(),
                                layer.positions(h).to_vec(),
                            )
                        })
                        .collect()
                })
                .unwrap()
        })
        .collect()
}

/// Feeds the prompt and `forced` tokens one by one; after every decode step that compressed, calls
/// `check(state, before, generated)` with the caches as they were before that step.
fn run(
    m: &Model,
    s: &PolicySpec,
    forced: &[u32],
    prompt: &[u32],
    check: &mut dyn FnMut(&SeqState, &Snapshot, usize) -> usize,
) -> (usize, usize) {
    let policy = s.build(&m.policy_context(s, forced.len())).unwrap();
    let mut state = m.transformer.new_state(policy).unwrap();
    state.trace = Some(Vec::new());
    let feed = |tokens: &[u32], state: &mut SeqState| {
        m.transformer
            .forward(&mut [SeqInput { tokens, state }])
            .unwrap();
    };
    feed(prompt, &mut state);
    let (mut events, mut checked) = (0, 0);
    for (i, &t) in forced.iter().enumerate() {
        let before = snapshot(&state);
        let seen_events = state.trace.as_ref().unwrap().len();
        feed(&[t], &mut state);
        let new = state.trace.as_ref().unwrap().len() - seen_events;
        if new > 0 {
            events += new;
            checked += check(&state, &before, i + 1);
        }
    }
    (events, checked)
}

fn setup() -> (std::sync::Arc<Model>, Vec<u32>, Vec<u32>) {
    let m = model(WeightFormat::Auto);
    let prompt = m
        .tokenizer
        .encode(&m.template.render(
            "A train leaves at 3 pm at 60 km/h; a second leaves the same station at 4 pm at 90 km/h. When does the second catch up? Think step by step.",
            None,
        ))
        .unwrap();
    let forced = common::run_greedy(&m, &prompt, Box::new(Full), STEPS).0;
    assert_eq!(forced.len(), STEPS, "the greedy run decodes {STEPS} tokens");
    (m, prompt, forced)
}

/// StreamingLLM (spec §0.4, R-KV repo cadence): at every event each head keeps the first `sinks`
/// positions and the most recent `B − sinks`.
#[test]
fn streaming_keeps_exactly_the_sinks_and_the_most_recent() {
    let (m, prompt, forced) = setup();
    let (b, sinks) = (40usize, 4usize);
    let s = spec("streaming", b as f64, &[("buffer", "16"), ("sinks", "4")]);
    let mut check = |state: &SeqState, _: &Snapshot, generated: usize| {
        let mut n = 0;
        for e in state.trace.as_ref().unwrap() {
            if e.generated != generated {
                continue;
            }
            let seen = e.seen as u32;
            let want: Vec<u32> = (0..sinks as u32)
                .chain(seen - (b - sinks) as u32..seen)
                .collect();
            assert_eq!(
                e.kept, want,
                "layer {} head {} at step {generated}",
                e.layer, e.head
            );
            n += 1;
        }
        n
    };
    let (events, checked) = run(&m, &s, &forced, &prompt, &mut check);
    assert!(
        events >= 10 * m.transformer.config.num_layers,
        "{events} events"
    );
    assert_eq!(events, checked);
}

/// SnapKV as R-KV's repository runs it at decode time (spec §1 and §6): the last `window` queries,
/// the group's maximum logit per key, softmax over the candidates only (the window's keys excluded),
/// mean over the window's queries, max-pooling of width 7 (clipped at the ends), the top `B − window`
/// candidates by score (ties: the lower index), then the window itself.
#[test]
fn snapkv_keeps_the_reference_sets_event_by_event() {
    let (m, prompt, forced) = setup();
    let (b, w, buffer) = (48usize, 8usize, 16usize);
    let s = spec("snapkv", b as f64, &[("buffer", "16"), ("window", "8")]);
    let cfg = &m.transformer.config;
    let (hq, d) = (cfg.num_heads, cfg.head_dim);
    let mut near_ties = 0usize;
    let mut check = |state: &SeqState, before: &Snapshot, generated: usize| {
        let mut n_checked = 0;
        for e in state.trace.as_ref().unwrap() {
            if e.generated != generated {
                continue;
            }
            let (l, h) = (e.layer, e.head);
            let heads = state.cache.layer(l).kv_heads();
            let g = hq / heads;
            // The candidates the compressing step saw: what the head held before it, and this step's
            // key (kept: it is in the window).
            let (mut keys, mut pos) = before[l][h].clone();
            let seen_before = (e.seen - 1) as u32;
            let after = state.cache.layer(l);
            let j = after
                .positions(h)
                .iter()
                .position(|&p| p == seen_before)
                .unwrap();
            after
                .with_host(|kv| keys.extend_from_slice(&kv.keys(h)[j * d..(j + 1) * d]))
                .unwrap();
            pos.push(seen_before);
            let n = pos.len();
            assert!(n >= b, "a compression only once the cache holds B");
            let n_cand = n - w;
            let qw = state.query_windows[l].as_ref().unwrap();
            let (_, wq, _) = qw.dims3().unwrap();
            let q: Vec<f32> = qw.flatten_all().unwrap().to_vec1().unwrap();
            let scale = 1.0 / (d as f64).sqrt();
            let mut score = vec![0f64; n_cand];
            for r in 0..wq {
                // Group maximum of the raw logits, per candidate.
                let z: Vec<f64> = (0..n_cand)
                    .map(|jj| {
                        (0..g)
                            .map(|k| {
                                let qrow = &q[((h * g + k) * wq + r) * d..][..d];
                                let krow = &keys[jj * d..(jj + 1) * d];
                                qrow.iter()
                                    .zip(krow)
                                    .map(|(a, b)| (*a as f64) * (*b as f64))
                                    .sum::<f64>()
                                    * scale
                            })
                            .fold(f64::NEG_INFINITY, f64::max)
                    })
                    .collect();
                let top = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = z.iter().map(|x| (x - top).exp()).sum();
                for (s, x) in score.iter_mut().zip(&z) {
                    *s += (x - top).exp() / total / wq as f64;
                }
            }
            let pooled: Vec<f64> = (0..n_cand)
                .map(|jj| {
                    let lo = jj.saturating_sub(3);
                    let hi = (jj + 4).min(n_cand);
                    score[lo..hi]
                        .iter()
                        .copied()
                        .fold(f64::NEG_INFINITY, f64::max)
                })
                .collect();
            let mut order: Vec<usize> = (0..n_cand).collect();
            order.sort_by(|a, b| pooled[*b].total_cmp(&pooled[*a]).then(a.cmp(b)));
            let want: BTreeSet<u32> = order[..b - w]
                .iter()
                .map(|&jj| pos[jj])
                .chain(pos[n_cand..].iter().copied())
                .collect();
            let got: BTreeSet<u32> = e.kept.iter().copied().collect();
            assert_eq!(got.len(), b, "layer {l} head {h}: the budget");
            assert!(
                pos[n_cand..].iter().all(|p| got.contains(p)),
                "layer {l} head {h}: the window is always kept"
            );
            if got != want {
                // Only float-level near-ties at the boundary may differ (f32 against f64 sums).
                let boundary = pooled[order[b - w - 1]];
                for p in got.symmetric_difference(&want) {
                    let jj = pos.iter().position(|x| x == p).unwrap();
                    assert!(
                        (pooled[jj] - boundary).abs() <= 1e-6 * boundary.abs().max(1e-9),
                        "layer {l} head {h} step {generated}: position {p} (score {}, boundary {boundary}) decided differently",
                        pooled[jj]
                    );
                }
                near_ties += 1;
            }
            n_checked += 1;
        }
        n_checked
    };
    let (events, checked) = run(&m, &s, &forced, &prompt, &mut check);
    let layers = cfg.num_layers;
    assert!(
        events >= 8 * layers * (STEPS / buffer) / 16,
        "{events} events"
    );
    assert_eq!(events, checked);
    assert!(
        near_ties * 100 <= checked,
        "{near_ties} of {checked} sets differ by near-ties"
    );
    eprintln!("snapkv: {checked} kept sets checked, {near_ties} decided by float-level near-ties");
}
