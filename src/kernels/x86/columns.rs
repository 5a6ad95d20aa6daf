//! The driver's x86 side: which x86 kernel computes a task's next columns, by the product's
//! [`Plan`], and the scratch those kernels decode weight rows into.
//!
//! Decoding calls (fewer rows than [`Plan::tiled_from`]) use the kernels that decode blocks in
//! registers (`fused`); larger ones decode [`NW`] weight rows once per tile and multiply them with
//! several activation rows at a time ([`gemm`], [`gemm512`]). k-quant rows repacked at load are read
//! in place ([`gemm::dot_packed`], [`k45_vnni`], [`gemm512::dot_packed_pair`]) while
//! [`Plan::packed_in_place`], and interleaved per tile after; repacked 32-weight rows always in place
//! ([`legacy_packed`]). Columns a block of `NW` cannot take (a
//! task's last few, or stacked parts of different kinds) go one by one ([`prepared`]).

use super::finish::NW;
use super::{gemm, gemm512, k45_vnni, legacy_packed, prepared};
use crate::kernels::acts::Acts;
use crate::kernels::dispatch::Plan;
use crate::kernels::matrix::QMatrix;
use crate::kernels::output::Out;
use std::ops::Range;

/// A task's decoded weight rows.
#[derive(Default)]
pub struct Scratch {
    /// A repacked row put back as in the file, for the kernels of one row.
    raw: Vec<u8>,
    prepared: prepared::Prepared,
    block: [prepared::Prepared; NW],
    /// The task's k-quant rows interleaved, a slot per [`NW`] columns, with the first column each
    /// holds: built on the task's first tile, used by all. Grown when a slot is first asked for
    /// ([`Scratch::slots`]): decoding never needs one, and allocating and filling 32 empty slots for
    /// every split of every product was 3% of a batch-1 step (Qwen2.5-1.5B, profile).
    interleaved: Vec<(Option<usize>, gemm::Interleaved)>,
}

/// Computes the columns from `j` (at most to `end`, the task's last) for activation `rows` with the
/// kernel the plan picks for them; returns how many columns it did (at least one).
///
/// # Safety
/// The CPU runs `plan.path`, which is AVX2 or AVX-512; the columns `j .. end` are
/// this caller's only; `x` holds the activations of `w`'s width ([`crate::kernels::driver::run`]
/// checked the shapes).
pub unsafe fn next(
    w: &QMatrix,
    x: &Acts,
    rows: Range<usize>,
    (j, start, end): (usize, usize, usize),
    plan: &Plan,
    scratch: &mut Scratch,
    out: &Out,
) -> usize {
    debug_assert!(plan.path.simd());
    let slot = (j - start) / NW;
    // SAFETY (every call below): the caller's contract, and each callee's columns lie in `j .. end`.
    unsafe {
        if let Some((format, _)) = w.packed_group(j) {
            // Repacked 32-weight groups are read in place at every batch size (one kernel, so
            // that a row's bits do not depend on its batch); k-quant ones while the plan says so.
            if plan.packed_in_place() || legacy_packed::takes(format) {
                return packed_columns(w, x, rows, j, end, plan, out);
            }
        } else if plan.in_registers(w.format(j)) {
            // Two columns of one 32-weight format go together (docs/kernels.md: faster on Q4_1,
            // slower on k-quants).
            let format = w.format(j);
            let pair = !format.is_k_quant() && j + 1 < end && w.format(j + 1) == format;
            fused_columns(w, x, rows, j, pair, out);
            return 1 + usize::from(pair);
        }
        if plan.pairs_tiles()
            && j + 2 * NW <= end
            && block_kind(w, j) == Some(gemm::Kind::KQuant)
            && block_kind(w, j + NW) == Some(gemm::Kind::KQuant)
        {
            pair_columns(w, x, rows, (j, slot), plan.vnni, scratch, out);
            return 2 * NW;
        }
        if j + NW <= end {
            if let Some(kind) = block_kind(w, j) {
                block_columns(w, x, rows, (j, slot), kind, plan.vnni, scratch, out);
                return NW;
            }
        }
        one_column(w, x, rows, j, scratch, out);
    }
    1
}

