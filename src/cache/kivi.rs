//! KIVI's asymmetric low-bit cache (Liu et al., 2024, "KIVI: A Tuning-Free Asymmetric 2bit
//! Quantization for KV Cache"): keys quantized per channel over groups of [`GROUP`] tokens, values per
//! token over groups of [`GROUP`] channels, both as `x ≈ q·s + m` with `q` in `0..2^bits` and the
//! scale `s` and minimum `m` in f16; the most recent entries stay in a full-precision window (f16).
//!
//! Why a storage of its own: a key's scales belong to its group of tokens, not to its row, so rows are
//! not self-contained as in the block formats of [`super::quant`]. Each head keeps, in storage order,
//! where each entry lives: a row of its window buffer (f16 key and value) or of its packed buffer
//! (codes, the value's own scales, the index of its key group); and a table of key groups (per
//! channel scale and minimum).
//!
//! Rules (kvbench's; KIVI itself never evicts):
//! - **Window.** Entries are appended in f16. When a head holds `window + GROUP` entries in f16, the
//!   [`GROUP`] oldest of them (smallest positions) are quantized together: their keys per channel
//!   as one group, their values each per token. A head therefore keeps between `window` and
//!   `window + GROUP − 1` recent entries in full precision once it has that many. (KIVI's reference
//!   code flushes its whole key residual when it reaches the window and quantizes values one at a time;
//!   here both leave in groups, so keys and values share one window.)
//! - **Eviction.** A policy may evict any entry, packed or not. A packed key is read with its group's
//!   scales, which stay as long as any member of the group is held; a group with no member left is
//!   freed. Evicting from the window shrinks it; it refills from new entries.
//! - **Bytes**, exact for this layout: a window entry 4·d (f16 key and value); a packed entry
//!   2·d·bits/8 of codes, 4 bytes per 32 values of the value's scale and minimum, and 4 bytes for its
//!   group's index; a live key group 4·d (f16 scale and minimum per channel).

use super::rows::f16s;
use half::f16;

/// Tokens per key group and channels per value group (KIVI's default group size).
pub const GROUP: usize = 32;

/// The full-precision window when none is named (KIVI's default residual length).
pub const DEFAULT_WINDOW: usize = 128;

/// Bytes of one packed entry of one head (`d` values of key and value), its group's scales apart.
pub fn packed_entry_bytes(bits: u8, d: usize) -> usize {
    2 * d * bits as usize / 8 + d / GROUP * 4 + 4
}

/// Bytes of one full-precision (window) entry of one head.
pub fn window_entry_bytes(d: usize) -> usize {
    4 * d
}

/// Bytes of one key group of one head: an f16 scale and minimum per channel.
pub fn group_bytes(d: usize) -> usize {
    4 * d
}

/// Exact bytes one head of a full cache (nothing evicted) holds at `entries` entries.
pub fn full_head_bytes(bits: u8, window: usize, d: usize, entries: usize) -> usize {
    let packed = if entries < window + GROUP {
        0
    } else {
        (entries - window) / GROUP * GROUP
    };
    (entries - packed) * window_entry_bytes(d)
        + packed * packed_entry_bytes(bits, d)
        + packed / GROUP * group_bytes(d)
}

/// Where entry `j` of a head lives: row `index` of the window's rows or of the packed rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Window(u32),
    Packed(u32),
}

/// One KV head: its entries in storage order, the window's rows (f16 keys and values, `d` each) and
/// the packed rows (key codes; value scales, minima and codes; the key group) each in one contiguous
/// buffer, mostly in storage order (appends go last, a gather rebuilds them in the kept order), and
/// its key groups: group `g`'s per-channel scales then minima at `g·2d` of `group_params`, and how
/// many held entries use it. The scales and minima are f16 (what [`group_bytes`] counts), kept
/// widened to f32 so that a key is read without converting them, and all in one buffer: a separate
/// allocation per group put a cache miss on the first key of every group in a model's step.
#[derive(Debug, Clone, Default)]
struct Head {
    slots: Vec<Slot>,
    window_k: Vec<f16>,
    window_v: Vec<f16>,
    packed_k: Vec<u8>,
    packed_v: Vec<u8>,
    packed_group: Vec<u32>,
    group_params: Vec<f32>,
    group_live: Vec<u32>,
    free: Vec<u32>,
    live_groups: usize,
}

impl Head {
    fn in_window(&self, d: usize) -> usize {
        self.window_k.len() / d
    }

    fn packed(&self) -> usize {
        self.packed_group.len()
    }
}

