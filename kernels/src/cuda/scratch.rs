//! Short-lived device buffers inside one op (head-split copies, partial sums, uploaded
//! token ids, bf16 operands), counted in the ledger as workspace for exactly their life.

use crate::memory::{Category, MemoryLedger};
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

pub(super) struct Scratch<T> {
    slice: CudaSlice<T>,
    bytes: usize,
    ledger: Arc<MemoryLedger>,
}

impl<T: DeviceRepr> Scratch<T> {
    /// `len` elements, uninitialised: every caller writes all of them before reading.
    /// (CUDA rejects an empty allocation, so an empty buffer holds one unused element.)
    pub fn uninit(stream: &Arc<CudaStream>, ledger: &Arc<MemoryLedger>, len: usize) -> Self {
        // SAFETY: the memory is only read after a kernel or copy has written it.
        let slice = unsafe { stream.alloc::<T>(len.max(1)) }
            .unwrap_or_else(|e| panic!("cuda: cannot allocate {len} scratch elements: {e:?}"));
        Self::counted(slice, len, ledger)
    }

    /// A copy of host data (non-empty).
    pub fn from_host(stream: &Arc<CudaStream>, ledger: &Arc<MemoryLedger>, data: &[T]) -> Self {
        assert!(!data.is_empty(), "cuda: uploading an empty buffer");
        let slice = stream
            .clone_htod(data)
            .unwrap_or_else(|e| panic!("cuda: cannot upload {} scratch elements: {e:?}", data.len()));
        Self::counted(slice, data.len(), ledger)
    }

    fn counted(slice: CudaSlice<T>, len: usize, ledger: &Arc<MemoryLedger>) -> Self {
        let bytes = len * std::mem::size_of::<T>();
        ledger.allocated(Category::Workspace, bytes);
        Scratch { slice, bytes, ledger: ledger.clone() }
    }
}

impl<T> Drop for Scratch<T> {
    fn drop(&mut self) {
        self.ledger.freed(Category::Workspace, self.bytes);
    }
}

impl<T> Deref for Scratch<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}
