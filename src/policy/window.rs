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
use super::{host_vec, AttentionView, Budget, BuildContext, Capabilities, Policy, StepInfo};
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
/// of [`pyramid_budget`] on `B` alone (`n` unbounded), never on the current cache length. Deviation
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

impl WindowPolicy {
    pub fn new(config: Config, ctx: &BuildContext) -> Self {
        Self {
            config,
            layers: ctx.num_layers,
        }
    }

    /// Kept indices per cache head when compressing layer `l` down to `keep` entries.
    fn select(
        &self,
        queries: &candle_core::Tensor,
        cache: &LayerCache,
        keep: usize,
    ) -> candle_core::Result<Vec<Vec<usize>>> {
        let c = &self.config;
        let (hq, w_q, d) = queries.dims3()?;
        let q = host_vec(queries)?;
        let heads = cache.kv_heads();
        let g = hq / heads;
        let n = cache.len();
        let alpha = c.window.min(n);
        let n_cand = n - alpha;
        let scale = 1.0 / (d as f32).sqrt();
        // R-KV's redundancy is quadratic in the entries (about 340 MFLOP per head at 1,152 entries,
        // 17 GFLOP at 8,192): off the CPU it is computed where the keys are.
        let on_device = match c.redundancy {
            Some((_, threshold)) if !cache.buffers().0.device().is_cpu() => {
                Some(super::device_score::redundancy(&cache.keys()?, threshold)?)
            }
            _ => None,
        };
        // Heads in parallel: each head's choice is its own.
        cache.with_host_keys(|kv| {
            (0..heads)
                .into_par_iter()
                .map(|h| {
                    let qh = &q[h * g * w_q * d..(h + 1) * g * w_q * d];
                    let z = GroupLogits::compute(qh, kv.keys(h), g, d, scale);
                    let agg = if g == 1 { GqaAgg::SumProb } else { c.gqa };
                    let scores = window_scores(&z, n_cand, agg, c.domain, c.reduce);
                    let mut f = pool(&scores[0], c.pool);
                    if let Some((lambda, threshold)) = c.redundancy {
                        let host;
                        let r: &[f32] = match &on_device {
                            Some(r) => &r[h],
                            None => {
                                host = redundancy(kv.keys(h), d, threshold);
                                &host
                            }
                        };
                        f.iter_mut()
                            .zip(r)
                            .for_each(|(a, r)| *a = lambda * *a - (1.0 - lambda) * r);
                    }
                    let mut kept = top_k(&f, keep - alpha);
                    if c.order == KeptOrder::Positional {
                        kept.sort_unstable();
                    }
                    kept.extend(n_cand..n);
                    kept
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
        let c = &self.config;
        let due = step.is_prefill
            || (c.mode == WindowMode::Decode && step.generated.is_multiple_of(c.buffer));
        if !due {
            return Ok(());
        }
        let n = cache.len();
        let Some(keep) = c.keep(view.layer, self.layers, n, step.seen_after()) else {
            return Ok(());
        };
        let Some(queries) = view.query_window else {
            candle_core::bail!("{}: the engine kept no query window", c.name);
        };
        let kept = self.select(queries, cache, keep)?;
        cache.gather(&kept)
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