/// A layer's keys and values in KIVI's layout, for every KV head.
#[derive(Debug, Clone)]
pub struct KiviStore {
    bits: u8,
    window: usize,
    d: usize,
    /// Bytes of a packed key's codes, and of a packed value (scales, minima, codes).
    key_bytes: usize,
    value_bytes: usize,
    heads: Vec<Head>,
}

impl KiviStore {
    /// A store of `bits` (2 or 4: `KvType` parses no other) codes per value.
    pub fn new(bits: u8, window: usize, kv_heads: usize, d: usize) -> Self {
        assert!(
            matches!(bits, 2 | 4),
            "KIVI codes are 2 or 4 bits, not {bits}"
        );
        KiviStore {
            bits,
            window,
            d,
            key_bytes: d * bits as usize / 8,
            value_bytes: d / GROUP * 4 + d * bits as usize / 8,
            heads: vec![Head::default(); kv_heads],
        }
    }

    /// Exact bytes held, all heads.
    pub fn bytes(&self) -> usize {
        let d = self.d;
        self.heads
            .iter()
            .map(|h| {
                h.in_window(d) * window_entry_bytes(d)
                    + h.packed() * packed_entry_bytes(self.bits, d)
                    + h.live_groups * group_bytes(d)
            })
            .sum()
    }

    /// Bytes the store has allocated: its buffers' capacities and the key groups' scales as kept
    /// (f32, freed slots included), which can exceed [`bytes`](Self::bytes).
    pub fn allocated_bytes(&self) -> usize {
        self.heads
            .iter()
            .map(|h| {
                h.slots.capacity() * std::mem::size_of::<Slot>()
                    + (h.window_k.capacity() + h.window_v.capacity()) * 2
                    + h.packed_k.capacity()
                    + h.packed_v.capacity()
                    + h.packed_group.capacity() * 4
                    + (h.group_params.capacity() + h.group_live.capacity()) * 4
            })
            .sum()
    }

    /// Entries of head `h` held in full precision.
    pub fn in_window(&self, h: usize) -> usize {
        self.heads[h].in_window(self.d)
    }

    /// Appends head `h`'s new entries (`keys`, `values`: `[t][d]`) in f16, then quantizes what
    /// leaves the window; `positions` are the head's positions after the append (storage order).
    pub fn append(&mut self, h: usize, keys: &[f32], values: &[f32], positions: &[u32]) {
        let d = self.d;
        let head = &mut self.heads[h];
        for (k, v) in keys.chunks_exact(d).zip(values.chunks_exact(d)) {
            head.slots.push(Slot::Window(head.in_window(d) as u32));
            head.window_k.extend(k.iter().map(|&x| f16::from_f32(x)));
            head.window_v.extend(v.iter().map(|&x| f16::from_f32(x)));
        }
        while self.heads[h].in_window(d) >= self.window + GROUP {
            self.quantize_oldest(h, positions);
        }
    }

