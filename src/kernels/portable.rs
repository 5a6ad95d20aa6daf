//! The portable dot product: one unpacked weight row ([`Unpacked`]) with up to four quantized
//! activation rows ([`Acts`]), in plain Rust for every CPU. It computes the same integer sums as the
//! x86 kernels (`x86::avx2`), which are tested against it.
//!
//! Per group of 32 weights and activation row: `Σ_half scale_half · Σ_i q_i·xq_i` (the two 16-wide
//! halves scaled apart, for Q6_K's per-16 scales), summed over an activation block and multiplied by
//! its scale; then `Σ_h min_h · d · Σ xq` for formats with a minimum.

use super::acts::Acts;
use super::unpacked::{Unpacked, GROUP, HALF};

/// `Σ_h mins_h · d(h) · sums_h`: the minimum's share of one row's product.
#[inline(always)]
fn min_term(mins: &[f32], x: &Acts, r: usize) -> f32 {
    let (sums, d) = (x.row_sums(r), x.scales(r));
    let per_block = x.block / HALF;
    mins.iter()
        .zip(sums)
        .enumerate()
        .fold(0f32, |t, (h, (m, &s))| t + m * d[h / per_block] * s as f32)
}

/// Products of one unpacked weight row `w` with activation rows `r0 .. r0 + rows` into
/// `acc[..rows]`, portable. `has_min` says whether `w`'s format has a minimum.
pub fn portable(w: &Unpacked, has_min: bool, x: &Acts, r0: usize, rows: usize, acc: &mut [f32]) {
    #[cfg(test)]
    super::ran::mark(super::ran::Kernel::Portable);
    let per_block = x.block / GROUP;
    for (i, a) in acc.iter_mut().take(rows).enumerate() {
        let (xq, xd) = (x.row(r0 + i), x.scales(r0 + i));
        let mut total = 0f32;
        for (b, &d) in xd.iter().enumerate() {
            let mut block = 0f32;
            for g in b * per_block..(b + 1) * per_block {
                for h in 0..2 {
                    let at = g * GROUP + h * HALF;
                    let s: i32 = (at..at + HALF).map(|t| w.q[t] as i32 * xq[t] as i32).sum();
                    block += s as f32 * w.scales[g * 8 + 4 * h];
                }
            }
            total += block * d;
        }
        if has_min {
            total += min_term(&w.mins, x, r0 + i);
        }
        *a = total;
    }
}
