//! Communicators between threads of this process ([`threads`]) and between two processes
//! ([`processes`]: the test binary runs itself again as the other rank), through the
//! exported functions.

mod processes;
mod threads;

use super::api::*;
use crate::devices;
use crate::memory;
use crate::stream::{self, Stream};
use cudarc::driver::sys::CUstream;
use cudarc::nccl::sys::{cudaStream_t, ncclComm_t, ncclResult_t, ncclUniqueId};
use ncclResult_t::*;
use std::ffi::c_void;
use std::sync::Arc;

/// Stand-in device memory holding `T`s, freed on drop.
pub struct Buffer<T> {
    addr: u64,
    len: usize,
    _type: std::marker::PhantomData<T>,
}

impl<T: Copy> Buffer<T> {
    pub fn new(values: &[T]) -> Buffer<T> {
        let addr = memory::allocate(0, size_of_val(values)).expect("test buffers fit");
        // SAFETY: the allocation holds `values.len()` elements.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), addr as *mut T, values.len()) };
        Buffer { addr, len: values.len(), _type: std::marker::PhantomData }
    }

    pub fn ptr(&self) -> *mut c_void {
        self.addr as *mut c_void
    }

    pub fn read(&self) -> Vec<T> {
        // SAFETY: as `new`.
        unsafe { std::slice::from_raw_parts(self.addr as *const T, self.len) }.to_vec()
    }
}

impl<T> Drop for Buffer<T> {
    fn drop(&mut self) {
        memory::free(self.addr);
    }
}

/// One rank of a test: its communicator and its own stream.
pub struct Rank {
    pub rank: usize,
    pub comm: ncclComm_t,
    pub stream: CUstream,
}

impl Rank {
    pub fn join(id: ncclUniqueId, size: usize, rank: usize) -> Rank {
        let stream = stream::into_handle(Stream::new(0));
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` is a valid place for the handle.
        assert_eq!(unsafe { ncclCommInitRank(&mut comm, size as i32, id, rank as i32) }, ncclSuccess);
        Rank { rank, comm, stream }
    }

    pub fn s(&self) -> cudaStream_t {
        self.stream as cudaStream_t
    }

    pub fn stream(&self) -> Arc<Stream> {
        devices::stream_of(self.stream).expect("a live stream")
    }

    pub fn sync(&self) {
        self.stream().synchronize();
    }

    pub fn async_error(&self) -> ncclResult_t {
        let mut error = ncclSuccess;
        // SAFETY: a live handle and a valid output.
        assert_eq!(unsafe { ncclCommGetAsyncError(self.comm, &mut error) }, ncclSuccess);
        error
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        // SAFETY: the handles are this rank's own (a null comm is allowed: aborted).
        unsafe {
            ncclCommDestroy(self.comm);
            stream::release_handle(self.stream);
        }
    }
}

pub fn unique_id() -> ncclUniqueId {
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: a valid output.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, ncclSuccess);
    id
}

/// Runs `body` as each of `size` ranks, one thread each; returns their results by rank.
pub fn ranks<T: Send>(size: usize, body: impl Fn(&mut Rank) -> T + Sync) -> Vec<T> {
    let id = unique_id();
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..size)
            .map(|r| {
                let body = &body;
                s.spawn(move || body(&mut Rank::join(id, size, r)))
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("a rank panicked")).collect()
    })
}

pub fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}
