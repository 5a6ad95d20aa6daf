//! Choosing the next token: greedy (argmax, lowest index on ties) or temperature with nucleus (top-p)
//! sampling from a per-sample seeded ChaCha8 stream, whose output is stable across platforms and
//! crate versions, so a recorded seed reproduces a sample.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Decoding settings of one sample.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// A sampler with its own random stream.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// Each id's unnormalized probability, in id order.
    probs: Vec<f32>,
    /// The ids sorted for the nucleus, with their probabilities.
    scratch: Vec<(f32, u32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        Self {
            params,
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            probs: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Whether draws take the largest logit (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.params.temperature <= 0.0
    }

    /// The next token; an error when a logit is NaN or infinite (nothing sensible can be drawn).
    pub fn sample(&mut self, logits: &[f32]) -> crate::Result<u32> {
        if let Some((token, value)) = first_non_finite(logits) {
            return Err(crate::Error::NonFiniteLogits { token, value });
        }
        Ok(self.draw(logits))
    }

    fn draw(&mut self, logits: &[f32]) -> u32 {
        if self.is_greedy() {
            return crate::model::llama::argmax(logits);
        }
        let t = self.params.temperature;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        self.probs.clear();
        let mut total = 0.0f32;
        for &l in logits {
            let p = ((l - max) / t).exp();
            total += p;
            self.probs.push(p);
        }
        let top_p = self.params.top_p.clamp(0.0, 1.0);
        let cutoff = top_p * total;
        // The nucleus is a prefix of the ids ordered by descending probability (ascending id on ties).
        // The ids below τ = (1 − top_p)·total / n hold at most (1 − top_p)·total together, so the
        // nucleus lies among the ids at or above τ, themselves a prefix of that order: only they are
        // sorted (those of non-negligible probability, not the whole vocabulary: see the README for
        // the time this saves). Should rounding leave their mass short of the cutoff, all are sorted.
        // Either way the prefix, its sums and the draw are those of sorting everything.
        let n = self.probs.len();
        let tau = (1.0 - top_p) * total / n as f32;
        let (kept, mass) = match self.nucleus(|p| p >= tau, cutoff) {
            Ok(found) => found,
            // Every id was a candidate (top-p 1): all are kept, as sorting everything keeps them.
            Err(all) if self.scratch.len() == n => (n, all),
            Err(_) => self
                .nucleus(|_| true, cutoff)
                .unwrap_or_else(|all| (n, all)),
        };
        let mut r = self.rng.random::<f32>() * mass;
        for &(p, id) in &self.scratch[..kept] {
            if r < p {
                return id;
            }
            r -= p;
        }
        self.scratch[kept - 1].1
    }

    /// Sorts the ids whose probability passes `keep` (descending probability, ascending id on ties)
    /// into `scratch`, and returns how many of them reach `cutoff` and their mass, or, when all of
    /// them together stay below it, `Err` with their whole mass.
    fn nucleus(&mut self, keep: impl Fn(f32) -> bool, cutoff: f32) -> Result<(usize, f32), f32> {
        self.scratch.clear();
        self.scratch.extend(
            self.probs
                .iter()
                .enumerate()
                .filter(|(_, &p)| keep(p))
                .map(|(i, &p)| (p, i as u32)),
        );
        self.scratch
            .sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut mass = 0.0f32;
        for (k, &(p, _)) in self.scratch.iter().enumerate() {
            mass += p;
            if mass >= cutoff {
                return Ok((k + 1, mass));
            }
        }
        Err(mass)
    }
}

/// The first logit that is NaN or infinite, if any. One branch-free pass (vectorized) over the
/// vocabulary, then a search only when something is wrong.
fn first_non_finite(logits: &[f32]) -> Option<(usize, f32)> {
    if logits.iter().fold(true, |ok, x| ok & x.is_finite()) {
        return None;
    }
    logits
        .iter()
        .copied()
        .enumerate()
        .find(|(_, x)| !x.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_lowest_index_on_ties() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.0, 3.0, 3.0, 1.0]).unwrap(), 1);
    }

    #[test]
    fn same_seed_same_samples_and_top_p_restricts_support() {
        let logits = [2.0, 1.9, 0.0, -1.0, -5.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.6,
            seed: 7,
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..200).map(|_| s.sample(&logits).unwrap()).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..200).map(|_| s.sample(&logits).unwrap()).collect()
        };
        assert_eq!(a, b);
        // the two top tokens hold ~0.74 of the mass, so top-p 0.6 keeps only them
        assert!(a.iter().all(|&x| x <= 1));
        assert!(a.contains(&0) && a.contains(&1));
    }

    #[test]
    fn a_non_finite_logit_is_an_error_not_a_token() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for temperature in [0.0, 0.7] {
                let mut s = Sampler::new(SamplingParams {
                    temperature,
                    top_p: 0.9,
                    seed: 1,
                });
                let mut logits = vec![0.5f32; 100];
                logits[37] = bad;
                match s.sample(&logits) {
                    Err(crate::Error::NonFiniteLogits { token: 37, value }) => {
                        assert!(value.is_nan() == bad.is_nan())
                    }
                    other => panic!("{bad} at temperature {temperature}: {other:?}"),
                }
            }
        }
    }

    /// The draw as kvbench 0.4.0 made it: every id sorted, every time.
    fn sort_everything(logits: &[f32], params: SamplingParams, rng: &mut ChaCha8Rng) -> u32 {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut all: Vec<(f32, u32)> = Vec::new();
        let mut total = 0.0f32;
        for (i, &l) in logits.iter().enumerate() {
            let p = ((l - max) / params.temperature).exp();
            total += p;
            all.push((p, i as u32));
        }
        all.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let cutoff = params.top_p.clamp(0.0, 1.0) * total;
        let (mut kept, mut mass) = (0, 0.0);
        for &(p, _) in &all {
            mass += p;
            kept += 1;
            if mass >= cutoff {
                break;
            }
        }
        let mut r = rng.random::<f32>() * mass;
        for &(p, id) in &all[..kept] {
            if r < p {
                return id;
            }
            r -= p;
        }
        all[kept - 1].1
    }

    #[test]
    fn the_nucleus_from_the_ids_above_the_bound_draws_what_sorting_everything_draws() {
        let mut gen = ChaCha8Rng::seed_from_u64(99);
        let mut draws = 0;
        for case in 0..120 {
            let n = [1usize, 2, 7, 1000, 5000][case % 5];
            // Peaked, flat, coarse (many exact ties), and wide logits.
            let logits: Vec<f32> = (0..n)
                .map(|_| match case % 4 {
                    0 => 20.0 * gen.random::<f32>().powi(8) - 5.0,
                    1 => 0.0,
                    2 => (gen.random::<f32>() * 4.0).floor(),
                    _ => gen.random::<f32>() * 200.0 - 100.0,
                })
                .collect();
            for top_p in [0.0, 0.3, 0.9, 0.95, 0.999, 1.0] {
                for temperature in [0.1, 0.6, 1.0, 5.0] {
                    let params = SamplingParams {
                        temperature,
                        top_p,
                        seed: case as u64,
                    };
                    let mut fast = Sampler::new(params);
                    let mut reference = ChaCha8Rng::seed_from_u64(params.seed);
                    for step in 0..5 {
                        let want = sort_everything(&logits, params, &mut reference);
                        let got = fast.sample(&logits).unwrap();
                        assert_eq!(
                            got, want,
                            "case {case} n {n} top-p {top_p} t {temperature} step {step}"
                        );
                        draws += 1;
                    }
                }
            }
        }
        assert_eq!(draws, 120 * 6 * 4 * 5);
    }

    #[test]
    fn argmax_is_the_first_index_of_the_maximum_as_a_running_comparison_finds_it() {
        let running = |l: &[f32]| {
            let mut best = 0;
            for (i, &x) in l.iter().enumerate() {
                if x > l[best] {
                    best = i;
                }
            }
            best as u32
        };
        let mut gen = ChaCha8Rng::seed_from_u64(7);
        let special = [0.0, -0.0, f32::NEG_INFINITY, f32::NAN, f32::MAX, -f32::MAX];
        for case in 0..3000 {
            let n = 1 + gen.random_range(0..100usize) + [0, 16, 151_835][case % 3];
            let logits: Vec<f32> = (0..n)
                .map(|_| match gen.random_range(0..10) {
                    0 => special[gen.random_range(0..special.len())],
                    1..=4 => gen.random_range(0..4) as f32,
                    _ => gen.random::<f32>() * 10.0 - 5.0,
                })
                .collect();
            assert_eq!(
                crate::model::llama::argmax(&logits),
                running(&logits),
                "case {case}: {:?}",
                &logits[..n.min(40)]
            );
        }
    }
}
