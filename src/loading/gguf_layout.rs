//! Where a GGUF file's tensors lie, checked before a byte of them is read.
//!
//! candle's reader parses the header with bounds on every count and length, but leaves two things to
//! its callers: the data alignment (`general.alignment`; candle 0.11 divides by it, so a 0 there is
//! a panic, not an error) and whether each tensor's bytes lie inside the file (an offset near 2^64
//! wraps around to the header). This module checks both the way llama.cpp's own reader does: the
//! alignment a power of two, every tensor's offset a multiple of it, its rows whole blocks, and its
//! last byte inside the file, all in checked arithmetic.

use candle_core::quantized::gguf_file::TensorInfo;
use std::io::{BufReader, Read, Seek, SeekFrom};

/// GGUF's alignment when the file does not set `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Arrays nested deeper than this are left to candle's reader, which refuses them (its limit is 64).
const MAX_DEPTH: usize = 64;

/// The alignment a GGUF header declares, read before candle's reader sees the file.
///
/// `Ok(None)`: no valid `general.alignment` found, or the header is malformed in a way candle's
/// reader reports itself (bad version, lengths past the end). `Err`: the alignment is set but is not
/// a power of two, which no reader can use.
pub fn declared_alignment<R: Read + Seek>(r: &mut BufReader<R>) -> Result<Option<u64>, String> {
    let file_len = r.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
    r.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let mut walk = Walk { r, file_len, at: 0 };
    let Some(found) = walk.find_alignment() else {
        return Ok(None);
    };
    match u64::try_from(found) {
        Ok(a) if a.is_power_of_two() => Ok(Some(a)),
        _ => Err(format!(
            "general.alignment is {found}; it must be a power of two"
        )),
    }
}

/// Bytes of a value of GGUF type `t` when the type has a fixed size (numbers and booleans).
fn fixed_size(t: u32) -> Option<u64> {
    match t {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// A bounded walk over the metadata, looking for `general.alignment`. It keeps its own position and
/// skips inside the buffer: a tokenizer's 150,000 strings cost no system call each.
struct Walk<'a, R> {
    r: &'a mut BufReader<R>,
    file_len: u64,
    at: u64,
}

impl<R: Read + Seek> Walk<'_, R> {
    fn find_alignment(&mut self) -> Option<i64> {
        let _magic = self.bytes::<4>()?;
        let version = self.u32()?;
        let wide = match version {
            1 => false,
            2 | 3 => true,
            _ => return None,
        };
        let _tensors = self.len(wide)?;
        let entries = self.len(wide)?;
        for _ in 0..entries {
            let key_len = self.len(wide)?;
            if key_len > self.remaining()? {
                return None;
            }
            let mut key = vec![0u8; usize::try_from(key_len).ok()?];
            self.r.read_exact(&mut key).ok()?;
            self.at += key_len;
            let value_type = self.u32()?;
            if key == b"general.alignment" {
                // candle reads the integer types up to 32 bits; others fall back to the default.
                return match value_type {
                    0 => Some(i64::from(self.bytes::<1>()?[0])),
                    1 => Some(i64::from(i8::from_le_bytes(self.bytes::<1>()?))),
                    2 => Some(i64::from(u16::from_le_bytes(self.bytes::<2>()?))),
                    3 => Some(i64::from(i16::from_le_bytes(self.bytes::<2>()?))),
                    4 => Some(i64::from(self.u32()?)),
                    5 => Some(i64::from(i32::from_le_bytes(self.bytes::<4>()?))),
                    _ => None,
                };
            }
            self.skip_value(value_type, wide, 0)?;
        }
        None
    }

    /// Skips one value of `value_type`; `None` on anything candle's reader will refuse itself.
    fn skip_value(&mut self, value_type: u32, wide: bool, depth: usize) -> Option<()> {
        if let Some(size) = fixed_size(value_type) {
            return self.skip(size);
        }
        match value_type {
            8 => {
                let n = self.len(wide)?;
                self.skip(n)
            }
            9 if depth < MAX_DEPTH => {
                let elem = self.u32()?;
                let n = self.len(wide)?;
                if let Some(one) = fixed_size(elem) {
                    return self.skip(n.checked_mul(one)?);
                }
                // Strings or arrays: each takes at least a length or a type, so the count is
                // bounded by the file.
                if !matches!(elem, 8 | 9) || n > self.remaining()? {
                    return None;
                }
                for _ in 0..n {
                    self.skip_value(elem, wide, depth + 1)?;
                }
                Some(())
            }
            _ => None,
        }
    }

    fn remaining(&mut self) -> Option<u64> {
        self.file_len.checked_sub(self.at)
    }

    fn skip(&mut self, n: u64) -> Option<()> {
        if n > self.remaining()? {
            return None;
        }
        self.r.seek_relative(i64::try_from(n).ok()?).ok()?;
        self.at += n;
        Some(())
    }

    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).ok()?;
        self.at += N as u64;
        Some(b)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes::<4>()?))
    }

    /// A count or length: 32 bits in GGUF version 1, 64 after.
    fn len(&mut self, wide: bool) -> Option<u64> {
        if wide {
            Some(u64::from_le_bytes(self.bytes::<8>()?))
        } else {
            self.u32().map(u64::from)
        }
    }
}

