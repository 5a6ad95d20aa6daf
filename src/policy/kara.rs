//! Kara (arXiv 2607.01237), **an interpretation**: only the abstract of the paper could be read, so
//! everything below is the spec's marked INTERPRETATION (§4), with every interpreted choice a
//! parameter so that it can be corrected once the method text is available.
//!
//! Cache layout per layer and KV head: `[prompt, kept intact][frozen history H][active window A]`.
//! Whenever `A` holds `window` generated entries, it is compressed to `ceil(ρ·window)` entries, with
//! `ρ` the budget fraction, appended to `H` (never re-scored), and emptied. Scores are bidirectional
//! inside the window: the window's own queries attend non-causally over the window's keys, softmax
//! per query row, and entry `j` is scored by the probability mass every other window query gives it,
//! summed over the GQA group. Token2Chunk then grows the top `ceil(γ·kept)` seeds left and right while
//! a neighbour scores at least `τ` times its seed, up to `max_chunk` tokens, never across a delimiter
//! token (newline or punctuation ends a chunk), and fills the rest with the best isolated tokens.
//! Kept entries are stored in positional order. Memory grows as `prompt + ρ·generated + window`.

use super::params::Params;
use super::score::{softmax, top_k, GroupLogits};
use super::{layer_slot, AttentionView, Budget, BuildContext, Capabilities, Policy, StepInfo};
use crate::cache::LayerCache;
use crate::error::Result;
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct Config {
    /// Retention ratio ρ (the budget fraction).
    rho: f64,
    window: usize,
    gamma: f64,
    tau: f32,
    max_chunk: usize,
}

impl Config {
    pub fn parse(p: &mut Params, budget: Budget) -> Result<Self> {
        // Kara's own budget is its retention ratio ρ. An absolute budget B is read as
        // ρ = B / (the full run's mean generation length), so it is resolved before Kara is built
        // (`PolicySpec::resolve`); until then ρ is a placeholder that is never run.
        let rho = match budget {
            Budget::Ratio(r) | Budget::Seen(r) => r,
            Budget::Entries(_) | Budget::Held(_) => 1.0,
        };
        let window = p.positive("window", 128)?;
        let gamma = p.get("gamma", 0.5f64)?;
        if !(0.0..=1.0).contains(&gamma) {
            return Err(p.invalid("gamma", "must be in [0, 1]"));
        }
        let max_chunk = p.positive("max_chunk", 8)?;
        Ok(Self {
            rho,
            window,
            gamma,
            tau: p.get("tau", 0.5f32)?,
            max_chunk,
        })
    }

    /// The window size (its active part averages half of it).
    pub fn window(&self) -> usize {
        self.window
    }

    /// Entries a full window keeps.
    fn keep(&self) -> usize {
        ((self.rho * self.window as f64).ceil() as usize).min(self.window)
    }
}

/// Token2Chunk over one window's scores `u`: positional indices of the `keep` entries kept.
/// `delimiter[j]`: entry `j` ends a phrase.
pub fn token_to_chunk(
    u: &[f32],
    delimiter: &[bool],
    keep: usize,
    gamma: f64,
    tau: f32,
    max_chunk: usize,
) -> Vec<usize> {
    let w = u.len();
    let keep = keep.min(w);
    let seeds = ((gamma * keep as f64).ceil() as usize).clamp(1.min(keep), keep);
    let mut taken = vec![false; w];
    let mut count = 0;
    let take = |j: usize, taken: &mut Vec<bool>, count: &mut usize| {
        taken[j] = true;
        *count += 1;
    };
    // Every seed is kept first (spec §4 step 4: the top seeds, then growth within what is left),
    // so that one seed's chunk cannot use up the budget before the others are taken.
    let seed_list = top_k(u, seeds);
    for &seed in &seed_list {
        take(seed, &mut taken, &mut count);
    }
    for seed in seed_list {
        if count >= keep {
            break;
        }
        let floor = tau * u[seed];
        let (mut lo, mut hi) = (seed, seed);
        // Right: a delimiter closes the chunk it ends.
        while count < keep
            && hi - lo + 1 < max_chunk
            && !delimiter[hi]
            && hi + 1 < w
            && !taken[hi + 1]
            && u[hi + 1] >= floor
        {
            hi += 1;
            take(hi, &mut taken, &mut count);
        }
        // Left: a delimiter before the chunk belongs to the previous phrase.
        while count < keep
            && hi - lo + 1 < max_chunk
            && lo > 0
            && !taken[lo - 1]
            && !delimiter[lo - 1]
            && u[lo - 1] >= floor
        {
            lo -= 1;
            take(lo, &mut taken, &mut count);
        }
    }
    // Fill with the best isolated tokens.
    for j in top_k(u, w) {
        if count >= keep {
            break;
        }
        if !taken[j] {
            take(j, &mut taken, &mut count);
        }
    }
    (0..w).filter(|&j| taken[j]).collect()
}

#[derive(Clone)]
pub struct Kara {
    config: Config,
    delimiters: Option<Arc<Vec<bool>>>,
    /// Token id at every logical position of the sequence.
    tokens: Vec<u32>,
    /// Per layer: entries in the frozen history.
    history: Vec<usize>,
}

impl Kara {
    pub fn new(config: Config, ctx: &BuildContext) -> Self {
        Self {
            config,
            delimiters: ctx.delimiters.clone(),
            tokens: Vec::new(),
            history: Vec::new(),
        }
    }
}

impl Policy for Kara {
    fn fork(&self) -> Option<Box<dyn Policy>> {
        Some(Box::new(self.clone()))
    }

