//! Policies against independent slow references written here from `../shared/spec/policies.md`
//! (plain loops over the same keys and queries the engine held), event by event, for 220 decode
//! steps on the real model at budgets where they compress many times: a selection bug (a wrong
//! softmax domain, group aggregation, pooling, tie rule, window or sink) changes some kept set.

mod common;

use common::model;
use kvbench::model::weights::WeightFormat;
use kvbench::model::{Model, SeqInput, SeqState};
use kvbench::policy::{BudgetRule, Full, Policy, PolicySpec};
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

/// One layer's keys and positions per head, as a policy received them: (layer, heads).
type HeldLayer = (usize, Vec<(Vec<f32>, Vec<u32>)>);

fn snapshot(state: &SeqState) -> Snapshot {
    (0..state.cache.num_layers())
        .map(|l| {
            let layer = state.cache.layer(l);
            let d = layer.head_dim();
            layer
                .with_host_keys(|kv| {
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
    step(m, &mut state, prompt);
    let (mut events, mut checked) = (0, 0);
    for (i, &t) in forced.iter().enumerate() {
        let before = snapshot(&state);
        let seen_events = step(m, &mut state, &[t]);
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

/// Whether kvbench's kept set differs from the reference's; where it does, every position decided
/// differently must score within `tol` (relative) of the reference's boundary score: a float-level
/// near-tie, never a selection bug.
fn differs_by_near_ties(
    got: &BTreeSet<u32>,
    want: &BTreeSet<u32>,
    score_of: impl Fn(u32) -> f64,
    boundary: f64,
    tol: f64,
    at: &str,
) -> bool {
    for &p in got.symmetric_difference(want) {
        let v = score_of(p);
        assert!(
            (v - boundary).abs() <= tol * boundary.abs().max(1e-9),
            "{at}: position {p} (score {v}, boundary {boundary}) decided differently"
        );
    }
    got != want
}

/// The reference's entries continued from what kvbench kept, in its storage order (identical but for
/// near-ties), so that one near-tie does not make every later event differ.
fn follow<T: Copy>(entries: &mut Vec<T>, kept: &[u32], position: impl Fn(&T) -> u32) {
    *entries = kept
        .iter()
        .map(|p| *entries.iter().find(|e| position(e) == *p).unwrap())
        .collect();
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

/// A window policy (SnapKV or R-KV as R-KV's repository runs them at decode time, spec §1(b) and §6)
/// against its reference: the last `window` queries, the group's maximum logit per key, softmax over
/// the candidates only (the window's keys excluded), mean over the window's queries, max-pooling of
/// width 7 (clipped at the ends); for R-KV, `λ·A − (1−λ)·R` with R the softmax over all entries of the
/// raw cosine column means, each row's most recent partner above 0.5 (or column 0) exempt; the top
/// `B − window` candidates by score (ties: the lower index), then the window itself.
fn window_policy_matches_its_reference(name: &str, lambda: Option<f64>) {
    window_reference(name, lambda, Scoring::RKV);
}

/// How window scores are formed (spec §7's knobs).
#[derive(Clone, Copy)]
struct Scoring {
    /// Group maximum of raw logits (R-KV), or the mean over the group of each head's probabilities.
    max_logit: bool,
    /// Softmax over the candidates only (R-KV), or over every key each window query sees (causal).
    candidates_only: bool,
    /// Mean over the window's queries (R-KV), or their sum.
    mean: bool,
    /// PyramidKV's schedule (β): layer l keeps its own share of B.
    pyramid: Option<usize>,
}

impl Scoring {
    const RKV: Scoring = Scoring {
        max_logit: true,
        candidates_only: true,
        mean: true,
        pyramid: None,
    };
}

fn window_reference(name: &str, lambda: Option<f64>, scoring: Scoring) {
    let (m, prompt, forced) = setup();
    let (b, w, buffer) = (48usize, 8usize, 16usize);
    let s = spec(name, b as f64, &[("buffer", "16"), ("window", "8")]);
    let cfg = &m.transformer.config;
    let (hq, d) = (cfg.num_heads, cfg.head_dim);
    let layers = cfg.num_layers;
    let budget = |l: usize| match scoring.pyramid {
        Some(beta) => kvbench::policy::pyramid_schedule(b, w, beta, l, layers),
        None => b,
    };
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
            // The entries the compressing step saw: what the head held before it, and this step's
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
                .with_host_keys(|kv| keys.extend_from_slice(&kv.keys(h)[j * d..(j + 1) * d]))
                .unwrap();
            pos.push(seen_before);
            let n = pos.len();
            let b = budget(l);
            assert!(n >= b, "a compression only once the cache holds B");
            let n_cand = n - w;
            let qw = state.query_windows[l].as_ref().unwrap();
            let (_, wq, _) = qw.dims3().unwrap();
            let q: Vec<f32> = qw.flatten_all().unwrap().to_vec1().unwrap();
            let key = |jj: usize| &keys[jj * d..(jj + 1) * d];
            let dot = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .map(|(x, y)| (*x as f64) * (*y as f64))
                    .sum::<f64>()
            };
            let scale = 1.0 / (d as f64).sqrt();
            let mut score = vec![0f64; n_cand];
            let reduce = if scoring.mean { 1.0 / wq as f64 } else { 1.0 };
            for r in 0..wq {
                // The keys this window query sees: the candidates, or (causal) every key up to its own.
                let seen_keys = if scoring.candidates_only {
                    n_cand
                } else {
                    n - wq + r + 1
                };
                let logits = |k: usize| -> Vec<f64> {
                    (0..seen_keys)
                        .map(|jj| dot(&q[((h * g + k) * wq + r) * d..][..d], key(jj)) * scale)
                        .collect()
                };
                let softmax = |z: &[f64]| -> Vec<f64> {
                    let top = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let total: f64 = z.iter().map(|x| (x - top).exp()).sum();
                    z.iter().map(|x| (x - top).exp() / total).collect()
                };
                let p: Vec<f64> = if scoring.max_logit {
                    let per_head: Vec<Vec<f64>> = (0..g).map(logits).collect();
                    let z: Vec<f64> = (0..seen_keys)
                        .map(|jj| {
                            per_head
                                .iter()
                                .map(|z| z[jj])
                                .fold(f64::NEG_INFINITY, f64::max)
                        })
                        .collect();
                    softmax(&z)
                } else {
                    let mut mean = vec![0f64; seen_keys];
                    for k in 0..g {
                        for (m, x) in mean.iter_mut().zip(softmax(&logits(k))) {
                            *m += x / g as f64;
                        }
                    }
                    mean
                };
                for (s, x) in score.iter_mut().zip(&p) {
                    *s += x * reduce;
                }
            }
            let mut f: Vec<f64> = (0..n_cand)
                .map(|jj| {
                    let lo = jj.saturating_sub(3);
                    let hi = (jj + 4).min(n_cand);
                    score[lo..hi]
                        .iter()
                        .copied()
                        .fold(f64::NEG_INFINITY, f64::max)
                })
                .collect();
            if let Some(lambda) = lambda {
                let norm: Vec<f64> = (0..n)
                    .map(|jj| dot(key(jj), key(jj)).sqrt() + 1e-8)
                    .collect();
                let mut col = vec![0f64; n];
                for i in 0..n {
                    let mut row: Vec<f64> = (0..n)
                        .map(|jj| {
                            if jj == i {
                                0.0
                            } else {
                                dot(key(i), key(jj)) / (norm[i] * norm[jj])
                            }
                        })
                        .collect();
                    let partner = (0..n).rev().find(|&jj| row[jj] > 0.5).unwrap_or(0);
                    row[partner] = 0.0;
                    for (c, x) in col.iter_mut().zip(&row) {
                        *c += x / n as f64;
                    }
                }
                let top = col.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = col.iter().map(|x| (x - top).exp()).sum();
                for (jj, fj) in f.iter_mut().enumerate() {
                    let r = (col[jj] - top).exp() / total;
                    *fj = lambda * *fj - (1.0 - lambda) * r;
                }
            }
            let mut order: Vec<usize> = (0..n_cand).collect();
            order.sort_by(|a, b| f[*b].total_cmp(&f[*a]).then(a.cmp(b)));
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
            // Only float-level near-ties at the boundary may differ (f32 against f64 sums).
            let score_of = |p: u32| f[pos.iter().position(|x| *x == p).unwrap()];
            let at = format!("{name}: layer {l} head {h} step {generated}");
            if differs_by_near_ties(&got, &want, score_of, f[order[b - w - 1]], 1e-6, &at) {
                near_ties += 1;
            }
            n_checked += 1;
        }
        n_checked
    };
    let (events, checked) = run(&m, &s, &forced, &prompt, &mut check);
    let heads = cfg.num_kv_heads * cfg.num_layers;
    // PyramidKV's lower layers hold up to about 2B and compress less often.
    let per_head = if scoring.pyramid.is_some() {
        4
    } else {
        STEPS / buffer - 4
    };
    assert!(events >= heads * per_head, "{events} events");
    assert_eq!(events, checked);
    assert!(
        near_ties * 100 <= checked,
        "{near_ties} of {checked} sets differ by near-ties"
    );
    eprintln!("{name}: {checked} kept sets checked, {near_ties} decided by float-level near-ties");
}

#[test]
fn snapkv_keeps_the_reference_sets_event_by_event() {
    window_policy_matches_its_reference("snapkv", None);
}

/// PyramidKV's defaults: the group's mean probability, softmax over every key a window query sees
/// (causal), summed over the window; layer l keeps its own share of B (the schedule, β = 20).
#[test]
fn pyramidkv_keeps_the_reference_sets_event_by_event() {
    window_reference(
        "pyramidkv",
        None,
        Scoring {
            max_logit: false,
            candidates_only: false,
            mean: false,
            pyramid: Some(20),
        },
    );
}

#[test]
fn rkv_keeps_the_reference_sets_event_by_event() {
    window_policy_matches_its_reference("rkv", Some(0.1));
}

/// Probabilities one layer's attention gave at one step: `[heads, group, t, n]`, host copy.
struct Seen {
    layer: usize,
    shape: (usize, usize, usize, usize),
    probs: Vec<f32>,
}

/// A policy that records the attention probabilities the engine hands it, then lets the real policy
/// act: the reference sees exactly the attention the policy saw.
struct Spy {
    inner: Box<dyn Policy>,
    logs: Logs,
}

type Shared<T> = std::sync::Arc<std::sync::Mutex<Vec<T>>>;

/// What a [`Spy`] records, shared with the test that reads it after every step.
#[derive(Default, Clone)]
struct Logs {
    /// Attention probabilities handed to the policy.
    probs: Shared<Seen>,
    /// Sparse attention choices, with the query and keys they were made from.
    selections: Shared<Selected>,
    /// When given: every layer's keys and positions as the policy received them (before it compressed).
    caches: Option<Shared<HeldLayer>>,
}

/// A traced sequence whose policy is `s` inside a spy writing to `logs`.
fn spied(m: &Model, s: &PolicySpec, logs: &Logs) -> SeqState {
    let spy = Spy {
        inner: s.build(&m.policy_context(s, STEPS)).unwrap(),
        logs: logs.clone(),
    };
    let mut state = m.transformer.new_state(Box::new(spy)).unwrap();
    state.trace = Some(Vec::new());
    state
}

/// Feeds one step; returns the index of the first trace event it added.
fn step(m: &Model, state: &mut SeqState, tokens: &[u32]) -> usize {
    let events_before = state.trace.as_ref().map_or(0, Vec::len);
    m.transformer
        .forward(&mut [SeqInput { tokens, state }])
        .unwrap();
    events_before
}

/// A run's inputs: the prompt, then each forced token.
fn inputs(prompt: &[u32], forced: &[u32]) -> Vec<Vec<u32>> {
    std::iter::once(prompt.to_vec())
        .chain(forced.iter().map(|&t| vec![t]))
        .collect()
}

/// Takes what a log gathered since the last take.
fn take<T>(log: &Shared<T>) -> Vec<T> {
    std::mem::take(&mut *log.lock().unwrap())
}

/// One sparse-attention choice: the layer, this step's query `[query_heads · d]`, every cache head's
/// keys `[n · d]`, and the entries each head attends to.
struct Selected {
    layer: usize,
    query: Vec<f32>,
    keys: Vec<Vec<f32>>,
    chosen: Vec<Vec<usize>>,
}

impl Policy for Spy {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> kvbench::policy::Capabilities {
        self.inner.capabilities()
    }
    fn reset(&mut self) {
        self.inner.reset()
    }
    fn after_attention(
        &mut self,
        step: &kvbench::policy::StepInfo<'_>,
        view: &kvbench::policy::AttentionView<'_>,
        cache: &mut kvbench::cache::LayerCache,
    ) -> candle_core::Result<()> {
        if let Some(log) = &self.logs.caches {
            let d = cache.head_dim();
            let held = cache.with_host_keys(|kv| {
                (0..cache.kv_heads())
                    .map(|h| {
                        (
                            kv.keys(h)[..cache.len() * d].to_vec(),
                            cache.positions(h).to_vec(),
                        )
                    })
                    .collect()
            })?;
            log.lock().unwrap().push((view.layer, held));
        }
        if let Some(p) = view.probs {
            self.logs.probs.lock().unwrap().push(Seen {
                layer: view.layer,
                shape: p.dims4()?,
                probs: p.flatten_all()?.to_vec1()?,
            });
        }
        self.inner.after_attention(step, view, cache)
    }
    fn select_attention(
        &mut self,
        step: &kvbench::policy::StepInfo<'_>,
        layer: usize,
        query: &[f32],
        cache: &kvbench::cache::LayerCache,
    ) -> candle_core::Result<Option<Vec<Vec<usize>>>> {
        let chosen = self.inner.select_attention(step, layer, query, cache)?;
        if let Some(chosen) = &chosen {
            let d = cache.head_dim();
            let keys = cache.with_host_keys(|kv| {
                (0..cache.kv_heads())
                    .map(|h| kv.keys(h)[..cache.len() * d].to_vec())
                    .collect()
            })?;
            self.logs.selections.lock().unwrap().push(Selected {
                layer,
                query: query.to_vec(),
                keys,
                chosen: chosen.clone(),
            });
        }
        Ok(chosen)
    }
    fn selection_bytes_read(&self) -> usize {
        self.inner.selection_bytes_read()
    }
    fn entry_limit(&self, layer: usize, seen: usize, prompt_len: usize) -> Option<usize> {
        self.inner.entry_limit(layer, seen, prompt_len)
    }
    fn state_bytes(&self) -> usize {
        self.inner.state_bytes()
    }
}

/// H2O (spec §5 table; the original's heavy hitters): every entry accumulates the attention it gets
/// from every query, summed over the GQA group; after each step a head keeps the `⌊B·ratio⌋` highest
/// sums among all but the `recent` newest entries, in position order, then the newest. The reference
/// tracks each head's entries and sums itself, from the probabilities the engine computed.
#[test]
fn h2o_keeps_the_reference_sets_event_by_event() {
    let (m, prompt, forced) = setup();
    let b = 48usize;
    let (heavy, recent) = (b / 2, b - b / 2);
    let s = spec("h2o", b as f64, &[]);
    let logs = Logs::default();
    let mut state = spied(&m, &s, &logs);
    let layers = m.transformer.config.num_layers;
    // Per layer and head: (position, accumulated attention) in storage (position) order.
    let mut reference: Vec<Vec<Vec<(u32, f64)>>> = Vec::new();
    let (mut checked, mut near_ties) = (0usize, 0usize);
    let mut seen = 0usize;
    for (step_index, tokens) in inputs(&prompt, &forced).iter().enumerate() {
        let events_before = step(&m, &mut state, tokens);
        let calls = take(&logs.probs);
        assert_eq!(calls.len(), layers, "one attention per layer per step");
        if reference.is_empty() {
            reference = vec![vec![Vec::new(); calls[0].shape.0]; layers];
        }
        let trace = &state.trace.as_ref().unwrap()[events_before..];
        for call in &calls {
            let (heads, g, t, n) = call.shape;
            assert_eq!(reference[call.layer].len(), heads);
            for (h, entries) in reference[call.layer].iter_mut().enumerate() {
                entries.extend((seen..seen + t).map(|p| (p as u32, 0.0)));
                assert_eq!(
                    entries.len(),
                    n,
                    "layer {} head {h}: the cache the step saw",
                    call.layer
                );
                for row in call.probs[h * g * t * n..(h + 1) * g * t * n].chunks_exact(n) {
                    for (e, &p) in entries.iter_mut().zip(row) {
                        e.1 += p as f64;
                    }
                }
                if n <= b {
                    continue;
                }
                let old = n - recent;
                let mut order: Vec<usize> = (0..old).collect();
                order.sort_by(|x, y| entries[*y].1.total_cmp(&entries[*x].1).then(x.cmp(y)));
                let mut keep: Vec<usize> = order[..heavy].to_vec();
                keep.sort_unstable();
                keep.extend(old..n);
                let want: Vec<u32> = keep.iter().map(|&j| entries[j].0).collect();
                let event = trace
                    .iter()
                    .find(|e| e.layer == call.layer && e.head == h)
                    .expect("a trimming step records an event");
                assert!(
                    event.kept.windows(2).all(|x| x[0] < x[1]),
                    "positional order"
                );
                let got: BTreeSet<u32> = event.kept.iter().copied().collect();
                let wanted: BTreeSet<u32> = want.iter().copied().collect();
                let score_of = |p: u32| entries.iter().find(|e| e.0 == p).unwrap().1;
                let at = format!("layer {} head {h} step {step_index}", call.layer);
                let boundary = entries[order[heavy - 1]].1;
                if differs_by_near_ties(&got, &wanted, score_of, boundary, 1e-5, &at) {
                    near_ties += 1;
                }
                follow(entries, &event.kept, |e| e.0);
                checked += 1;
            }
        }
        seen += tokens.len();
    }
    assert!(checked >= STEPS * layers, "{checked} kept sets checked");
    assert!(
        near_ties * 100 <= checked,
        "{near_ties} of {checked} differ by near-ties"
    );
    eprintln!("h2o: {checked} kept sets checked, {near_ties} decided by float-level near-ties");
}

/// LazyEviction (spec §2(b)): per query head, `TS = 0, MRI = 0` for every entry at the first decode
/// step, then `TS = t − 1` for each new entry; an entry whose probability reaches α is important:
/// `MRI ← max(MRI, t − TS)`, `TS ← t`; at steps that are multiples of `W` with more than `Cap` entries,
/// all but the last `W` are scored `2σ(−(1 + (t − TS)/(MRI + 1e−5))) + [MRI > 0]·2σ(−(MRI − 1))` and
/// the top `Cap − W` kept (score order, ties: the lower storage index), then the last `W`.
#[test]
fn lazy_keeps_the_reference_sets_event_by_event() {
    let (m, prompt, forced) = setup();
    let (cap, w, alpha) = (48usize, 8usize, 5e-4f32);
    let s = spec("lazy", cap as f64, &[("window", "8"), ("alpha", "0.0005")]);
    let logs = Logs::default();
    let mut state = spied(&m, &s, &logs);
    let layers = m.transformer.config.num_layers;
    let sigma = |x: f64| 1.0 / (1.0 + (-x).exp());
    // Per layer and cache head: (position, TS, MRI) in storage order.
    let mut reference: Vec<Vec<Vec<(u32, u64, u64)>>> = Vec::new();
    let (mut checked, mut near_ties) = (0usize, 0usize);
    let mut seen = 0usize;
    for (t, tokens) in inputs(&prompt, &forced).iter().enumerate() {
        let events_before = step(&m, &mut state, tokens);
        let calls = take(&logs.probs);
        let trace = &state.trace.as_ref().unwrap()[events_before..];
        seen += tokens.len();
        if t == 0 {
            assert!(trace.is_empty(), "no prefill compression");
            continue;
        }
        assert_eq!(calls.len(), layers, "one attention per layer per step");
        if reference.is_empty() {
            // The first decode step: every entry (the prompt and this token) starts at 0, 0.
            reference =
                vec![vec![(0..seen as u32).map(|p| (p, 0, 0)).collect(); calls[0].shape.0]; layers];
        } else {
            for layer in reference.iter_mut() {
                for head in layer.iter_mut() {
                    head.push(((seen - 1) as u32, t as u64 - 1, 0));
                }
            }
        }
        let t = t as u64;
        for call in &calls {
            let (heads, g, rows, n) = call.shape;
            assert_eq!((g, rows), (1, 1), "per query head, one query");
            assert_eq!(reference[call.layer].len(), heads);
            for (h, entries) in reference[call.layer].iter_mut().enumerate() {
                assert_eq!(entries.len(), n, "layer {} head {h}", call.layer);
                for (e, &p) in entries.iter_mut().zip(&call.probs[h * n..(h + 1) * n]) {
                    if p >= alpha {
                        e.2 = e.2.max(t - e.1);
                        e.1 = t;
                    }
                }
                if n <= cap || !t.is_multiple_of(w as u64) {
                    continue;
                }
                let score = |e: &(u32, u64, u64)| {
                    let (ts, mri) = (e.1 as f64, e.2 as f64);
                    2.0 * sigma(-(1.0 + (t as f64 - ts) / (mri + 1e-5)))
                        + if e.2 > 0 {
                            2.0 * sigma(-(mri - 1.0))
                        } else {
                            0.0
                        }
                };
                let old = n - w;
                let mut order: Vec<usize> = (0..old).collect();
                order.sort_by(|x, y| {
                    score(&entries[*y])
                        .total_cmp(&score(&entries[*x]))
                        .then(x.cmp(y))
                });
                let want: BTreeSet<u32> = order[..cap - w]
                    .iter()
                    .map(|&j| entries[j].0)
                    .chain(entries[old..].iter().map(|e| e.0))
                    .collect();
                let event = trace
                    .iter()
                    .find(|e| e.layer == call.layer && e.head == h)
                    .expect("an eviction step records an event");
                let got: BTreeSet<u32> = event.kept.iter().copied().collect();
                let score_of = |p: u32| score(entries.iter().find(|e| e.0 == p).unwrap());
                let at = format!("layer {} head {h} step {t}", call.layer);
                let boundary = score(&entries[order[cap - w - 1]]);
                if differs_by_near_ties(&got, &want, score_of, boundary, 1e-5, &at) {
                    near_ties += 1;
                }
                follow(entries, &event.kept, |e| e.0);
                checked += 1;
            }
        }
    }
    assert!(
        checked >= (STEPS / w - 4) * layers,
        "{checked} kept sets checked"
    );
    assert!(
        near_ties * 100 <= checked,
        "{near_ties} of {checked} differ by near-ties"
    );
    eprintln!("lazy: {checked} kept sets checked, {near_ties} decided by float-level near-ties");
}

/// RocketKV's stage 2 (spec §3(b), the HF budget split of §3(f)): at every decode step each KV head
/// attends to the `k = B/2` tokens with the highest mean over its group of a softmax of chunk-bound
/// scores: chunks of `s` keys summarised by the per-dimension max of `σ_c·k`, on the `r_dims`
/// dimensions of largest mean `|q|`, with SparQ's temperature per query head; ties go to the lower
/// index. Checked at every step and layer against the choice kvbench made from the same query and keys.
#[test]
fn rocket_attends_to_the_reference_tokens_at_every_step() {
    let (m, prompt, forced) = setup();
    let b = 32usize;
    let s = spec("rocket", b as f64, &[]);
    let logs = Logs::default();
    let mut state = spied(&m, &s, &logs);
    let cfg = &m.transformer.config;
    let (hq, d, layers) = (cfg.num_heads, cfg.head_dim, cfg.num_layers);
    // The budget split (HF path), from the spec's formulas.
    let (s_total, max_new) = ((prompt.len() + STEPS) as f64, STEPS as f64);
    let c = (s_total / b as f64).max(1.0);
    let e = (0.2 + 0.06 * c.log2()).min(0.8);
    let capacity = ((s_total / c.powf(e)).floor()).max((2.0 * max_new).min(s_total));
    let c2 = (capacity / b as f64).max(1.0);
    let root = c2.sqrt().ceil();
    let chunk = if root <= c2 { root as usize } else { 1 };
    let dims = ((d as f64 * chunk as f64 / c2) as usize).clamp(1, d);
    let k = b / 2;
    step(&m, &mut state, &prompt);
    let (mut checked, mut near_ties) = (0usize, 0usize);
    for &tok in &forced {
        step(&m, &mut state, &[tok]);
        let made = take(&logs.selections);
        assert_eq!(made.len(), layers, "a choice per layer per step");
        for sel in &made {
            let heads = sel.keys.len();
            let g = hq / heads;
            for (h, keys) in sel.keys.iter().enumerate() {
                let n = keys.len() / d;
                let q = &sel.query[h * g * d..(h + 1) * g * d];
                let sign: Vec<f64> = (0..d)
                    .map(|cc| {
                        if (0..g).map(|r| q[r * d + cc] as f64).sum::<f64>() > 0.0 {
                            1.0
                        } else {
                            -1.0
                        }
                    })
                    .collect();
                let mag: Vec<f64> = (0..d)
                    .map(|cc| (0..g).map(|r| (q[r * d + cc] as f64).abs()).sum::<f64>() / g as f64)
                    .collect();
                let mut order: Vec<usize> = (0..d).collect();
                order.sort_by(|x, y| mag[*y].total_cmp(&mag[*x]).then(x.cmp(y)));
                let kept_dims = &order[..dims];
                let chunks = n.div_ceil(chunk);
                let bound: Vec<Vec<f64>> = (0..chunks)
                    .map(|bb| {
                        (0..d)
                            .map(|cc| {
                                (bb * chunk..((bb + 1) * chunk).min(n))
                                    .map(|j| sign[cc] * keys[j * d + cc] as f64)
                                    .fold(f64::NEG_INFINITY, f64::max)
                            })
                            .collect()
                    })
                    .collect();
                let mut mean = vec![0f64; n];
                for r in 0..g {
                    let qr = &q[r * d..(r + 1) * d];
                    let kept_l1: f64 = kept_dims.iter().map(|&cc| (qr[cc] as f64).abs()).sum();
                    let all_l1: f64 = qr.iter().map(|x| (*x as f64).abs()).sum();
                    let tau = (d as f64 * kept_l1 / all_l1).sqrt();
                    let z: Vec<f64> = (0..n)
                        .map(|j| {
                            let bb = j / chunk;
                            kept_dims
                                .iter()
                                .map(|&cc| sign[cc] * qr[cc] as f64 * bound[bb][cc])
                                .sum::<f64>()
                                / tau
                        })
                        .collect();
                    let top = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let total: f64 = z.iter().map(|x| (x - top).exp()).sum();
                    for (mm, x) in mean.iter_mut().zip(&z) {
                        *mm += (x - top).exp() / total / g as f64;
                    }
                }
                let mut rank: Vec<usize> = (0..n).collect();
                rank.sort_by(|x, y| mean[*y].total_cmp(&mean[*x]).then(x.cmp(y)));
                let want: BTreeSet<usize> = rank[..k].iter().copied().collect();
                let got: BTreeSet<usize> = sel.chosen[h].iter().copied().collect();
                assert_eq!(got.len(), k, "layer {} head {h}: top-k", sel.layer);
                if got != want {
                    let boundary = mean[rank[k - 1]];
                    for j in got.symmetric_difference(&want) {
                        // Tokens of one chunk tie; the boundary chunk may be split either way only
                        // by float-level differences.
                        assert!(
                            (mean[*j] - boundary).abs() <= 1e-6 * boundary.abs().max(1e-12),
                            "layer {} head {h}: token {j} (score {}, boundary {boundary}) decided differently",
                            sel.layer,
                            mean[*j]
                        );
                    }
                    near_ties += 1;
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, STEPS * layers * cfg.num_kv_heads);
    assert!(
        near_ties * 100 <= checked,
        "{near_ties} of {checked} differ by near-ties"
    );
    eprintln!("rocket: {checked} stage-2 choices checked (chunk {chunk}, {dims} dims, top-{k}), {near_ties} decided by float-level near-ties");
}

/// Kara, as kvbench interprets the abstract (spec §4): every `W_s` generated tokens the window is
/// compressed to `⌈ρ·W_s⌉` entries and the rest of the cache (the prompt and earlier windows) is left
/// exactly as it was; the window's entries are scored by non-causal attention among themselves,
/// `u_j = Σ_{group} Σ_{i ≠ j} p[i, j]`, and Token2Chunk's `⌈γ·keep⌉` seeds (the highest `u`) are
/// always kept; storage stays positional. Checked event by event against scores computed here.
#[test]
fn kara_keeps_the_history_and_the_reference_seeds_event_by_event() {
    let (m, prompt, forced) = setup();
    let (ws, rho, gamma) = (32usize, 0.25f64, 0.5f64);
    let keep = (rho * ws as f64).ceil() as usize;
    let seeds = (gamma * keep as f64).ceil() as usize;
    let s = spec("kara", rho, &[("window", "32")]);
    let cfg = &m.transformer.config;
    let (hq, d) = (cfg.num_heads, cfg.head_dim);
    let logs = Logs {
        caches: Some(Default::default()),
        ..Default::default()
    };
    let mut state = spied(&m, &s, &logs);
    let (mut events, mut checked) = (0usize, 0usize);
    for (generated, tokens) in inputs(&prompt, &forced).iter().enumerate() {
        let events_before = step(&m, &mut state, tokens);
        let caches = take(logs.caches.as_ref().unwrap());
        let trace = &state.trace.as_ref().unwrap()[events_before..];
        events += trace.len();
        for e in trace {
            let (l, h) = (e.layer, e.head);
            let g = hq / state.cache.layer(l).kv_heads();
            // The cache the policy compressed, as it received it.
            let (keys, pos) = &caches.iter().find(|c| c.0 == l).unwrap().1[h];
            let n = pos.len();
            let start = n - ws;
            // The history (prompt and earlier windows) is kept whole and in place.
            assert_eq!(
                &e.kept[..start],
                &pos[..start],
                "layer {l} head {h}: history"
            );
            let window_kept = &e.kept[start..];
            assert_eq!(window_kept.len(), keep, "layer {l} head {h}: ⌈ρ·W⌉");
            assert!(
                window_kept.windows(2).all(|x| x[0] < x[1]),
                "positional order"
            );
            let qw = state.query_windows[l].as_ref().unwrap();
            let q: Vec<f32> = qw.flatten_all().unwrap().to_vec1().unwrap();
            let scale = 1.0 / (d as f64).sqrt();
            let mut u = vec![0f64; ws];
            for k in 0..g {
                for i in 0..ws {
                    let qi = &q[((h * g + k) * ws + i) * d..][..d];
                    let z: Vec<f64> = (0..ws)
                        .map(|jj| {
                            let kj = &keys[(start + jj) * d..(start + jj + 1) * d];
                            qi.iter()
                                .zip(kj)
                                .map(|(a, b)| (*a as f64) * (*b as f64))
                                .sum::<f64>()
                                * scale
                        })
                        .collect();
                    let top = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let total: f64 = z.iter().map(|x| (x - top).exp()).sum();
                    for jj in 0..ws {
                        if jj != i {
                            u[jj] += (z[jj] - top).exp() / total;
                        }
                    }
                }
            }
            let mut order: Vec<usize> = (0..ws).collect();
            order.sort_by(|x, y| u[*y].total_cmp(&u[*x]).then(x.cmp(y)));
            for &jj in &order[..seeds] {
                let near_boundary = (u[jj] - u[order[seeds]]).abs() <= 1e-6 * u[jj].abs();
                assert!(
                    window_kept.contains(&pos[start + jj]) || near_boundary,
                    "layer {l} head {h} step {generated}: seed at window index {jj} (u = {}) was dropped",
                    u[jj]
                );
            }
            checked += 1;
        }
    }
    let heads = cfg.num_kv_heads * cfg.num_layers;
    assert!(events >= heads * (STEPS / ws - 1), "{events} events");
    assert_eq!(events, checked);
    eprintln!("kara: {checked} compressed windows checked ({keep} of {ws} kept, {seeds} seeds)");
}
