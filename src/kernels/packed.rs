//! Rows of every block format kvbench multiplies (the k-quants and the 32-weight formats) repacked at
//! load, four at a time, so that the multi-row kernels read them as they are (llama.cpp repacks its
//! Q4_K and Q4_0 for the same reason).
//!
//! Why it exists: the kernels for several activation rows multiply four weight rows at once, 8 weights
//! of each per 32-byte vector. From the file's row-major blocks they had to build that interleaved form
//! once per product and step, decoding every weight to a byte: on Qwen2.5-Coder-1.5B at batch 8 a third
//! of the decoding time (README, speed). Repacked once at load, the same bytes (no more, no fewer: a
//! permutation within each group of four rows) are read directly by the kernels.
//!
//! The layout of a group of four rows, super-block by super-block: the four rows' headers (scales,
//! `d`, `dmin`; the file's bytes) one after the other, then the rest of the four super-blocks, every
//! 32-byte segment `s` of it as 128 bytes: chunk `c` (its bytes `8c … 8c + 7`) of row `w` at
//! `128 s + 32 c + 8 w`. The k-quant decoding works byte by byte on 32-byte segments, so the kernels
//! decode a repacked segment with the same instructions and get the four rows' weights interleaved in
//! 8-weight chunks, ready for one `maddubs` against 8 broadcast activation bytes.
//!
//! The 32-weight formats the same way, block by block: the four rows' headers (`d`, `m` for Q4_1 and
//! Q5_1, the fifth bits for Q5_0 and Q5_1, as the file has them), then their weight bytes in 32-byte
//! chunks, bytes 8t … 8t + 7 of each row in chunk t: for the nibble formats bytes 0–7 of each row in the
//! first and 8–15 in the second, so that one load and a mask give weights 0–7 (8–15) of the four rows and
//! a shift weights 16–23 (24–31); for Q8_0 four chunks of 8 weights. Each chunk is multiplied against 8
//! broadcast activation bytes ([`super::x86::legacy_packed`]).
//!
//! A matrix's rows are repacked in whole groups; a last group of fewer than four rows stays as in the
//! file. Nothing else in the model is laid out anew.

use super::format::BlockFormat;

/// Rows repacked together.
pub const GROUP_ROWS: usize = 4;

/// Where a format's block keeps its header and its weights: `(header, data)` as byte ranges of the
/// file's block. Every format is repacked: one with no kernel for the layout would need a way out here.
pub fn regions(format: BlockFormat) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    match format {
        // d; 16 bytes of nibbles.
        BlockFormat::Q4_0 => (0..2, 2..18),
        // d, m; 16 bytes of nibbles.
        BlockFormat::Q4_1 => (0..4, 4..20),
        // d, 32 fifth bits; 16 bytes of nibbles.
        BlockFormat::Q5_0 => (0..6, 6..22),
        // d, m, 32 fifth bits; 16 bytes of nibbles.
        BlockFormat::Q5_1 => (0..8, 8..24),
        // d; 32 signed bytes.
        BlockFormat::Q8_0 => (0..2, 2..34),
        // d, dmin, 12 bytes of scales; then 128 bytes of nibbles.
        BlockFormat::Q4K => (0..16, 16..144),
        // d, dmin, scales; 32 bytes of fifth bits, 128 of nibbles.
        BlockFormat::Q5K => (0..16, 16..176),
        // 128 bytes of low nibbles, 64 of high bits; then 16 scales and d.
        BlockFormat::Q6K => (192..210, 0..192),
    }
}

/// Repacks every whole group of four rows of `bytes` (`rows` rows of `row_bytes` in `format`) in
/// place, groups in parallel, each through one group's worth of scratch.
pub fn pack(format: BlockFormat, bytes: &mut [u8], rows: usize, row_bytes: usize) {
    use rayon::prelude::*;
    let (header, data) = regions(format);
    let group_bytes = GROUP_ROWS * row_bytes;
    let block = format.block_bytes();
    bytes[..rows / GROUP_ROWS * group_bytes]
        .par_chunks_exact_mut(group_bytes)
        .for_each_init(
            || vec![0u8; group_bytes],
            |src, group| {
                src.copy_from_slice(group);
                for (b, out) in group.chunks_exact_mut(GROUP_ROWS * block).enumerate() {
                    let (hl, at) = (header.len(), b * block);
                    let (heads, chunks) = out.split_at_mut(GROUP_ROWS * hl);
                    for w in 0..GROUP_ROWS {
                        let row = &src[w * row_bytes + at..][..block];
                        heads[w * hl..(w + 1) * hl].copy_from_slice(&row[header.clone()]);
                        // Chunk t of the row's weights (8 bytes) becomes chunk 4t + w: segment
                        // s = t / 4, chunk c = t % 4 at 128 s + 32 c + 8 w.
                        for (t, chunk) in row[data.clone()].chunks_exact(8).enumerate() {
                            chunks[8 * (GROUP_ROWS * t + w)..][..8].copy_from_slice(chunk);
                        }
                    }
                }
            },
        );
}

