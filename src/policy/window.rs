//! Observation-window policies: SnapKV, PyramidKV and R-KV share one machine and differ in presets.
//!
//! At a trigger, the last `window` queries (a rolling query cache, seeded with the last prompt
//! queries) score every cache entry except the last `window` (spec §0.3); the top `B − window`
//! candidates are kept with the window. R-KV mixes in key redundancy (`F = λ·A − (1−λ)·R`, spec §1);
//! PyramidKV gives layer `l` the budget `b_l + window` with `b_l` decreasing linearly (spec §5).
//!
//! Trigger (`mode=decode`, the R-KV repository's cadence): at prefill when the prompt holds at least
//! `B` entries, then at every decode step whose generated-token count is a multiple of `buffer`, when
//! the cache holds at least `B`. The counter is per sequence (the reference's global counter is a
//! documented bug, spec §1(h)6). `mode=prefill` compresses once at prefill, as the originals.

use super::params::{GqaAgg, KeptOrder, Params, Pool, QueryReduce, SoftmaxDomain, WindowMode};
use super::score::{pool, redundancy, top_k, window_scores, GroupLogits};
use super::{AttentionView, Budget, BuildContext, Capabilities, Policy, ScoreRequest, StepInfo};
use crate::cache::LayerCache;
use crate::error::Result;
use rayon::prelude::*;

#[derive(Debug, Clone)]
pub struct Config {
    name: &'static str,
    budget: Budget,
    mode: WindowMode,
    window: usize,
    buffer: usize,
    gqa: GqaAgg,
    domain: SoftmaxDomain,
    reduce: QueryReduce,
    pool: Pool,
    order: KeptOrder,
    /// R-KV: `(λ, cosine threshold)`.
    redundancy: Option<(f32, f32)>,
    /// PyramidKV: β.
    pyramid: Option<usize>,
}

impl Config {
    pub fn parse(name: &str, p: &mut Params, budget: Budget) -> Result<Self> {
        let mode = p.get("mode", WindowMode::Decode)?;
        let original = mode == WindowMode::Prefill;
        let (name, window, gqa, domain, reduce) = match name {
            // The decode-time SnapKV of the R-KV repository; `mode=prefill` is the original's LongBench
            // configuration (window 32, sum, softmax over all keys, per query head).
            "snapkv" if original => (
                "snapkv",
                32,
                GqaAgg::PerQueryHead,
                SoftmaxDomain::AllCausal,
                QueryReduce::Sum,
            ),
            "snapkv" => (
                "snapkv",
                8,
                GqaAgg::MaxLogit,
                SoftmaxDomain::Candidates,
                QueryReduce::Mean,
            ),
            // KVCache-Factory's PyramidKV in its GQA-native "kv-head" mode.
            "pyramidkv" => (
                "pyramidkv",
                8,
                GqaAgg::MeanProb,
                SoftmaxDomain::AllCausal,
                QueryReduce::Sum,
            ),
            _ => (
                "rkv",
                8,
                GqaAgg::MaxLogit,
                SoftmaxDomain::Candidates,
                QueryReduce::Mean,
            ),
        };
        let window = p.positive("window", window)?;
        let buffer = p.positive("buffer", 128)?;
        let gqa = p.get("gqa", gqa)?;
        let domain = p.get("softmax", domain)?;
        let reduce = p.get("reduce", reduce)?;
        let pool = p.get("pool", Pool::max(7))?;
        let order = p.get(
            "order",
            if name == "pyramidkv" {
                KeptOrder::Positional
            } else {
                KeptOrder::Score
            },
        )?;
        let redundancy = if name == "rkv" {
            let lambda = p.get("lambda", 0.1f32)?;
            let threshold = p.get("threshold", 0.5f32)?;
            if !(0.0..=1.0).contains(&lambda) {
                return Err(p.invalid("lambda", "must be in [0, 1]"));
            }
            Some((lambda, threshold))
        } else {
            None
        };
        let pyramid = if name == "pyramidkv" {
            let beta = p.positive("beta", 20)?;
            Some(beta)
        } else {
            None
        };
        Ok(Self {
            name,
            budget,
            mode,
            window,
            buffer,
            gqa,
            domain,
            reduce,
            pool,
            order,
            redundancy,
            pyramid,
        })
    }

