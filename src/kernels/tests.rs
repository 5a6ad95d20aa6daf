//! Every format's kernel against candle's dequantization, the AVX2 path against the portable one, and
//! a row's result against its batch.
//!
//! A test of a path needs that path's instructions: on a CPU without them it says so and does not run
//! (`KVBENCH_REQUIRE=avx2,avx512,vnni,gfni` makes that a failure), and where it runs it asserts that
//! the path's kernels ran ([`super::ran`]), so a dispatch that fell back to another path fails it.

use super::dispatch::{has_avx2, has_avx512, has_gfni, has_vnni, Path};
use super::ran::Kernel;
use super::*;
use candle_core::quantized::{QStorage, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};

/// Whether a test of `kernel`'s path can run on this CPU (`has`). When it cannot, it is skipped with a
/// line on standard error, unless `KVBENCH_REQUIRE` (a comma list of `avx2`, `avx512`, `vnni`,
/// `gfni`) names it: then the test fails, so a machine meant to check every path cannot pass by
/// skipping.
pub(crate) fn needs(kernel: Kernel, has: bool) -> bool {
    if has {
        return true;
    }
    let required = std::env::var("KVBENCH_REQUIRE").unwrap_or_default();
    if required.split(',').any(|r| r.trim() == kernel.name()) {
        panic!(
            "KVBENCH_REQUIRE={required} names {} but this CPU does not run it: the test of that path cannot run",
            kernel.name()
        );
    }
    eprintln!(
        "skipped: this CPU does not run the {} kernels",
        kernel.name()
    );
    false
}

/// Runs `f` on a pool of one thread (kernels run on the calling pool) and returns its result with
/// the kernel families that ran meanwhile.
fn counting<R: Send>(f: impl FnOnce() -> R + Send) -> (R, [usize; 5]) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a pool of one thread");
    pool.install(super::ran::take);
    let r = pool.install(f);
    (r, pool.install(super::ran::take))
}

/// Asserts `kernel` ran (`counts` from [`counting`]).
fn assert_ran(counts: &[usize; 5], kernel: Kernel, what: &str) {
    assert!(
        counts[kernel as usize] > 0,
        "{what}: the {} kernels did not run (counts {counts:?})",
        kernel.name()
    );
}