/// Row `w` (0–3) of a repacked `group` (`GROUP_ROWS · row_bytes` bytes) as the file stored it, into
/// `out` (`row_bytes`).
pub fn unpack_row(format: BlockFormat, group: &[u8], w: usize, out: &mut [u8]) {
    let (header, data) = regions(format);
    let hl = header.len();
    let block = format.block_bytes();
    for (b, row_block) in out.chunks_exact_mut(block).enumerate() {
        let packed = &group[b * GROUP_ROWS * block..][..GROUP_ROWS * block];
        row_block[header.clone()].copy_from_slice(&packed[w * hl..(w + 1) * hl]);
        let chunks = &packed[GROUP_ROWS * hl..];
        for (t, chunk) in row_block[data.clone()].chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&chunks[8 * (GROUP_ROWS * t + w)..][..8]);
        }
    }
}

/// Undoes [`pack`].
pub fn unpack(format: BlockFormat, bytes: &mut [u8], rows: usize, row_bytes: usize) {
    let group_bytes = GROUP_ROWS * row_bytes;
    let mut src = vec![0u8; group_bytes];
    for group in bytes[..rows / GROUP_ROWS * group_bytes].chunks_exact_mut(group_bytes) {
        src.copy_from_slice(group);
        for (w, row) in group.chunks_exact_mut(row_bytes).enumerate() {
            unpack_row(format, &src, w, row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repacking_is_a_permutation_that_unpacking_undoes() {
        for format in [
            BlockFormat::Q4K,
            BlockFormat::Q5K,
            BlockFormat::Q6K,
            BlockFormat::Q4_0,
            BlockFormat::Q4_1,
            BlockFormat::Q5_0,
            BlockFormat::Q5_1,
            BlockFormat::Q8_0,
        ] {
            let (rows, k) = (9, 512);
            let row_bytes = format.row_bytes(k).unwrap();
            let file: Vec<u8> = (0..rows * row_bytes)
                .map(|i| (i * 7 + i / 251) as u8)
                .collect();
            let mut packed = file.clone();
            pack(format, &mut packed, rows, row_bytes);
            assert_ne!(packed, file, "{format:?}: nothing moved");
            let (mut a, mut b) = (packed.clone(), file.clone());
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "{format:?}: not a permutation");
            // The ninth row is a group of its own: left as in the file.
            assert_eq!(packed[8 * row_bytes..], file[8 * row_bytes..]);
            let mut row = vec![0u8; row_bytes];
            for j in 0..8 {
                unpack_row(format, &packed[j / 4 * 4 * row_bytes..], j % 4, &mut row);
                assert_eq!(row, file[j * row_bytes..(j + 1) * row_bytes], "row {j}");
            }
            unpack(format, &mut packed, rows, row_bytes);
            assert_eq!(packed, file);
        }
    }

    #[test]
    fn a_q4_block_holds_the_four_headers_then_each_rows_nibbles_in_two_chunks() {
        let format = BlockFormat::Q4_1;
        let row_bytes = format.row_bytes(64).unwrap();
        let bytes: Vec<u8> = (0..4 * row_bytes).map(|i| i as u8).collect();
        let mut packed = bytes.clone();
        pack(format, &mut packed, 4, row_bytes);
        // Block 1 of the group: 80 bytes from 80; row w's block 1 starts at w · 40 + 20.
        let block = &packed[80..160];
        for w in 0..4 {
            let file = &bytes[w * row_bytes + 20..][..20];
            assert_eq!(block[4 * w..4 * w + 4], file[..4], "row {w}'s d and m");
            assert_eq!(
                block[16 + 8 * w..24 + 8 * w],
                file[4..12],
                "row {w}'s bytes 0–7"
            );
            assert_eq!(
                block[48 + 8 * w..56 + 8 * w],
                file[12..20],
                "row {w}'s bytes 8–15"
            );
        }
    }

    #[test]
    fn a_segment_chunk_holds_eight_bytes_of_each_row_in_turn() {
        let format = BlockFormat::Q4K;
        let row_bytes = format.row_bytes(256).unwrap();
        let mut bytes = vec![0u8; 4 * row_bytes];
        for w in 0..4 {
            for i in 0..128 {
                bytes[w * row_bytes + 16 + i] = (w * 128 + i) as u8;
            }
        }
        pack(format, &mut bytes, 4, row_bytes);
        // Segment 1, chunk 2: bytes 32 + 16 … 32 + 23 of the data of rows 0, 1, 2, 3.
        let at = 4 * 16 + 128 + 64;
        for w in 0..4 {
            let want: Vec<u8> = (0..8).map(|i| (w * 128 + 48 + i) as u8).collect();
            assert_eq!(bytes[at + 8 * w..at + 8 * w + 8], want[..], "row {w}");
        }
    }
}
