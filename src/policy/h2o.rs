//! H2O, the Heavy-Hitter Oracle (Zhang et al. 2023): every entry accumulates the attention it receives
//! from every query (prompt rows at prefill, then each decode step); after every step the cache is
//! trimmed to the budget: the `heavy` highest accumulators among the older entries plus the `recent`
//! newest entries. Survivors carry their sums (never recomputed); a new entry starts with its first
//! column sum. Kept order is positional, as in the original.
//!
//! Granularity: the original scores per head of MHA models. For GQA models kvbench scores per KV head
//! by default, summing the probabilities of the group's query heads (`gqa=sum-prob`, GQA-native
//! memory); `gqa=per-query-head` stores keys per query head and reproduces the per-head selection.

use super::params::{GqaAgg, Params};
use super::{layer_slot, AttentionView, Budget, Capabilities, Policy, StepInfo};
use crate::cache::LayerCache;
use crate::error::Result;

#[derive(Debug, Clone)]
pub struct Config {
    budget: Budget,
    /// Share of the budget given to heavy hitters (the rest is the recent window).
    heavy_ratio: f64,
    gqa: GqaAgg,
}

impl Config {
    pub fn parse(p: &mut Params, budget: Budget) -> Result<Self> {
        let heavy_ratio = p.get("heavy_ratio", 0.5f64)?;
        if !(0.0..=1.0).contains(&heavy_ratio) {
            return Err(p.invalid("heavy_ratio", "must be in [0, 1]"));
        }
        let gqa = p.get("gqa", GqaAgg::SumProb)?;
        if gqa == GqaAgg::MaxLogit {
            return Err(p.invalid(
                "gqa",
                "H2O accumulates probabilities: use sum-prob, mean-prob or per-query-head",
            ));
        }
        Ok(Self {
            budget,
            heavy_ratio,
            gqa,
        })
    }

    /// `(heavy, recent)` entries for a sequence that has seen `seen` tokens.
    fn split(&self, seen: usize) -> (usize, usize) {
        let total = self.budget.entries(seen).max(1);
        let heavy = ((total as f64) * self.heavy_ratio).floor() as usize;
        let heavy = heavy.min(total - 1);
        (heavy, total - heavy)
    }
}

#[derive(Clone)]
pub struct H2o {
    config: Config,
    /// Per layer, per cache head: accumulated attention of each entry, in storage order (empty for
    /// a layer whose cache holds them: [`Policy::accumulation`]).
    acc: Vec<Vec<Vec<f32>>>,
    /// Query heads per cache head, once the first call told it.
    group: Option<usize>,
}

impl H2o {
    pub fn new(config: Config) -> Self {
        Self {
            config,
            acc: Vec::new(),
            group: None,
        }
    }

    /// What each query head's probability counts for: 1, or one over the group under `mean-prob`.
    fn norm(&self, group: usize) -> f32 {
        match self.config.gqa {
            GqaAgg::MeanProb => 1.0 / group as f32,
            _ => 1.0,
        }
    }

    /// Per head, the entries kept out of `acc[h]`'s: the `heavy` highest among all but the `recent`
    /// newest (in position order), then those.
    fn kept(acc: &[Vec<f32>], heavy: usize, recent: usize) -> Vec<Vec<usize>> {
        acc.iter()
            .map(|a| {
                let old = a.len() - recent;
                let mut top = super::score::top_k(&a[..old], heavy);
                top.sort_unstable();
                top.extend(old..a.len());
                top
            })
            .collect()
    }

    /// Step 2 where the engine accumulated this step's attention into the cache's scores: evicts
    /// the entry it chose per head when one is over the budget, or (more over it: a budget that
    /// shrank) trims from the scores copied to the host.
    fn trim_accumulated(
        &self,
        step: &StepInfo<'_>,
        evict: &[u32],
        cache: &mut LayerCache,
    ) -> candle_core::Result<()> {
        let (heavy, recent) = self.config.split(step.seen_after());
        let n = cache.len();
        if n <= heavy + recent {
            return Ok(());
        }
        let old = n - recent;
        if let Some(e) = evict.iter().find(|&&e| e as usize >= old) {
            candle_core::bail!("h2o: the engine chose entry {e} of {old} it may evict");
        }
        let kept = match n - (heavy + recent) {
            1 => evict
                .iter()
                .map(|&e| (0..n).filter(|&j| j != e as usize).collect())
                .collect(),
            _ => Self::kept(&cache.read_scores()?, heavy, recent),
        };
        cache.gather(&kept)
    }
}