/// `len` values uniform in [-1, 1) from `seed`.
pub(crate) fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// An `n × k` matrix quantized to `format` by candle, as the file's bytes.
pub(crate) fn quantized(format: BlockFormat, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let w = Tensor::from_vec(random(n * k, seed), (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&w, format.to_ggml()).unwrap();
    q.data().unwrap().into_owned()
}

/// candle's dequantization of the same bytes.
fn candle_dequantized(format: BlockFormat, bytes: &[u8], n: usize, k: usize) -> Vec<f32> {
    let storage = QStorage::from_data(
        std::borrow::Cow::Borrowed(bytes),
        &Device::Cpu,
        format.to_ggml(),
    )
    .unwrap();
    QTensor::new(storage, (n, k))
        .unwrap()
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Checks `y = x Wᵀ` against the f32 product of the dequantized weights: only activations are rounded,
/// each by at most half its block's scale.
pub(crate) fn assert_within_activation_rounding(
    w: &[f32],
    x: &[f32],
    y: &[f32],
    n: usize,
    k: usize,
    block: usize,
) {
    let m = x.len() / k;
    for r in 0..m {
        let xr = &x[r * k..(r + 1) * k];
        for j in 0..n {
            let wj = &w[j * k..(j + 1) * k];
            let exact: f64 = (0..k).map(|i| xr[i] as f64 * wj[i] as f64).sum();
            let bound: f64 = (0..k)
                .map(|i| {
                    let b = i / block * block;
                    let dx = xr[b..b + block].iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                    (wj[i].abs() * dx / 2.0) as f64
                })
                .sum();
            let got = y[r * n + j] as f64;
            assert!(
                (got - exact).abs() <= bound * 1.001 + 1e-4 * exact.abs().max(1.0),
                "row {r}, column {j}: {got} vs {exact} (bound {bound})"
            );
        }
    }
}

#[test]
fn every_format_dequantizes_exactly_as_candle_does() {
    for format in BlockFormat::ALL {
        let (n, k) = (3, 512);
        let bytes = quantized(format, n, k, 1);
        let ours = QMatrix::new(format, bytes.clone(), n, k)
            .unwrap()
            .dequantize();
        assert_eq!(ours, candle_dequantized(format, &bytes, n, k), "{format:?}");
    }
}

#[test]
fn every_format_multiplies_within_the_activation_rounding() {
    for format in BlockFormat::ALL {
        let (n, k) = (37, 512);
        let q = QMatrix::new(format, quantized(format, n, k, 2), n, k).unwrap();
        let w = q.dequantize();
        for m in [1, 3, 4, 9, 70] {
            let x = random(m * k, 3 + m as u64);
            for path in [Path::Portable, Path::best()] {
                let y = q.matmul_with(&x, m, path);
                assert_within_activation_rounding(&w, &x, &y, n, k, q.act_block());
            }
        }
    }
}

#[test]
fn simd_and_portable_paths_agree() {
    if !needs(Kernel::Avx2, has_avx2()) {
        return;
    }
    for format in BlockFormat::ALL {
        let (n, k) = (19, 768);
        let q = QMatrix::new(format, quantized(format, n, k, 4), n, k).unwrap();
        // 6 rows take the kernels that decode in registers, 40 the tiled ones.
        for m in [6, 40] {
            let x = random(m * k, 5);
            let (a, ran) = counting(|| q.matmul_with(&x, m, Path::Portable));
            assert_ran(&ran, Kernel::Portable, &format!("{format:?}, {m} rows"));
            let (b, ran) = counting(|| q.matmul_with(&x, m, Path::Avx2));
            assert_eq!(
                ran[Kernel::Portable as usize],
                0,
                "{format:?}: AVX2 fell back"
            );
            for (p, s) in a.iter().zip(&b) {
                assert!(
                    (p - s).abs() <= 1e-4 * p.abs().max(1.0),
                    "{format:?}, {m} rows: {p} vs {s}"
                );
            }
        }
    }
}

/// A row computed alone (registers kernels), in a small batch, and in a large one (tiled kernels) gives
/// the same bits.
#[test]
fn a_row_is_independent_of_its_batch() {
    for format in BlockFormat::ALL {
        let (n, k) = (33, 768);
        let q = QMatrix::new(format, quantized(format, n, k, 6), n, k).unwrap();
        // 71 rows: a tile of 64 and one of 7, so the register-blocked kernel also ends on a single row.
        let x = random(71 * k, 7);
        let all = q.matmul(&x, 71);
        let few = q.matmul(&x[..5 * k], 5);
        assert_eq!(&all[..5 * n], &few[..], "{format:?}: 5 rows against 71");
        for r in [0, 2, 65, 70] {
            let one = q.matmul(&x[r * k..(r + 1) * k], 1);
            assert_eq!(&all[r * n..(r + 1) * n], &one[..], "{format:?} row {r}");
        }
    }
}

/// The AVX-512 k-quant kernel gives the AVX2 kernels' bits: on whole matrices of each k-quant format
/// (70 columns: tasks of 32 in pairs of blocks, and a rest that goes block by block and one by one),
/// on stacked parts where a Q6_K block meets a Q4_K or Q5_K one (chunks summed differently: the pair
/// goes block by block), and for every number of rows in a call (16 to 19; 40, read in place on CPUs
/// with VNNI; 70, in two tiles), and from 8 rows, where the AVX-512 path goes tiled and the AVX2 path
/// decodes in registers. The 32-weight formats too: on CPUs with VNNI their tiles take four rows a call
/// (16 to 19 rows: calls of one to four) through `gemm::legacy_vnni`, two through AVX2's kernel.
#[test]
fn avx512_and_avx2_paths_give_the_same_bits() {
    if !needs(Kernel::Avx512, has_avx512()) {
        return;
    }
    let k = 512;
    // Every format: the 32-weight ones' tiles go through the VNNI kernel on CPUs that have it.
    let mut mats: Vec<(String, QMatrix)> = BlockFormat::ALL
        .into_iter()
        .map(|f| {
            let q = QMatrix::new(f, quantized(f, 70, k, 30), 70, k).unwrap();
            (format!("{f:?}"), q)
        })
        .collect();
    let parts = [
        (BlockFormat::Q4K, 12),
        (BlockFormat::Q6K, 8),
        (BlockFormat::Q5K, 6),
        (BlockFormat::Q4K, 10),
    ];
    mats.push((format!("{parts:?}"), stacked_parts(&parts, k, 31).1));
    let mut ran = [0usize; 5];
    for (name, q) in &mats {
        for m in [8, 11, 16, 17, 18, 19, 40, 70] {
            let x = random(m * k, 32 + m as u64);
            let (wide, r) = counting(|| q.matmul_with(&x, m, Path::Avx512));
            ran.iter_mut().zip(r).for_each(|(a, b)| *a += b);
            let narrow = q.matmul_with(&x, m, Path::Avx2);
            assert_eq!(wide, narrow, "{name}, {m} rows");
        }
    }
    assert_ran(
        &ran,
        Kernel::Avx512,
        "the k-quant matrices on the AVX-512 path",
    );
    if needs(Kernel::Vnni, has_vnni()) {
        assert_ran(&ran, Kernel::Vnni, "the AVX-512 path on a CPU with VNNI");
    }
}

/// Q4_K and Q5_K rows repacked at load, at one to five activation rows on the AVX-512 path: the
/// 256-bit VNNI kernel (`k45_vnni`, with GFNI where the CPU has it) runs and gives the AVX2 path's bits.
#[test]
fn vnni_and_gfni_kernels_run_and_give_the_avx2_bits() {
    if !needs(Kernel::Vnni, has_avx512() && has_vnni()) {
        return;
    }
    let gfni = needs(Kernel::Gfni, has_gfni());
    let k = 512;
    for format in [BlockFormat::Q4K, BlockFormat::Q5K] {
        let q = QMatrix::with_layout(format, quantized(format, 40, k, 50), 40, k, true).unwrap();
        for m in 1..=5 {
            let x = random(m * k, 51 + m as u64);
            let (wide, ran) = counting(|| q.matmul_with(&x, m, Path::Avx512));
            assert_ran(&ran, Kernel::Vnni, &format!("{format:?}, {m} rows"));
            if gfni {
                assert_ran(&ran, Kernel::Gfni, &format!("{format:?}, {m} rows"));
            }
            assert_eq!(
                wide,
                q.matmul_with(&x, m, Path::Avx2),
                "{format:?}, {m} rows"
            );
        }
    }
}

/// A random `n × k` matrix of `format` (n ≥ 36) from `seed`: its bytes, and the matrix in the file's
/// layout and repacked, after checking that repacking holds whole groups of four only (the last row
/// repacked only when `n` is a multiple of four), adds no byte and keeps the weights.
fn file_and_repacked(
    format: BlockFormat,
    n: usize,
    k: usize,
    seed: u64,
) -> (Vec<u8>, QMatrix, QMatrix) {
    let bytes = quantized(format, n, k, seed);
    let file = QMatrix::with_layout(format, bytes.clone(), n, k, false).unwrap();
    let packed = QMatrix::with_layout(format, bytes.clone(), n, k, true).unwrap();
    assert!(packed.is_packed(0) && packed.is_packed(35) && !file.is_packed(0));
    assert_eq!(
        packed.is_packed(n - 1),
        n.is_multiple_of(4),
        "{format:?}, {n} rows"
    );
    assert_eq!(
        packed.bytes(),
        file.bytes(),
        "{format:?}: repacking adds nothing"
    );
    assert_eq!(packed.dequantize(), file.dequantize(), "{format:?}");
    (bytes, file, packed)
}

/// k-quant rows repacked at load give the bits of the file's layout, on every path, for a batch of one
/// (read in place, AVX-512 in pairs of groups), of a few rows, past one call of rows, and of two tiles
/// (interleaved once per tile), with a last group of fewer than four rows left as in the file, and
/// with none (36 rows: the last group ends the matrix and is not followed by a pair on AVX-512).
#[test]
fn repacked_rows_give_the_bits_of_the_files_layout() {
    let k = 768;
    for (format, n) in [BlockFormat::Q4K, BlockFormat::Q5K, BlockFormat::Q6K]
        .into_iter()
        .flat_map(|f| [(f, 42), (f, 36)])
    {
        let (_, file, packed) = file_and_repacked(format, n, k, 40);
        for path in [Path::Portable, Path::Avx2, Path::Avx512] {
            for m in [1, 2, 3, 4, 5, 8, 33, 70] {
                let x = random(m * k, 41 + m as u64);
                let a = file.matmul_with(&x, m, path);
                let b = packed.matmul_with(&x, m, path);
                assert_eq!(a, b, "{format:?}, {n} × {k}, {path:?}, {m} rows");
            }
        }
    }
}

/// Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 rows repacked at load are read in place at every batch size
/// (`x86::legacy_packed`): the file's weights exactly (same bytes, same dequantization), each product
/// its exact integer sums put through the float steps block by block (a scalar model of them gives
/// the same bits), the same bits on the AVX-512 path, and results within the file layout's rounding; a
/// last group of fewer than four rows stays as in the file (42 rows), or there is none (36).
#[test]
fn repacked_32_weight_rows_are_read_in_place_at_every_batch() {
    if !needs(Kernel::Avx2, has_avx2()) {
        return;
    }
    let k = 768;
    let formats = [
        BlockFormat::Q4_0,
        BlockFormat::Q4_1,
        BlockFormat::Q5_0,
        BlockFormat::Q5_1,
        BlockFormat::Q8_0,
    ];
    for (format, n) in formats.into_iter().flat_map(|f| [(f, 42), (f, 36)]) {
        let (bytes, file, packed) = file_and_repacked(format, n, k, 60);
        let w = file.dequantize();
        for m in [1, 2, 3, 4, 5, 8, 33, 70] {
            let x = random(m * k, 61 + m as u64);
            let (got, ran) = counting(|| packed.matmul_with(&x, m, Path::Avx2));
            assert_ran(&ran, Kernel::Avx2, &format!("{format:?}, {m} rows"));
            assert_eq!(
                got,
                packed.matmul_with(&x, m, Path::Avx512),
                "{format:?}, {m} rows: the AVX-512 path"
            );
            let acts = acts::Acts::quantize(&x, m, k, 32);
            let row_bytes = format.row_bytes(k).unwrap();
            for r in 0..m {
                // The repacked columns; a last group of two goes through the file layout's kernels.
                for j in 0..n / 4 * 4 {
                    let row = &bytes[j * row_bytes..(j + 1) * row_bytes];
                    let want = if format == BlockFormat::Q8_0 {
                        q8_block_steps(row, &acts, r)
                    } else {
                        nibble_block_steps(format, row, &acts, r)
                    };
                    assert_eq!(
                        got[r * n + j].to_bits(),
                        want.to_bits(),
                        "{format:?}, {m} rows: row {r}, column {j} ({} vs {want})",
                        got[r * n + j]
                    );
                }
            }
            let old = file.matmul_with(&x, m, Path::Avx2);
            for (a, b) in old.iter().zip(&got) {
                assert!(
                    (a - b).abs() <= 1e-4 * a.abs().max(1.0),
                    "{format:?}: {a} vs {b}"
                );
            }
            assert_within_activation_rounding(&w, &x, &got, n, k, 32);
        }
    }
}

/// What `x86::legacy_packed` computes for one Q4_0, Q4_1, Q5_0 or Q5_1 row (the file's bytes) and
/// activation row `r`: per block, the exact sum `s = Σ q·xq` (q the stored value: nibble, and fifth
/// bit), then `total = fma(m, xs, fma(s·d, dx, total))` with the activations' scale `dx` and scaled sum
/// `xs`, `m` the block's minimum (Q4_1, Q5_1) or −8·d (Q4_0) or −16·d (Q5_0).
fn nibble_block_steps(format: BlockFormat, row: &[u8], x: &acts::Acts, r: usize) -> f32 {
    let (xq, xd, xs) = (x.row(r), x.scales(r), x.row_scaled(r));
    // Where the minimum and the fifth bits are, and the offset of formats without a minimum.
    let (min_at, fifth_at, offset) = match format {
        BlockFormat::Q4_0 => (None, None, -8.0),
        BlockFormat::Q4_1 => (Some(2), None, 0.0),
        BlockFormat::Q5_0 => (None, Some(2), -16.0),
        BlockFormat::Q5_1 => (Some(2), Some(4), 0.0),
        _ => unreachable!(),
    };
    let block = format.block_bytes();
    let mut total = 0f32;
    for (b, blk) in row.chunks_exact(block).enumerate() {
        let d = unpacked::f16_at(blk, 0);
        let m = min_at.map_or(offset * d, |at| unpacked::f16_at(blk, at));
        let high = fifth_at.map_or(0, |at| {
            u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]])
        });
        let nibbles = &blk[block - 16..];
        let mut s = 0i32;
        for (t, &byte) in nibbles.iter().enumerate() {
            let q = |nibble: u8, bit: usize| (nibble | (((high >> bit) & 1) << 4) as u8) as i32;
            let (lo, hi) = (xq[32 * b + t] as i32, xq[32 * b + t + 16] as i32);
            s += q(byte & 0x0F, t) * lo + q(byte >> 4, t + 16) * hi;
        }
        total = m.mul_add(xs[b], (s as f32 * d).mul_add(xd[b], total));
    }
    total
}

