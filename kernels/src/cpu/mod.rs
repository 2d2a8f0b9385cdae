//! The CPU backend: rayon + gemm, one file per kernel.
//! (Being implemented; see kernels/src/device.rs for the contract.)

/// A CPU device with its own rayon pool.
pub struct CpuDevice;