    /// The fewest entries kept: the observation window.
    /// Entries held above the budget between compressions at most: the buffer; `None` for
    /// `mode=prefill`, which never evicts a generated entry (its holding grows with the output).
    pub fn slack(&self) -> Option<usize> {
        match self.mode {
            WindowMode::Decode => Some(self.buffer),
            WindowMode::Prefill => None,
        }
    }

    pub fn floor(&self) -> usize {
        self.window
    }

    /// The budget `B` (window included) for a sequence that has seen `seen` tokens.
    fn total(&self, seen: usize) -> usize {
        self.budget.entries(seen).max(self.window)
    }

    /// Layer `l`'s budget (window included): `B`, or PyramidKV's schedule on `B`.
    fn layer_budget(&self, l: usize, layers: usize, seen: usize) -> usize {
        let total = self.total(seen);
        match self.pyramid {
            Some(beta) => pyramid_schedule(total, self.window, beta, l, layers),
            None => total,
        }
    }

    /// Entries layer `l` of `layers` keeps when compressing `n` entries (window included), or `None`
    /// when it keeps them all.
    fn keep(&self, l: usize, layers: usize, n: usize, seen: usize) -> Option<usize> {
        let budget = self.layer_budget(l, layers, seen);
        if n < budget || (self.pyramid.is_some() && n == budget) {
            return None;
        }
        Some(budget)
    }
}

/// PyramidKV's layer budget as kvbench applies it, at every compression in both modes: the schedule
/// of `pyramid_budget` on `B` alone (`n` unbounded), never on the current cache length. Deviation
/// from KVCache-Factory, which clamps the schedule to the prompt length (and falls back to uniform
/// below `2(B − w)` prompt entries) at its one prefill compression: applied to the growing cache at
/// decode triggers, that clamp made every layer keep `B` and no pyramid was ever built.
pub fn pyramid_schedule(b: usize, w: usize, beta: usize, l: usize, layers: usize) -> usize {
    pyramid_budget(b, w, beta, l, layers, usize::MAX / 4)
}

/// PyramidKV's layer budget (KVCache-Factory, integer arithmetic): `b_min = (B−w)/β`,
/// `b_max = 2(B−w) − b_min`, clamped to `n − w`, `b_l = b_max − l·⌊(b_max − b_min)/(L−1)⌋`; layer `l`
/// keeps `b_l + w`. Below `2(B−w)` entries every layer keeps `B`. When `b_max − b_min < L − 1` the
/// integer step is 0 and every layer keeps `b_max + w`, about `2B`: the reference's arithmetic, kept
/// (the achieved ratio in every report shows it).
pub fn pyramid_budget(b: usize, w: usize, beta: usize, l: usize, layers: usize, n: usize) -> usize {
    let span = b.saturating_sub(w) as i64;
    if (n as i64) < 2 * span {
        return b;
    }
    let mut min = span / beta as i64;
    let mut max = 2 * span - min;
    if max >= n as i64 - w as i64 {
        max = n as i64 - w as i64;
        min = 2 * span - max;
    }
    let steps = if layers > 1 {
        (max - min).div_euclid(layers as i64 - 1)
    } else {
        0
    };
    (max - l as i64 * steps).max(0) as usize + w
}

#[derive(Clone)]
pub struct WindowPolicy {
    config: Config,
    layers: usize,
}

/// A compression's shape: `w_q` window queries of dimension `d` per query head, `g` query heads per
/// cache head, `n` entries of which the last `alpha` (the window's) are kept and the first `n_cand`
/// are candidates.
struct Shape {
    w_q: usize,
    d: usize,
    g: usize,
    n: usize,
    alpha: usize,
    n_cand: usize,
}

impl WindowPolicy {
    pub fn new(config: Config, ctx: &BuildContext) -> Self {
        Self {
            config,
            layers: ctx.num_layers,
        }
    }

