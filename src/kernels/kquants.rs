//! Unpacking ggml's 256-weight k-quant formats: Q4_K, Q5_K and Q6_K.
//!
//! Each function unpacks super-block `b` of a row into groups `8b … 8b + 7` of [`Unpacked`], with the
//! sub-block scales folded into the group scales: the values of ggml's `dequantize_row_q*_K`, exactly.

use super::unpacked::{f16_at, Unpacked};

/// Scale and minimum (6 bits each) of sub-block `j` of Q4_K/Q5_K's packed 12 bytes
/// (ggml's `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K and Q5_K share everything but the fifth bit: `qh` is Q5_K's 32 bytes of high bits.
#[inline(always)]
fn q45_k(
    d: f32,
    dmin: f32,
    scales: &[u8],
    qs: &[u8],
    qh: Option<&[u8]>,
    b: usize,
    out: &mut Unpacked,
) {
    for j in 0..4 {
        let g = 8 * b + 2 * j;
        let ql = &qs[32 * j..32 * j + 32];
        let (lo, hi) = out.q[g * 32..g * 32 + 64].split_at_mut(32);
        match qh {
            None => {
                for l in 0..32 {
                    lo[l] = (ql[l] & 0x0F) as i8;
                    hi[l] = (ql[l] >> 4) as i8;
                }
            }
            Some(qh) => {
                let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
                for l in 0..32 {
                    lo[l] = ((ql[l] & 0x0F) | if qh[l] & u1 != 0 { 16 } else { 0 }) as i8;
                    hi[l] = ((ql[l] >> 4) | if qh[l] & u2 != 0 { 16 } else { 0 }) as i8;
                }
            }
        }
        for (t, sub) in [2 * j, 2 * j + 1].into_iter().enumerate() {
            let (sc, m) = scale_min(sub, scales);
            let s = d * sc as f32;
            out.set_scales(g + t, s, s);
            out.mins[2 * (g + t)..2 * (g + t) + 2].fill(-(dmin * m as f32));
        }
    }
}

/// Q4_K (144 bytes): f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and minima, 128 bytes of nibbles;
/// sub-block `j` (32 weights): `w = d·sc_j·q − dmin·m_j`.
pub fn q4_k(x: &[u8], b: usize, out: &mut Unpacked) {
    q45_k(
        f16_at(x, 0),
        f16_at(x, 2),
        &x[4..16],
        &x[16..144],
        None,
        b,
        out,
    );
}

/// Q5_K (176 bytes): as Q4_K, with 32 bytes of fifth bits before the nibbles.
pub fn q5_k(x: &[u8], b: usize, out: &mut Unpacked) {
    q45_k(
        f16_at(x, 0),
        f16_at(x, 2),
        &x[4..16],
        &x[48..176],
        Some(&x[16..48]),
        b,
        out,
    );
}

/// Q6_K (210 bytes): 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 signed 8-bit scales (one
/// per 16 weights), f16 `d`; `w = d·sc·(q − 32)`.
pub fn q6_k(x: &[u8], b: usize, out: &mut Unpacked) {
    let (ql, qh, sc) = (&x[0..128], &x[128..192], &x[192..208]);
    let d = f16_at(x, 208);
    for h in 0..2 {
        let (ql, qh, sc) = (
            &ql[64 * h..64 * h + 64],
            &qh[32 * h..32 * h + 32],
            &sc[8 * h..8 * h + 8],
        );
        let g0 = 8 * b + 4 * h;
        let q = &mut out.q[g0 * 32..g0 * 32 + 128];
        for l in 0..32 {
            q[l] = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i8 - 32;
            q[l + 32] = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            q[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            q[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
        for t in 0..4 {
            let (lo, hi) = (sc[2 * t] as i8 as f32, sc[2 * t + 1] as i8 as f32);
            out.set_scales(g0 + t, d * lo, d * hi);
        }
    }
}
