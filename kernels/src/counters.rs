//! How often a device makes the host wait for its values, how often it asks the backing
//! allocator (`cudaMalloc`, the heap) for memory, and how often it is asked to zero a
//! tensor: a training step should wait once, after its first allocate nothing, and zero
//! only its gradients, in one op. Both backends count at the same points — every download is
//! a host sync, every buffer its cache could not supply an allocation, every
//! [`Device::fill_zero`](crate::Device::fill_zero) (so every `zeros_of`) and every
//! `fill_zero_tensors` a zero fill — so a test on the CPU says the same about the structure of
//! a CUDA step. A zero fill is a memset on CUDA, a pass over the tensor's bytes outside any
//! kernel: a layer whose op writes every element of its output takes it `empty_of`.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct Counters {
    host_syncs: AtomicU64,
    backing_allocations: AtomicU64,
    zero_fills: AtomicU64,
}

impl Counters {
    pub fn host_sync(&self) {
        self.host_syncs.fetch_add(1, Ordering::Relaxed);
    }

    pub fn backing_allocation(&self) {
        self.backing_allocations.fetch_add(1, Ordering::Relaxed);
    }

    pub fn zero_fill(&self) {
        self.zero_fills.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> DeviceCounters {
        DeviceCounters {
            host_syncs: self.host_syncs.load(Ordering::Relaxed),
            backing_allocations: self.backing_allocations.load(Ordering::Relaxed),
            zero_fills: self.zero_fills.load(Ordering::Relaxed),
        }
    }
}

/// A device's counts since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Downloads the host waited for.
    pub host_syncs: u64,
    /// Buffers taken from the backing allocator rather than the device's cache of freed ones.
    pub backing_allocations: u64,
    /// Tensors zeroed on request (a `fill_zero_tensors` counts once, as CUDA zeroes them in
    /// one launch).
    pub zero_fills: u64,
}

impl std::ops::Sub for DeviceCounters {
    type Output = DeviceCounters;
    fn sub(self, earlier: DeviceCounters) -> DeviceCounters {
        DeviceCounters {
            host_syncs: self.host_syncs - earlier.host_syncs,
            backing_allocations: self.backing_allocations - earlier.backing_allocations,
            zero_fills: self.zero_fills - earlier.zero_fills,
        }
    }
}