/// What `x86::legacy_packed` computes for one Q8_0 row (the file's bytes) and activation row `r`: per
/// block the exact sum `s = Σ q·xq` of the signed weights, then `total = fma(s·d, dx, total)`.
fn q8_block_steps(row: &[u8], x: &acts::Acts, r: usize) -> f32 {
    let (xq, xd) = (x.row(r), x.scales(r));
    let mut total = 0f32;
    for (b, blk) in row.chunks_exact(34).enumerate() {
        let d = unpacked::f16_at(blk, 0);
        let s: i32 = (0..32)
            .map(|t| blk[2 + t] as i8 as i32 * xq[32 * b + t] as i32)
            .sum();
        total = (s as f32 * d).mul_add(xd[b], total);
    }
    total
}

/// A product computed on a decoding team (two threads claiming runs of tasks, see
/// `parallel::for_each_range_init`) gives the bits of the same product on one thread, for every format,
/// repacked or not, at batch 1 (tasks of 128 columns, several runs) and at batches 8 and 32 (tasks of 32).
/// On a one-core machine no team forms and both sides run alone.
#[test]
fn a_product_on_a_team_gives_the_bits_of_one_thread() {
    let k = 256;
    let n = 600;
    let threads = |t: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .unwrap()
    };
    let (one, two) = (threads(1), threads(2));
    for format in BlockFormat::ALL {
        let bytes = quantized(format, n, k, 50);
        for repack in [false, true] {
            let q = QMatrix::with_layout(format, bytes.clone(), n, k, repack).unwrap();
            for m in [1, 8, 32] {
                let x = random(m * k, 51 + m as u64);
                let alone = one.install(|| q.matmul(&x, m));
                let teamed = two.install(|| crate::parallel::with_team(true, || q.matmul(&x, m)));
                assert_eq!(alone, teamed, "{format:?}, repacked {repack}, {m} rows");
            }
        }
    }
}