    /// Quantizes the [`GROUP`] window entries of head `h` with the smallest positions: their keys
    /// as one group, their values each on its own; the window's rows are then compacted.
    fn quantize_oldest(&mut self, h: usize, positions: &[u32]) {
        let (bits, d) = (self.bits, self.d);
        let head = &mut self.heads[h];
        let mut oldest: Vec<usize> = (0..head.slots.len())
            .filter(|&j| matches!(head.slots[j], Slot::Window(_)))
            .collect();
        oldest.sort_by_key(|&j| (positions[j], j));
        oldest.truncate(GROUP);
        oldest.sort_unstable();
        let row = |j: usize| match head.slots[j] {
            Slot::Window(w) => w as usize * d..(w as usize + 1) * d,
            Slot::Packed(_) => unreachable!("only window entries are chosen"),
        };
        // Keys: per channel over the group's tokens.
        let mut lo = vec![f32::INFINITY; d];
        let mut hi = vec![f32::NEG_INFINITY; d];
        for &j in &oldest {
            for (c, x) in head.window_k[row(j)].iter().enumerate() {
                lo[c] = lo[c].min(x.to_f32());
                hi[c] = hi[c].max(x.to_f32());
            }
        }
        let (scale, min): (Vec<f32>, Vec<f32>) = lo
            .iter()
            .zip(&hi)
            .map(|(&l, &u)| {
                let (s, m) = scale_and_min(l, u, bits);
                (s.to_f32(), m.to_f32())
            })
            .unzip();
        let mut x = vec![0f32; d];
        let mut packed_k = Vec::with_capacity(oldest.len() * self.key_bytes);
        let mut packed_v = Vec::with_capacity(oldest.len() * self.value_bytes);
        for &j in &oldest {
            let mut kc = vec![0u8; self.key_bytes];
            for (c, y) in head.window_k[row(j)].iter().enumerate() {
                put_code(&mut kc, bits, c, code(y.to_f32(), scale[c], min[c], bits));
            }
            packed_k.extend_from_slice(&kc);
            f16s(&head.window_v[row(j)], &mut x);
            packed_v.extend_from_slice(&pack_value(&x, bits));
        }
        let live = oldest.len() as u32;
        let g = match head.free.pop() {
            Some(g) => {
                let at = g as usize * 2 * d;
                head.group_params[at..at + d].copy_from_slice(&scale);
                head.group_params[at + d..at + 2 * d].copy_from_slice(&min);
                head.group_live[g as usize] = live;
                g
            }
            None => {
                head.group_params.extend_from_slice(&scale);
                head.group_params.extend_from_slice(&min);
                head.group_live.push(live);
                (head.group_live.len() - 1) as u32
            }
        };
        head.live_groups += 1;
        for (i, &j) in oldest.iter().enumerate() {
            head.slots[j] = Slot::Packed((head.packed() + i) as u32);
        }
        head.packed_k.extend_from_slice(&packed_k);
        head.packed_v.extend_from_slice(&packed_v);
        head.packed_group
            .extend(std::iter::repeat_n(g, oldest.len()));
        // The window's remaining rows, renumbered in storage order.
        let (mut wk, mut wv) = (Vec::new(), Vec::new());
        for slot in head.slots.iter_mut() {
            if let Slot::Window(w) = *slot {
                let r = w as usize * d..(w as usize + 1) * d;
                *slot = Slot::Window((wk.len() / d) as u32);
                wk.extend_from_slice(&head.window_k[r.clone()]);
                wv.extend_from_slice(&head.window_v[r]);
            }
        }
        head.window_k = wk;
        head.window_v = wv;
    }

    /// Key of entry `j` of head `h`, as f32, into `out` (`d` values). Inlined where it is used, so
    /// that it is compiled for the instructions its caller runs on (the same bits on every path).
    #[inline(always)]
    pub fn key_into(&self, h: usize, j: usize, out: &mut [f32]) {
        let (head, d) = (&self.heads[h], self.d);
        match head.slots[j] {
            Slot::Window(w) => f16s(&head.window_k[w as usize * d..][..d], out),
            Slot::Packed(p) => {
                let p = p as usize;
                let at = head.packed_group[p] as usize * 2 * d;
                let (scale, min) = head.group_params[at..at + 2 * d].split_at(d);
                let kb = self.key_bytes;
                let codes = &head.packed_k[p * kb..(p + 1) * kb];
                let out = &mut out[..d];
                match self.bits {
                    2 => super::rows::codes_scaled_each::<2>(codes, scale, min, out),
                    _ => super::rows::codes_scaled_each::<4>(codes, scale, min, out),
                }
            }
        }
    }

    /// Value of entry `j` of head `h`, as f32, into `out` (`d` values); inlined as [`Self::key_into`].
    #[inline(always)]
    pub fn value_into(&self, h: usize, j: usize, out: &mut [f32]) {
        let (head, d) = (&self.heads[h], self.d);
        match head.slots[j] {
            Slot::Window(w) => f16s(&head.window_v[w as usize * d..][..d], out),
            Slot::Packed(p) => {
                let vb = self.value_bytes;
                let p = p as usize;
                let row = &head.packed_v[p * vb..(p + 1) * vb];
                match self.bits {
                    2 => unpack_value::<2>(row, out),
                    _ => unpack_value::<4>(row, out),
                }
            }
        }
    }

    /// Where the stored bytes of entry `j`'s key (`keys`) or value of head `h` start, and how many
    /// there are, for a prefetch; `None` past the last entry.
    #[inline(always)]
    pub fn row_at(&self, h: usize, j: usize, keys: bool) -> Option<(*const u8, usize)> {
        let (head, d) = (self.heads.get(h)?, self.d);
        Some(match (*head.slots.get(j)?, keys) {
            (Slot::Window(w), true) => (head.window_k[w as usize * d..].as_ptr().cast(), 2 * d),
            (Slot::Window(w), false) => (head.window_v[w as usize * d..].as_ptr().cast(), 2 * d),
            (Slot::Packed(p), true) => {
                let kb = self.key_bytes;
                (head.packed_k[p as usize * kb..].as_ptr(), kb)
            }
            (Slot::Packed(p), false) => {
                let vb = self.value_bytes;
                (head.packed_v[p as usize * vb..].as_ptr(), vb)
            }
        })
    }

