//! The KV cache kvbench owns: per layer, per KV head, keys after RoPE, values, and each entry's
//! original position.
//!
//! Storage is one `[kv_heads, capacity, head_dim]` buffer per layer for keys and one for values, never
//! replicated per query head, so GQA models keep their memory advantage. Every head of a layer holds
//! the same number of entries (policies select per head, but keep equal counts), and each head keeps
//! its own list of original positions because heads may keep different tokens. Appends write in place;
//! evictions gather the kept rows to the front. Entries are stored as [`KvType`] says (f32, f16, bf16,
//! or llama.cpp's Q8_0/Q4_0 blocks, quantized when appended). Byte sizes are exact: entries × heads ×
//! 2 × a stored row's bytes (scales included). The KIVI modes hold their rows in a layout of their own
//! on the host ([`kivi::KiviStore`]: key scales per group of tokens, a full-precision window), with
//! their own exact bytes.

pub mod kivi;
pub mod kv_type;
pub mod pool;
pub mod quant;
pub mod rows;
mod scores;

pub use kv_type::{KvElement, KvType};

use candle_core::{DType, Device, Result, Tensor};

/// One layer's keys, values and position metadata.
#[derive(Debug, Clone)]
pub struct LayerCache {
    /// `[kv_heads, capacity, width]`: rows of `head_dim` values, or of their blocks' bytes (empty
    /// under KIVI, whose rows live in `kivi`; they still name the device).
    k: Tensor,
    v: Tensor,
    kivi: Option<kivi::KiviStore>,
    /// Scores a policy keeps per entry in the cache rather than in itself (H2O's accumulated
    /// attention in a decoding batch on a device, see [`scores`]): `[kv_heads, capacity, width]` f32,
    /// appended (zero), moved by gathers, grown and pooled with the keys and values. `None` while the
    /// policy keeps them itself (and always under KIVI).
    scores: Option<Tensor>,
    /// Set while `k` and `v` are views of a pool shared with other sequences ([`pool`]).
    pool: Option<pool::PoolSlot>,
    /// Set by the engine while a pooled batch's policies act ([`pool::defer_gathers`]): a gather then
    /// updates the positions and length at once and leaves its rows in `pending`, which
    /// [`pool::settle_gathers`] moves for the whole pool together.
    defer_gathers: bool,
    /// A deferred gather's rows, head by head in the new storage order: `h·capacity + j` for entry `j`
    /// of head `h` in the buffer as it still is. Reading the buffers while it is set is a bug (they
    /// hold the entries before the gather): every reader asserts it is not.
    pending: Option<Vec<u32>>,
    /// The keys of the last append as stored, on the host (`[kv_heads][t][head_dim]` from entry
    /// `.0`), when the engine had them there ([`keep_host_keys`](Self::keep_host_keys)):
    /// [`key_rows`](Self::key_rows) reads them from here instead of copying from a device. Dropped
    /// by every change to the entries.
    host_keys: Option<(usize, Vec<f32>)>,
    kv_type: KvType,
    len: usize,
    kv_heads: usize,
    head_dim: usize,
    /// `positions[h][j]`: the logical position (tokens seen before it) of entry `j` of head `h`.
    positions: Vec<Vec<u32>>,
    /// Largest entry count this layer ever held, including the transient size inside a compressing step.
    peak_len: usize,
    /// Number of gathers (compression events) so far.
    compressions: usize,
    /// Bytes held at the start of the current forward step, and the most held during it (after this
    /// step's append, before the policy compresses).
    step_start_bytes: usize,
    step_max_bytes: usize,
}

/// Keys of one layer as host f32 slices: borrowed from the buffer on the CPU when it holds f32, else
/// converted (or dequantized, or copied from the device). Head `h`'s entries are rows
/// `h·stride .. h·stride + len`. Values are not offered: no policy scores them, and reading them cost a
/// second conversion (or a second device-to-host copy) of the cache at every compression.
pub struct HostKeys<'a> {
    keys: std::borrow::Cow<'a, [f32]>,
    stride: usize,
    pub len: usize,
    pub head_dim: usize,
}

impl HostKeys<'_> {
    /// Keys of head `h`, `[len][head_dim]`.
    pub fn keys(&self, h: usize) -> &[f32] {
        let d = self.head_dim;
        &self.keys[h * self.stride * d..(h * self.stride + self.len) * d]
    }
}

