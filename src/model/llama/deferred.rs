//! Policies that read attention probabilities (H2O, LazyEviction) act at the end of a decoding step
//! on the device path, not after each layer.
//!
//! Why it exists: such a policy decides on the host from its layer's probabilities, and copying them
//! there waits for the device to finish everything queued so far. Done after every layer, that is one
//! wait per layer and step, each leaving the device idle while the host launches the next layer's
//! operations. A policy only changes its own layer's cache and state, and a layer's cache is read
//! again only at the next step, so the calls can wait until the step's last layer has been queued:
//! then one wait for the device, the layers' probabilities copied (already computed), and the
//! policies run layer by layer in the same order, with the same inputs, as before. The price: every
//! layer's probabilities stay on the device until the step ends (at R1-Distill-Qwen-7B's shapes, 28
//! layers × 28 query heads × 4 bytes per entry and sequence: 3.1 KiB per cache entry, about 200 MB for
//! a batch of 32 over 2,048 entries), counted in the device's peak memory. Prefill is not
//! deferred (its probabilities are `[heads, tokens, n]` per layer: too large to keep for every layer),
//! and neither is the CPU's own decoding loop (no device to wait for). `KVBENCH_POLICY_PER_LAYER=1`
//! calls them after each layer as before, to measure the difference (the GPU check does).

use super::{Handed, SeqInput, Transformer};
use crate::cache::pool;
use crate::policy::StepInfo;
use candle_core::{Device, Tensor};
use rayon::prelude::*;

/// One layer's policy calls left for the end of the step.
pub(super) struct Deferred {
    pub l: usize,
    pub probs: DeferredProbs,
    /// Whether the batch's query windows were already extended for this layer (pooled attention).
    pub window_extended: bool,
}

/// The probabilities the deferred calls read, still on the device.
pub(super) enum DeferredProbs {
    /// Per sequence of the batch (`None`: its policy already ran): its query `[heads, 1, d]` and its
    /// probabilities `[kv_heads, group, 1, n]`.
    Each(Vec<Option<(Tensor, Tensor)>>),
    /// A pooled layer's: every sequence's queries `[heads, batch, d]`, probabilities `[batch·kv_heads,
    /// group, n]` padded to the longest, each cache's length before this step's entry, and which
    /// sequences' policies read them.
    Pooled {
        q: Tensor,
        probs: Tensor,
        lens: Vec<usize>,
        readers: Vec<bool>,
    },
    /// A pooled layer whose policies accumulate in the cache ([`super::accumulated`]): every
    /// sequence's queries `[heads, batch, d]` and, where the engine chose them, its heads'
    /// evictions, `[batch·kv_heads]` u32.
    Accumulated {
        q: Tensor,
        evictions: Option<Tensor>,
    },
}

impl Transformer {
    /// Whether a layer's policy call waits for the end of the step: a decoding step (one new token)
    /// off the CPU's own loop whose policy reads probabilities, unless `KVBENCH_POLICY_PER_LAYER=1`.
    pub(super) fn defers_policy(&self, reads_probs: bool, step: &StepInfo, t: usize) -> bool {
        static PER_LAYER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let per_layer = *PER_LAYER.get_or_init(|| crate::switches::POLICY_PER_LAYER.is_on());
        reads_probs && !per_layer && !self.cpu_loop() && t == 1 && !step.is_prefill
    }

