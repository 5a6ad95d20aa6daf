//! The multi-row driver: `y = x Wᵀ` for a [`QMatrix`] and quantized activations.
//!
//! Output columns are split into tasks run in parallel, which a decoding team's threads claim in runs
//! of consecutive tasks (`crate::parallel::for_each_range_init`: each run one stream of weights).
//! Within a task, activation rows go in tiles ([`tile_rows`]: as many as keep the tile's bytes in L2
//! while the task's weight rows stream past). On AVX2, calls of fewer than [`TILED_MIN_ROWS`] rows
//! (decoding; 8 for k-quants on AVX-512, see [`tiled_from`]) use the kernels that decode blocks in
//! registers; larger ones decode [`gemm::NW`] weight rows once per tile (into L1) and multiply them
//! with several activation rows at a time, every load serving several products. k-quant rows
//! repacked at load ([`super::packed`]) are read in place, four or eight columns a call, below
//! [`packed_tiled_from`] rows, and interleaved per tile from there. Columns a block of `NW` cannot
//! take (a task's last few, or stacked parts of different kinds) go one by one.

use super::acts::Acts;
use super::dot::{portable, Path};
#[cfg(target_arch = "x86_64")]
use super::gemm;
#[cfg(target_arch = "x86_64")]
use super::gemm512;
use super::{QMatrix, Unpacked};
use std::ops::Range;

/// Output columns per task (weight rows unpacked and used by one thread in turn).
const COLS: usize = 32;

/// Output columns per task for a call of `m` activation rows: 128 below 8 rows (decoding), where a
/// task is a few microseconds of streaming weights: longer runs of consecutive rows for the hardware
/// prefetcher and a quarter of the hand-offs. Measured with `kvbench perf --batch 1 --threads 2`
/// (Xeon, two rounds each): SmolLM2 (Q4_1) 129.2 / 117.6 tokens/s with 32 against 131.7 / 129.9 with
/// 128, Qwen2.5-Coder-1.5B 15.1 / 15.0 against 17.6 / 17.2; 512 was slower (SmolLM2 76.9 against 81.7
/// with 32, before the f16 loads were fixed).
fn cols_per_task(m: usize) -> usize {
    if m < 8 {
        4 * COLS
    } else {
        COLS
    }
}

/// Activation bytes a tile may hold: half of this machine's 512 KiB L2, leaving room for the weights.
const TILE_BYTES: usize = 256 * 1024;

/// Activation rows per tile for `m` rows of `k` inputs: at most as many as keep a tile's 8-bit
/// activations in L2 (64 rows of 1,536 inputs, 29 of 8,960; never fewer than 16), the `m` rows then
/// split into tiles of equal size rounded up to whole k-quant calls (32 rows of 8,960 inputs: two of 16,
/// not 29 and 3).
fn tile_rows(m: usize, k: usize) -> usize {
    let most = (TILE_BYTES / k.max(1)).clamp(16, 64);
    let tiles = m.div_ceil(most).max(1);
    m.div_ceil(tiles).next_multiple_of(gemm_rows())
}

/// The k-quant kernel's activation rows per call, which tiles are made a multiple of.
fn gemm_rows() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        gemm::KR
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        1
    }
}

