//! Several sequences' caches of one layer held in one pair of buffers, so that a decoding step can
//! append and attend for a whole batch in a few device operations instead of a dozen per sequence.
//!
//! On a GPU the per-sequence path was bound by launches, not by bytes: about a dozen small operations
//! per sequence and layer, so a batch of 32 decoded only 1.6 times as fast as one sequence (docs/gpu.md).
//! A pool holds keys and values as `[slots·kv_heads, capacity, width]`; slot `s`'s [`LayerCache`]
//! keeps a view of rows `s·kv_heads..(s+1)·kv_heads` as its own buffer, so its appends, evictions
//! (gathers) and reads work on it exactly as on a buffer it owns, and the batch's attention reads
//! the whole pool at once. A pool is rebuilt (its members' entries copied into new buffers, an
//! eighth larger again when it is full) when the batch no longer is its slots in order or when a member has
//! no room left; a member that grows on its own leaves the pool (`LayerCache::grow`).

use super::LayerCache;
use candle_core::{DType, Result, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};

/// A layer cache's place in a pool, and the pool's whole buffers.
#[derive(Debug, Clone)]
pub struct PoolSlot {
    /// Which pool (ids are never reused in a process).
    id: u64,
    slot: usize,
    slots: usize,
    /// `[slots·kv_heads, capacity, width]` keys and values; the member's own buffers are views of them.
    keys: Tensor,
    values: Tensor,
    /// `[slots·kv_heads, capacity, width]`: the members' per-entry scores ([`LayerCache::scores`]), made
    /// when a member has some ([`pooled_scores`]).
    scores: Option<Tensor>,
}

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

/// Whether `caches` can share a pool: plain rows of one type (not block formats, not KIVI), the
/// same heads and width.
pub fn poolable(caches: &[&mut LayerCache]) -> bool {
    let Some(first) = caches.first() else {
        return false;
    };
    caches.iter().all(|c| {
        c.kv_type.plain_rows()
            && c.kv_type == first.kv_type
            && c.kv_heads == first.kv_heads
            && c.head_dim == first.head_dim
    })
}

/// The pool whose slot `i` is `caches[i]`, with room for `extra` more entries in every slot, as its
/// whole key and value buffers: the one the caches already share, or a new one their entries are
/// copied into.
pub fn pooled(caches: &mut [&mut LayerCache], extra: usize) -> Result<(Tensor, Tensor)> {
    let n = caches.len();
    if n == 0 || !poolable(caches) {
        candle_core::bail!("pool: {n} layer caches that cannot share buffers");
    }
    for c in caches.iter_mut() {
        c.settle_gather()?;
    }
    let needed = caches.iter().map(|c| c.len + extra).max().unwrap_or(0);
    let id = caches[0].pool.as_ref().map(|p| p.id);
    let shared = caches.iter().enumerate().all(|(i, c)| {
        c.pool
            .as_ref()
            .is_some_and(|p| Some(p.id) == id && p.slot == i && p.slots == n)
    });
    match &caches[0].pool {
        Some(p) if shared && needed <= caches[0].capacity() => {
            Ok((p.keys.clone(), p.values.clone()))
        }
        _ => rebuild(caches, needed),
    }
}

/// The most elements one tensor may hold for candle's CUDA kernels, which count them in 32 bits
/// (`LaunchConfig::for_num_elems(n as u32)`: past it a kernel silently covers only part of the
/// tensor). Held on every device, so that what the CPU's tests of the device path run is what a GPU
/// can.
pub const KERNEL_ELEMENTS: usize = u32::MAX as usize;

/// Entries per slot of a pool built for `needed` entries when its members' buffers hold at most
/// `largest`: an eighth again when full (not half, as a sequence's own buffer grows): a pool holds
/// the whole batch, and its slack is what decides the largest batch that fits; a rebuild copies one
/// layer's entries once, against the thousands of steps that read them.
fn capacity(needed: usize, largest: usize) -> usize {
    match needed <= largest {
        true => largest,
        false => needed.max(largest + largest / 8),
    }
    .next_multiple_of(64)
    .max(64)
}