/// The byte range `[start, start + len)` of a tensor in the file, or why it cannot be used: its
/// offset not a multiple of `alignment`, its rows not whole blocks of its type, its size or end
/// past 2^64, or its end past `file_len`.
pub fn tensor_extent(
    name: &str,
    info: &TensorInfo,
    data_offset: u64,
    alignment: u64,
    file_len: u64,
) -> Result<(u64, usize), String> {
    if !info.offset.is_multiple_of(alignment) {
        return Err(format!(
            "tensor '{name}' starts at offset {} of the data, not a multiple of the alignment {alignment}",
            info.offset
        ));
    }
    let dims = info.shape.dims();
    let block = info.ggml_dtype.block_size();
    // candle's `[rows, cols]`: the last dimension is GGUF's first, the one blocks run along.
    let row = dims.last().copied().unwrap_or(1);
    if !row.is_multiple_of(block) {
        return Err(format!(
            "tensor '{name}' has rows of {row} values, not whole blocks of {block} ({:?})",
            info.ggml_dtype
        ));
    }
    let too_big = || format!("tensor '{name}' of shape {dims:?} is larger than any file");
    let elems = dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(too_big)?;
    let len = (elems / block)
        .checked_mul(info.ggml_dtype.type_size())
        .ok_or_else(too_big)?;
    let inside = |start: &u64| {
        start
            .checked_add(len as u64)
            .is_some_and(|end| end <= file_len)
    };
    let Some(start) = data_offset.checked_add(info.offset).filter(inside) else {
        return Err(format!(
            "truncated: tensor '{name}' ({len} bytes at offset {} of the data, which starts at byte {data_offset}) ends past the file's {file_len} bytes",
            info.offset
        ));
    };
    Ok((start, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;
    use std::io::Cursor;

    /// A version-3 header with the given metadata entries (key, type, value bytes) and no tensors.
    fn header(entries: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend((entries.len() as u64).to_le_bytes());
        for (k, t, v) in entries {
            b.extend((k.len() as u64).to_le_bytes());
            b.extend(k.as_bytes());
            b.extend(t.to_le_bytes());
            b.extend(v);
        }
        b
    }

    fn string(s: &str) -> Vec<u8> {
        let mut v = (s.len() as u64).to_le_bytes().to_vec();
        v.extend(s.as_bytes());
        v
    }

    #[test]
    fn the_alignment_is_found_after_strings_and_arrays() {
        let mut strings = 8u32.to_le_bytes().to_vec();
        strings.extend(2u64.to_le_bytes());
        strings.extend(string("a"));
        strings.extend(string("bc"));
        let mut ints = 4u32.to_le_bytes().to_vec();
        ints.extend(3u64.to_le_bytes());
        ints.extend([0u8; 12]);
        let bytes = header(&[
            ("general.name", 8, string("x")),
            ("tokens", 9, strings),
            ("types", 9, ints),
            ("general.alignment", 4, 64u32.to_le_bytes().to_vec()),
        ]);
        assert_eq!(
            declared_alignment(&mut BufReader::new(Cursor::new(bytes))),
            Ok(Some(64))
        );
        let none = header(&[("general.name", 8, string("x"))]);
        assert_eq!(
            declared_alignment(&mut BufReader::new(Cursor::new(none))),
            Ok(None)
        );
    }

    #[test]
    fn an_alignment_of_zero_or_not_a_power_of_two_is_refused() {
        for (t, v, shown) in [
            (4u32, 0u32.to_le_bytes().to_vec(), "0"),
            (4, 48u32.to_le_bytes().to_vec(), "48"),
            (0, vec![0u8], "0"),
            (5, 0i32.to_le_bytes().to_vec(), "0"),
            (3, (-4i16).to_le_bytes().to_vec(), "-4"),
        ] {
            let bytes = header(&[("general.alignment", t, v)]);
            let e = declared_alignment(&mut BufReader::new(Cursor::new(bytes))).unwrap_err();
            assert!(e.contains(&format!("general.alignment is {shown};")), "{e}");
        }
    }

    #[test]
    fn a_malformed_header_is_left_to_candles_reader() {
        // A string running past the end, and a version candle does not read: no answer, no panic.
        let mut long = header(&[("general.name", 8, string("x"))]);
        let at = long.len() - 9;
        long[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            declared_alignment(&mut BufReader::new(Cursor::new(long))),
            Ok(None)
        );
        let mut v9 = header(&[("general.alignment", 4, 0u32.to_le_bytes().to_vec())]);
        v9[4] = 9;
        assert_eq!(
            declared_alignment(&mut BufReader::new(Cursor::new(v9))),
            Ok(None)
        );
    }

    fn info(dims: &[usize], dtype: GgmlDType, offset: u64) -> TensorInfo {
        TensorInfo {
            ggml_dtype: dtype,
            shape: candle_core::Shape::from(dims.to_vec()),
            offset,
        }
    }

    #[test]
    fn extents_are_checked_in_checked_arithmetic() {
        let q = GgmlDType::Q4_0; // 32 values in 18 bytes
        let ok = tensor_extent("t", &info(&[2, 64], q, 32), 1000, 32, 2000);
        assert_eq!(ok, Ok((1032, 72)));
        // An offset near 2^64 wraps to the header in unchecked arithmetic.
        let e = tensor_extent("t", &info(&[2, 64], q, u64::MAX - 31), 1000, 32, 2000).unwrap_err();
        assert!(
            e.contains("truncated") && e.contains("past the file's 2000 bytes"),
            "{e}"
        );
        // Dimensions whose product overflows.
        let e = tensor_extent("t", &info(&[1 << 40, 1 << 30], q, 0), 1000, 32, 2000).unwrap_err();
        assert!(e.contains("larger than any file"), "{e}");
        let e = tensor_extent("t", &info(&[2, 64], q, 33), 1000, 32, 2000).unwrap_err();
        assert!(e.contains("not a multiple of the alignment 32"), "{e}");
        let e = tensor_extent("t", &info(&[2, 48], q, 0), 1000, 32, 2000).unwrap_err();
        assert!(e.contains("not whole blocks of 32"), "{e}");
        let e = tensor_extent("t", &info(&[2, 64], q, 960), 1000, 32, 2000).unwrap_err();
        assert!(e.contains("truncated") && e.contains("offset 960"), "{e}");
    }
}