/// Random matrices of `parts` (format, rows) with `k` columns, seeded from `seed`, and their stack.
fn stacked_parts(parts: &[(BlockFormat, usize)], k: usize, seed: u64) -> (Vec<QMatrix>, QMatrix) {
    let mats: Vec<QMatrix> = parts
        .iter()
        .enumerate()
        .map(|(i, &(f, n))| QMatrix::new(f, quantized(f, n, k, seed + i as u64), n, k).unwrap())
        .collect();
    let stacked = QMatrix::stack(mats.clone()).unwrap();
    (mats, stacked)
}

#[test]
fn stacked_formats_equal_their_parts() {
    let k = 512;
    let parts = [
        (BlockFormat::Q4K, 10),
        (BlockFormat::Q6K, 7),
        (BlockFormat::Q5K, 5),
    ];
    let (mats, stacked) = stacked_parts(&parts, k, 10);
    assert_eq!(stacked.rows(), 22);
    let x = random(3 * k, 11);
    let y = stacked.matmul(&x, 3);
    let mut col = 0;
    for m in &mats {
        let w = m.dequantize();
        let mut part = vec![0f32; 3 * m.rows()];
        for r in 0..3 {
            part[r * m.rows()..(r + 1) * m.rows()]
                .copy_from_slice(&y[r * 22 + col..r * 22 + col + m.rows()]);
        }
        assert_within_activation_rounding(&w, &x, &part, m.rows(), k, 256);
        col += m.rows();
    }
}