impl LayerCache {
    pub fn new(kv_heads: usize, head_dim: usize, kv_type: KvType, device: &Device) -> Result<Self> {
        if let Err(e) = kv_type.check(head_dim, device) {
            candle_core::bail!("{e}");
        }
        let kivi = kv_type
            .kivi()
            .map(|(bits, window)| kivi::KiviStore::new(bits, window, kv_heads, head_dim));
        let capacity = if kivi.is_some() { 0 } else { 64 };
        let buffer = |e: KvElement| {
            Tensor::zeros(
                (kv_heads, capacity, e.row_width(head_dim)),
                e.dtype(),
                device,
            )
        };
        Ok(Self {
            k: buffer(kv_type.keys)?,
            v: buffer(kv_type.values)?,
            kivi,
            scores: None,
            pool: None,
            defer_gathers: false,
            pending: None,
            host_keys: None,
            kv_type,
            len: 0,
            kv_heads,
            head_dim,
            positions: vec![Vec::new(); kv_heads],
            peak_len: 0,
            compressions: 0,
            step_start_bytes: 0,
            step_max_bytes: 0,
        })
    }

    /// A copy with buffers of its own (a clone would share them, and appends write in place), out
    /// of any pool.
    pub fn deep_copy(&self) -> Result<Self> {
        self.assert_settled();
        let mut copy = self.clone();
        copy.k = self.k.copy()?;
        copy.v = self.v.copy()?;
        copy.scores = self.scores.as_ref().map(Tensor::copy).transpose()?;
        copy.pool = None;
        Ok(copy)
    }

    /// Whether the buffers are views of a pool shared with other sequences' caches of the layer
    /// ([`pool`]): a decoding batch on the path a GPU takes.
    pub fn in_pool(&self) -> bool {
        self.pool.is_some()
    }

    /// Number of entries each KV head holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    pub fn peak_len(&self) -> usize {
        self.peak_len
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// How entries are stored.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Compression events (gathers) so far.
    pub fn compressions(&self) -> usize {
        self.compressions
    }

