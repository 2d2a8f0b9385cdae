//! The device's arena: buffers freed during a step (tensors and op scratch alike) are kept,
//! by element type and length, and handed out again, so after the first step a step's
//! buffers all come from here and the hot loop calls no allocator. The ledger still counts
//! what tensors and scratch hold, exactly as before; the arena holds the rest.
//!
//! A buffer keeps the stream it was allocated on and cudarc's events, so a reuse on another
//! stream (an adopted tensor's, under the threads backend) still waits for its last use.

use crate::counters::Counters;
use crate::memory::OutOfMemory;
use crate::tensor::{Recycle, Storage};
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type Key = (TypeId, usize);

pub(super) struct Arena {
    free: Mutex<HashMap<Key, Vec<Box<dyn Any + Send>>>>,
    counters: Arc<Counters>,
}

impl Arena {
    pub fn new(counters: Arc<Counters>) -> Arena {
        Arena { free: Mutex::default(), counters }
    }

    /// `len` elements (at least one: CUDA rejects an empty allocation), unspecified: a
    /// freed buffer of that type and length, or, counted as a backing allocation, a new one.
    pub fn take<T: DeviceRepr + Send + 'static>(&self, stream: &Arc<CudaStream>, len: usize) -> CudaSlice<T> {
        let len = len.max(1);
        let reused =
            self.free.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&key::<T>(len)).and_then(Vec::pop);
        if let Some(slice) = reused {
            return *slice.downcast::<CudaSlice<T>>().expect("the arena files buffers by their type");
        }
        self.counters.backing_allocation();
        // SAFETY: every caller writes the elements before reading them (`empty`, scratch), or
        // fills them first (`zeros`, uploads).
        let alloc = || unsafe { stream.alloc::<T>(len) };
        match alloc() {
            Ok(slice) => slice,
            Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                // The cached buffers of other sizes may be what fills the GPU: hand them
                // back (each freed in its own stream's order) and try once more, as
                // PyTorch's caching allocator does.
                self.free.lock().unwrap_or_else(|e| e.into_inner()).clear();
                alloc().unwrap_or_else(|_| std::panic::panic_any(out_of_memory::<T>(stream, len)))
            }
            Err(e) => panic!("cuda: cannot allocate {len} elements: {e:?}"),
        }
    }

    pub fn put<T: DeviceRepr + Send + 'static>(&self, slice: CudaSlice<T>) {
        let key = key::<T>(slice.len());
        self.free.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default().push(Box::new(slice));
    }
}

/// What the failed allocation asked for, and what the GPU had.
fn out_of_memory<T>(stream: &CudaStream, len: usize) -> OutOfMemory {
    let (free, total) = stream.context().mem_get_info().unwrap_or((0, 0));
    OutOfMemory {
        device: format!("GPU {}", stream.context().ordinal()),
        bytes: len * std::mem::size_of::<T>(),
        free,
        total,
    }
}

fn key<T: 'static>(len: usize) -> Key {
    (TypeId::of::<T>(), len)
}

impl Recycle for Arena {
    fn recycle(&self, storage: Storage) {
        match storage {
            Storage::Cuda(slice) => self.put(slice),
            Storage::CudaBf16(slice) => self.put(slice),
            Storage::CudaMaster { master, bf16 } => {
                self.put(master);
                self.put(bf16);
            }
            Storage::Cpu(_) | Storage::HostBf16(_) => {}
        }
    }
}

/// Frees a buffer on a stream other than the one that allocated it: the stream that used
/// it last, so the free follows that use in stream order (see `CudaDevice::adopted`).
pub(super) struct FreeOnStream(pub Arc<CudaStream>);

impl FreeOnStream {
    fn free<T>(&self, slice: CudaSlice<T>) {
        let ptr = slice.leak();
        // SAFETY: the buffer is no longer referenced; the free runs after this stream's
        // work so far, which includes every use of it.
        unsafe { cudarc::driver::result::free_async(ptr, self.0.cu_stream()) }
            .unwrap_or_else(|e| panic!("cuda: cannot free a received buffer: {e:?}"));
    }
}

impl Recycle for FreeOnStream {
    fn recycle(&self, storage: Storage) {
        match storage {
            Storage::Cuda(slice) => self.free(slice),
            Storage::CudaBf16(slice) => self.free(slice),
            other => drop(other),
        }
    }
}
