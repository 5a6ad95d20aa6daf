//! Unpacking ggml's 32-weight block formats: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.
//!
//! Each function unpacks block `b` of a row (the file's bytes `x`) into groups `b` of [`Unpacked`]:
//! the same values ggml's `dequantize_row_*` produce, as integers with their scale and minimum. The
//! loops are plain slices of fixed length so the compiler vectorizes them.

use super::unpacked::{f16_at, Unpacked};

/// Writes the 32 values of block `b` from 16 bytes of nibbles (low nibbles first) plus optional high
/// bits `qh` (bit `i` is the fifth bit of weight `i`), minus `offset`.
#[inline(always)]
fn nibbles(qs: &[u8], qh: Option<u32>, offset: i8, out: &mut [i8]) {
    let (lo, hi) = out.split_at_mut(16);
    for i in 0..16 {
        let (mut a, mut c) = (qs[i] & 0x0F, qs[i] >> 4);
        if let Some(h) = qh {
            a |= (((h >> i) << 4) & 0x10) as u8;
            c |= ((h >> (i + 12)) & 0x10) as u8;
        }
        lo[i] = a as i8 - offset;
        hi[i] = c as i8 - offset;
    }
}

fn group(out: &mut Unpacked, b: usize) -> &mut [i8] {
    &mut out.q[b * 32..(b + 1) * 32]
}

/// Q4_0 (18 bytes): f16 `d`, 16 bytes of nibbles; `w = d·(q − 8)`.
pub fn q4_0(x: &[u8], b: usize, out: &mut Unpacked) {
    let d = f16_at(x, 0);
    nibbles(&x[2..18], None, 8, group(out, b));
    out.set_scales(b, d, d);
}

/// Q4_1 (20 bytes): f16 `d`, f16 `m`, 16 bytes of nibbles; `w = d·q + m`.
pub fn q4_1(x: &[u8], b: usize, out: &mut Unpacked) {
    let (d, m) = (f16_at(x, 0), f16_at(x, 2));
    nibbles(&x[4..20], None, 0, group(out, b));
    out.set_scales(b, d, d);
    out.mins[2 * b..2 * b + 2].fill(m);
}

/// Q5_0 (22 bytes): f16 `d`, 32 high bits, 16 bytes of nibbles; `w = d·(q − 16)`.
pub fn q5_0(x: &[u8], b: usize, out: &mut Unpacked) {
    let d = f16_at(x, 0);
    let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
    nibbles(&x[6..22], Some(qh), 16, group(out, b));
    out.set_scales(b, d, d);
}

/// Q5_1 (24 bytes): f16 `d`, f16 `m`, 32 high bits, 16 bytes of nibbles; `w = d·q + m`.
pub fn q5_1(x: &[u8], b: usize, out: &mut Unpacked) {
    let (d, m) = (f16_at(x, 0), f16_at(x, 2));
    let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
    nibbles(&x[8..24], Some(qh), 0, group(out, b));
    out.set_scales(b, d, d);
    out.mins[2 * b..2 * b + 2].fill(m);
}

/// Q8_0 (34 bytes): f16 `d`, 32 signed bytes; `w = d·q`.
pub fn q8_0(x: &[u8], b: usize, out: &mut Unpacked) {
    let d = f16_at(x, 0);
    for (o, &v) in group(out, b).iter_mut().zip(&x[2..34]) {
        *o = v as i8;
    }
    out.set_scales(b, d, d);
}