    fn name(&self) -> &str {
        "kara"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            query_window: self.config.window,
            ..Default::default()
        }
    }

    fn reset(&mut self) {
        self.tokens.clear();
        self.history.clear();
    }

    fn after_attention(
        &mut self,
        step: &StepInfo<'_>,
        view: &AttentionView<'_>,
        cache: &mut LayerCache,
    ) -> candle_core::Result<()> {
        if view.layer == 0 {
            self.tokens.extend_from_slice(step.tokens);
        }
        if step.is_prefill {
            return Ok(());
        }
        let ws = self.config.window;
        let n = cache.len();
        let frozen = step.prompt_len + *layer_slot(&mut self.history, view.layer);
        if n - frozen < ws {
            return Ok(());
        }
        let Some(queries) = view.query_window else {
            candle_core::bail!("kara: the engine kept no query window");
        };
        let (hq, w_q, d) = queries.dims3()?;
        if w_q != ws {
            candle_core::bail!("kara: query window holds {w_q} queries, expected {ws}");
        }
        let q = crate::host_copy::flat_f32(queries)?;
        let heads = cache.kv_heads();
        let g = hq / heads;
        let scale = 1.0 / (d as f32).sqrt();
        let start = n - ws;
        let keep = self.config.keep();
        let c = &self.config;
        let delimiters = self.delimiters.as_deref();
        let tokens = &self.tokens;
        let kept = cache.with_host_keys(|kv| {
            (0..heads)
                .map(|h| {
                    let keys = &kv.keys(h)[start * d..];
                    let mut z = GroupLogits::compute(
                        &q[h * g * ws * d..(h + 1) * g * ws * d],
                        keys,
                        g,
                        d,
                        scale,
                    );
                    // Non-causal: every window query sees every window key.
                    let mut u = vec![0f32; ws];
                    for (row_idx, row) in z.z.chunks_exact_mut(ws).enumerate() {
                        softmax(row);
                        let i = row_idx % ws;
                        for (j, &p) in row.iter().enumerate() {
                            if j != i {
                                u[j] += p;
                            }
                        }
                    }
                    let delim: Vec<bool> = cache.positions(h)[start..n]
                        .iter()
                        .map(|&pos| {
                            delimiters.is_some_and(|t| {
                                tokens
                                    .get(pos as usize)
                                    .is_some_and(|&id| t.get(id as usize).copied().unwrap_or(false))
                            })
                        })
                        .collect();
                    let chosen = token_to_chunk(&u, &delim, keep, c.gamma, c.tau, c.max_chunk);
                    (0..start)
                        .chain(chosen.into_iter().map(|j| start + j))
                        .collect()
                })
                .collect::<Vec<Vec<usize>>>()
        })?;
        *layer_slot(&mut self.history, view.layer) += keep;
        cache.gather(&kept)
    }

    fn state_bytes(&self) -> usize {
        super::vec_bytes(&self.tokens) + super::vec_bytes(&self.history)
    }

    fn entry_limit(&self, _layer: usize, seen: usize, prompt_len: usize) -> Option<usize> {
        if prompt_len == 0 {
            return None;
        }
        let generated = seen.saturating_sub(prompt_len);
        let c = &self.config;
        Some(prompt_len + c.keep() * (generated / c.window) + c.window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_to_chunk_grows_seeds_and_stops_at_delimiters() {
        // Scores: a peak at 3 with strong neighbours 2 and 4; entry 4 is a delimiter (ends a phrase).
        let u = [0.1, 0.2, 0.8, 1.0, 0.9, 0.85, 0.05, 0.3];
        let mut delim = vec![false; 8];
        delim[4] = true;
        // keep 4, one seed (γ = 0.25): chunk grows right to the delimiter, then left to 2; the rest
        // is filled with the best isolated token (5 is blocked from the chunk by the delimiter).
        let kept = token_to_chunk(&u, &delim, 4, 0.25, 0.5, 8);
        assert_eq!(kept, vec![2, 3, 4, 5]);
        // Without delimiters and max_chunk 2 the chunk is 3..=4, then fills 5 and 2.
        let kept = token_to_chunk(&u, &[false; 8], 4, 0.25, 0.5, 2);
        assert_eq!(kept, vec![2, 3, 4, 5]);
        // τ above every neighbour ratio: no growth, only isolated tokens.
        let kept = token_to_chunk(&u, &[false; 8], 3, 0.3, 2.0, 8);
        assert_eq!(kept, vec![3, 4, 5]);
        assert_eq!(
            token_to_chunk(&u, &delim, 0, 0.5, 0.5, 8),
            Vec::<usize>::new()
        );
        // A delimiter to the left stops leftward growth: the slot goes to the best isolated token.
        let u = [0.1, 0.2, 0.6, 1.0, 0.3, 0.1, 0.05, 0.7];
        assert_eq!(token_to_chunk(&u, &[false; 8], 2, 0.5, 0.5, 8), vec![2, 3]);
        let mut d2 = vec![false; 8];
        d2[2] = true;
        assert_eq!(token_to_chunk(&u, &d2, 2, 0.5, 0.5, 8), vec![3, 7]);
        // Every seed is kept before any grows: keep 4 with two seeds (3 and 7), the first seed's
        // strong neighbours cannot crowd out the second (before 0.4: [2, 3, 4, 5]).
        let u = [0.1, 0.9, 0.95, 1.0, 0.97, 0.96, 0.05, 0.99];
        assert_eq!(
            token_to_chunk(&u, &[false; 8], 4, 0.5, 0.5, 8),
            vec![3, 4, 5, 7]
        );
    }
}