    /// Runs `f` on the keys as host f32 slices, without a copy when the cache is an f32 CPU tensor.
    /// Policies score from here.
    pub fn with_host_keys<R>(&self, f: impl FnOnce(&HostKeys<'_>) -> R) -> Result<R> {
        use candle_core::Storage;
        use std::borrow::Cow;
        self.assert_settled();
        let (k_store, k_layout) = self.k.storage_and_layout();
        if let Storage::Cpu(kc) = &*k_store {
            if let Ok(k) = kc.as_slice::<f32>() {
                let view = HostKeys {
                    keys: Cow::Borrowed(&k[k_layout.start_offset()..]),
                    stride: self.capacity(),
                    len: self.len,
                    head_dim: self.head_dim,
                };
                return Ok(f(&view));
            }
        }
        drop(k_store);
        let view = HostKeys {
            keys: Cow::Owned(crate::host_copy::flat_f32(&self.keys()?)?),
            stride: self.len,
            len: self.len,
            head_dim: self.head_dim,
        };
        Ok(f(&view))
    }

    fn capacity(&self) -> usize {
        match self.kivi {
            Some(_) => self.len,
            None => self.k.dim(1).unwrap_or(0),
        }
    }

    /// The KIVI store, when the cache holds a KIVI mode (attention then reads its rows).
    pub fn kivi(&self) -> Option<&kivi::KiviStore> {
        self.kivi.as_ref()
    }

    /// Buffer elements per stored row of keys and of values.
    fn widths(&self) -> (usize, usize) {
        let d = self.head_dim;
        (
            self.kv_type.keys.row_width(d),
            self.kv_type.values.row_width(d),
        )
    }

    /// Keys held, `[kv_heads, len, head_dim]`: a view into the buffer, or for block formats and KIVI
    /// their values (a dequantized copy, f32: candle's path, prefill and other devices; on a GPU made
    /// there, [`quant::Blocks::dequantize_tensor`]).
    pub fn keys(&self) -> Result<Tensor> {
        self.held(true)
    }

    /// Values held, `[kv_heads, len, head_dim]`, as [`keys`](Self::keys).
    pub fn values(&self) -> Result<Tensor> {
        self.held(false)
    }

    fn held(&self, keys: bool) -> Result<Tensor> {
        self.assert_settled();
        let (buf, elem) = match keys {
            true => (&self.k, self.kv_type.keys),
            false => (&self.v, self.kv_type.values),
        };
        if let Some(store) = &self.kivi {
            let mut out = Vec::with_capacity(self.kv_heads * self.len * self.head_dim);
            for h in 0..self.kv_heads {
                store.read_rows(h, 0..self.len, keys, &mut out);
            }
            return Tensor::from_vec(out, (self.kv_heads, self.len, self.head_dim), buf.device());
        }
        let held = buf.narrow(1, 0, self.len)?;
        let Some(blocks) = elem.blocks() else {
            return Ok(held);
        };
        // Off the CPU the blocks are read where they are (copying the whole cache to the host and
        // back took every layer of every step); on the CPU a loop over the bytes is several times
        // faster than candle's operations.
        if !held.device().is_cpu() {
            return blocks.dequantize_tensor(&held);
        }
        let bytes = crate::host_copy::flat::<u8>(&held)?;
        let row = blocks.row_bytes(self.head_dim);
        let mut out = Vec::with_capacity(self.kv_heads * self.len * self.head_dim);
        let mut vals = Vec::with_capacity(self.head_dim);
        for r in bytes.chunks_exact(row) {
            blocks.dequantize(r, &mut vals);
            out.extend_from_slice(&vals);
        }
        Tensor::from_vec(out, (self.kv_heads, self.len, self.head_dim), buf.device())
    }

    /// The whole key and value buffers, `[kv_heads, capacity, width]` (a row: `head_dim` values, or
    /// their blocks' bytes, [`KvElement::row_width`]); the first [`len`](Self::len) entries of each head
    /// are held. For kernels that read the cache in place (empty under KIVI: see [`kivi`](Self::kivi)).
    pub fn buffers(&self) -> (&Tensor, &Tensor) {
        self.assert_settled();
        (&self.k, &self.v)
    }

    /// Panics when a deferred gather has not moved its rows yet: the buffers would be read as they
    /// were before it (an engine bug, never an input's).
    fn assert_settled(&self) {
        assert!(
            self.pending.is_none(),
            "a layer cache was read before its deferred gather was settled"
        );
    }

    /// Keys `rows` of heads `heads` as f32, `[heads.len()][rows.len()][head_dim]`: only those rows are
    /// read (and converted from the stored type, or copied from the device: one copy for all the
    /// heads, one wait for a GPU).
    pub fn key_rows(
        &self,
        heads: std::ops::Range<usize>,
        rows: std::ops::Range<usize>,
    ) -> Result<Vec<f32>> {
        self.assert_settled();
        if rows.end > self.len || rows.start > rows.end || heads.end > self.kv_heads {
            candle_core::bail!(
                "key_rows: rows {rows:?} of heads {heads:?} beyond {} entries of {} heads",
                self.len,
                self.kv_heads
            );
        }
        let d = self.head_dim;
        let mut out = Vec::with_capacity(heads.len() * rows.len() * d);
        if let Some((first, keys)) = &self.host_keys {
            let t = keys.len() / (self.kv_heads * d);
            if rows.start >= *first && rows.end <= first + t {
                for h in heads {
                    let at = (h * t + rows.start - first) * d;
                    out.extend_from_slice(&keys[at..at + rows.len() * d]);
                }
                return Ok(out);
            }
        }
        if let Some(store) = &self.kivi {
            for h in heads {
                store.read_rows(h, rows.clone(), true, &mut out);
            }
            return Ok(out);
        }
        let part = self
            .k
            .narrow(0, heads.start, heads.len())?
            .narrow(1, rows.start, rows.len())?;
        let Some(blocks) = self.kv_type.keys.blocks() else {
            return crate::host_copy::flat_f32(&part);
        };
        let bytes = crate::host_copy::flat::<u8>(&part)?;
        let mut vals = Vec::with_capacity(d);
        for r in bytes.chunks_exact(blocks.row_bytes(d)) {
            blocks.dequantize(r, &mut vals);
            out.extend_from_slice(&vals);
        }
        Ok(out)
    }

    /// Original positions of head `h`'s entries, in storage order.
    pub fn positions(&self, h: usize) -> &[u32] {
        &self.positions[h]
    }

    /// Bytes of keys and values of one entry (all heads), block scales included.
    fn entry_bytes(&self) -> usize {
        self.kv_heads * self.kv_type.entry_row_bytes(self.head_dim)
    }

    /// Exact bytes of keys and values held (not the allocated capacity).
    pub fn bytes(&self) -> usize {
        match &self.kivi {
            Some(store) => store.bytes(),
            None => self.len * self.entry_bytes(),
        }
    }

    /// Bytes of the key and value buffers allocated (they grow by half when full and never shrink;
    /// under KIVI, its store's buffers as allocated).
    pub fn capacity_bytes(&self) -> usize {
        match &self.kivi {
            Some(store) => store.allocated_bytes(),
            None => self.capacity() * self.entry_bytes(),
        }
    }

    /// Appends `t` new entries: `k`, `v` are `[kv_heads, t, head_dim]`; `first_pos` is the logical
    /// position of the first one.
    pub fn append(&mut self, k: &Tensor, v: &Tensor, first_pos: usize) -> Result<()> {
        self.settle_gather()?;
        self.host_keys = None;
        let t = k.dim(1)?;
        for p in &mut self.positions {
            p.extend((first_pos..first_pos + t).map(|x| x as u32));
        }
        if let Some(store) = &mut self.kivi {
            let host = crate::host_copy::flat_f32;
            let (ks, vs) = (host(k)?, host(v)?);
            let per = t * self.head_dim;
            for h in 0..self.kv_heads {
                let rows = h * per..(h + 1) * per;
                store.append(h, &ks[rows.clone()], &vs[rows], &self.positions[h]);
            }
        } else {
            if self.len + t > self.capacity() {
                self.grow(self.len + t)?;
            }
            self.k
                .slice_set(&Self::stored(k, self.kv_type.keys)?, 1, self.len)?;
            self.v
                .slice_set(&Self::stored(v, self.kv_type.values)?, 1, self.len)?;
            self.zero_scores(self.len, t)?;
        }
        self.len += t;
        self.note_growth();
        Ok(())
    }

    /// Records `t` entries that were written into this cache's buffer from outside it (a pool's
    /// batched append, [`pool`]), the first at logical position `first_pos`.
    pub(crate) fn note_appended(&mut self, t: usize, first_pos: usize) -> Result<()> {
        self.assert_settled();
        self.host_keys = None;
        if self.kivi.is_some() || self.len + t > self.capacity() {
            candle_core::bail!(
                "note_appended: {t} entries beyond the buffer of {} entries holding {}",
                self.capacity(),
                self.len
            );
        }
        for p in &mut self.positions {
            p.extend((first_pos..first_pos + t).map(|x| x as u32));
        }
        self.len += t;
        self.note_growth();
        Ok(())
    }

    fn note_growth(&mut self) {
        self.peak_len = self.peak_len.max(self.len);
        self.step_max_bytes = self.step_max_bytes.max(self.bytes());
    }

    /// New rows `[kv_heads, t, head_dim]` as stored: converted, or quantized into blocks (on the host).
    fn stored(x: &Tensor, elem: KvElement) -> Result<Tensor> {
        let Some(blocks) = elem.blocks() else {
            return x.to_dtype(elem.dtype())?.contiguous();
        };
        let (h, t, d) = x.dims3()?;
        let vals = crate::host_copy::flat_f32(x)?;
        let row = blocks.row_bytes(d);
        let mut bytes = vec![0u8; h * t * row];
        for (v, b) in vals.chunks_exact(d).zip(bytes.chunks_exact_mut(row)) {
            blocks.quantize(v, b);
        }
        Tensor::from_vec(bytes, (h, t, row), x.device())
    }

    /// Room for at least `needed` entries: half as much again as now (a multiple of 64), or `needed`
    /// if more. Half again rather than double: a 640-token run (512 prompt, 128 new) holds 768 entries'
    /// buffers rather than 1,024, for SmolLM2 256 entries × 30 layers × 1.5 KiB = 11 MiB less; a long run copies its cache a few
    /// more times (seven growths from 512 to 8,192 entries instead of four), each a plain copy.
    fn grow(&mut self, needed: usize) -> Result<()> {
        self.assert_settled();
        let cap = self.capacity();
        let new_cap = needed.max(cap + cap / 2).next_multiple_of(64).max(64);
        let (heads, len) = (self.kv_heads, self.len);
        let grown = |old: &Tensor| -> Result<Tensor> {
            let width = old.dim(2)?;
            let new = Tensor::zeros((heads, new_cap, width), old.dtype(), old.device())?;
            if len > 0 {
                new.slice_set(&old.narrow(1, 0, len)?.contiguous()?, 1, 0)?;
            }
            Ok(new)
        };
        self.k = grown(&self.k)?;
        self.v = grown(&self.v)?;
        self.scores = self.scores.as_ref().map(grown).transpose()?;
        // Its own buffers now: it leaves any pool it was in.
        self.pool = None;
        Ok(())
    }

    /// Keeps, for every head `h`, the entries `kept[h]` (indices into the current storage, in the order
    /// given: that order becomes the new storage order). Every head must keep the same number of entries.
    pub fn gather(&mut self, kept: &[Vec<usize>]) -> Result<()> {
        if kept.len() != self.kv_heads {
            candle_core::bail!(
                "gather: {} index lists for {} KV heads",
                kept.len(),
                self.kv_heads
            );
        }
        self.host_keys = None;
        let m = kept[0].len();
        let cap = self.capacity();
        // Entry `j` of head `h` is buffer row `h·cap + j`, or the row a deferred gather left for it.
        let row = |h: usize, j: usize| match &self.pending {
            Some(rows) => rows[h * self.len + j],
            None => (h * cap + j) as u32,
        };
        let mut flat = Vec::with_capacity(m * self.kv_heads);
        for (h, idx) in kept.iter().enumerate() {
            if idx.len() != m {
                candle_core::bail!(
                    "gather: head {h} keeps {} entries, head 0 keeps {m}",
                    idx.len()
                );
            }
            for &j in idx {
                if j >= self.len {
                    candle_core::bail!("gather: index {j} out of range for {} entries", self.len);
                }
                flat.push(row(h, j));
            }
        }
        if let Some(store) = &mut self.kivi {
            store.gather(kept);
        } else if self.defer_gathers {
            self.pending = Some(flat);
        } else {
            self.pending = None;
            self.move_rows(&flat, m)?;
        }
        for (h, idx) in kept.iter().enumerate() {
            let old = &self.positions[h];
            self.positions[h] = idx.iter().map(|&j| old[j]).collect();
        }
        self.len = m;
        self.compressions += 1;
        Ok(())
    }

    /// Moves buffer rows `rows` (`h·capacity + j`, head by head, `m` a head) to the front of their
    /// heads, keys and values: one selection and one write each.
    fn move_rows(&self, rows: &[u32], m: usize) -> Result<()> {
        let cap = self.capacity();
        let index = Tensor::from_slice(rows, m * self.kv_heads, self.k.device())?;
        let heads = self.kv_heads;
        let gather = |buf: &Tensor, w: usize| -> Result<()> {
            let kept = buf.reshape((heads * cap, w))?.index_select(&index, 0)?;
            buf.slice_set(&kept.reshape((heads, m, w))?, 1, 0)
        };
        let (wk, wv) = self.widths();
        gather(&self.k, wk)?;
        gather(&self.v, wv)?;
        match &self.scores {
            Some(s) => gather(s, s.dim(2)?),
            None => Ok(()),
        }
    }

    /// Keeps on the host the keys just appended (`keys`: the last `t` entries of every head,
    /// `[kv_heads][t][head_dim]`, as the activations held them before the append), rounded as the
    /// cache stores them, so that a policy reading them ([`key_rows`](Self::key_rows)) does not copy
    /// them back from a device: the engine copies a layer's new keys once for the whole batch. Kept
    /// only for float storage (f32, f16, bf16), whose rounding the host repeats exactly; block and
    /// KIVI storage are read as before.
    pub fn keep_host_keys(&mut self, mut keys: Vec<f32>) -> Result<()> {
        let per = self.kv_heads * self.head_dim;
        if per == 0 || !keys.len().is_multiple_of(per) || keys.len() / per > self.len {
            candle_core::bail!(
                "keep_host_keys: {} values for {} heads of {} with {} entries",
                keys.len(),
                self.kv_heads,
                self.head_dim,
                self.len
            );
        }
        let round: fn(f32) -> f32 = match (self.kivi.is_some(), self.kv_type.keys.dtype()) {
            (false, DType::F32) => |x| x,
            (false, DType::F16) => |x| half::f16::from_f32(x).to_f32(),
            (false, DType::BF16) => |x| half::bf16::from_f32(x).to_f32(),
            _ => {
                self.host_keys = None;
                return Ok(());
            }
        };
        keys.iter_mut().for_each(|x| *x = round(*x));
        self.host_keys = Some((self.len - keys.len() / per, keys));
        Ok(())
    }

    /// Moves the rows of a deferred gather, if any, and stops deferring.
    pub(crate) fn settle_gather(&mut self) -> Result<()> {
        self.defer_gathers = false;
        match self.pending.take() {
            Some(rows) => self.move_rows(&rows, self.len),
            None => Ok(()),
        }
    }
}

/// A whole sequence's cache: one [`LayerCache`] per layer, plus the running statistics every report needs.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<LayerCache>,
    /// Sum over finished steps of the entries held at the end of the step, per layer (for time averages).
    entry_steps: Vec<u64>,
    steps: u64,
    /// Sum over finished steps of the tokens seen: what a full cache would have held.
    seen_steps: u64,
    seen: usize,
    /// The most bytes held at any moment so far (inside steps too), and the most allocated.
    peak_bytes: usize,
    peak_capacity_bytes: usize,
}

