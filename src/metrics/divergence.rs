//! What a policy does to the model's next-token distribution and to its output, with no grader
//! involved: KL divergence from the full cache's distribution, top-1 agreement, the rank of full's
//! token, and the repetition of an output (compression that makes a model loop shows up here).

/// Log-softmax in f64.
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    let log_z = max + sum.ln();
    logits.iter().map(|&x| x as f64 - log_z).collect()
}

/// KL(p ‖ q) in nats, where p and q are the softmax distributions of two logit vectors: how much
/// information is lost when the compressed model's `q` stands in for the full model's `p`.
pub fn kl_from_logits(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    assert_eq!(p_logits.len(), q_logits.len(), "vocabularies differ");
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    let kl: f64 = lp
        .iter()
        .zip(&lq)
        .map(|(&a, &b)| {
            if a == f64::NEG_INFINITY {
                0.0
            } else {
                a.exp() * (a - b)
            }
        })
        .sum();
    // Rounding can leave a tiny negative for equal distributions.
    kl.max(0.0)
}

/// The index of the largest logit (the first one on ties): the greedy token, as the sampler picks it.
pub use crate::model::llama::argmax;

/// Rank of `token` under `logits`: how many tokens have a strictly larger logit (0: the top).
pub fn rank_of(logits: &[f32], token: u32) -> usize {
    let x = logits[token as usize];
    logits.iter().filter(|&&y| y > x).count()
}

/// Share of the `n`-gram windows among the last `span` tokens that repeat a window seen earlier in that
/// span: 0 for text without repeats, close to 1 for a loop.
pub fn repetition(tokens: &[u32], n: usize, span: usize) -> f64 {
    let tail = &tokens[tokens.len().saturating_sub(span)..];
    if n == 0 || tail.len() < n {
        return 0.0;
    }
    let windows = tail.len() - n + 1;
    let mut seen = std::collections::HashSet::with_capacity(windows);
    let repeated = tail.windows(n).filter(|w| !seen.insert(*w)).count();
    repeated as f64 / windows as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_of_known_distributions() {
        assert_eq!(kl_from_logits(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]), 0.0);
        // p = (1/2, 1/2), q = (e/(1+e), 1/(1+e)): KL = ln(1/2) - ½ln(q1) - ½ln(q2).
        let e = std::f64::consts::E;
        let (q1, q2) = (e / (1.0 + e), 1.0 / (1.0 + e));
        let want = 0.5f64.ln() - 0.5 * q1.ln() - 0.5 * q2.ln();
        assert!((kl_from_logits(&[0.0, 0.0], &[1.0, 0.0]) - want).abs() < 1e-12);
        // Shifting logits does not change a distribution.
        assert!(kl_from_logits(&[0.5, -1.0, 2.0], &[10.5, 9.0, 12.0]) < 1e-12);
    }

    #[test]
    fn ranks_and_argmax() {
        let l = [0.1, 3.0, -2.0, 3.0, 1.0];
        assert_eq!(argmax(&l), 1);
        assert_eq!(rank_of(&l, 1), 0);
        assert_eq!(rank_of(&l, 3), 0);
        assert_eq!(rank_of(&l, 4), 2);
        assert_eq!(rank_of(&l, 2), 4);
    }

    #[test]
    fn repetition_of_known_sequences() {
        // 1 2 3 4 1 2 3 4: windows 1234 2341 3412 4123 1234, one repeats.
        assert_eq!(repetition(&[1, 2, 3, 4, 1, 2, 3, 4], 4, 512), 0.2);
        assert_eq!(repetition(&[1, 2, 3, 4, 5, 6], 4, 512), 0.0);
        // A loop of one token: every window after the first repeats.
        assert_eq!(repetition(&[7; 10], 4, 512), 6.0 / 7.0);
        // Only the last `span` tokens count.
        assert_eq!(repetition(&[1, 2, 3, 4, 1, 2, 3, 4, 9, 8, 7, 6], 4, 4), 0.0);
        assert_eq!(repetition(&[1, 2], 4, 512), 0.0);
    }
}
