//! A cache of freed CPU buffers, by length, so that the tensors of each step reuse the
//! memory of the last instead of asking the allocator for fresh pages (which the kernel
//! then zero-faults one by one: a third of a small model's step time otherwise).
//!
//! Like PyTorch's caching allocator: the ledger counts the tensors alive (what the model
//! needs), the cache holds what was freed and not yet reused ([`BufferCache::cached_bytes`]).

use crate::counters::Counters;
use crate::tensor::{Recycle, Storage};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

#[derive(Default)]
pub struct BufferCache {
    free: Mutex<HashMap<usize, Vec<Vec<f32>>>>,
    cached_bytes: AtomicUsize,
}

impl BufferCache {
    /// A buffer of `len` elements with unspecified contents, reused when one is cached; a
    /// fresh one otherwise, counted in `counters` as a backing allocation.
    ///
    /// In a build with debug assertions (the tests') every element is NaN, so that an op
    /// that leaves an element of its output unwritten shows as NaN in whatever reads it,
    /// where a zero or an old value could pass for a result.
    pub fn take(&self, len: usize, counters: &Counters) -> Vec<f32> {
        let reused = self.free.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&len).and_then(Vec::pop);
        let mut buffer = match reused {
            Some(v) => {
                self.cached_bytes.fetch_sub(len * 4, Ordering::Relaxed);
                v
            }
            None => {
                counters.backing_allocation();
                vec![0.0; len]
            }
        };
        if cfg!(debug_assertions) {
            buffer.fill(f32::NAN);
        }
        buffer
    }

    /// Bytes held for reuse, outside every tensor.
    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes.load(Ordering::Relaxed)
    }
}

impl Recycle for BufferCache {
    fn recycle(&self, storage: Storage) {
        #[allow(irrefutable_let_patterns)]
        if let Storage::Cpu(v) = storage {
            if v.is_empty() {
                return;
            }
            self.cached_bytes.fetch_add(v.len() * 4, Ordering::Relaxed);
            self.free.lock().unwrap_or_else(|e| e.into_inner()).entry(v.len()).or_default().push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_buffers_are_reused_by_length() {
        let (cache, counters) = (BufferCache::default(), Counters::default());
        let a = cache.take(8, &counters);
        let ptr = a.as_ptr();
        cache.recycle(Storage::Cpu(a));
        assert_eq!(cache.cached_bytes(), 32);
        assert_eq!(cache.take(4, &counters).len(), 4);
        let b = cache.take(8, &counters);
        assert_eq!(b.as_ptr(), ptr);
        assert_eq!(cache.cached_bytes(), 0);
        // The 8 and the 4 came from the allocator; the second 8 from the cache.
        assert_eq!(counters.snapshot().backing_allocations, 2);
    }

    #[test]
    #[cfg(debug_assertions)]
    fn a_taken_buffer_is_nan_where_debug_assertions_are_on() {
        let (cache, counters) = (BufferCache::default(), Counters::default());
        assert!(cache.take(3, &counters).iter().all(|x| x.is_nan()));
        cache.recycle(Storage::Cpu(vec![1.0; 3]));
        assert!(cache.take(3, &counters).iter().all(|x| x.is_nan()));
    }
}