pub fn run(w: &QMatrix, x: &Acts, path: Path) -> Result<Vec<f32>, ShapeError> {
    check(w, x)?;
    let (n, m, k) = (w.rows(), x.m, w.cols());
    let mut out = vec![0f32; m * n];
    let dst = Out(out.as_mut_ptr(), n);
    let path = path.supported();
    let tile = tile_rows(m, k);
    let per_task = cols_per_task(m);
    #[cfg(target_arch = "x86_64")]
    let in_place_below = packed_tiled_from(path);
    // The 32-weight formats' tiles through the VNNI kernel (`gemm::legacy_vnni`: the same bits).
    #[cfg(target_arch = "x86_64")]
    let vnni = path == Path::Avx512 && gemm512::has_vnni();
    let init = || Scratch {
        unpacked: None,
        raw: Vec::new(),
        #[cfg(target_arch = "x86_64")]
        prepared: Default::default(),
        #[cfg(target_arch = "x86_64")]
        block: Default::default(),
        #[cfg(target_arch = "x86_64")]
        interleaved: Vec::new(),
    };
    let task = |scratch: &mut Scratch, cols: Range<usize>| {
        for t0 in (0..m).step_by(tile) {
            let rows = t0..(t0 + tile).min(m);
            let mut j = cols.start;
            while j < cols.end {
                #[cfg(target_arch = "x86_64")]
                if path.simd() {
                    if w.packed_group(j).is_some() {
                        if m < in_place_below {
                            // SAFETY: AVX2, FMA and F16C were checked above; the columns are
                            // this task's only.
                            j += unsafe {
                                packed_columns(w, x, rows.clone(), j, cols.end, path, &dst)
                            };
                            continue;
                        }
                    } else if m < tiled_from(path, w.format(j)) {
                        // Two columns of one 32-weight format go together: measured on SmolLM2
                        // (Q4_1) 12% faster at batch 8, and at batch 1 121.1 / 120.0 → 130.6 /
                        // 137.6 tokens/s (two rounds; it had been 20% slower there while each block's scale
                        // conversion waited on the running sum, see `avx2::f16_lanes`); on
                        // Qwen2.5-Coder-1.5B's k-quants 14% slower at 8.
                        let format = w.format(j);
                        let pair =
                            !format.is_k_quant() && j + 1 < cols.end && w.format(j + 1) == format;
                        // SAFETY: AVX2, FMA and F16C were checked above; the columns are this
                        // task's only.
                        unsafe { fused_columns(w, x, rows.clone(), j, pair, &dst) };
                        j += 1 + usize::from(pair);
                        continue;
                    }
                    if path == Path::Avx512
                        && j + 2 * gemm::NW <= cols.end
                        && block_kind(w, j) == Some(gemm::Kind::KQuant)
                        && block_kind(w, j + gemm::NW) == Some(gemm::Kind::KQuant)
                    {
                        let slot = (j - cols.start) / gemm::NW;
                        // SAFETY: AVX-512 was checked by `supported`; columns j .. j + 2·NW
                        // are this task's only.
                        unsafe { pair_columns(w, x, rows.clone(), (j, slot), scratch, &dst) };
                        j += 2 * gemm::NW;
                        continue;
                    }
                    if j + gemm::NW <= cols.end {
                        if let Some(kind) = block_kind(w, j) {
                            let slot = (j - cols.start) / gemm::NW;
                            // SAFETY: as above; columns j .. j + NW are this task's only.
                            unsafe {
                                block_columns(
                                    w,
                                    x,
                                    rows.clone(),
                                    (j, slot),
                                    kind,
                                    vnni,
                                    scratch,
                                    &dst,
                                )
                            };
                            j += gemm::NW;
                            continue;
                        }
                    }
                }
                one_column(w, x, rows.clone(), j, path, scratch, &dst);
                j += 1;
            }
        }
    };
    // Tasks of `per_task` columns, claimed in runs of consecutive tasks (a run's weights are one stream
    // for the prefetchers; see `for_each_range_init`).
    crate::parallel::for_each_range_init(n, per_task, per_task, init, |scratch, run| {
        for start in run.clone().step_by(per_task) {
            task(scratch, start..(start + per_task).min(run.end));
        }
    });
    Ok(out)
}

/// Inputs a product was given that do not fit each other: `run` is safe and public, and its kernels
/// read the activations and weights without bounds checks, so a mismatch is refused before any read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kernels: {0}")]
pub struct ShapeError(String);

/// The checks `run` makes (a constant cost per call): the activations have the matrix's width, in
/// the activation block its format reads, and every buffer has the length its shape implies.
fn check(w: &QMatrix, x: &Acts) -> Result<(), ShapeError> {
    let (m, k, block) = x.shape();
    let bad = |why: String| Err(ShapeError(why));
    if k != w.cols() {
        return bad(format!(
            "activations of {k} values for a matrix of {} columns",
            w.cols()
        ));
    }
    if block != w.act_block() {
        return bad(format!(
            "activations in blocks of {block} for a matrix whose format reads blocks of {}",
            w.act_block()
        ));
    }
    let kb = k / block;
    let sums32 = if block == 256 { m * (k / 32) } else { 0 };
    if x.q.len() != m * k
        || x.d.len() != m * kb
        || x.scaled.len() != m * kb
        || x.sums.len() != m * (k / 16)
        || x.sums32.len() != sums32
    {
        return bad(format!(
            "activation buffers that do not hold {m} rows of {k}"
        ));
    }
    Ok(())
}