/// Whether one step of a batch of `caches` (one layer's, slot order) attending through a pool stays
/// within [`KERNEL_ELEMENTS`] in every tensor of that step: the pool's buffers with room for one more
/// entry each, and the attention scores (`query_heads` rows per sequence over the pool's entries).
/// A batch past it attends one sequence at a time instead.
pub fn fits_kernels(caches: &[&LayerCache], query_heads: usize) -> bool {
    let Some(first) = caches.first() else {
        return true;
    };
    let needed = caches.iter().map(|c| c.len + 1).max().unwrap_or(0);
    let largest = caches.iter().map(|c| c.capacity()).max().unwrap_or(0);
    let cap = capacity(needed, largest);
    let (wk, wv) = first.widths();
    let slots = caches.len();
    [
        slots.checked_mul(first.kv_heads * wk.max(wv)),
        slots.checked_mul(query_heads),
    ]
    .into_iter()
    .all(|rows| {
        rows.and_then(|r| r.checked_mul(cap))
            .is_some_and(|e| e <= KERNEL_ELEMENTS)
    })
}

/// Copies every member's entries into new pool buffers of at least `needed` entries per slot.
fn rebuild(caches: &mut [&mut LayerCache], needed: usize) -> Result<(Tensor, Tensor)> {
    let n = caches.len();
    let first = &caches[0];
    let heads = first.kv_heads;
    let (wk, wv) = first.widths();
    let (dk, dv) = (first.kv_type.keys.dtype(), first.kv_type.values.dtype());
    let device = first.k.device().clone();
    let largest = caches.iter().map(|c| c.capacity()).max().unwrap_or(0);
    let cap = capacity(needed, largest);
    let width = wk.max(wv);
    let elements = [n, heads, cap, width]
        .iter()
        .try_fold(1usize, |a, &x| a.checked_mul(x));
    if elements.is_none_or(|e| e > KERNEL_ELEMENTS) {
        candle_core::bail!(
            "pool: {n} sequences × {heads} KV heads × {cap} entries × {width} elements pass the {KERNEL_ELEMENTS} candle's CUDA kernels count"
        );
    }
    let keys = Tensor::zeros((n * heads, cap, wk), dk, &device)?;
    let values = Tensor::zeros((n * heads, cap, wv), dv, &device)?;
    let scores = match caches.iter().map(|c| c.score_width()).max().unwrap_or(0) {
        0 => None,
        w => Some(Tensor::zeros((n * heads, cap, w), DType::F32, &device)?),
    };
    let id = NEXT_POOL.fetch_add(1, Ordering::Relaxed);
    for (i, c) in caches.iter_mut().enumerate() {
        let own = |buf: &Tensor| buf.narrow(0, i * heads, heads);
        let (k, v) = (own(&keys)?, own(&values)?);
        let s = scores.as_ref().map(own).transpose()?;
        let len = c.len;
        let copy = |to: &Tensor, from: &Tensor| match len {
            0 => Ok(()),
            _ => to.slice_set(&from.narrow(1, 0, len)?.contiguous()?, 1, 0),
        };
        copy(&k, &c.k)?;
        copy(&v, &c.v)?;
        c.k = k;
        c.v = v;
        // A member without scores keeps none (its slot's rows stay unused until it has some).
        if let (Some(to), Some(from)) = (&s, &c.scores) {
            if to.dim(2)? != from.dim(2)? {
                candle_core::bail!("pool: members keep scores of different widths");
            }
            copy(to, from)?;
            c.scores = s;
        }
        c.pool = Some(PoolSlot {
            id,
            slot: i,
            slots: n,
            keys: keys.clone(),
            values: values.clone(),
            scores: scores.clone(),
        });
    }
    Ok((keys, values))
}

/// Defers the gathers of `caches`, the members of one pool in slot order, until
/// [`settle_gathers`]: while a batch's policies compress one after another, each gather only
/// records its rows (a sequence at a time it was an index copy, two selections and two writes per
/// sequence and layer; at a batch of a thousand on a GPU, most of a compression's launches).
pub fn defer_gathers(caches: &mut [&mut LayerCache]) {
    for c in caches.iter_mut() {
        c.defer_gathers = c.pool.is_some() && c.kivi.is_none();
    }
}

