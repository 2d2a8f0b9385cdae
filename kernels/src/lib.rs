//! kernels: the math of a GPT-2 training step on a device.
//!
//! [`Device`] is the one interface the model code calls; [`cpu::CpuDevice`] implements it
//! with rayon + gemm, and the CUDA backend (feature `cuda`) beside it. Every buffer a device
//! hands out is a [`Tensor`] counted in that device's [`MemoryLedger`].

pub mod counters;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod dropout;
pub mod memory;
pub mod philox;
pub mod readout;
pub mod tensor;

pub use counters::DeviceCounters;
pub use device::{AdamWStep, Device, WeightLayout};
pub use dropout::{DropoutKey, DropoutSite, DropoutSpec};
pub use memory::{Category, MemoryLedger, MemorySnapshot};
pub use readout::{Readout, ReadoutStorage};
pub use tensor::{Detached, Storage, Tensor};