impl KvCache {
    pub fn new(
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        kv_type: KvType,
        device: &Device,
    ) -> Result<Self> {
        let layers = (0..num_layers)
            .map(|_| LayerCache::new(kv_heads, head_dim, kv_type, device))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            entry_steps: vec![0; num_layers],
            steps: 0,
            seen_steps: 0,
            seen: 0,
            peak_bytes: 0,
            peak_capacity_bytes: 0,
        })
    }

    /// A copy whose layers have buffers of their own ([`LayerCache::deep_copy`]).
    pub fn deep_copy(&self) -> Result<Self> {
        let mut copy = self.clone();
        copy.layers = self
            .layers
            .iter()
            .map(LayerCache::deep_copy)
            .collect::<Result<_>>()?;
        Ok(copy)
    }

    pub fn layer(&self, l: usize) -> &LayerCache {
        &self.layers[l]
    }

    /// How every layer stores keys and values.
    pub fn kv_type(&self) -> KvType {
        self.layers.first().map_or(KvType::F32, LayerCache::kv_type)
    }

    pub fn layer_mut(&mut self, l: usize) -> &mut LayerCache {
        &mut self.layers[l]
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Tokens the sequence has seen at the end of the last step: what a full cache holds.
    pub fn seen(&self) -> usize {
        self.seen
    }

    /// Exact bytes of keys and values held now, all layers.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerCache::bytes).sum()
    }

    /// Bytes of the per-entry scores a policy keeps in the cache, all layers (its side state, not
    /// keys and values: [`LayerCache::score_bytes`]).
    pub fn score_bytes(&self) -> usize {
        self.layers.iter().map(LayerCache::score_bytes).sum()
    }

    /// Records the end of a forward step, after which the sequence has seen `seen` tokens, for
    /// time-averaged statistics.
    pub fn end_step(&mut self, seen: usize) {
        for (acc, layer) in self.entry_steps.iter_mut().zip(&self.layers) {
            *acc += layer.len() as u64;
        }
        // Layers run in order, each appending then compressing: while layer l holds its most, the
        // layers before it are already compressed and the ones after it have not appended yet.
        // (No allocation: this runs after every step of every sequence.)
        let mut pending: usize = self.layers.iter().map(|c| c.step_start_bytes).sum();
        let mut done = 0usize;
        for c in &self.layers {
            pending -= c.step_start_bytes;
            let moment = done + c.step_max_bytes.max(c.bytes()) + pending;
            self.peak_bytes = self.peak_bytes.max(moment);
            done += c.bytes();
        }
        self.peak_capacity_bytes = self
            .peak_capacity_bytes
            .max(self.layers.iter().map(LayerCache::capacity_bytes).sum());
        for c in self.layers.iter_mut() {
            c.step_start_bytes = c.bytes();
            c.step_max_bytes = c.step_start_bytes;
        }
        self.steps += 1;
        self.seen_steps += seen as u64;
        self.seen = seen;
    }

    /// The most key and value bytes held at any moment so far, inside steps too (the uncompressed
    /// prompt before prefill compression, a compressing step's extra entries).
    pub fn peak_bytes(&self) -> usize {
        self.peak_bytes
    }

    /// The most bytes of key and value buffers allocated so far (capacity, not entries held).
    pub fn peak_capacity_bytes(&self) -> usize {
        self.peak_capacity_bytes
    }

    /// Retained-entry statistics so far.
    pub fn stats(&self) -> CacheStats {
        let steps = self.steps.max(1) as f64;
        CacheStats {
            peak_entries: self.layers.iter().map(LayerCache::peak_len).collect(),
            mean_entries: self.entry_steps.iter().map(|&s| s as f64 / steps).collect(),
            final_entries: self.layers.iter().map(LayerCache::len).collect(),
            compressions: self.layers.iter().map(LayerCache::compressions).collect(),
            full_mean_entries: self.seen_steps as f64 / steps,
            full_final_entries: self.seen,
        }
    }
}