    /// Runs the deferred calls, layer by layer in order, each layer's sequences in parallel: one wait
    /// for the device's queued work, then each layer's probabilities copied to the host (one copy per
    /// layer, or per sequence and layer outside a pool) or, for accumulating policies, every layer's
    /// evictions in one copy; the copies' time shared among the policies that read them.
    pub(super) fn run_deferred(
        &self,
        batch: &mut [SeqInput<'_>],
        steps: &[StepInfo],
        deferred: Vec<Deferred>,
    ) -> candle_core::Result<()> {
        if deferred.is_empty() {
            return Ok(());
        }
        // The pass's queued work is not the policies': waited for before their clock starts.
        if !self.device.is_cpu() {
            self.device.synchronize()?;
        }
        // The caches' heads (per query head under per-query-head storage).
        let hkv = Self::pool_heads(batch);
        // Every accumulating layer's evictions (`[batch·kv_heads]` u32 a layer) in one copy, its
        // time shared among those layers.
        let started = std::time::Instant::now();
        let evictions: Vec<&Tensor> = deferred
            .iter()
            .filter_map(|d| match &d.probs {
                DeferredProbs::Accumulated { evictions, .. } => evictions.as_ref(),
                _ => None,
            })
            .collect();
        let (evicted, rows) = match evictions.first() {
            None => (Vec::new(), 0),
            Some(first) => (
                crate::host_copy::flat::<u32>(&Tensor::cat(&evictions, 0)?)?,
                first.dim(0)?,
            ),
        };
        let copy_share = started.elapsed() / evictions.len().max(1) as u32;
        let mut accumulated = evicted.chunks(rows.max(1));
        for Deferred {
            l,
            probs,
            window_extended,
        } in deferred
        {
            let started = std::time::Instant::now();
            // A pool's gathers (H2O evicts at every step) move together once all policies acted.
            let pooled = !matches!(probs, DeferredProbs::Each(_));
            let mut copied = std::time::Duration::ZERO;
            let per_seq: Vec<Option<(Tensor, Item<'_>)>> = match probs {
                DeferredProbs::Each(each) => each
                    .into_iter()
                    .map(|e| match e {
                        Some((q, p)) => Ok(Some((q, Item::Probs(p.to_device(&Device::Cpu)?)))),
                        None => Ok(None),
                    })
                    .collect::<candle_core::Result<_>>()?,
                DeferredProbs::Pooled {
                    q,
                    probs,
                    lens,
                    readers,
                } => {
                    // Counted as a copy where the policies read it (`host_copy`), not here.
                    let host = probs.to_device(&Device::Cpu)?;
                    // The group, or 1 when it was summed on the device (`probs_for_policy`).
                    let g = host.dim(1)?;
                    let mut out = Vec::with_capacity(readers.len());
                    for (i, (&len, read)) in lens.iter().zip(readers).enumerate() {
                        if !read {
                            out.push(None);
                            continue;
                        }
                        let m = len + 1;
                        let p = host
                            .narrow(0, i * hkv, hkv)?
                            .narrow(2, 0, m)?
                            .contiguous()?
                            .reshape((hkv, g, 1, m))?;
                        out.push(Some((q.narrow(1, i, 1)?, Item::Probs(p))));
                    }
                    out
                }
                DeferredProbs::Accumulated { q, evictions } => {
                    let layer = match evictions {
                        Some(_) => {
                            copied = copy_share;
                            accumulated.next().unwrap_or_default()
                        }
                        None => &[],
                    };
                    (0..batch.len())
                        .map(|i| {
                            let own = layer.get(i * hkv..(i + 1) * hkv).unwrap_or_default();
                            Ok(Some((q.narrow(1, i, 1)?, Item::Evictions(own))))
                        })
                        .collect::<candle_core::Result<_>>()?
                }
            };
            let readers = per_seq.iter().flatten().count().max(1);
            let share = (started.elapsed() + copied) / readers as u32;
            let finish = |((s, step), item): ((&mut SeqInput<'_>, &StepInfo), Option<_>)| {
                let Some((q_s, item)) = item else {
                    return Ok(());
                };
                s.state.policy_time += share;
                let handed = match &item {
                    Item::Probs(p) => Handed::Probs(p),
                    Item::Evictions(e) => Handed::Accumulated(e),
                };
                self.finish_layer(l, step, &mut *s.state, &q_s, handed, window_extended)
            };
            let together = pooled && self.batch_compressions;
            if together {
                pool::defer_gathers(&mut Self::layer_caches(batch, l));
            }
            // A single sequence runs on this thread (handing it to the pool costs a wake-up).
            let acted = if batch.len() > 1 {
                batch
                    .par_iter_mut()
                    .zip(steps.par_iter())
                    .zip(per_seq.into_par_iter())
                    .try_for_each(finish)
            } else {
                batch
                    .iter_mut()
                    .zip(steps.iter())
                    .zip(per_seq)
                    .try_for_each(finish)
            };
            if together {
                self.settle_gathers(batch, l)?;
            }
            acted?;
        }
        Ok(())
    }
}

/// What one sequence's deferred call reads: its probabilities on the host, or its heads' evictions.
enum Item<'a> {
    Probs(Tensor),
    Evictions(&'a [u32]),
}