/// Calls with fewer activation rows use the kernels that decode blocks in registers (decoding); from
/// here on weight rows are decoded once per tile. Measured on Qwen2.5-Coder-1.5B (README, speed): the
/// register kernels decode at batch 1 in 11.5 tokens/s where the tiled ones manage 7.4, and the tiled
/// ones prefill 512 tokens in 29.9 tokens/s where the register ones manage 25.6.
const TILED_MIN_ROWS: usize = 16;

/// The fewest activation rows that go through the tiled kernels for a column of `format`: k-quants on
/// the AVX-512 path from 8 rows (measured on Qwen2.5-Coder-1.5B, Xeon, two rounds: batch 8 36.1 / 36.4
/// → 37.5 / 37.5 tokens/s; batch 4 slower tiled, 31.6 → 29.1), the rest from [`TILED_MIN_ROWS`]
/// (SmolLM2's Q4_1 at batch 8: 203 / 184 in registers against 176 / 180 tiled; with the VNNI tiles of
/// `gemm::legacy_vnni`, Zen 4, four rounds, medians: batch 8 291 in registers against 270 tiled, batch
/// 12 302 against 257).
#[cfg(target_arch = "x86_64")]
fn tiled_from(path: Path, format: super::BlockFormat) -> usize {
    if path == Path::Avx512 && format.is_k_quant() {
        8
    } else {
        TILED_MIN_ROWS
    }
}

/// Activation rows one kernel call multiplies with a decoded weight row.
const ROWS: usize = 8;

/// Column `j` (and `j + 1` when `pair`, of the same format) for activation `rows`, blocks decoded in
/// registers, four rows at a time.
///
/// # Safety
/// AVX2, FMA and F16C; the columns are written by this caller only.
#[cfg(target_arch = "x86_64")]
unsafe fn fused_columns(
    w: &QMatrix,
    x: &Acts,
    rows: Range<usize>,
    j: usize,
    pair: bool,
    out: &Out,
) {
    let (format, bytes) = w.row(j);
    let mut r = rows.start;
    while r < rows.end {
        let take = (rows.end - r).min(4);
        // SAFETY (both calls): the rows hold whole blocks of `k` weights and the activation rows exist.
        if pair {
            let mut acc = [[0f32; 4]; 2];
            super::fused::dot_rows2(format, [bytes, w.row(j + 1).1], x, r, take, &mut acc);
            for (c, col) in acc.iter().enumerate() {
                for (i, a) in col.iter().take(take).enumerate() {
                    out.set(r + i, j + c, *a);
                }
            }
        } else {
            let mut acc = [0f32; 4];
            super::fused::dot_rows(format, bytes, x, r, take, &mut acc);
            for (i, a) in acc.iter().take(take).enumerate() {
                out.set(r + i, j, *a);
            }
        }
        r += take;
    }
}

/// The kernel kind shared by rows `j .. j + NW`, if they share one and are either one repacked group
/// or all as in the file.
#[cfg(target_arch = "x86_64")]
fn block_kind(w: &QMatrix, j: usize) -> Option<gemm::Kind> {
    if w.packed_group(j).is_some() {
        return Some(gemm::Kind::KQuant);
    }
    let kind = gemm::Kind::of(w.format(j));
    (0..gemm::NW)
        .all(|i| !w.is_packed(j + i) && gemm::Kind::of(w.format(j + i)) == kind)
        .then_some(kind)
}

/// Activation rows from which repacked groups are interleaved once per tile (into bytes, as the file's
/// rows are) rather than read in place by every call. Measured on Qwen2.5-Coder-1.5B (Xeon, tokens/s,
/// AVX-512 reading eight rows a call in place): batch 16 65.8 in place against 55.2 interleaved, batch
/// 32 65.5 against 70.4. With VNNI (`gemm512::kquant_vnni`, Q4_K and Q5_K in place) batch 32 goes in
/// place too: 74.4 / 74.1 against 70.5 / 70.2 through tiles (two rounds, `kvbench perf --batch 8,32
/// --decode-tokens 32`).
#[cfg(target_arch = "x86_64")]
fn packed_tiled_from(path: Path) -> usize {
    if path == Path::Avx512 && gemm512::has_vnni() {
        64
    } else {
        32
    }
}