/// Per-layer retained-entry figures of one sequence (per KV head; every head of a layer holds the same count).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct CacheStats {
    pub peak_entries: Vec<usize>,
    pub mean_entries: Vec<f64>,
    pub final_entries: Vec<usize>,
    /// Compression events (gathers) per layer.
    #[serde(default)]
    pub compressions: Vec<usize>,
    /// What a full cache would hold per head, time-averaged over the same steps and at the end.
    #[serde(default)]
    pub full_mean_entries: f64,
    #[serde(default)]
    pub full_final_entries: usize,
}

impl CacheStats {
    /// Largest peak over layers.
    pub fn max_peak(&self) -> usize {
        self.peak_entries.iter().copied().max().unwrap_or(0)
    }

    /// Mean over layers of the time-averaged entries.
    pub fn mean_entries(&self) -> f64 {
        self.mean_entries.iter().sum::<f64>() / self.mean_entries.len().max(1) as f64
    }

    /// Compression events of the layer that compressed most often.
    pub fn events(&self) -> usize {
        self.compressions.iter().copied().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(n: usize) -> LayerCache {
        let dev = Device::Cpu;
        let mut c = LayerCache::new(2, 4, KvType::F32, &dev).unwrap();
        // entry j of head h holds the value 100*h + j in every dimension
        let k: Vec<f32> = (0..2)
            .flat_map(|h| (0..n).flat_map(move |j| [(100 * h + j) as f32; 4]))
            .collect();
        let k = Tensor::from_vec(k, (2, n, 4), &dev).unwrap();
        c.append(&k, &(&k * 2.0).unwrap(), 10).unwrap();
        c
    }

    #[test]
    fn append_grows_and_keeps_positions() {
        let c = filled(100);
        assert_eq!(c.len(), 100);
        assert_eq!(c.positions(1)[0], 10);
        assert_eq!(c.positions(1)[99], 109);
        let k = c.keys().unwrap().to_vec3::<f32>().unwrap();
        assert_eq!(k[1][99][0], 199.0);
        // 100 entries × 2 heads × 4 dims × (k + v) × 4 bytes
        assert_eq!(c.bytes(), 100 * 2 * 4 * 2 * 4);
    }

    #[test]
    fn the_peak_counts_the_moment_inside_a_step_and_capacity_is_apart() {
        let dev = Device::Cpu;
        let mut cache = KvCache::new(2, 2, 4, KvType::F32, &dev).unwrap();
        let entry = 2 * 4 * 2 * 4;
        let k = Tensor::zeros((2, 10, 4), DType::F32, &dev).unwrap();
        // A prefill of 10 compressed to 4 per layer, layer by layer as the engine runs them.
        for l in 0..2 {
            let c = cache.layer_mut(l);
            c.append(&k, &k, 0).unwrap();
            c.gather(&[vec![0, 1, 2, 9], vec![0, 1, 2, 9]]).unwrap();
        }
        cache.end_step(10);
        assert_eq!(cache.bytes(), 8 * entry, "held at the end of the step");
        // While layer 1 held its 10, layer 0 held its 4.
        assert_eq!(cache.peak_bytes(), 14 * entry);
        assert_eq!(cache.peak_capacity_bytes(), 2 * 64 * entry);
        // A decode step that appends one and keeps it does not raise the peak.
        let one = Tensor::zeros((2, 1, 4), DType::F32, &dev).unwrap();
        for l in 0..2 {
            cache.layer_mut(l).append(&one, &one, 10).unwrap();
        }
        cache.end_step(11);
        assert_eq!(cache.peak_bytes(), 14 * entry);
    }

    #[test]
    fn gather_keeps_order_and_metadata_per_head() {
        let mut c = filled(10);
        c.gather(&[vec![9, 0, 4], vec![1, 2, 3]]).unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c.positions(0), &[19, 10, 14]);
        assert_eq!(c.positions(1), &[11, 12, 13]);
        let k = c.keys().unwrap().to_vec3::<f32>().unwrap();
        assert_eq!(
            k[0].iter().map(|r| r[0]).collect::<Vec<_>>(),
            vec![9.0, 0.0, 4.0]
        );
        assert_eq!(
            k[1].iter().map(|r| r[0]).collect::<Vec<_>>(),
            vec![101.0, 102.0, 103.0]
        );
        let v = c.values().unwrap().to_vec3::<f32>().unwrap();
        assert_eq!(v[0][0][0], 18.0);
        assert_eq!(c.peak_len(), 10);
        // a later append continues after the kept entries with its own logical position
        let k = Tensor::ones((2, 1, 4), DType::F32, &Device::Cpu).unwrap();
        c.append(&k, &k, 20).unwrap();
        assert_eq!(c.positions(0), &[19, 10, 14, 20]);
    }

