//! A test double for the CUDA driver, cuBLAS, cuBLASLt and NCCL: the subset of their C APIs
//! that cudarc and pipetrain call, with the same ABI, computed on the CPU. Built as a cdylib
//! and found under the names cudarc loads (`libcuda.so`, `libcublas.so`, `libcublasLt.so`,
//! `libnccl.so`: links to one library, made by `standin/run`), it lets pipetrain's real CUDA
//! host path run where there is no GPU: its dtype dispatch, buffers, streams and events,
//! cuBLAS and cuBLASLt calls and NCCL collectives between processes. It is never loaded
//! unless the environment asks for it.
//!
//! - GPUs ([`devices`]): as many as `CUDA_STANDIN_GPUS` says, each with the capacity
//!   `CUDA_STANDIN_MEMORY` gives it; device memory is host memory ([`memory`]).
//! - Streams ([`stream`]) run asynchronously, each on its own host thread; events order them.
//! - Kernels run under the SIMT emulator of kernels/tests/simt, compiled for the host with
//!   every family of kernels/cuda when this crate is built ([`emulator`]); the driver's entry
//!   points are in [`driver`].
//! - [`cublas`]: the GEMMs, on the CPU, on the handle's stream.
//! - [`cublaslt`]: matmuls with bias and GELU-gradient epilogues, through the same GEMMs, on
//!   the stream each call names.
//! - [`nccl`]: communicators between threads or processes, through a hub in the process that
//!   made the unique id.
//!
//! Errors a real driver would return are returned; misuse a real GPU would turn into a
//! fault (a kernel reading past a buffer, a barrier not every thread reaches) ends the
//! process with a message, as the emulator does.

pub mod cublas;
pub mod cublaslt;
pub mod devices;
pub mod driver;
pub mod emulator;
pub mod memory;
pub mod nccl;
pub mod stream;
