//! [`AlignedBuf`]: heap memory with the alignment `O_DIRECT` demands.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::{Error, Result};

/// An owned, zero-initialised byte buffer whose address is a multiple of a chosen
/// power-of-two alignment, as direct I/O requires.
///
/// The writer's queued API takes these by value and hands them back in the
/// [`Completion`](crate::Completion), so the kernel never sees memory the caller could
/// free or touch while a request is in flight.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
    /// Set for a buffer of a writer's registered pool: dropping it returns the memory
    /// to the pool instead of freeing it (the kernel has it registered).
    pooled: Option<(Arc<PoolInner>, u16)>,
}

// SAFETY: AlignedBuf uniquely owns its allocation (like Box<[u8]>); no interior
// mutability, so moving it to another thread or sharing `&AlignedBuf` is sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above; `&AlignedBuf` only allows reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` bytes aligned to `align` (a power of two), filled with zeros.
    /// Memory is always initialised, so this is the same as [`AlignedBuf::zeroed`].
    pub fn new(len: usize, align: usize) -> Result<Self> {
        Self::zeroed(len, align)
    }

    /// Allocates `len` zeroed bytes aligned to `align` (a power of two).
    pub fn zeroed(len: usize, align: usize) -> Result<Self> {
        let invalid = || Error::InvalidBuffer { len, align };
        if len == 0 {
            return Err(invalid());
        }
        let layout = Layout::from_size_align(len, align).map_err(|_| invalid())?;
        // SAFETY: the layout has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Ok(Self {
            ptr,
            layout,
            pooled: None,
        })
    }

    /// Allocates a buffer aligned to `align` holding a copy of `data`.
    pub fn from_slice(data: &[u8], align: usize) -> Result<Self> {
        let mut b = Self::zeroed(data.len(), align)?;
        b.as_mut_slice().copy_from_slice(data);
        Ok(b)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Always false: zero-length buffers cannot be allocated.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The alignment this buffer was allocated with.
    pub fn align(&self) -> usize {
        self.layout.align()
    }

    /// Whether this buffer belongs to a writer's registered (fixed) buffers, lent by
    /// [`DirectWriter::registered_buffer`](crate::DirectWriter::registered_buffer).
    pub fn is_registered(&self) -> bool {
        self.pooled.is_some()
    }

    /// Start address.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Start address, writable.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of layout.size() initialised bytes owned by
        // self; the shared borrow of self prevents concurrent mutation.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; the unique borrow of self makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some((pool, index)) = self.pooled.take() {
            pool.give_back(self.ptr, index);
            return;
        }
        // SAFETY: ptr was returned by alloc_zeroed with exactly this layout and is
        // freed only here, once (pooled buffers return above and are freed by the pool).
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Memory registered with an io_uring (`IORING_REGISTER_BUFFERS`): `count` buffers of
/// one layout, lent out as [`AlignedBuf`]s that come back here when dropped. The
/// memory is freed only when the pool and every lent buffer are gone, which is after
/// the ring that registered it (the ring holds the pool), so the kernel never keeps a
/// registration of freed memory.
pub(crate) struct PoolInner {
    layout: Layout,
    all: Vec<NonNull<u8>>,
    free: Mutex<Vec<(NonNull<u8>, u16)>>,
}

// SAFETY: the pointers are allocations owned by the pool; they are handed out only as
// AlignedBufs (unique ownership) and taken back through the mutex.
unsafe impl Send for PoolInner {}
// SAFETY: as above; all shared mutation goes through the mutex.
unsafe impl Sync for PoolInner {}

impl PoolInner {
    fn give_back(&self, ptr: NonNull<u8>, index: u16) {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((ptr, index));
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        for ptr in &self.all {
            // SAFETY: each pointer came from alloc_zeroed with self.layout; every lent
            // AlignedBuf held an Arc to this pool, so none is alive now.
            unsafe { alloc::dealloc(ptr.as_ptr(), self.layout) }
        }
    }
}

