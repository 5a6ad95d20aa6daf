//! Greedy tokens chosen where the logits are: on a GPU, a decoding step's logits are `[batch,
//! vocabulary]` floats (19.5 MB at batch 32 over Qwen2's 152,064 ids) that were copied to the host
//! for the sampler to scan twice (a finiteness check, then the argmax) on one thread. When every
//! sequence decodes greedily, the same choice is made on the device and only the chosen ids come
//! back.
//!
//! The choice is the host sampler's exactly: the largest logit, the lowest id on ties (`==` on
//! floats, so −0 and +0 tie as they do there). A row holding a NaN or an infinity is not chosen from
//! here: the caller takes the logits to the host, where the sampler reports the offending id and
//! value as it always has.

use candle_core::{DType, Tensor};

/// Each row's greedy token, or `None` when any logit of any row is NaN or infinite (the caller then
/// samples on the host, which names the first such logit). One copy to the host: the ids, a row with
/// such a logit marked by the id `vocab`.
pub fn greedy_tokens(logits: &Tensor) -> candle_core::Result<Option<Vec<u32>>> {
    let (rows, vocab) = logits.dims2()?;
    let logits = logits.to_dtype(DType::F32)?;
    let device = logits.device();
    let sentinel = Tensor::new(vocab as u32, device)?;
    // The lowest id holding the row's maximum: ids where the maximum is, `vocab` elsewhere, the least.
    let max = logits.max_keepdim(1)?;
    let hit = logits.broadcast_eq(&max)?;
    let ids = Tensor::arange(0u32, vocab as u32, device)?
        .unsqueeze(0)?
        .broadcast_as((rows, vocab))?;
    let first = hit
        .where_cond(&ids, &sentinel.broadcast_as((rows, vocab))?)?
        .min(1)?;
    // `x − x` is exactly 0 for every finite x and NaN for NaN and ±∞: a row's sum is 0 iff all its
    // logits are finite.
    let finite = logits.sub(&logits)?.sum(1)?.eq(0f32)?;
    let chosen = finite.where_cond(&first, &sentinel.broadcast_as(rows)?)?;
    let chosen = crate::host_copy::flat::<u32>(&chosen)?;
    Ok((!chosen.contains(&(vocab as u32))).then_some(chosen))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::llama::argmax;
    use candle_core::Device;
    use rand::{Rng, SeedableRng};

    #[test]
    fn the_device_choice_is_the_host_argmax_ties_included() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let (rows, vocab) = (7, 1000);
        // Logits from a few values only, so that every row's maximum is held by several ids; one row
        // all equal; one with its maximum at the last id alone; signed zeros as the maximum.
        let mut data: Vec<f32> = (0..rows * vocab)
            .map(|_| rng.random_range(0..5) as f32 - 3.0)
            .collect();
        data[vocab..2 * vocab].fill(0.25);
        data[2 * vocab + vocab - 1] = 9.0;
        for (i, x) in data[3 * vocab..4 * vocab].iter_mut().enumerate() {
            *x = match i {
                17 => -0.0,
                400 => 0.0,
                _ => -1.0,
            };
        }
        let t = Tensor::from_vec(data.clone(), (rows, vocab), &Device::Cpu).unwrap();
        let host: Vec<u32> = data.chunks(vocab).map(argmax).collect();
        assert_eq!(greedy_tokens(&t).unwrap(), Some(host.clone()));
        assert_eq!(host[1], 0);
        assert_eq!(host[2], vocab as u32 - 1);
        assert_eq!(host[3], 17);
        // In 16-bit floats, as bf16 activations leave them: the same choice as the host's over the
        // widened values.
        let half = t.to_dtype(DType::BF16).unwrap();
        let widened = half.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
        let host16: Vec<u32> = widened.iter().map(|r| argmax(r)).collect();
        assert_eq!(greedy_tokens(&half).unwrap(), Some(host16));
    }

    #[test]
    fn a_nan_or_an_infinity_anywhere_is_left_to_the_host() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut data = vec![0.5f32; 3 * 50];
            data[2 * 50 + 13] = bad;
            let t = Tensor::from_vec(data, (3, 50), &Device::Cpu).unwrap();
            assert_eq!(greedy_tokens(&t).unwrap(), None, "{bad}");
        }
        // Large finite logits do not overflow the check (x − x is 0 before the sum).
        let t = Tensor::from_vec(vec![f32::MAX; 100], (2, 50), &Device::Cpu).unwrap();
        assert_eq!(greedy_tokens(&t).unwrap(), Some(vec![0, 0]));
    }
}