    /// Kept indices per cache head when compressing layer `l` down to `keep` entries: scored where
    /// the keys are ([`super::device_score`] off the CPU, the host's own loops on it).
    fn select(
        &self,
        queries: &candle_core::Tensor,
        cache: &LayerCache,
        keep: usize,
    ) -> candle_core::Result<Vec<Vec<usize>>> {
        if !cache.buffers().0.device().is_cpu() {
            if let Some(kept) = self.select_on_device(queries, cache, keep)? {
                return Ok(kept);
            }
        }
        self.select_on_host(queries, cache, keep)
    }

    /// The shape of a compression of `cache` scored by the window `queries`.
    fn shape(
        &self,
        queries: &candle_core::Tensor,
        cache: &LayerCache,
    ) -> candle_core::Result<Shape> {
        let (hq, w_q, d) = queries.dims3()?;
        let n = cache.len();
        let alpha = self.config.window.min(n);
        Ok(Shape {
            w_q,
            d,
            g: hq / cache.kv_heads(),
            n,
            alpha,
            n_cand: n - alpha,
        })
    }

    /// The group aggregation a compression uses: any is the sum when a group is one head.
    fn aggregation(&self, g: usize) -> GqaAgg {
        if g == 1 {
            GqaAgg::SumProb
        } else {
            self.config.gqa
        }
    }

    /// One head's kept indices from its candidates' window scores and (R-KV) their redundancy:
    /// pooled, mixed, the top `keep − alpha` in the configured order, then the window's entries.
    fn kept_from_scores(
        &self,
        scores: &[f32],
        redundancy: Option<&[f32]>,
        keep: usize,
        s: &Shape,
    ) -> Vec<usize> {
        let c = &self.config;
        let mut f = pool(scores, c.pool);
        if let (Some((lambda, _)), Some(r)) = (c.redundancy, redundancy) {
            f.iter_mut()
                .zip(r)
                .for_each(|(a, r)| *a = lambda * *a - (1.0 - lambda) * r);
        }
        let mut kept = top_k(&f, keep - s.alpha);
        if c.order == KeptOrder::Positional {
            kept.sort_unstable();
        }
        kept.extend(s.n_cand..s.n);
        kept
    }

    /// [`select`](Self::select) with the scores computed on the keys' device and only the scores
    /// copied to the host (R-KV's redundancy is quadratic in the entries: about 340 MFLOP per head at
    /// 1,152 entries, 17 GFLOP at 8,192). `None` where the device version does not apply (a window
    /// query that sees no key).
    fn select_on_device(
        &self,
        queries: &candle_core::Tensor,
        cache: &LayerCache,
        keep: usize,
    ) -> candle_core::Result<Option<Vec<Vec<usize>>>> {
        let c = &self.config;
        let s = self.shape(queries, cache)?;
        let keys = cache.keys()?;
        let agg = self.aggregation(s.g);
        let Some(scores) =
            super::device_score::window_scores(queries, &keys, s.n_cand, agg, c.domain, c.reduce)?
        else {
            return Ok(None);
        };
        let redundancy = match c.redundancy {
            Some((_, threshold)) => Some(super::device_score::redundancy(&keys, threshold)?),
            None => None,
        };
        Ok(Some(self.kept_from_heads(
            &scores,
            redundancy.as_deref(),
            keep,
            &s,
        )))
    }

    /// Every head's kept indices ([`Self::kept_from_scores`]) from scores computed on a device, by
    /// this policy or for its batch, heads in parallel.
    fn kept_from_heads(
        &self,
        scores: &[Vec<f32>],
        redundancy: Option<&[Vec<f32>]>,
        keep: usize,
        s: &Shape,
    ) -> Vec<Vec<usize>> {
        (0..scores.len())
            .into_par_iter()
            .map(|h| {
                let r = redundancy.map(|r| r[h].as_slice());
                self.kept_from_scores(&scores[h], r, keep, s)
            })
            .collect()
    }

    /// The entries to keep at this call's compression of `layer`, whose cache holds `n` entries;
    /// `None` when this call does not compress (not due, or within the budget).
    fn compression(&self, step: &StepInfo<'_>, layer: usize, n: usize) -> Option<usize> {
        let c = &self.config;
        let due = step.is_prefill
            || (c.mode == WindowMode::Decode && step.generated.is_multiple_of(c.buffer));
        if !due {
            return None;
        }
        c.keep(layer, self.layers, n, step.seen_after())
    }