    #[test]
    fn key_rows_reads_the_rows_keys_holds_in_every_type() {
        let dev = Device::Cpu;
        let n = 45;
        let x: Vec<f32> = (0..2 * n * 32)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let x = Tensor::from_vec(x, (2, n, 32), &dev).unwrap();
        for kv in ["f32", "f16", "q8_0", "q4_0/f16", "kivi2:4"] {
            let mut c = LayerCache::new(2, 32, kv.parse().unwrap(), &dev).unwrap();
            c.append(&x, &x, 0).unwrap();
            let all = c.keys().unwrap().to_dtype(DType::F32).unwrap();
            let want = all.get(1).unwrap().narrow(0, 40, 5).unwrap();
            let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(c.key_rows(1..2, 40..45).unwrap(), want, "{kv}");
            assert!(c.key_rows(1..2, 40..46).is_err(), "{kv}");
            assert!(c.key_rows(1..3, 40..45).is_err(), "{kv}");
            // Both heads at once: each head's rows in turn.
            let both = all.narrow(1, 38, 7).unwrap().flatten_all().unwrap();
            let both = both.to_vec1::<f32>().unwrap();
            assert_eq!(c.key_rows(0..2, 38..45).unwrap(), both, "{kv}");
            assert!(c.key_rows(0..2, 45..45).unwrap().is_empty(), "{kv}");
        }
    }

