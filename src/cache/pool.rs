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
use candle_core::{Result, Tensor};
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
}

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

/// Whether `caches` can share a pool: plain rows of one type (not block formats, not KIVI), the
/// same heads and width.
pub fn poolable(caches: &[&mut LayerCache]) -> bool {
    let Some(first) = caches.first() else {
        return false;
    };
    caches.iter().all(|c| {
        c.kivi.is_none()
            && c.kv_type.keys.blocks().is_none()
            && c.kv_type.values.blocks().is_none()
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

/// Copies every member's entries into new pool buffers of at least `needed` entries per slot.
fn rebuild(caches: &mut [&mut LayerCache], needed: usize) -> Result<(Tensor, Tensor)> {
    let n = caches.len();
    let first = &caches[0];
    let heads = first.kv_heads;
    let (wk, wv) = first.widths();
    let (dk, dv) = (first.kv_type.keys.dtype(), first.kv_type.values.dtype());
    let device = first.k.device().clone();
    let largest = caches.iter().map(|c| c.capacity()).max().unwrap_or(0);
    // An eighth again when full (not half, as a sequence's own buffer grows): a pool holds the
    // whole batch, and its slack is what decides the largest batch that fits; a rebuild copies one
    // layer's entries once, against the thousands of steps that read them.
    let cap = match needed <= largest {
        true => largest,
        false => needed.max(largest + largest / 8),
    }
    .next_multiple_of(64)
    .max(64);
    let keys = Tensor::zeros((n * heads, cap, wk), dk, &device)?;
    let values = Tensor::zeros((n * heads, cap, wv), dv, &device)?;
    let id = NEXT_POOL.fetch_add(1, Ordering::Relaxed);
    for (i, c) in caches.iter_mut().enumerate() {
        let k = keys.narrow(0, i * heads, heads)?;
        let v = values.narrow(0, i * heads, heads)?;
        if c.len > 0 {
            k.slice_set(&c.k.narrow(1, 0, c.len)?.contiguous()?, 1, 0)?;
            v.slice_set(&c.v.narrow(1, 0, c.len)?.contiguous()?, 1, 0)?;
        }
        c.k = k;
        c.v = v;
        c.pool = Some(PoolSlot {
            id,
            slot: i,
            slots: n,
            keys: keys.clone(),
            values: values.clone(),
        });
    }
    Ok((keys, values))
}