/// Activation rows from which two repacked groups go through the AVX-512 kernel together
/// ([`gemm512::dot_packed_pair`]); below, one group at a time through the 256-bit kernels
/// ([`gemm::dot_packed`], with VNNI where the CPU has it). Measured on Qwen2.5-Coder-1.5B (AMD Zen 4,
/// `kvbench perf --batch 1,4,8`, three rounds, tokens/s): batch 1 15.4 / 15.9 / 17.3 in pairs against
/// 20.0 / 22.4 / 19.9 one group at a time, batch 4 45.0 / 46.8 / 49.2 against 48.2 / 50.8 / 45.0;
/// the kernel bench put the two even from 5 to 7 rows and the pairs ahead from 8.
const PAIR_FROM: usize = 6;

/// Columns `j .. j + NW` of a repacked group, or `j .. j + 2·NW` on AVX-512 when the next group is one
/// of the same format, read in place for activation `rows`, [`gemm::KR`] rows a call (a pair: up to
/// [`gemm512::MAX_ROWS`], each super-block's headers decoded once for all of them); returns the
/// columns done.
///
/// # Safety
/// AVX2, FMA and F16C (and AVX-512F/BW on `Path::Avx512`); row `j` starts a repacked group; the columns
/// up to `end` are written by this caller only.
#[cfg(target_arch = "x86_64")]
unsafe fn packed_columns(
    w: &QMatrix,
    x: &Acts,
    rows: Range<usize>,
    j: usize,
    end: usize,
    path: Path,
    out: &Out,
) -> usize {
    let (format, group) = w.packed_group(j).expect("a repacked group starts at j");
    // The next group only when it is this task's: past the matrix's last row there is none to ask for.
    let next = (j + 2 * gemm::NW <= end)
        .then(|| w.packed_group(j + gemm::NW))
        .flatten();
    if let Some((_, second)) =
        next.filter(|n| path == Path::Avx512 && n.0 == format && rows.len() >= PAIR_FROM)
    {
        use super::gemm512::{Acc, KR, MAX_ROWS};
        let mut r = rows.start;
        while r < rows.end {
            let take = (rows.end - r).min(MAX_ROWS);
            let mut acc = [Acc::default(); MAX_ROWS / KR];
            super::gemm512::dot_packed_pair(format, [group, second], x, r, take, &mut acc);
            for (c, chunk) in acc.iter().take(take.div_ceil(KR)).enumerate() {
                let r = r + KR * c;
                let take = (take - KR * c).min(KR);
                for (s, block) in chunk.iter().enumerate() {
                    write_block(out, block, r, take, j + s * gemm::NW);
                }
            }
            r += take;
        }
        return 2 * gemm::NW;
    }
    let mut r = rows.start;
    while r < rows.end {
        let take = (rows.end - r).min(gemm::KR);
        let mut acc = [[0f32; gemm::KR]; gemm::NW];
        gemm::dot_packed(
            format,
            group,
            x,
            r,
            take,
            &mut acc,
            path == Path::Avx512 && gemm512::has_vnni(),
        );
        write_block(out, &acc, r, take, j);
        r += take;
    }
    gemm::NW
}

/// Writes `acc[c][i]` (activation rows `r .. r + take`) into columns `j + c`.
///
/// # Safety
/// The columns are written by this caller only and the rows exist.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn write_block<const N: usize>(
    out: &Out,
    acc: &[[f32; N]; gemm::NW],
    r: usize,
    take: usize,
    j: usize,
) {
    for (c, col) in acc.iter().enumerate() {
        for (i, a) in col.iter().take(take).enumerate() {
            out.set(r + i, j + c, *a);
        }
    }
}

