//! A buffer that parallel tasks write at disjoint but interleaved places (one attention
//! head's columns of [B,T,C], one column range of every embedding row), which safe slices
//! cannot split.

use std::marker::PhantomData;

#[derive(Clone, Copy)]
pub struct DisjointMut<'a> {
    ptr: *mut f32,
    len: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: the wrapper only hands out access through the unsafe methods below, whose callers
// promise that concurrent tasks touch disjoint elements.
unsafe impl Send for DisjointMut<'_> {}
unsafe impl Sync for DisjointMut<'_> {}

impl<'a> DisjointMut<'a> {
    pub fn new(data: &'a mut [f32]) -> Self {
        DisjointMut { ptr: data.as_mut_ptr(), len: data.len(), _borrow: PhantomData }
    }

    /// Elements `start..start + len`.
    ///
    /// # Safety
    /// No other live reference, in this task or another, may overlap the range.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &'a mut [f32] {
        assert!(start + len <= self.len, "range {start}+{len} outside {}", self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }

    /// A raw pointer to element `offset`, for strided writes (gemm's destination).
    ///
    /// # Safety
    /// The caller writes only elements no other task touches concurrently, all in bounds.
    pub unsafe fn ptr_at(&self, offset: usize) -> *mut f32 {
        assert!(offset < self.len, "offset {offset} outside {}", self.len);
        self.ptr.add(offset)
    }
}
