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
    scratch: Vec<(f32, u32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        Self {
            params,
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            scratch: Vec::new(),
        }
    }

    /// The next token; an error when a logit is NaN or infinite (nothing sensible can be drawn).
    pub fn sample(&mut self, logits: &[f32]) -> crate::Result<u32> {
        if let Some((token, value)) = first_non_finite(logits) {
            return Err(crate::Error::NonFiniteLogits { token, value });
        }
        Ok(self.draw(logits))
    }

    fn draw(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature <= 0.0 {
            return crate::model::llama::argmax(logits);
        }
        let t = self.params.temperature;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        self.scratch.clear();
        let mut total = 0.0f32;
        for (i, &l) in logits.iter().enumerate() {
            let p = ((l - max) / t).exp();
            total += p;
            self.scratch.push((p, i as u32));
        }
        // Descending probability, ascending id on ties: deterministic order.
        self.scratch
            .sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let cutoff = self.params.top_p.clamp(0.0, 1.0) * total;
        let mut kept = 0;
        let mut mass = 0.0;
        for &(p, _) in &self.scratch {
            mass += p;
            kept += 1;
            if mass >= cutoff {
                break;
            }
        }
        let mut r = self.rng.random::<f32>() * mass;
        for &(p, id) in &self.scratch[..kept] {
            if r < p {
                return id;
            }
            r -= p;
        }
        self.scratch[kept - 1].1
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
}
