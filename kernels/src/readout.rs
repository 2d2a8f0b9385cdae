//! The values a training step computes for the host — each microbatch's mean loss, each
//! parameter gradient's sum of squares — kept on the device as they are made, in f64, and
//! read back together once per step ([`Device::read`](crate::Device::read)): one host
//! synchronisation where there would be one per microbatch and one per parameter.

use crate::memory::{Category, MemoryLedger};
use std::sync::Arc;

/// Where a readout's values live.
pub enum ReadoutStorage {
    Cpu(Vec<f64>),
    #[cfg(feature = "cuda")]
    Cuda(cudarc::driver::CudaSlice<f64>),
}

/// A device buffer of f64 slots, counted in its device's ledger as workspace.
pub struct Readout {
    len: usize,
    storage: ReadoutStorage,
    ledger: Arc<MemoryLedger>,
}

impl Readout {
    /// Wraps `len` slots a device allocated.
    pub fn new(len: usize, storage: ReadoutStorage, ledger: Arc<MemoryLedger>) -> Readout {
        ledger.allocated(Category::Workspace, len * std::mem::size_of::<f64>());
        Readout { len, storage, ledger }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn storage(&self) -> &ReadoutStorage {
        &self.storage
    }

    pub fn storage_mut(&mut self) -> &mut ReadoutStorage {
        &mut self.storage
    }
}

impl Drop for Readout {
    fn drop(&mut self) {
        self.ledger.freed(Category::Workspace, self.len * std::mem::size_of::<f64>());
    }
}
