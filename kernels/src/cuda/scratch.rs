//! Short-lived device buffers inside one op (head-split copies, partial sums, uploaded
//! token ids, bf16 operands), counted in the ledger as workspace for exactly their life and
//! then given back to the device's arena.

use super::arena::Arena;
use crate::memory::{Category, MemoryLedger};
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

pub(super) struct Scratch<T: DeviceRepr + Send + 'static> {
    /// Always Some until the drop hands it back.
    slice: Option<CudaSlice<T>>,
    bytes: usize,
    ledger: Arc<MemoryLedger>,
    arena: Arc<Arena>,
}

impl<T: DeviceRepr + Send + 'static> Scratch<T> {
    /// `len` elements, uninitialised: every caller writes all of them before reading.
    pub fn uninit(
        stream: &Arc<CudaStream>,
        arena: &Arc<Arena>,
        ledger: &Arc<MemoryLedger>,
        len: usize,
    ) -> Self {
        let slice = arena.take::<T>(stream, len);
        let bytes = len * std::mem::size_of::<T>();
        ledger.allocated(Category::Workspace, bytes);
        Scratch { slice: Some(slice), bytes, ledger: ledger.clone(), arena: arena.clone() }
    }

    /// A copy of host data (non-empty).
    pub fn from_host(
        stream: &Arc<CudaStream>,
        arena: &Arc<Arena>,
        ledger: &Arc<MemoryLedger>,
        data: &[T],
    ) -> Self {
        assert!(!data.is_empty(), "cuda: uploading an empty buffer");
        let mut s = Self::uninit(stream, arena, ledger, data.len());
        stream
            .memcpy_htod(data, &mut *s)
            .unwrap_or_else(|e| panic!("cuda: cannot upload {} scratch elements: {e:?}", data.len()));
        s
    }
}

impl<T: DeviceRepr + Send + 'static> Drop for Scratch<T> {
    fn drop(&mut self) {
        self.ledger.freed(Category::Workspace, self.bytes);
        if let Some(slice) = self.slice.take() {
            self.arena.put(slice);
        }
    }
}

impl<T: DeviceRepr + Send + 'static> Deref for Scratch<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        self.slice.as_ref().expect("held until drop")
    }
}

impl<T: DeviceRepr + Send + 'static> DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        self.slice.as_mut().expect("held until drop")
    }
}