/// Moves the rows of every gather [`defer_gathers`] held back, and stops deferring: when every slot
/// of the pool gathered and kept as many entries, with one selection and one write per buffer for the
/// whole pool; otherwise member by member, as each would have alone. Returns the members that had a
/// gather to move (whose policies the time is charged to).
pub fn settle_gathers(caches: &mut [&mut LayerCache]) -> Result<Vec<usize>> {
    let n = caches.len();
    let moved: Vec<usize> = (0..n).filter(|&i| caches[i].pending.is_some()).collect();
    let whole = n > 0 && {
        let first = &caches[0];
        let id = first.pool.as_ref().map(|p| p.id);
        caches.iter().enumerate().all(|(i, c)| {
            c.pending.is_some()
                && c.len == first.len
                && c.pool
                    .as_ref()
                    .is_some_and(|p| Some(p.id) == id && p.slot == i && p.slots == n)
        })
    };
    if !whole {
        for c in caches.iter_mut() {
            c.settle_gather()?;
        }
        return Ok(moved);
    }
    let (heads, cap, m) = (caches[0].kv_heads, caches[0].capacity(), caches[0].len);
    let (wk, wv) = caches[0].widths();
    let slot_rows = heads * cap;
    let mut rows = Vec::with_capacity(n * heads * m);
    for (i, c) in caches.iter_mut().enumerate() {
        let own = c.pending.take().expect("checked above");
        rows.extend(own.iter().map(|&r| (i * slot_rows) as u32 + r));
        c.defer_gathers = false;
    }
    let p = caches[0].pool.as_ref().expect("checked above");
    let index = Tensor::from_vec(rows, n * heads * m, p.keys.device())?;
    let scores = match &p.scores {
        Some(s) => Some((s, s.dim(2)?)),
        None => None,
    };
    for (buf, w) in [(&p.keys, wk), (&p.values, wv)].into_iter().chain(scores) {
        let kept = buf.reshape((n * slot_rows, w))?.index_select(&index, 0)?;
        buf.slice_set(&kept.reshape((n * heads, m, w))?, 1, 0)?;
    }
    Ok(moved)
}