    /// Keys (`keys`) or values of head `h`'s entries `rows` as f32, appended to `out`.
    pub fn read_rows(
        &self,
        h: usize,
        rows: std::ops::Range<usize>,
        keys: bool,
        out: &mut Vec<f32>,
    ) {
        let (d, start) = (self.d, out.len());
        out.resize(start + rows.len() * d, 0.0);
        for (j, o) in rows.zip(out[start..].chunks_exact_mut(d)) {
            match keys {
                true => self.key_into(h, j, o),
                false => self.value_into(h, j, o),
            }
        }
    }

    /// Keeps, for every head, the entries `kept[h]` in that order (indices checked by the caller),
    /// its rows rebuilt in that order. A packed entry keeps its group's scales; groups left without
    /// members are freed.
    pub fn gather(&mut self, kept: &[Vec<usize>]) {
        let (d, kb, vb) = (self.d, self.key_bytes, self.value_bytes);
        for (head, idx) in self.heads.iter_mut().zip(kept) {
            let mut new = Head {
                group_params: std::mem::take(&mut head.group_params),
                group_live: vec![0; head.group_live.len()],
                ..Head::default()
            };
            for &j in idx {
                match head.slots[j] {
                    Slot::Window(w) => {
                        let r = w as usize * d..(w as usize + 1) * d;
                        new.slots.push(Slot::Window(new.in_window(d) as u32));
                        new.window_k.extend_from_slice(&head.window_k[r.clone()]);
                        new.window_v.extend_from_slice(&head.window_v[r]);
                    }
                    Slot::Packed(p) => {
                        let p = p as usize;
                        let g = head.packed_group[p];
                        new.slots.push(Slot::Packed(new.packed() as u32));
                        new.packed_k
                            .extend_from_slice(&head.packed_k[p * kb..(p + 1) * kb]);
                        new.packed_v
                            .extend_from_slice(&head.packed_v[p * vb..(p + 1) * vb]);
                        new.packed_group.push(g);
                        new.group_live[g as usize] += 1;
                    }
                }
            }
            // A group without members is free for the next group this head packs (its space stays
            // allocated, and counted by `allocated_bytes`, until then).
            for (i, &live) in new.group_live.iter().enumerate() {
                match live {
                    0 => new.free.push(i as u32),
                    _ => new.live_groups += 1,
                }
            }
            *head = new;
        }
    }
}

/// The f16 scale and minimum of values in `[lo, hi]` at `bits` bits: `s = (hi − lo) / (2^bits − 1)`.
fn scale_and_min(lo: f32, hi: f32, bits: u8) -> (f16, f16) {
    let levels = ((1u32 << bits) - 1) as f32;
    (f16::from_f32((hi - lo) / levels), f16::from_f32(lo))
}

/// The code of `x` under scale `s` and minimum `m` (both as stored), rounded to the nearest level.
fn code(x: f32, s: f32, m: f32, bits: u8) -> u8 {
    let top = ((1u32 << bits) - 1) as f32;
    if s <= 0.0 {
        return 0;
    }
    ((x - m) / s).round().clamp(0.0, top) as u8
}

fn put_code(codes: &mut [u8], bits: u8, i: usize, q: u8) {
    let bit = i * bits as usize;
    codes[bit / 8] |= q << (bit % 8);
}

/// A value row per token: for every [`GROUP`] channels an f16 scale and minimum, then the codes.
fn pack_value(x: &[f32], bits: u8) -> Vec<u8> {
    let d = x.len();
    let head = d / GROUP * 4;
    let mut out = vec![0u8; head + d * bits as usize / 8];
    for (g, chunk) in x.chunks_exact(GROUP).enumerate() {
        let lo = chunk.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = chunk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let (s, m) = scale_and_min(lo, hi, bits);
        out[g * 4..g * 4 + 2].copy_from_slice(&s.to_le_bytes());
        out[g * 4 + 2..g * 4 + 4].copy_from_slice(&m.to_le_bytes());
        let (s, m) = (s.to_f32(), m.to_f32());
        for (c, &v) in chunk.iter().enumerate() {
            put_code(&mut out[head..], bits, g * GROUP + c, code(v, s, m, bits));
        }
    }
    out
}