#[test]
fn stacked_parts_of_different_kernels_are_independent_of_the_batch() {
    // Signed Q8_0 rows beside unsigned Q4_0 and Q4_1 rows: blocks of columns that straddle two kinds
    // go one by one, and every column still gives the bits it gives alone. k-quant parts of three
    // formats: blocks of four that straddle two go another way, alone and in a batch.
    let k = 256;
    let legacy = [
        (BlockFormat::Q8_0, 5),
        (BlockFormat::Q4_0, 6),
        (BlockFormat::Q4_1, 3),
    ];
    // Q4_1 and Q4_0 parts that start on a group of four are repacked (a last group of two as in the
    // file), a Q4_1 part after an odd start is not.
    let repacked = [
        (BlockFormat::Q4_1, 8),
        (BlockFormat::Q4_0, 6),
        (BlockFormat::Q8_0, 6),
        (BlockFormat::Q4_1, 5),
    ];
    let kquants = [
        (BlockFormat::Q4K, 6),
        (BlockFormat::Q6K, 7),
        (BlockFormat::Q5K, 9),
    ];
    for parts in [&legacy[..], &repacked[..], &kquants[..]] {
        let (_, stacked) = stacked_parts(parts, k, 20);
        let n = stacked.rows();
        let x = random(40 * k, 21);
        let all = stacked.matmul(&x, 40);
        for r in [0, 17, 39] {
            let one = stacked.matmul(&x[r * k..(r + 1) * k], 1);
            assert_eq!(&all[r * n..(r + 1) * n], &one[..], "{parts:?} row {r}");
        }
    }
}

