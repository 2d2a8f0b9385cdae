//! How often a device makes the host wait for its values, and how often it asks the backing
//! allocator (`cudaMalloc`, the heap) for memory: a training step should wait once and, after
//! its first, allocate nothing. Both backends count at the same points — every download is a
//! host sync, every buffer its cache could not supply an allocation — so a test on the CPU
//! says the same about the structure of a CUDA step.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct Counters {
    host_syncs: AtomicU64,
    backing_allocations: AtomicU64,
}

impl Counters {
    pub fn host_sync(&self) {
        self.host_syncs.fetch_add(1, Ordering::Relaxed);
    }

    pub fn backing_allocation(&self) {
        self.backing_allocations.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> DeviceCounters {
        DeviceCounters {
            host_syncs: self.host_syncs.load(Ordering::Relaxed),
            backing_allocations: self.backing_allocations.load(Ordering::Relaxed),
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
}

impl std::ops::Sub for DeviceCounters {
    type Output = DeviceCounters;
    fn sub(self, earlier: DeviceCounters) -> DeviceCounters {
        DeviceCounters {
            host_syncs: self.host_syncs - earlier.host_syncs,
            backing_allocations: self.backing_allocations - earlier.backing_allocations,
        }
    }
}
