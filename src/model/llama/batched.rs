//! A decoding step's attention for a whole batch in one set of device operations, over the batch's
//! pooled caches ([`crate::cache::pool`]): one scatter appends every sequence's new key and value,
//! one product scores every query head of every sequence against its cache (padded to the longest,
//! the rest masked), one softmax, one product with the values. The per-sequence path
//! (`Transformer::attend_sequence`) launches about a dozen operations per sequence and layer; on a
//! GPU those launches, not the bytes, bounded a batch's speed.
//!
//! The arithmetic is the per-sequence path's, row for row: the same products over the same keys,
//! masked entries adding exact zeros. Policies then run per sequence as before, on their own slot
//! of the pool, with their own slice of the probabilities. A batch under sparse attention (RocketKV)
//! attends to the entries each policy selected, gathered from the pool in one selection.

use super::deferred::{Deferred, DeferredProbs};
use super::{Handed, SeqInput, Transformer};
use crate::cache::{pool, LayerCache};
use crate::model::matmul::matmul;
use crate::model::state::{SeqState, WindowBatch};
use crate::policy::{device_score, ScoreRequest, StepInfo, WindowScores};
use candle_core::Tensor;
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};

impl Transformer {
    /// Whether a decoding step of `batch` may attend through the pool: more than one sequence, one
    /// new token each, every cache plain rows of one type (no block or KIVI storage) with the same
    /// heads (one entry per KV head, or per query head: `gqa=per-query-head` storage), and sparse
    /// attention for all or none (and then, one entry per KV head).
    pub(super) fn can_batch_attention(&self, batch: &[SeqInput<'_>]) -> bool {
        let heads = Self::pool_heads(batch);
        self.batched_attention
            && !self.cpu_loop()
            && batch.len() > 1
            && (heads == self.config.num_kv_heads || heads == self.config.num_heads)
            && batch.iter().all(|s| {
                s.tokens.len() == 1
                    && s.state.seen > 0
                    && s.state.cache.num_layers() > 0
                    && s.state.cache.layer(0).kv_heads() == heads
            })
            // Sparse attention (RocketKV's selection) pools when the whole batch selects and none
            // reads the probabilities (whose entries would be the selection's, not the cache's).
            && match batch.iter().filter(|s| s.state.caps.sparse_attention).count() {
                0 => true,
                all if all == batch.len() => {
                    heads == self.config.num_kv_heads
                        && batch.iter().all(|s| !s.state.caps.attention_probs)
                }
                _ => false,
            }
            && {
                let first = batch[0].state.cache.kv_type();
                batch.iter().all(|s| s.state.cache.kv_type() == first) && first.plain_rows()
            }
            // Past candle's CUDA kernels' 32-bit element counts (a tiny model's huge batch): one
            // sequence at a time, whose tensors are a batch's smaller.
            && (0..self.config.num_layers).all(|l| {
                let layers: Vec<&LayerCache> =
                    batch.iter().map(|s| s.state.cache.layer(l)).collect();
                pool::fits_kernels(&layers, self.config.num_heads)
            })
    }

    /// The heads each cache of `batch` holds (its first's): the model's KV heads, or its query heads
    /// under per-query-head storage. 0 for an empty batch.
    pub(super) fn pool_heads(batch: &[SeqInput<'_>]) -> usize {
        batch
            .first()
            .filter(|s| s.state.cache.num_layers() > 0)
            .map_or(0, |s| s.state.cache.layer(0).kv_heads())
    }

    /// Layer `l`'s attention for a decoding batch through its pool. `q` is `[heads, batch, d]`,
    /// `k` and `v` `[kv_heads, batch, d]` (after RoPE); returns `[batch, heads·d]`. The calls of
    /// policies that read the probabilities wait for the end of the step (`deferred`). Caches that
    /// store a head per query head (`gqa=per-query-head`) pool as well: each KV head's new entry is
    /// written to its group's query heads, and each query head attends over its own (a group of
    /// one).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend_batch(
        &self,
        l: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        batch: &mut [SeqInput<'_>],
        steps: &[StepInfo],
        deferred: &mut Vec<Deferred>,
    ) -> candle_core::Result<Tensor> {
        let cfg = &self.config;
        let (hq, d) = (cfg.num_heads, cfg.head_dim);
        // The caches' heads, and the query heads attending over each.
        let hkv = Self::pool_heads(batch);
        let (b, g) = (batch.len(), hq / hkv);
        let scale = 1.0 / (d as f64).sqrt();
        // 1. The pool (built or grown when needed) and every sequence's new entry in its slot.
        let (pool_k, pool_v, lens) = {
            let mut layers = Self::layer_caches(batch, l);
            let (pool_k, pool_v) = pool::pooled(&mut layers, 1)?;
            let lens: Vec<usize> = layers.iter().map(|c| c.len()).collect();
            (pool_k, pool_v, lens)
        };
        let sparse = batch[0].state.caps.sparse_attention;
        let PoolTensors { index, mask } = self.pool_inputs(&lens, hkv, !sparse)?;
        let scatter = |pool: &Tensor, new: &Tensor| -> candle_core::Result<()> {
            // [kv_heads, batch, d] → [batch·heads, 1, d], in the pool's type (each KV head's row
            // repeated for its query heads under per-query-head storage: head `r` is KV head r / g).
            let new = match new.dim(0)? {
                kv if kv == hkv => new.clone(),
                kv => new
                    .unsqueeze(1)?
                    .broadcast_as((kv, hkv / kv, b, d))?
                    .reshape((hkv, b, d))?,
            };
            let rows = new
                .transpose(0, 1)?
                .to_dtype(pool.dtype())?
                .contiguous()?
                .reshape((b * hkv, 1, d))?;
            pool.scatter_set(&index, &rows, 1)
        };
        scatter(&pool_k, k)?;
        scatter(&pool_v, v)?;
        for (s, step) in batch.iter_mut().zip(steps) {
            s.state
                .cache
                .layer_mut(l)
                .note_appended(1, step.seen_before)?;
            if !sparse {
                s.state.count_decode_read(l, None);
            }
        }

        // 2. Scores of every sequence's query heads over its cache (or the entries its policy
        //    selected), padded to the longest.
        let n = lens.iter().max().copied().unwrap_or(0) + 1;
        let q3 = q.transpose(0, 1)?.contiguous()?.reshape((b * hkv, g, d))?;
        let (keys, values, mask) = match sparse {
            true => self.sparse_selection(l, (q, k), (&pool_k, &pool_v), batch, steps)?,
            false => (pool_k.narrow(1, 0, n)?, pool_v.narrow(1, 0, n)?, mask),
        };
        let width = keys.dim(1)?;
        let (keys, values) = (keys.to_dtype(q3.dtype())?, values.to_dtype(q3.dtype())?);
        // Scores `[batch·kv_heads, g, width]`, mask and softmax in f32 whatever the activations'
        // type (as `attend_sequence`).
        let scores = (matmul(&q3, &keys.t()?)?.to_dtype(candle_core::DType::F32)? * scale)?;
        let scores = match &mask {
            None => scores,
            Some(mask) => scores
                .reshape((b, hkv, g, width))?
                .broadcast_add(mask)?
                .reshape((b * hkv, g, width))?,
        };
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let out = matmul(&probs.to_dtype(values.dtype())?, &values)?.reshape((b, hq * d))?;

        // 3. The batch's query windows at once where they can be, then each sequence's policy, on
        //    its own slot and probabilities, in parallel: a compression event's scoring can run on
        //    the host, and a batch's sequences one after another took minutes.
        let window_extended = self.extend_windows(l, &q3.reshape((b, hq, 1, d))?, batch)?;
        // Window scores for the batch at once over one entry per KV head (per-query-head storage:
        // each policy scores its own, as one sequence at a time).
        let scores = match self.batch_compressions && window_extended && hkv == cfg.num_kv_heads {
            true => self.batch_scores(l, &pool_k, &lens, batch, steps)?,
            false => vec![None; b],
        };
        // The policies that read the probabilities (H2O, LazyEviction) act from one copy of the
        // layer's, at the end of the step (`deferred`, see `super::deferred`); the others now.
        let readers: Vec<bool> = batch.iter().map(|s| s.state.caps.attention_probs).collect();
        let finish = |(i, ((s, step), reads)): (usize, ((&mut SeqInput<'_>, &StepInfo), &bool))| {
            if *reads {
                return Ok(());
            }
            let st: &mut SeqState = s.state;
            let q_s = q.narrow(1, i, 1)?;
            let handed = scores[i].as_ref().map_or(Handed::Nothing, Handed::Scores);
            self.finish_layer(l, step, st, &q_s, handed, window_extended)
        };
        // Where the scores were the batch's, so are the gathers: the policies' are held back and
        // moved together once all have acted (settled before any error goes up, so that no cache
        // is left holding back a gather).
        if self.batch_compressions {
            pool::defer_gathers(&mut Self::layer_caches(batch, l));
        }
        let acted = batch
            .par_iter_mut()
            .zip(steps.par_iter())
            .zip(readers.par_iter())
            .enumerate()
            .try_for_each(finish);
        if self.batch_compressions {
            self.settle_gathers(batch, l)?;
        }
        acted?;
        if readers.iter().any(|&r| r) {
            let probs = match Self::batch_accumulation(batch, steps) {
                // Accumulated where the probabilities are: only the evictions will be copied.
                Some(rules) => DeferredProbs::Accumulated {
                    q: q.clone(),
                    evictions: self.accumulate_pooled(l, &probs, &lens, &rules, (batch, steps))?,
                },
                None => {
                    // Summed over each group when every reader reads only that (one operation for
                    // the pool).
                    let group_sum = batch
                        .iter()
                        .filter(|s| s.state.caps.attention_probs)
                        .all(|s| s.state.caps.group_sum_probs);
                    DeferredProbs::Pooled {
                        q: q.clone(),
                        probs: super::probs_for_policy(probs, group_sum)?,
                        lens,
                        readers,
                    }
                }
            };
            let layer = Deferred {
                l,
                probs,
                window_extended,
            };
            match self.defers_policy(true, &steps[0], 1) {
                true => deferred.push(layer),
                false => self.run_deferred(batch, steps, vec![layer])?,
            }
        }
        Ok(out)
    }

    /// Layer `l`'s entries that a sparse-attention batch attends to, gathered from the pool in one
    /// selection per buffer: each sequence's policy selects from its query and its cache (which
    /// keeps its new keys on the host first), as one sequence at a time does, after one copy of the
    /// layer's queries and new keys for the whole batch. Returns keys and values `[batch·kv_heads,
    /// width, d]` (in the pool's order, `width` the longest selection; a sequence whose policy selects
    /// nothing this step attends to all its entries) and, where selections are shorter, the mask of
    /// their padding, `[batch, kv_heads, 1, width]`.
    fn sparse_selection(
        &self,
        l: usize,
        (q, k): (&Tensor, &Tensor),
        (pool_k, pool_v): (&Tensor, &Tensor),
        batch: &mut [SeqInput<'_>],
        steps: &[StepInfo],
    ) -> candle_core::Result<(Tensor, Tensor, Option<Tensor>)> {
        let (b, hkv, d) = (batch.len(), self.config.num_kv_heads, self.config.head_dim);
        let to_host = crate::host_copy::flat_f32;
        let (q_host, k_host) = (to_host(q)?, to_host(k)?);
        // Sequence `i`'s rows of a `[heads, batch, d]` layer on the host, `[heads·d]`.
        let own = |all: &[f32], i: usize| -> Vec<f32> {
            (0..all.len() / (b * d))
                .flat_map(|h| &all[(h * b + i) * d..][..d])
                .copied()
                .collect()
        };
        let subsets: Vec<Vec<Vec<usize>>> = batch
            .par_iter_mut()
            .zip(steps.par_iter())
            .enumerate()
            .map(|(i, (s, step))| {
                let st: &mut SeqState = s.state;
                st.cache.layer_mut(l).keep_host_keys(own(&k_host, i))?;
                let subset = st.select_attention(step, l, &own(&q_host, i))?;
                st.count_decode_read(l, subset.as_deref());
                let n = st.cache.layer(l).len();
                Ok(subset.unwrap_or_else(|| vec![(0..n).collect(); hkv]))
            })
            .collect::<candle_core::Result<_>>()?;
        let width = subsets.iter().flatten().map(Vec::len).max().unwrap_or(0);
        let cap = pool_k.dim(1)?;
        let mut index = Vec::with_capacity(b * hkv * width);
        let mut mask = Vec::new();
        let padded = subsets.iter().flatten().any(|s| s.len() < width);
        for (row, sel) in subsets.iter().flatten().enumerate() {
            let first = row * cap;
            index.extend(sel.iter().map(|&j| (first + j) as u32));
            // Padding reads the row's first entry, masked.
            index.extend(std::iter::repeat_n(first as u32, width - sel.len()));
            if padded {
                mask.extend(std::iter::repeat_n(0f32, sel.len()));
                mask.extend(std::iter::repeat_n(f32::NEG_INFINITY, width - sel.len()));
            }
        }
        let index = Tensor::from_vec(index, b * hkv * width, pool_k.device())?;
        let take = |pool: &Tensor| {
            pool.reshape((b * hkv * cap, d))?
                .index_select(&index, 0)?
                .reshape((b * hkv, width, d))
        };
        let mask = match padded {
            true => Some(Tensor::from_vec(mask, (b, hkv, 1, width), pool_k.device())?),
            false => None,
        };
        Ok((take(pool_k)?, take(pool_v)?, mask))
    }

    /// Moves the gathers layer `l`'s caches held back ([`pool::settle_gathers`]), the time charged
    /// in equal shares to the policies that gathered.
    pub(super) fn settle_gathers(
        &self,
        batch: &mut [SeqInput<'_>],
        l: usize,
    ) -> candle_core::Result<()> {
        let started = std::time::Instant::now();
        let moved = pool::settle_gathers(&mut Self::layer_caches(batch, l))?;
        let share = started.elapsed() / moved.len().max(1) as u32;
        for i in moved {
            batch[i].state.policy_time += share;
        }
        Ok(())
    }

    /// Layer `l`'s cache of every sequence of `batch`, in order.
    pub(super) fn layer_caches<'b>(
        batch: &'b mut [SeqInput<'_>],
        l: usize,
    ) -> Vec<&'b mut crate::cache::LayerCache> {
        batch
            .iter_mut()
            .map(|s| s.state.cache.layer_mut(l))
            .collect()
    }

    /// The scores of every observation-window compression the batch's policies make at layer `l`
    /// this step ([`crate::policy::Policy::score_request`]), computed together: the sequences whose
    /// requests and cache lengths are equal in one set of device operations over the pool's keys
    /// and the batch's windows, and one copy to the host. One sequence at a time, R-KV's scoring
    /// took about a hundred operations and two waits for the device per sequence and layer: at a
    /// batch of a thousand, millions of launches at every compression (counted, not measured). Returns each sequence's scores (`None`:
    /// it does not compress now, or scores by itself). Needs the windows extended for the batch at
    /// once (`extend_windows`), and `lens` the cache lengths before this step's append. The time
    /// (after waiting for the step's queued work) is shared among the scored sequences' policy time.
    fn batch_scores(
        &self,
        l: usize,
        pool_k: &Tensor,
        lens: &[usize],
        batch: &mut [SeqInput<'_>],
        steps: &[StepInfo],
    ) -> candle_core::Result<Vec<Option<WindowScores>>> {
        let cfg = &self.config;
        let (hkv, b) = (cfg.num_kv_heads, batch.len());
        let g = cfg.num_heads / hkv;
        let mut out = vec![None; b];
        // Sequences with the same request over caches of the same length, in batch order.
        let mut groups: Vec<(ScoreRequest, usize, Vec<usize>)> = Vec::new();
        for (i, (s, step)) in batch.iter().zip(steps).enumerate() {
            let n = lens[i] + 1;
            let Some(request) = s.state.policy.score_request(step, l, n, g) else {
                continue;
            };
            match groups.iter_mut().find(|(r, m, _)| *r == request && *m == n) {
                Some((_, _, members)) => members.push(i),
                None => groups.push((request, n, vec![i])),
            }
        }
        let Some(windows) = batch[0].state.window_batches[l]
            .as_ref()
            .map(|w| w.windows.clone())
        else {
            return Ok(out);
        };
        if groups.is_empty() {
            return Ok(out);
        }
        self.device.synchronize()?;
        let started = std::time::Instant::now();
        let mut scored = Vec::new();
        for (request, n, members) in groups {
            let m = members.len();
            // The members' rows of the pool and their windows: all of them, or picked out.
            let (keys, windows) = match m == b {
                true => (pool_k.narrow(1, 0, n)?, windows.clone()),
                false => {
                    let rows: Vec<u32> = members
                        .iter()
                        .flat_map(|&i| (i * hkv..(i + 1) * hkv).map(|r| r as u32))
                        .collect();
                    let rows = Tensor::from_vec(rows, m * hkv, &self.device)?;
                    let slots: Vec<u32> = members.iter().map(|&i| i as u32).collect();
                    let slots = Tensor::from_vec(slots, m, &self.device)?;
                    (
                        pool_k.index_select(&rows, 0)?.narrow(1, 0, n)?,
                        windows.contiguous()?.index_select(&slots, 0)?,
                    )
                }
            };
            // `keys`: `[m·kv_heads, n, d]`, read chunk by chunk by the scoring.
            let Some(window) = device_score::window_scores_batch(
                &windows,
                &keys,
                request.n_cand,
                request.agg,
                request.domain,
                request.reduce,
                device_score::CHUNK_BYTES,
            )?
            else {
                continue; // a window row that sees no key: each policy scores on its own
            };
            let mut redundancy = match request.redundancy {
                Some(threshold) => Some(device_score::redundancy(&keys, threshold)?.into_iter()),
                None => None,
            };
            for (i, window) in members.into_iter().zip(window) {
                let redundancy = redundancy.as_mut().map(|r| r.by_ref().take(hkv).collect());
                out[i] = Some(WindowScores { window, redundancy });
                scored.push(i);
            }
        }
        let share = started.elapsed() / scored.len().max(1) as u32;
        for i in scored {
            batch[i].state.policy_time += share;
        }
        Ok(out)
    }

    /// The tensors a pooled step needs that depend only on the batch's cache lengths before the
    /// append (`lens`) and their `heads`: where each sequence's new entry goes (`[batch·heads, 1,
    /// head_dim]`, for the scatter) and, when the lengths
    /// differ and the step attends to every entry (`masked`: not a sparse selection, which masks its
    /// own padding), the mask of each sequence's padding (`[batch, 1, 1, n]`, 0 or −∞, n the longest
    /// plus one). Built from host vectors (a copy to the device each), for the first layer of a step
    /// and kept for the next layers while their lengths are the same (most of a step's: only
    /// policies that compress layers differently, or at different steps, change them).
    fn pool_inputs(
        &self,
        lens: &[usize],
        heads: usize,
        masked: bool,
    ) -> candle_core::Result<PoolTensors> {
        let mut memo = self.pool_inputs.lock().unwrap_or_else(|e| e.into_inner());
        let same = |m: &&PoolInputs| m.lens == lens && m.heads == heads && m.masked == masked;
        if let Some(m) = memo.as_ref().filter(same) {
            return Ok(m.tensors.clone());
        }
        let (hkv, d) = (heads, self.config.head_dim);
        let b = lens.len();
        let at: Vec<u32> = lens
            .iter()
            .flat_map(|&n| std::iter::repeat_n(n as u32, hkv))
            .collect();
        let index = Tensor::from_vec(at, (b * hkv, 1, 1), &self.device)?
            .broadcast_as((b * hkv, 1, d))?
            .contiguous()?;
        let n = lens.iter().max().copied().unwrap_or(0) + 1;
        let mask = match masked && lens.iter().any(|&m| m + 1 != n) {
            false => None,
            true => {
                let mask: Vec<f32> = lens
                    .iter()
                    .flat_map(|&m| {
                        (0..n).map(move |j| if j <= m { 0.0 } else { f32::NEG_INFINITY })
                    })
                    .collect();
                Some(Tensor::from_vec(mask, (b, 1, 1, n), &self.device)?)
            }
        };
        let tensors = PoolTensors { index, mask };
        *memo = Some(PoolInputs {
            lens: lens.to_vec(),
            heads,
            masked,
            tensors: tensors.clone(),
        });
        Ok(tensors)
    }

    /// Extends every sequence's query window of layer `l` by its query of this step (`q_rows`:
    /// `[batch, heads, 1, d]`, contiguous) in one concatenation for the batch, as `finish_layer` does one sequence at a time
    /// (the same values), when every sequence keeps a window of the same size and length. The
    /// windows become views of one tensor, which the next step extends again without gathering
    /// them. Returns whether it did.
    fn extend_windows(
        &self,
        l: usize,
        q_rows: &Tensor,
        batch: &mut [SeqInput<'_>],
    ) -> candle_core::Result<bool> {
        let n = batch.len();
        let w = batch[0].state.caps.query_window;
        let mut len = None;
        for s in batch.iter() {
            let Some(win) = &s.state.query_windows[l] else {
                return Ok(false);
            };
            let this = win.dim(1)?;
            if w == 0 || s.state.caps.query_window != w || *len.get_or_insert(this) != this {
                return Ok(false);
            }
        }
        let len = len.unwrap_or(0);
        // The windows as one tensor: the one they are views of, or stacked once.
        let id = batch[0].state.window_batches[l].as_ref().map(|b| b.id);
        let shared = batch.iter().enumerate().all(|(i, s)| {
            s.state.window_batches[l]
                .as_ref()
                .is_some_and(|b| Some(b.id) == id && b.slot == i && b.slots == n)
        });
        let old = match (&batch[0].state.window_batches[l], shared) {
            (Some(b), true) => b.windows.clone(),
            _ => {
                let each: Vec<&Tensor> = batch
                    .iter()
                    .map(|s| s.state.query_windows[l].as_ref().expect("checked above"))
                    .collect();
                Tensor::stack(&each, 0)?
            }
        };
        // The last `w − 1` (or fewer) queries and the new ones: one copy of the window (joining
        // first, then cutting, copied it twice).
        let keep = len.min(w - 1);
        let new = match keep {
            0 => q_rows.clone(),
            _ => Tensor::cat(&[&old.narrow(2, len - keep, keep)?, q_rows], 2)?.contiguous()?,
        };
        let id = NEXT_WINDOWS.fetch_add(1, Ordering::Relaxed);
        for (i, s) in batch.iter_mut().enumerate() {
            s.state.query_windows[l] = Some(new.get(i)?);
            s.state.window_batches[l] = Some(WindowBatch {
                id,
                slot: i,
                slots: n,
                windows: new.clone(),
            });
        }
        Ok(true)
    }
}

static NEXT_WINDOWS: AtomicU64 = AtomicU64::new(1);

/// [`Transformer::pool_inputs`]'s last tensors and what they were built for.
pub(super) struct PoolInputs {
    lens: Vec<usize>,
    heads: usize,
    masked: bool,
    tensors: PoolTensors,
}

/// A pooled step's scatter indices and padding mask ([`Transformer::pool_inputs`]).
#[derive(Clone)]
struct PoolTensors {
    index: Tensor,
    mask: Option<Tensor>,
}