#[test]
fn wrong_sizes_are_refused() {
    assert!(QMatrix::new(BlockFormat::Q4_1, vec![0; 20], 1, 64).is_err());
    assert!(QMatrix::new(BlockFormat::Q4_1, vec![0; 20], 1, 30).is_err());
    assert!(QMatrix::new(BlockFormat::Q4K, vec![0; 144], 1, 128).is_err());
    let a = QMatrix::new(BlockFormat::Q8_0, vec![0; 34], 1, 32).unwrap();
    let b = QMatrix::new(BlockFormat::Q8_0, vec![0; 68], 1, 64).unwrap();
    assert!(QMatrix::stack(vec![a, b]).is_err());
    let legacy = QMatrix::new(BlockFormat::Q8_0, vec![0; 34 * 8], 1, 256).unwrap();
    let kquant = QMatrix::new(BlockFormat::Q4K, vec![0; 144], 1, 256).unwrap();
    assert!(!legacy.stacks_with(&kquant));
    assert!(QMatrix::stack(vec![legacy, kquant]).is_err());
}

/// The public kernel entry checks that activations fit the matrix before any unchecked read:
/// another width, or activations quantized in another block, are an error naming both.
#[test]
fn mismatched_activations_are_an_error_not_a_read() {
    let (n, k) = (8, 512);
    let q4 = QMatrix::new(
        BlockFormat::Q4_0,
        quantized(BlockFormat::Q4_0, n, k, 70),
        n,
        k,
    )
    .unwrap();
    let narrow = acts::Acts::quantize(&random(256, 71), 1, 256, 32);
    let e = driver::run(&q4, &narrow, Path::best())
        .unwrap_err()
        .to_string();
    assert!(e.contains("256 values") && e.contains("512 columns"), "{e}");
    let wide_blocks = acts::Acts::quantize(&random(k, 72), 1, k, 256);
    let e = driver::run(&q4, &wide_blocks, Path::best())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("blocks of 256") && e.contains("blocks of 32"),
        "{e}"
    );
    let fits = acts::Acts::quantize(&random(2 * k, 73), 2, k, 32);
    assert_eq!(driver::run(&q4, &fits, Path::best()).unwrap().len(), 2 * n);
}