/// Column `j` for activation `rows`: the weight row decoded once, then multiplied eight activation
/// rows at a time.
///
/// # Safety
/// AVX2, FMA and F16C; the column is written by this caller only.
unsafe fn one_column(
    w: &QMatrix,
    x: &Acts,
    rows: Range<usize>,
    j: usize,
    scratch: &mut Scratch,
    out: &Out,
) {
    let (format, bytes) = w.raw_row(j, &mut scratch.raw);
    // SAFETY: the caller's CPU has AVX2, FMA and F16C; the row holds whole blocks of `k` weights.
    unsafe { prepared::prepare(format, bytes, w.cols(), &mut scratch.prepared) };
    let mut r = rows.start;
    while r < rows.end {
        let take = (rows.end - r).min(ROWS);
        let mut acc = [0f32; ROWS];
        // SAFETY: as above; the row was prepared for `k` weights and the activation rows exist; the
        // column is the caller's.
        unsafe {
            prepared::dot_rows(&scratch.prepared, x, r, take, &mut acc);
            for (i, a) in acc.iter().take(take).enumerate() {
                out.set(r + i, j, *a);
            }
        }
        r += take;
    }
}

/// Activation rows one kernel call multiplies with a decoded weight row.
const ROWS: usize = 8;

/// Column `j` (and `j + 1` when `pair`, of the same format) for activation `rows`, blocks decoded in
/// registers, four rows at a time.
///
/// # Safety
/// AVX2, FMA and F16C; the columns are written by this caller only.
unsafe fn fused_columns(
    w: &QMatrix,
    x: &Acts,
    rows: Range<usize>,
    j: usize,
    pair: bool,
    out: &Out,
) {
    unsafe {
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
}

/// The kernel kind shared by rows `j .. j + NW`, if they share one and are either one repacked group
/// or all as in the file.
fn block_kind(w: &QMatrix, j: usize) -> Option<gemm::Kind> {
    if let Some((format, _)) = w.packed_group(j) {
        return format.is_k_quant().then_some(gemm::Kind::KQuant);
    }
    let kind = gemm::Kind::of(w.format(j));
    (0..gemm::NW)
        .all(|i| !w.is_packed(j + i) && gemm::Kind::of(w.format(j + i)) == kind)
        .then_some(kind)
}

/// Columns `j .. j + NW` of a repacked group, or `j .. j + 2·NW` on AVX-512 when the next group is one
/// of the same format, read in place for activation `rows`, [`gemm::KR`] rows a call (a pair: up to
/// [`gemm512::MAX_ROWS`], each super-block's headers decoded once for all of them); returns the
/// columns done.
///
/// # Safety
/// The CPU runs `plan`'s path; row `j` starts a repacked group; the columns up to `end` are written
/// by this caller only.
unsafe fn packed_columns(
    w: &QMatrix,
    x: &Acts,
    rows: Range<usize>,
    j: usize,
    end: usize,
    plan: &Plan,
    out: &Out,
) -> usize {
    unsafe {
        let (format, group) = w.packed_group(j).expect("a repacked group starts at j");
        // The next group only when it is this task's: past the matrix's last row there is none to ask for.
        let next = (j + 2 * gemm::NW <= end)
            .then(|| w.packed_group(j + gemm::NW))
            .flatten();
        let pairs = format.is_k_quant() && plan.pairs_packed(rows.len());
        if let Some((_, second)) = next.filter(|n| n.0 == format && pairs) {
            use gemm512::{Acc, KR, MAX_ROWS};
            let mut r = rows.start;
            while r < rows.end {
                let take = (rows.end - r).min(MAX_ROWS);
                let mut acc = [Acc::default(); MAX_ROWS / KR];
                gemm512::dot_packed_pair(format, [group, second], x, r, take, &mut acc, plan.vnni);
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
            if legacy_packed::takes(format) {
                legacy_packed::dot_packed(format, group, x, r, take, &mut acc);
            } else if plan.vnni && k45_vnni::takes(format) {
                // Q4_K and Q5_K: fewer instructions a super-block than `gemm`'s VNNI kernel.
                k45_vnni::dot_packed(format, group, x, r, take, &mut acc);
            } else {
                gemm::dot_packed(format, group, x, r, take, &mut acc, plan.vnni);
            }
            write_block(out, &acc, r, take, j);
            r += take;
        }
        gemm::NW
    }
}

/// Writes `acc[c][i]` (activation rows `r .. r + take`) into columns `j + c`.
///
/// # Safety
/// The columns are written by this caller only and the rows exist.
#[inline(always)]
unsafe fn write_block<const N: usize>(
    out: &Out,
    acc: &[[f32; N]; gemm::NW],
    r: usize,
    take: usize,
    j: usize,
) {
    unsafe {
        for (c, col) in acc.iter().enumerate() {
            for (i, a) in col.iter().take(take).enumerate() {
                out.set(r + i, j + c, *a);
            }
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
    unsafe {
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
}

/// k-quant columns `j .. j + NW` interleaved into the task's `slot`, unless they already are
/// (built on the task's first tile, kept for the others).
///
/// # Safety
/// AVX2, FMA and F16C; the columns are k-quants.
unsafe fn interleave(w: &QMatrix, (j, slot): (usize, usize), scratch: &mut Scratch) {
    unsafe {
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
        // rows are built once a step, and their loads waited on memory (measured: docs/kernels.md).
        prefetch_rows(w, j + gemm::NW..(j + 2 * gemm::NW).min(w.rows()));
    }
}

/// k-quant columns `j .. j + 2·NW` (two blocks, in slots `slot` and `slot + 1`) for activation `rows`
/// through the AVX-512 kernel, [`gemm::KR`] rows a call; blocks whose chunk sums differ (Q6_K beside
/// Q4_K) go one by one through [`block_columns`].
///
/// # Safety
/// AVX-512F/BW, AVX2, FMA and F16C; the columns are k-quants written by this caller only; `slot` as
/// for [`block_columns`].
unsafe fn pair_columns(
    w: &QMatrix,
    x: &Acts,
    rows: Range<usize>,
    (j, slot): (usize, usize),
    vnni: bool,
    scratch: &mut Scratch,
    out: &Out,
) {
    unsafe {
        interleave(w, (j, slot), scratch);
        interleave(w, (j + gemm::NW, slot + 1), scratch);
        let p = [
            &scratch.interleaved[slot].1,
            &scratch.interleaved[slot + 1].1,
        ];
        if !gemm512::pairs_with(p[0], p[1]) {
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
            // Four rows a call: eight were slower at prefill (measured: docs/kernels.md).
            let take = (rows.end - r).min(gemm::KR);
            let mut acc = [[[0f32; gemm512::KR]; gemm::NW]; 2];
            gemm512::dot_pair(p, x, r, take, &mut acc, vnni);
            for (s, block) in acc.iter().enumerate() {
                write_block(out, block, r, take, j + s * gemm::NW);
            }
            r += take;
        }
    }
}

/// Asks for weight `rows` to be brought into L2, a cache line at a time (a hint: nothing is read).
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
unsafe fn prepare_block(w: &QMatrix, j: usize, block: &mut [prepared::Prepared; gemm::NW]) {
    unsafe {
        for (i, p) in block.iter_mut().enumerate() {
            let (format, bytes) = w.row(j + i);
            prepared::prepare(format, bytes, w.cols(), p);
        }
    }
}

impl Scratch {
    /// Makes sure slots `0 ..= slot` exist.
    fn slots(&mut self, slot: usize) {
        if self.interleaved.len() <= slot {
            self.interleaved.resize_with(slot + 1, Default::default);
        }
    }
}