/// Columns `j .. j + NW` for activation `rows`: each weight row decoded once, then multiplied several
/// activation rows at a time by [`gemm::dot_block`] ([`gemm::rows_per_call`]; `vnni` as there).
/// k-quant rows are interleaved into the task's `slot` on its first tile and kept there for the
/// others (a 256-row product on Qwen2.5-1.5B's
/// 8,960-input shape has nine tiles): measured 6–14% faster at 256 rows, up to 11% at 32 (README,
/// speed).
///
/// # Safety
/// AVX2, FMA and F16C; the columns are written by this caller only and are all of `kind`; `slot` is
/// `(j − the task's first column) / NW`, so that no two blocks of a task share one.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_columns(
    w: &QMatrix,
    x: &Acts,
    rows: Range<usize>,
    (j, slot): (usize, usize),
    kind: gemm::Kind,
    vnni: bool,
    scratch: &mut Scratch,
    out: &Out,
) {
    scratch.slots(slot);
    if kind == gemm::Kind::KQuant {
        interleave(w, (j, slot), scratch);
    } else {
        prepare_block(w, j, &mut scratch.block);
    }
    let per_call = gemm::rows_per_call(kind, vnni);
    let mut r = rows.start;
    while r < rows.end {
        let take = (rows.end - r).min(per_call);
        let mut acc = [[0f32; gemm::KR]; gemm::NW];
        gemm::dot_block(
            kind,
            &scratch.block,
            &scratch.interleaved[slot].1,
            x,
            r,
            take,
            &mut acc,
            vnni,
        );
        write_block(out, &acc, r, take, j);
        r += take;
    }
}

/// k-quant columns `j .. j + NW` interleaved into the task's `slot`, unless they already are
/// (built on the task's first tile, kept for the others).
///
/// # Safety
/// AVX2, FMA and F16C; the columns are k-quants.
#[cfg(target_arch = "x86_64")]
unsafe fn interleave(w: &QMatrix, (j, slot): (usize, usize), scratch: &mut Scratch) {
    scratch.slots(slot);
    let (built_for, inter) = &mut scratch.interleaved[slot];
    if *built_for == Some(j) {
        return;
    }
    if let Some((format, group)) = w.packed_group(j) {
        inter.build_packed(format, group, w.cols());
        *built_for = Some(j);
        return;
    }
    let rows = std::array::from_fn(|i| w.row(j + i));
    if !inter.build_raw(rows, w.cols()) {
        // Rows of different k-quant formats (at the seam of stacked parts): through the
        // prepared forms.
        prepare_block(w, j, &mut scratch.block);
        inter.build(&scratch.block, w.cols());
    }
    *built_for = Some(j);
    // The next block's rows come from memory while this one is multiplied: at batch 32 the
    // rows are built once a step, and their loads waited on memory (measured on Qwen2.5-1.5B:
    // 63.5 / 61.3 → 70.7 / 68.5 tokens/s at batch 32, prefill unchanged; README).
    prefetch_rows(w, j + gemm::NW..(j + 2 * gemm::NW).min(w.rows()));
}

/// k-quant columns `j .. j + 2·NW` (two blocks, in slots `slot` and `slot + 1`) for activation `rows`
/// through the AVX-512 kernel, [`gemm::KR`] rows a call; blocks whose chunk sums differ (Q6_K beside
/// Q4_K) go one by one through [`block_columns`].
///
/// # Safety
/// AVX-512F/BW, AVX2, FMA and F16C; the columns are k-quants written by this caller only; `slot` as
/// for [`block_columns`].
#[cfg(target_arch = "x86_64")]
unsafe fn pair_columns(
    w: &QMatrix,
    x: &Acts,
    rows: Range<usize>,
    (j, slot): (usize, usize),
    scratch: &mut Scratch,
    out: &Out,
) {
    interleave(w, (j, slot), scratch);
    interleave(w, (j + gemm::NW, slot + 1), scratch);
    let p = [
        &scratch.interleaved[slot].1,
        &scratch.interleaved[slot + 1].1,
    ];
    if !super::gemm512::pairs_with(p[0], p[1]) {
        for s in 0..2 {
            let at = (j + s * gemm::NW, slot + s);
            block_columns(
                w,
                x,
                rows.clone(),
                at,
                gemm::Kind::KQuant,
                false,
                scratch,
                out,
            );
        }
        return;
    }
    let mut r = rows.start;
    while r < rows.end {
        // Four rows a call: with eight, prefill measured 85.2 tokens/s against 93.2 with four (Qwen).
        let take = (rows.end - r).min(gemm::KR);
        let mut acc = [[[0f32; super::gemm512::KR]; gemm::NW]; 2];
        super::gemm512::dot_pair(p, x, r, take, &mut acc);
        for (s, block) in acc.iter().enumerate() {
            write_block(out, block, r, take, j + s * gemm::NW);
        }
        r += take;
    }
}

/// Asks for weight `rows` to be brought into L2, a cache line at a time (a hint: nothing is read).
#[cfg(target_arch = "x86_64")]
fn prefetch_rows(w: &QMatrix, rows: Range<usize>) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    for j in rows {
        let bytes = w.row(j).1;
        for line in (0..bytes.len()).step_by(64) {
            // SAFETY: a prefetch of an address inside the row; it has no effect on the program.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(bytes.as_ptr().add(line) as *const i8) };
        }
    }
}