    /// [`select`](Self::select) from the keys on the host, heads in parallel (each head's choice is
    /// its own).
    fn select_on_host(
        &self,
        queries: &candle_core::Tensor,
        cache: &LayerCache,
        keep: usize,
    ) -> candle_core::Result<Vec<Vec<usize>>> {
        let c = &self.config;
        let s = self.shape(queries, cache)?;
        let (g, w_q, d) = (s.g, s.w_q, s.d);
        let q = crate::host_copy::flat_f32(queries)?;
        let scale = 1.0 / (d as f32).sqrt();
        let agg = self.aggregation(g);
        cache.with_host_keys(|kv| {
            (0..cache.kv_heads())
                .into_par_iter()
                .map(|h| {
                    let qh = &q[h * g * w_q * d..(h + 1) * g * w_q * d];
                    let z = GroupLogits::compute(qh, kv.keys(h), g, d, scale);
                    let scores = window_scores(&z, s.n_cand, agg, c.domain, c.reduce);
                    let r = c
                        .redundancy
                        .map(|(_, threshold)| redundancy(kv.keys(h), d, threshold));
                    self.kept_from_scores(&scores[0], r.as_deref(), keep, &s)
                })
                .collect()
        })
    }
}

impl Policy for WindowPolicy {
    fn fork(&self) -> Option<Box<dyn Policy>> {
        Some(Box::new(self.clone()))
    }