/// A value row of `B`-bit codes ([`pack_value`]'s layout) as f32 into `out` (`d` values).
#[inline(always)]
fn unpack_value<const B: usize>(row: &[u8], out: &mut [f32]) {
    let groups = out.len() / GROUP;
    let (params, codes) = row.split_at(groups * 4);
    let per = GROUP * B / 8;
    for ((o, p), c) in out
        .chunks_exact_mut(GROUP)
        .zip(params.chunks_exact(4))
        .zip(codes.chunks_exact(per))
    {
        let (s, m) = super::rows::f16_pair([p[0], p[1], p[2], p[3]]);
        super::rows::codes_scaled::<B>(c, s, m, o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Key (`keys`) or value of entry `j` of head `h`.
    fn read(s: &KiviStore, h: usize, j: usize, keys: bool) -> Vec<f32> {
        let mut out = Vec::new();
        s.read_rows(h, j..j + 1, keys, &mut out);
        out
    }

    fn rows(n: usize, d: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n * d).map(|_| rng.random_range(-2.0f32..2.0)).collect()
    }

    #[test]
    fn the_window_stays_full_precision_and_older_entries_leave_in_groups() {
        let (d, window) = (64, 8);
        let mut s = KiviStore::new(2, window, 1, d);
        let n = 50;
        let (k, v) = (rows(n, d, 1), rows(n, d, 2));
        let pos: Vec<u32> = (0..n as u32).collect();
        for i in 0..n {
            let p = &pos[..=i];
            s.append(0, &k[i * d..(i + 1) * d], &v[i * d..(i + 1) * d], p);
        }
        // 50 = 32 packed (one group, reached at 8 + 32 = 40) + 18 in the window.
        assert_eq!(s.in_window(0), 18);
        let want = 18 * window_entry_bytes(d) + 32 * packed_entry_bytes(2, d) + group_bytes(d);
        assert_eq!(s.bytes(), want);
        assert_eq!(full_head_bytes(2, window, d, n), want);
        assert!(s.allocated_bytes() >= want, "allocated covers held");
        // Window entries read back as f16 rounds them.
        let j = 45;
        let back = read(&s, 0, j, true);
        for (a, b) in back.iter().zip(&k[j * d..(j + 1) * d]) {
            assert_eq!(*a, f16::from_f32(*b).to_f32());
        }
        // Packed keys and values are within half a quantization step (plus f16 rounding).
        for j in 0..32 {
            let kb = read(&s, 0, j, true);
            for (c, (a, b)) in kb.iter().zip(&k[j * d..(j + 1) * d]).enumerate() {
                let (lo, hi) = (0..32)
                    .map(|i| k[i * d + c])
                    .fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), x| {
                        (l.min(x), h.max(x))
                    });
                assert!((a - b).abs() <= (hi - lo) / 3.0 * 0.5 + 0.01, "key {j},{c}");
            }
            let vb = read(&s, 0, j, false);
            for (a, b) in vb.iter().zip(&v[j * d..(j + 1) * d]) {
                assert!((a - b).abs() <= 4.0 / 3.0 * 0.5 + 0.01, "value {j}");
            }
        }
    }

    #[test]
    fn evicting_keeps_a_groups_scales_while_a_member_lives() {
        let (d, window) = (32, 4);
        let mut s = KiviStore::new(4, window, 2, d);
        let n = 40; // one group of 32 packed, 8 in the window
        let (k, v) = (rows(n, d, 3), rows(n, d, 4));
        let pos: Vec<u32> = (0..n as u32).collect();
        for h in 0..2 {
            s.append(h, &k, &v, &pos);
        }
        let before = read(&s, 0, 5, true);
        // Head 0 keeps one packed entry and two window entries; head 1 only window entries.
        s.gather(&[vec![39, 5, 36], vec![33, 34, 35]]);
        assert_eq!(read(&s, 0, 1, true), before, "same scales after eviction");
        assert_eq!(s.in_window(0), 2);
        assert_eq!(s.in_window(1), 3);
        let head0 = 2 * window_entry_bytes(d) + packed_entry_bytes(4, d) + group_bytes(d);
        assert_eq!(s.bytes(), head0 + 3 * window_entry_bytes(d));
        // Head 1's group is freed and reused by the next group it packs.
        assert_eq!(s.heads[1].live_groups, 0);
        assert_eq!(s.heads[1].free, vec![0]);
        let after: Vec<u32> = (33..36).chain(40..75).collect();
        s.append(1, &k[..35 * d], &v[..35 * d], &after);
        assert_eq!(s.heads[1].group_live.len(), 1, "the freed slot is reused");
        assert_eq!(s.in_window(1), 38 - 32);
    }
}