/// A handle on a registered pool.
#[derive(Clone)]
pub(crate) struct BufPool(Arc<PoolInner>);

impl fmt::Debug for BufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPool")
            .field("count", &self.0.all.len())
            .field("len", &self.0.layout.size())
            .finish()
    }
}

impl BufPool {
    /// Allocates `count` (at most `u16::MAX`) zeroed buffers of `len` bytes aligned to
    /// `align`.
    pub(crate) fn new(count: usize, len: usize, align: usize) -> Result<Self> {
        let invalid = || Error::InvalidBuffer { len, align };
        if len == 0 || count == 0 || count > usize::from(u16::MAX) {
            return Err(invalid());
        }
        let layout = Layout::from_size_align(len, align).map_err(|_| invalid())?;
        let mut all = Vec::with_capacity(count);
        for _ in 0..count {
            // SAFETY: the layout has a non-zero size (checked above).
            let raw = unsafe { alloc::alloc_zeroed(layout) };
            let Some(ptr) = NonNull::new(raw) else {
                alloc::handle_alloc_error(layout)
            };
            all.push(ptr);
        }
        // Lend the lowest indices first.
        let free = all
            .iter()
            .enumerate()
            .rev()
            .map(|(i, p)| (*p, i as u16))
            .collect();
        Ok(Self(Arc::new(PoolInner {
            layout,
            all,
            free: Mutex::new(free),
        })))
    }

    /// The `iovec`s to register, in index order. They stay valid as long as this pool
    /// (or a buffer lent from it) lives.
    pub(crate) fn iovecs(&self) -> Vec<libc::iovec> {
        self.0
            .all
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.as_ptr().cast(),
                iov_len: self.0.layout.size(),
            })
            .collect()
    }

    /// Lends a free buffer, if any.
    pub(crate) fn take(&self) -> Option<AlignedBuf> {
        let (ptr, index) = self
            .0
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()?;
        Some(AlignedBuf {
            ptr,
            layout: self.0.layout,
            pooled: Some((Arc::clone(&self.0), index)),
        })
    }

    /// The registered index of `buf` if it was lent from this pool.
    pub(crate) fn index_of(&self, buf: &AlignedBuf) -> Option<u16> {
        match &buf.pooled {
            Some((pool, index)) if Arc::ptr_eq(pool, &self.0) => Some(*index),
            _ => None,
        }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        // The layout was valid when self was allocated, so this cannot fail.
        match Self::from_slice(self.as_slice(), self.align()) {
            Ok(b) => b,
            Err(_) => unreachable!("layout of an existing AlignedBuf is valid"),
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for AlignedBuf {}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("addr", &self.ptr)
            .field("len", &self.len())
            .field("align", &self.align())
            .field("registered", &self.pooled.as_ref().map(|(_, i)| *i))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_zeroed_and_sized() {
        for align in [512usize, 4096, 65536] {
            let mut b = AlignedBuf::zeroed(3 * align, align).expect("alloc");
            assert_eq!(b.as_ptr() as usize % align, 0);
            assert_eq!(b.len(), 3 * align);
            assert!(b.iter().all(|&x| x == 0));
            b.as_mut_slice()[align] = 7;
            let c = b.clone();
            assert_eq!(c[align], 7);
            assert_eq!(c.as_ptr() as usize % align, 0);
            assert_ne!(c.as_ptr(), b.as_ptr());
        }
    }

    #[test]
    fn invalid_requests_are_refused() {
        assert!(matches!(
            AlignedBuf::new(0, 512),
            Err(Error::InvalidBuffer { .. })
        ));
        assert!(matches!(
            AlignedBuf::new(512, 3),
            Err(Error::InvalidBuffer { .. })
        ));
        assert!(matches!(
            AlignedBuf::new(usize::MAX - 10, 4096),
            Err(Error::InvalidBuffer { .. })
        ));
    }
}