    fn name(&self) -> &str {
        self.config.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            query_window: self.config.window,
            per_query_head: self.config.gqa == GqaAgg::PerQueryHead,
            ..Default::default()
        }
    }

    fn reset(&mut self) {}

    fn after_attention(
        &mut self,
        step: &StepInfo<'_>,
        view: &AttentionView<'_>,
        cache: &mut LayerCache,
    ) -> candle_core::Result<()> {
        let n = cache.len();
        let Some(keep) = self.compression(step, view.layer, n) else {
            return Ok(());
        };
        let Some(queries) = view.query_window else {
            candle_core::bail!("{}: the engine kept no query window", self.config.name);
        };
        let kept = match view.scores {
            Some(scores) => {
                let s = self.shape(queries, cache)?;
                let fits = |v: &[Vec<f32>], len: usize| {
                    v.len() == cache.kv_heads() && v.iter().all(|x| x.len() == len)
                };
                let redundancy_fits = match (&scores.redundancy, self.config.redundancy) {
                    (Some(r), Some(_)) => fits(r, n),
                    (None, None) => true,
                    _ => false,
                };
                if !fits(&scores.window, s.n_cand) || !redundancy_fits {
                    candle_core::bail!(
                        "{}: the batch's scores do not fit layer {}'s cache ({} heads, {n} entries)",
                        self.config.name,
                        view.layer,
                        cache.kv_heads()
                    );
                }
                self.kept_from_heads(&scores.window, scores.redundancy.as_deref(), keep, &s)
            }
            None => self.select(queries, cache, keep)?,
        };
        cache.gather(&kept)
    }

    fn score_request(
        &self,
        step: &StepInfo<'_>,
        layer: usize,
        n: usize,
        group: usize,
    ) -> Option<ScoreRequest> {
        let c = &self.config;
        self.compression(step, layer, n)?;
        Some(ScoreRequest {
            n_cand: n - c.window.min(n),
            agg: self.aggregation(group),
            domain: c.domain,
            reduce: c.reduce,
            redundancy: c.redundancy.map(|(_, threshold)| threshold),
        })
    }

    fn entry_limit(&self, layer: usize, seen: usize, prompt_len: usize) -> Option<usize> {
        let c = &self.config;
        // Each layer's own budget: PyramidKV's upper layers are bounded by their smaller share. Under
        // the growing `seen` rule the schedule moves with every token (its integer step is not
        // monotonic), so there the bound is the largest layer's.
        let bound_layer = match c.budget {
            Budget::Seen(_) => 0,
            _ => layer,
        };
        let per_layer = |seen: usize| c.layer_budget(bound_layer, self.layers, seen);
        match c.mode {
            WindowMode::Decode => Some(per_layer(seen) + c.buffer),
            // Generated tokens are never evicted: only the prompt is bounded.
            WindowMode::Prefill => Some(per_layer(prompt_len) + seen.saturating_sub(prompt_len)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::random;

    /// The scores computed where the keys are (a GPU's path, run here on the CPU's tensors) keep the
    /// entries the host's own loops keep, for R-KV, SnapKV and PyramidKV and the variants of
    /// aggregation, softmax domain, reduction and order, with GQA groups of two.
    #[test]
    fn scoring_on_the_device_keeps_what_the_host_keeps() {
        use candle_core::{Device, Tensor};
        let (heads, g, w, n, d) = (2, 2, 8, 64, 16);
        let variants: [(&str, &[(&str, &str)]); 6] = [
            ("rkv", &[]),
            ("rkv", &[("softmax", "all-causal"), ("reduce", "sum")]),
            ("snapkv", &[]),
            ("snapkv", &[("gqa", "mean-prob"), ("order", "positional")]),
            ("snapkv", &[("gqa", "sum-prob"), ("pool", "avg:5")]),
            ("pyramidkv", &[]),
        ];
        let mut keys = random(heads * n * d, 21);
        // Near copies of earlier keys, so that R-KV's redundancy tells entries apart.
        for h in 0..heads {
            for i in (3..n).step_by(4) {
                for j in 0..d {
                    keys[(h * n + i) * d + j] = keys[(h * n + i / 2) * d + j] + 0.01;
                }
            }
        }
        let keys = Tensor::from_vec(keys, (heads, n, d), &Device::Cpu).unwrap();
        let mut cache = LayerCache::new(heads, d, crate::cache::KvType::F32, &Device::Cpu).unwrap();
        cache.append(&keys, &keys, 0).unwrap();
        let q: Vec<f32> = random(heads * g * w * d, 22)
            .iter()
            .map(|x| 8.0 * x)
            .collect();
        let queries = Tensor::from_vec(q, (heads * g, w, d), &Device::Cpu).unwrap();
        let ctx = BuildContext {
            num_layers: 1,
            head_dim: d,
            max_new_tokens: 256,
            qwen: false,
            delimiters: None,
        };
        for (name, args) in variants {
            let args = args
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let spec = super::super::PolicySpec::new(name, 24.0, args).unwrap();
            let super::super::Config::Window(c) = &spec.config else {
                panic!("{name} is a window policy")
            };
            let p = WindowPolicy::new(c.clone(), &ctx);
            let host = p.select_on_host(&queries, &cache, 24).unwrap();
            let device = p.select_on_device(&queries, &cache, 24).unwrap().unwrap();
            assert_eq!(host, device, "{}", spec.describe());
            assert_eq!(host[0].len(), 24);
        }
    }

    #[test]
    fn pyramid_budgets_match_the_reference_example() {
        // B = 1024, w = 8, L = 32, a long prompt: 1982, 1920, …, 60 (+ w each).
        let b: Vec<usize> = (0..32)
            .map(|l| pyramid_budget(1024, 8, 20, l, 32, 100_000) - 8)
            .collect();
        assert_eq!(b[0], 1982);
        assert_eq!(b[1], 1920);
        assert_eq!(b[31], 60);
        let mean = b.iter().sum::<usize>() as f64 / 32.0;
        assert!((mean - 1021.0).abs() < 1.0, "{mean}");
        // The schedule kvbench applies is the unclamped one, whatever the cache holds.
        assert_eq!(pyramid_schedule(1024, 8, 20, 0, 32), 1990);
        assert_eq!(pyramid_schedule(1024, 8, 20, 31, 32), 68);
        // The reference's clamp on a short prompt: uniform below 2(B − w) entries.
        assert_eq!(pyramid_budget(1024, 8, 20, 5, 32, 1500), 1024);
        assert_eq!(pyramid_budget(1024, 8, 20, 0, 32, 2100), 1990);
        // Clamped (β large, so b_max ≥ n − w): b_max = n − w, b_min = 2(B−w) − b_max.
        assert_eq!(pyramid_budget(1024, 8, 1000, 0, 32, 2035), 2035);
        assert_eq!(
            pyramid_budget(1024, 8, 1000, 31, 32, 2035),
            5 + 8 + (2027 - 5) % 31
        );
    }
}