/// The pool's per-entry scores, `[slots·kv_heads, capacity, width]`, for `caches`, the members of
/// one pool in slot order ([`pooled`] first): made (zero) if the pool has none yet, and each member
/// without scores given its slot's rows, holding `handed(i)` (one vector per head, at most its
/// entries' scores, the rest zero: see [`LayerCache::take_scores`]). Members that have scores keep
/// theirs.
pub fn pooled_scores(
    caches: &mut [&mut LayerCache],
    width: usize,
    mut handed: impl FnMut(usize) -> Vec<Vec<f32>>,
) -> Result<Tensor> {
    let n = caches.len();
    let Some(p) = caches.first().and_then(|c| c.pool.clone()) else {
        candle_core::bail!("pooled_scores: the caches are not pooled");
    };
    if caches.iter().enumerate().any(|(i, c)| {
        c.pool
            .as_ref()
            .is_none_or(|q| q.id != p.id || q.slot != i || q.slots != n)
    }) {
        candle_core::bail!("pooled_scores: {n} caches that are not one pool's slots in order");
    }
    let scores = match &p.scores {
        Some(s) if s.dim(2)? == width => s.clone(),
        Some(s) => candle_core::bail!(
            "pooled_scores: the pool keeps {} scores an entry, not {width}",
            s.dim(2)?
        ),
        None => {
            let (rows, cap, _) = p.keys.dims3()?;
            let s = Tensor::zeros((rows, cap, width), DType::F32, p.keys.device())?;
            for c in caches.iter_mut() {
                if let Some(slot) = c.pool.as_mut() {
                    slot.scores = Some(s.clone());
                }
            }
            s
        }
    };
    for (i, c) in caches.iter_mut().enumerate() {
        if c.scores.is_none() {
            let heads = c.kv_heads;
            c.scores = Some(scores.narrow(0, i * heads, heads)?);
            c.write_scores(&handed(i))?;
        }
    }
    Ok(scores)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::KvType;
    use candle_core::Device;

    /// A cache of `n` entries whose key `j` of head `h` is `seed + 100·h + j` in each of its four
    /// dimensions, and whose value is twice that.
    fn cache(n: usize, seed: f32) -> LayerCache {
        let dev = Device::Cpu;
        let mut c = LayerCache::new(2, 4, KvType::F32, &dev).unwrap();
        let k: Vec<f32> = (0..2)
            .flat_map(|h| (0..n).flat_map(move |j| [seed + (100 * h + j) as f32; 4]))
            .collect();
        let k = Tensor::from_vec(k, (2, n, 4), &dev).unwrap();
        c.append(&k, &(&k * 2.0).unwrap(), 0).unwrap();
        c
    }

    fn contents(c: &LayerCache) -> (Vec<f32>, Vec<f32>, Vec<Vec<u32>>) {
        let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let positions = (0..c.kv_heads()).map(|h| c.positions(h).to_vec()).collect();
        (
            flat(c.keys().unwrap()),
            flat(c.values().unwrap()),
            positions,
        )
    }

    /// Each head keeps `m` entries of `len`, out of order.
    fn kept(len: usize, m: usize) -> Vec<Vec<usize>> {
        vec![
            (0..m).map(|t| (len - 1 + 2 * t) % len).collect(),
            (0..m).map(|t| (3 * t + 1) % len).collect(),
        ]
    }

    #[test]
    fn a_batch_fits_the_kernels_up_to_their_element_count_and_not_past_it() {
        // Two KV heads of four dimensions at the smallest capacity (64 entries): 512 elements a
        // slot in each buffer, so 8,388,607 slots are the most whose buffers the kernels count.
        let c = cache(5, 0.0);
        assert_eq!(c.capacity(), 64);
        let most = KERNEL_ELEMENTS / 512;
        let mut batch = vec![&c; most];
        assert!(fits_kernels(&batch, 8));
        batch.push(&c);
        assert!(!fits_kernels(&batch, 8));
        // The scores count too: a slot's query heads over the pool's entries.
        let batch = vec![&c; KERNEL_ELEMENTS / (64 * 1000) + 1];
        assert!(fits_kernels(&batch, 8));
        assert!(!fits_kernels(&batch, 1000));
        // A product past the machine's word is not a fit either.
        assert!(!fits_kernels(&[&c], usize::MAX / 2));
    }

    #[test]
    fn deferred_gathers_settle_to_what_each_gather_does_alone() {
        let lens = [7, 5, 9];
        // Every member keeping three (one write for the pool); one member not gathering; one
        // gathering twice (member by member).
        let cases: [[&[usize]; 3]; 3] =
            [[&[3], &[3], &[3]], [&[3], &[], &[3]], [&[4, 2], &[3], &[3]]];
        for plan in cases {
            let mut alone: Vec<LayerCache> = Vec::new();
            let mut members: Vec<LayerCache> = Vec::new();
            for (i, &len) in lens.iter().enumerate() {
                alone.push(cache(len, 1000.0 * i as f32));
                members.push(cache(len, 1000.0 * i as f32));
            }
            let mut refs: Vec<&mut LayerCache> = members.iter_mut().collect();
            pooled(&mut refs, 1).unwrap();
            defer_gathers(&mut refs);
            for (i, gathers) in plan.iter().enumerate() {
                for &m in gathers.iter() {
                    let k = kept(refs[i].len(), m);
                    refs[i].gather(&k).unwrap();
                    alone[i].gather(&k).unwrap();
                }
            }
            let moved = settle_gathers(&mut refs).unwrap();
            let gathered: Vec<usize> = (0..3).filter(|&i| !plan[i].is_empty()).collect();
            assert_eq!(moved, gathered, "plan {plan:?}");
            for (i, (a, b)) in alone.iter().zip(refs.iter()).enumerate() {
                assert_eq!(contents(a), contents(b), "plan {plan:?}, member {i}");
                assert!(!b.defer_gathers && b.pending.is_none());
            }
        }
    }

    #[test]
    #[should_panic(expected = "deferred gather")]
    fn reading_a_cache_before_its_deferred_gather_settles_panics() {
        let mut members = [cache(6, 0.0), cache(6, 1.0)];
        let mut refs: Vec<&mut LayerCache> = members.iter_mut().collect();
        pooled(&mut refs, 1).unwrap();
        defer_gathers(&mut refs);
        refs[0].gather(&kept(6, 3)).unwrap();
        let _ = refs[0].keys();
    }
}