/// Decodes weight rows `j .. j + NW` into `block`.
///
/// # Safety
/// AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
unsafe fn prepare_block(w: &QMatrix, j: usize, block: &mut [super::avx2::Prepared; gemm::NW]) {
    for (i, p) in block.iter_mut().enumerate() {
        let (format, bytes) = w.row(j + i);
        super::avx2::prepare(format, bytes, w.cols(), p);
    }
}

/// Column `j` for activation `rows`: the weight row decoded once, then multiplied eight activation
/// rows at a time (AVX2, or the portable kernel).
fn one_column(
    w: &QMatrix,
    x: &Acts,
    rows: Range<usize>,
    j: usize,
    path: Path,
    scratch: &mut Scratch,
    out: &Out,
) {
    let (format, bytes) = w.raw_row(j, &mut scratch.raw);
    match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Path::Avx2` and `Avx512` are only taken on CPUs with AVX2, FMA and F16C (checked by
        // `run`); the row holds whole blocks of `k` weights.
        Path::Avx2 | Path::Avx512 => unsafe {
            super::avx2::prepare(format, bytes, w.cols(), &mut scratch.prepared)
        },
        _ => format.unpack_row(
            bytes,
            scratch
                .unpacked
                .get_or_insert_with(|| Unpacked::with_len(w.cols(), w.has_min())),
        ),
    }
    let mut r = rows.start;
    while r < rows.end {
        let take = (rows.end - r).min(ROWS);
        let mut acc = [0f32; ROWS];
        match path {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above; the row was prepared for `k` weights and the activation rows exist.
            Path::Avx2 | Path::Avx512 => unsafe {
                super::avx2::dot_rows(&scratch.prepared, x, r, take, &mut acc)
            },
            _ => {
                let unpacked = scratch.unpacked.as_ref().expect("unpacked just above");
                portable(unpacked, format.has_min(), x, r, take, &mut acc)
            }
        }
        for (i, a) in acc.iter().take(take).enumerate() {
            // SAFETY: a row of the activations, a column of the weights, owned by this task.
            unsafe { out.set(r + i, j, *a) };
        }
        r += take;
    }
}

/// A task's decoded weight rows.
struct Scratch {
    /// The portable path's row, allocated on first use: the AVX2 kernels never need it, and every
    /// split of the parallel loop builds a scratch (several per product, a hundred products a step).
    unpacked: Option<Unpacked>,
    /// A repacked row put back as in the file, for the kernels of one row.
    raw: Vec<u8>,
    #[cfg(target_arch = "x86_64")]
    prepared: super::avx2::Prepared,
    #[cfg(target_arch = "x86_64")]
    block: [super::avx2::Prepared; gemm::NW],
    /// The task's k-quant rows interleaved, a slot per [`gemm::NW`] columns, with the first column
    /// each holds: built on the task's first tile, used by all. Grown when a slot is first asked for
    /// ([`Scratch::slots`]): decoding never needs one, and allocating and filling 32 empty slots for
    /// every split of every product was 3% of a batch-1 step (Qwen2.5-1.5B, profile).
    #[cfg(target_arch = "x86_64")]
    interleaved: Vec<(Option<usize>, gemm::Interleaved)>,
}

#[cfg(target_arch = "x86_64")]
impl Scratch {
    /// Makes sure slots `0 ..= slot` exist.
    fn slots(&mut self, slot: usize) {
        if self.interleaved.len() <= slot {
            self.interleaved.resize_with(slot + 1, Default::default);
        }
    }
}

/// The output matrix (`m × n`, row-major), written by tasks that own disjoint columns.
struct Out(*mut f32, usize);
// SAFETY: tasks write disjoint columns of the output through this pointer.
unsafe impl Sync for Out {}
unsafe impl Send for Out {}

impl Out {
    /// Writes element (`r`, `j`).
    ///
    /// # Safety
    /// (`r`, `j`) is inside the `m × n` output and column `j` is written by the caller's task only.
    #[inline(always)]
    unsafe fn set(&self, r: usize, j: usize, v: f32) {
        *self.0.add(r * self.1 + j) = v;
    }
}
