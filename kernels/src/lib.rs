//! kernels: the math of a GPT-2 training step on a device.
//!
//! [`Device`] is the one interface the model code calls; [`cpu::CpuDevice`] implements it
//! with rayon + gemm, and the CUDA backend (feature `cuda`) beside it. Every buffer a device
//! hands out is a [`Tensor`] counted in that device's [`MemoryLedger`].

/// The name the CUDA stand-in (standin/, a test double for the CUDA libraries) gives its
/// GPUs: what runs on one is the host path and the emulated kernels, and its timings are
/// the CPU's.
pub const STANDIN_GPU_NAME: &str = "pipetrain stand-in GPU (CPU, SIMT emulator)";

pub mod attention;
pub mod backend;
pub mod counters;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
/// The build scripts' reading of kernels/cuda, tested here (they have no tests of their own).
#[cfg(test)]
#[path = "../build/cuda_decls.rs"]
mod cuda_decls;
pub mod device;
pub mod dropout;
pub mod gate;
pub mod memory;
pub mod op_args;
pub mod philox;
pub mod qk_norm;
pub mod readout;
pub mod rope_frequencies;
pub mod shapes;
pub mod splitmix;
pub mod tensor;
pub mod timing;

pub use attention::{
    attention_mma_fits, AttentionSaved, AttentionSaves, CausalMask, ChainedDq, ATTENTION_MMA_K,
    ATTENTION_MMA_MAX_HEAD_SIZE, FUSED_MAX_HEAD_SIZE,
};
pub use counters::DeviceCounters;
pub use device::{bf16_copy_len, cuda_fuses_gelu_backward, padded_vocab, Device, VOCAB_PADDING};
pub use dropout::{DropoutKey, DropoutSite, DropoutSpec, HeadRange};
pub use gate::Gate;
pub use memory::{Category, MemoryLedger, MemorySnapshot, OutOfMemory};
pub use op_args::{AdamWConstants, AdamWStep, AdamWTensor, ClassifierGrad, WeightLayout, OTHER_SHARD};
pub use qk_norm::{QkNormHeads, QkNormRows, QkNormSpan};
pub use readout::{Readout, ReadoutStorage};
pub use rope_frequencies::RopeFrequencies;
pub use splitmix::SplitMix64;
pub use tensor::{DType, Detached, Fence, Storage, Tensor};
pub use timing::{Clock, Mark, Readings, Stopwatch};
