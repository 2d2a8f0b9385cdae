//! The device's arena: buffers freed during a step (tensors and op scratch alike) are kept,
//! by element type and length, and handed out again, so after the first step a step's
//! buffers all come from here and the hot loop calls no allocator. The ledger still counts
//! what tensors and scratch hold, exactly as before; the arena holds the rest.
//!
//! A buffer keeps the stream it was allocated on and cudarc's events, so a reuse on another
//! stream (an adopted tensor's, under the threads backend) still waits for its last use. A
//! buffer an offload's copy may still be reading is filed with that copy's event, which its
//! next user's stream waits for (`put_after`).
//!
//! Offloaded activations' page-locked host buffers are kept the same way, so offload too
//! allocates nothing after the first step.

use crate::counters::Counters;
use crate::memory::OutOfMemory;
use crate::tensor::{Recycle, Storage};
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DeviceRepr, PinnedHostSlice};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A buffer's type (a device slice or a page-locked host slice, of some element type) and
/// length.
type Key = (TypeId, usize);

/// A freed buffer, and the event of a copy still reading it, if any.
struct Freed {
    buffer: Box<dyn Any + Send>,
    read_until: Option<CudaEvent>,
}

pub(super) struct Arena {
    free: Mutex<HashMap<Key, Vec<Freed>>>,
    counters: Arc<Counters>,
}

impl Arena {
    pub fn new(counters: Arc<Counters>) -> Arena {
        Arena { free: Mutex::default(), counters }
    }

    /// A freed buffer of type `B` and length `len`, if one is kept.
    fn reuse<B: Any + Send>(&self, len: usize) -> Option<(B, Option<CudaEvent>)> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let Freed { buffer, read_until } = free.get_mut(&(TypeId::of::<B>(), len)).and_then(Vec::pop)?;
        Some((*buffer.downcast::<B>().expect("the arena files buffers by their type"), read_until))
    }

    fn shelve<B: Any + Send>(&self, len: usize, buffer: B, read_until: Option<CudaEvent>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let freed = Freed { buffer: Box::new(buffer), read_until };
        free.entry((TypeId::of::<B>(), len)).or_default().push(freed);
    }

    /// `len` elements (at least one: CUDA rejects an empty allocation), unspecified: a
    /// freed buffer of that type and length, or, counted as a backing allocation, a new one.
    pub fn take<T: DeviceRepr + Send + 'static>(&self, stream: &Arc<CudaStream>, len: usize) -> CudaSlice<T> {
        let len = len.max(1);
        if let Some((slice, read_until)) = self.reuse::<CudaSlice<T>>(len) {
            if let Some(copy) = read_until {
                wait(stream, &copy);
            }
            return slice;
        }
        self.counters.backing_allocation();
        // SAFETY: every caller writes the elements before reading them (`empty`, scratch), or
        // fills them first (`zeros`, uploads).
        let alloc = || unsafe { stream.alloc::<T>(len) };
        match alloc() {
            Ok(slice) => slice,
            Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                // The cached buffers of other sizes may be what fills the GPU: hand them
                // back (each freed in its own stream's order, after any copy reading it)
                // and try once more, as PyTorch's caching allocator does.
                let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
                for copy in free.values().flatten().filter_map(|f| f.read_until.as_ref()) {
                    wait(stream, copy);
                }
                free.clear();
                drop(free);
                alloc().unwrap_or_else(|_| std::panic::panic_any(out_of_memory::<T>(stream, len)))
            }
            Err(e) => panic!("cuda: cannot allocate {len} elements: {e:?}"),
        }
    }

    pub fn put<T: DeviceRepr + Send + 'static>(&self, slice: CudaSlice<T>) {
        self.shelve(slice.len(), slice, None)
    }

    /// Keeps `slice` for reuse once the copy that `copied` follows has read it.
    pub fn put_after<T: DeviceRepr + Send + 'static>(&self, slice: CudaSlice<T>, copied: CudaEvent) {
        self.shelve(slice.len(), slice, Some(copied))
    }

    /// `len` elements of page-locked host memory on `ctx`'s GPU: a freed buffer, or,
    /// counted as a backing allocation, a new one.
    pub fn take_pinned<T: DeviceRepr + Send + 'static>(
        &self,
        ctx: &Arc<CudaContext>,
        len: usize,
    ) -> PinnedHostSlice<T> {
        let len = len.max(1);
        if let Some((pinned, _)) = self.reuse::<PinnedHostSlice<T>>(len) {
            return pinned;
        }
        self.counters.backing_allocation();
        // Not write-combined (cudarc's default), which suits buffers the host writes for the
        // GPU to read; here the GPU both writes and reads it.
        // SAFETY: every copy out fills the buffer before a copy back reads it.
        unsafe { ctx.alloc_pinned_with_flags::<T>(len, 0) }.unwrap_or_else(|e| {
            panic!("cuda: cannot allocate {len} elements of page-locked host memory: {e:?}")
        })
    }

    fn put_pinned<T: Send + 'static>(&self, pinned: PinnedHostSlice<T>) {
        self.shelve(pinned.len(), pinned, None)
    }
}

/// Makes `stream`'s later work wait for `event` (a copy's, on another stream).
pub(super) fn wait(stream: &CudaStream, event: &CudaEvent) {
    stream.wait(event).unwrap_or_else(|e| panic!("cuda: a stream cannot wait for a copy: {e:?}"));
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

impl Recycle for Arena {
    fn recycle(&self, storage: Storage) {
        match storage {
            Storage::Cuda(slice) => self.put(slice),
            Storage::CudaBf16(slice) => self.put(slice),
            Storage::CudaMaster { master, bf16, .. } => {
                self.put(master);
                self.put(bf16);
            }
            Storage::Pinned(pinned) => self.put_pinned(pinned),
            Storage::PinnedBf16(pinned) => self.put_pinned(pinned),
            Storage::Cpu(_) => {}
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
