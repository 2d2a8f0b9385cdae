//! Accounting of every buffer a device hands out: live and peak bytes, in total and per
//! category, so a run can report (and tests can assert) what each stage really held.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// What a buffer is for. The report and the simulator's memory model use the same split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    Parameters,
    Gradients,
    OptimizerState,
    /// Tensors a layer keeps from forward for its backward (the activation stash).
    Activations,
    /// Activations and gradients in flight between stages.
    Transfer,
    /// Short-lived buffers inside one action (scratch, recomputed tensors, gradients of
    /// activations).
    Workspace,
}

impl Category {
    pub const ALL: [Category; 6] = [
        Category::Parameters,
        Category::Gradients,
        Category::OptimizerState,
        Category::Activations,
        Category::Transfer,
        Category::Workspace,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Default)]
struct Counter {
    live: AtomicUsize,
    peak: AtomicUsize,
}

impl Counter {
    fn add(&self, bytes: usize) -> usize {
        let live = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(live, Ordering::Relaxed);
        live
    }
    fn sub(&self, bytes: usize) {
        self.live.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Live and peak bytes of one device, in total and per [`Category`].
#[derive(Default)]
pub struct MemoryLedger {
    total: Counter,
    per_category: [Counter; 6],
    /// Serialises alloc/free so the total peak is exact, not a racy approximation.
    lock: Mutex<()>,
}

/// A point-in-time copy of a ledger's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemorySnapshot {
    pub live_bytes: usize,
    pub peak_bytes: usize,
    /// (category, live, peak) for each category.
    pub categories: Vec<(Category, usize, usize)>,
}

impl MemoryLedger {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn allocated(&self, category: Category, bytes: usize) {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.total.add(bytes);
        self.per_category[category.index()].add(bytes);
    }

    pub fn freed(&self, category: Category, bytes: usize) {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.total.sub(bytes);
        self.per_category[category.index()].sub(bytes);
    }

    pub fn live_bytes(&self) -> usize {
        self.total.live.load(Ordering::Relaxed)
    }

    pub fn peak_bytes(&self) -> usize {
        self.total.peak.load(Ordering::Relaxed)
    }

    pub fn live(&self, category: Category) -> usize {
        self.per_category[category.index()].live.load(Ordering::Relaxed)
    }

    pub fn peak(&self, category: Category) -> usize {
        self.per_category[category.index()].peak.load(Ordering::Relaxed)
    }

    /// Starts a new peak window: every peak becomes the current live value.
    pub fn reset_peaks(&self) {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        for c in std::iter::once(&self.total).chain(self.per_category.iter()) {
            c.peak.store(c.live.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> MemorySnapshot {
        MemorySnapshot {
            live_bytes: self.live_bytes(),
            peak_bytes: self.peak_bytes(),
            categories: Category::ALL.iter().map(|&c| (c, self.live(c), self.peak(c))).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_follows_the_high_water_mark_per_category() {
        let ledger = MemoryLedger::new();
        ledger.allocated(Category::Activations, 100);
        ledger.allocated(Category::Workspace, 50);
        ledger.freed(Category::Activations, 100);
        ledger.allocated(Category::Activations, 30);
        assert_eq!(ledger.live_bytes(), 80);
        assert_eq!(ledger.peak_bytes(), 150);
        assert_eq!(ledger.peak(Category::Activations), 100);
        assert_eq!(ledger.live(Category::Activations), 30);
        ledger.reset_peaks();
        assert_eq!(ledger.peak_bytes(), 80);
        assert_eq!(ledger.peak(Category::Workspace), 50);
    }
}

/// A device that could not allocate, even after handing its cached free buffers back: the
/// payload of the panic an op raises (ops are infallible), which the trainer turns into
/// one line naming the rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    /// e.g. "GPU 0"
    pub device: String,
    pub bytes: usize,
    /// The device's free and total bytes as its driver reported them after the failure.
    pub free: usize,
    pub total: usize,
}

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        write!(
            f,
            "{} is out of memory: {:.1} MiB asked for, {:.1} MiB free of {:.1} MiB; lower micro_batch_size or \
             recompute more (`pipetrain simulate` predicts each stage's peak)",
            self.device,
            mib(self.bytes),
            mib(self.free),
            mib(self.total)
        )
    }
}