impl Policy for H2o {
    fn fork(&self) -> Option<Box<dyn Policy>> {
        Some(Box::new(self.clone()))
    }

    fn name(&self) -> &str {
        "h2o"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            attention_probs: true,
            per_query_head: self.config.gqa == GqaAgg::PerQueryHead,
            group_sum_probs: self.config.gqa != GqaAgg::PerQueryHead,
            ..Default::default()
        }
    }

    fn reset(&mut self) {
        self.acc.clear();
    }

    fn after_attention(
        &mut self,
        step: &StepInfo<'_>,
        view: &AttentionView<'_>,
        cache: &mut LayerCache,
    ) -> candle_core::Result<()> {
        if let Some(evict) = view.accumulated {
            return self.trim_accumulated(step, evict, cache);
        }
        // Scores the cache held (a device batch's, `accumulation`) come back here first, but for
        // this step's new entries, which start at zero below (a pooled step that did not
        // accumulate left their slots as they were).
        if let Some(mut held) = cache.take_scores()? {
            let m = cache.len() - step.tokens.len();
            held.iter_mut().for_each(|h| h.truncate(m));
            *layer_slot(&mut self.acc, view.layer) = held;
        }
        let ((heads, g, t, n), p) = super::host_probs(view, "h2o")?;
        // The group's size: `g`, unless the engine summed each group already (`group_sum_probs`).
        let group = view.queries.dim(0)? / heads;
        self.group = Some(group);
        let norm = self.norm(group);
        let acc = layer_slot(&mut self.acc, view.layer);
        acc.resize(heads, Vec::new());
        // 1. Accumulate this step's column sums (new entries start at zero): each query row's sum
        //    over the group first, in the group's order (the engine's own sum, when it gives one: a
        //    group of one, added as it is, the same bits as a sum from zero).
        let mut col = vec![0f32; if g > 1 { n } else { 0 }];
        for (h, a) in acc.iter_mut().enumerate() {
            a.resize(n, 0.0);
            let head = &p[h * g * t * n..(h + 1) * g * t * n];
            for r in 0..t {
                let row = |j: usize| &head[(j * t + r) * n..][..n];
                let sum = if g == 1 {
                    row(0)
                } else {
                    col.fill(0.0);
                    for j in 0..g {
                        col.iter_mut().zip(row(j)).for_each(|(c, &q)| *c += q);
                    }
                    &col[..]
                };
                a.iter_mut().zip(sum).for_each(|(x, &c)| *x += c * norm);
            }
        }
        // 2. Trim to heavy hitters + recent.
        let (heavy, recent) = self.config.split(step.seen_after());
        if n <= heavy + recent {
            return Ok(());
        }
        let kept = Self::kept(acc, heavy, recent);
        for (a, k) in acc.iter_mut().zip(&kept) {
            *a = k.iter().map(|&j| a[j]).collect();
        }
        cache.gather(&kept)
    }

    fn accumulation(&self, step: &StepInfo<'_>) -> Option<super::Accumulation> {
        // A decoding step's one row (prefill's many stay on the host). Under per-query-head storage
        // each cache head is a query head, a group of one.
        if step.is_prefill || step.tokens.len() != 1 {
            return None;
        }
        let (heavy, recent) = self.config.split(step.seen_after());
        Some(super::Accumulation::Sum {
            norm: self.norm(self.group?),
            keep: heavy + recent,
            recent,
        })
    }

    fn take_accumulated(
        &mut self,
        _step: &StepInfo<'_>,
        layer: usize,
        _heads: usize,
        _n: usize,
    ) -> Vec<Vec<f32>> {
        self.acc
            .get_mut(layer)
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn state_bytes(&self) -> usize {
        self.acc
            .iter()
            .flat_map(|layer| layer.iter().map(|h| super::vec_bytes(h)))
            .sum()
    }

    fn entry_limit(&self, _layer: usize, seen: usize, _prompt_len: usize) -> Option<usize> {
        let (heavy, recent) = self.config.split(seen);
        Some(heavy + recent)
    }
}