    #[test]
    fn keys_kept_on_the_host_read_as_the_buffer_holds_them() {
        // Values that f16 and bf16 round (thirds), appended in two steps; the second step's keys kept
        // on the host must read exactly as the buffer's, in every type; block and KIVI storage keep
        // nothing and read the buffer.
        const D: usize = 32; // a block of q8_0
        let dev = Device::Cpu;
        let (n, t) = (20, 3);
        let x: Vec<f32> = (0..2 * (n + t) * D).map(|i| i as f32 / 3.0 - 7.1).collect();
        let split = |lo: usize, len: usize| -> Vec<f32> {
            (0..2)
                .flat_map(|h| x[(h * (n + t) + lo) * D..][..len * D].to_vec())
                .collect()
        };
        for kv in ["f32", "f16", "bf16", "q8_0", "kivi2:4"] {
            let mut c = LayerCache::new(2, D, kv.parse().unwrap(), &dev).unwrap();
            let first = Tensor::from_vec(split(0, n), (2, n, D), &dev).unwrap();
            c.append(&first, &first, 0).unwrap();
            let new = Tensor::from_vec(split(n, t), (2, t, D), &dev).unwrap();
            c.append(&new, &new, n).unwrap();
            let from_buffer = c.key_rows(0..2, n..n + t).unwrap();
            c.keep_host_keys(split(n, t)).unwrap();
            let kept = c.host_keys.is_some();
            assert_eq!(kept, ["f32", "f16", "bf16"].contains(&kv), "{kv}");
            assert_eq!(c.key_rows(0..2, n..n + t).unwrap(), from_buffer, "{kv}");
            assert_eq!(
                c.key_rows(1..2, n + 1..n + t).unwrap(),
                from_buffer[(t + 1) * D..],
                "{kv}"
            );
            // Rows before them come from the buffer; a gather drops what was kept.
            assert_eq!(c.key_rows(0..1, n - 1..n + 1).unwrap().len(), 2 * D, "{kv}");
            c.gather(&[vec![0, 1], vec![2, 3]]).unwrap();
            assert!(c.host_keys.is_none(), "{kv}");
        }
        let mut c = LayerCache::new(2, D, KvType::F32, &dev).unwrap();
        assert!(
            c.keep_host_keys(vec![0.0; 2 * D]).is_err(),
            "more rows than the cache holds"
        );
    }

    #[test]
    fn gather_rejects_bad_indices() {
        let mut c = filled(4);
        assert!(c.gather(&[vec![0, 9], vec![0, 1]]).is_err());
        assert!(c.gather(&[vec![0], vec![0, 1]]).is_err());
    }
}
