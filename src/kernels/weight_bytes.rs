//! Memory for weight matrices: the bytes every decoding step streams once, held in 2 MiB pages where
//! the OS lends them.
//!
//! Why it exists: decoding one token reads every weight matrix once (a gigabyte for
//! Qwen2.5-Coder-1.5B), and at batch 1 that stream is the step's time. In 4 KiB pages the stream
//! crosses a page every 4 KiB: a TLB miss each time, and a stop for the hardware prefetchers, which
//! do not follow data across pages. Linux gives anonymous memory 2 MiB pages only where asked
//! (`transparent_hugepage` = `madvise`, a common default), and only under whole aligned 2 MiB
//! stretches, which a tensor of 1.3 MiB (Qwen's query projection) never has on its own. So tensors
//! are carved out of shared slabs of `SLAB` bytes (each tensor 64-byte aligned), mapped and advised
//! before any page is touched; a tensor larger than a slab gets one of its own. Slabs gave batch-1
//! decoding what huge pages for the whole process gave, and load faster (the pages are zeroed once,
//! by the kernel); measured in docs/kernels.md.
//!
//! Elsewhere (other systems, or a refusal) the buffer is an ordinary zeroed allocation.

use std::ptr::NonNull;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
use std::sync::{Arc, Mutex, Weak};

/// A huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// Bytes per shared slab: a few of Qwen2.5-1.5B's layers; what a process leaves unused of its last
/// slab is address space only, never touched.
const SLAB: usize = 64 << 20;

/// Alignment of every tensor in a slab: a cache line.
const ALIGN: usize = 64;

/// A weight tensor's bytes: zeroed when made, writable while loading, read by the kernels.
pub struct WeightBytes {
    ptr: NonNull<u8>,
    len: usize,
    /// What keeps `ptr .. ptr + len` alive; never read.
    _owner: Owner,
}

enum Owner {
    Vec(#[allow(dead_code)] Vec<u8>),
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    Slab(#[allow(dead_code)] Arc<Slab>),
}

// SAFETY: a `WeightBytes` owns its range alone (slabs hand out disjoint ranges), like a `Box<[u8]>`.
unsafe impl Send for WeightBytes {}
// SAFETY: shared access is only reading.
unsafe impl Sync for WeightBytes {}

impl WeightBytes {
    /// `len` zero bytes, in huge pages where the OS lends them.
    pub fn zeroed(len: usize) -> Self {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if let Some(b) = Slab::carve(len) {
            return b;
        }
        vec![0u8; len].into()
    }
}

impl From<Vec<u8>> for WeightBytes {
    fn from(mut v: Vec<u8>) -> Self {
        let ptr = NonNull::new(v.as_mut_ptr()).expect("a Vec's pointer is never null");
        Self {
            ptr,
            len: v.len(),
            _owner: Owner::Vec(v),
        }
    }
}

impl std::ops::Deref for WeightBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr .. ptr + len` is initialised memory kept alive by `_owner`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for WeightBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`; the range is this value's alone and it is uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for WeightBytes {
    fn clone(&self) -> Self {
        let mut copy = Self::zeroed(self.len);
        copy.copy_from_slice(self);
        copy
    }
}

impl std::fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WeightBytes({} bytes)", self.len)
    }
}

/// An anonymous mapping of whole huge pages, advised for them, unmapped when its last tensor goes.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
struct Slab {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is only ever accessed through the disjoint `WeightBytes` carved from it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe impl Send for Slab {}
#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe impl Sync for Slab {}

/// The slab tensors are being carved from and how much of it is taken; a weak reference, so that a
/// slab whose tensors are all gone is unmapped rather than kept for the next model.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
static CURRENT: Mutex<(Weak<Slab>, usize)> = Mutex::new((Weak::new(), 0));

#[cfg(all(target_os = "linux", target_env = "gnu"))]
impl Slab {
    /// `len` zero bytes from the current slab, a new shared one, or (past [`SLAB`]) one of their
    /// own; `None` when the OS refuses a mapping.
    fn carve(len: usize) -> Option<WeightBytes> {
        if len == 0 || len > SLAB {
            let slab = Arc::new(Slab::map(len.max(1))?);
            return Some(WeightBytes {
                ptr: slab.base,
                len,
                _owner: Owner::Slab(slab),
            });
        }
        let mut current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
        let (slab, at) = match current.0.upgrade() {
            Some(slab) if current.1 + len <= slab.len => (slab, current.1),
            _ => (Arc::new(Slab::map(SLAB)?), 0),
        };
        *current = (Arc::downgrade(&slab), (at + len).next_multiple_of(ALIGN));
        // SAFETY: `at + len <= slab.len`, so the pointer stays inside the mapping.
        let ptr = unsafe { NonNull::new_unchecked(slab.base.as_ptr().add(at)) };
        Some(WeightBytes {
            ptr,
            len,
            _owner: Owner::Slab(slab),
        })
    }

    /// A zeroed private mapping of at least `len` bytes, 2 MiB-aligned and advised for huge pages
    /// before any page is touched.
    fn map(len: usize) -> Option<Slab> {
        let len = len.next_multiple_of(HUGE_PAGE);
        let span = len + HUGE_PAGE;
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let base = start.next_multiple_of(HUGE_PAGE);
        // SAFETY: the unaligned head and the tail past `base + len` belong to this fresh mapping and
        // nothing points into them; `madvise` only changes how the pages are backed.
        unsafe {
            if base > start {
                libc::munmap(raw, base - start);
            }
            let end = base + len;
            if start + span > end {
                libc::munmap(end as *mut libc::c_void, start + span - end);
            }
            libc::madvise(base as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        Some(Slab {
            base: NonNull::new(base as *mut u8)?,
            len,
        })
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `map` and its last user is gone.
        unsafe {
            libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers of every size are zero, aligned, disjoint, and keep what was written to them while
    /// others are made and dropped.
    #[test]
    fn buffers_are_zeroed_aligned_and_disjoint() {
        let sizes = [0, 1, 100, 4096, 3 * HUGE_PAGE + 17, SLAB - 5, SLAB + 1, 777];
        let mut kept = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let mut b = WeightBytes::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&v| v == 0), "{len} bytes are zero");
            if len > 0 {
                assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            }
            b.fill(i as u8 + 1);
            let dropped = WeightBytes::zeroed(1000);
            drop(dropped);
            kept.push(b);
        }
        for (i, b) in kept.iter().enumerate() {
            assert!(
                b.iter().all(|&v| v == i as u8 + 1),
                "buffer {i} kept its bytes"
            );
        }
        let copy = kept[3].clone();
        assert_eq!(&copy[..], &kept[3][..]);
        let from_vec: WeightBytes = vec![7u8; 10].into();
        assert_eq!(&from_vec[..], &[7u8; 10]);
    }
}