/// The modules of `src/kernels` and the ones each imports (`super::…`, `crate::kernels::…`), test
/// modules left out.
fn kernel_imports() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kernels");
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/kernels is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let name_of = |path: &std::path::Path| {
        let rel = path.strip_prefix(&root).expect("under src/kernels");
        let rel = rel.with_extension("");
        let name = rel.to_string_lossy().replace('\\', "/");
        match name.strip_suffix("/mod") {
            Some(dir) => dir.to_string(),
            None if name == "mod" => String::new(),
            None => name,
        }
    };
    let names: std::collections::BTreeSet<String> = files.iter().map(|f| name_of(f)).collect();
    let comment = regex::Regex::new(r"//.*").unwrap();
    let path = regex::Regex::new(r"(super|crate::kernels)::(\{[^}]*\}|[A-Za-z0-9_:]+)").unwrap();
    let mut graph = std::collections::BTreeMap::new();
    for file in &files {
        let me = name_of(file);
        let text = std::fs::read_to_string(file).expect("a kernel file is readable");
        let text = comment.replace_all(&text, "");
        // Test modules (at a file's end) may use anything.
        let text = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default();
        let parent = match me.rsplit_once('/') {
            Some((dir, _)) => dir.to_string(),
            None => String::new(),
        };
        let mut deps = std::collections::BTreeSet::new();
        for cap in path.captures_iter(text) {
            let base = if &cap[1] == "super" {
                parent.clone()
            } else {
                String::new()
            };
            for item in cap[2].trim_matches(|c| c == '{' || c == '}').split(',') {
                let mut parts = item.trim().split("::");
                let first = parts.next().unwrap_or_default();
                let mut target = if base.is_empty() {
                    first.to_string()
                } else {
                    format!("{base}/{first}")
                };
                if let Some(second) = parts.next() {
                    let deeper = format!("{target}/{second}");
                    if names.contains(&deeper) {
                        target = deeper;
                    }
                }
                if names.contains(&target) && target != me && !target.is_empty() {
                    deps.insert(target);
                }
            }
        }
        graph.insert(me, deps);
    }
    graph
}

#[test]
fn no_kernel_module_imports_one_that_imports_it_back() {
    let graph = kernel_imports();
    assert!(graph.len() > 20, "the kernel modules were found: {graph:?}");
    assert!(
        graph["x86/columns"].contains("x86/gemm"),
        "imports are read: {graph:?}"
    );
    // Depth-first search for a path back to where it started.
    fn back(
        graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        at: &str,
        trail: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = trail.iter().position(|t| t == at) {
            return Some(trail[i..].iter().cloned().chain([at.to_string()]).collect());
        }
        trail.push(at.to_string());
        for next in graph.get(at).into_iter().flatten() {
            if let Some(circle) = back(graph, next, trail) {
                return Some(circle);
            }
        }
        trail.pop();
        None
    }
    for start in graph.keys() {
        if let Some(circle) = back(&graph, start, &mut Vec::new()) {
            panic!("an import circle in src/kernels: {}", circle.join(" → "));
        }
    }
}
