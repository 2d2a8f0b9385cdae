//! stages: the model (its description, `model.rs`, and its hand-written layers), split into
//! chunks that pipeline stages own, with the activation stash and the recompute policy that
//! shapes it.

pub mod chunk;
pub mod dist;
pub mod flops;
pub mod init;
pub mod layers;
pub mod memory_model;
pub mod model;
pub mod offload;
pub mod optimizer_shard;
pub mod params;
pub mod partition;
pub mod recompute;
pub mod runtime;
pub mod saved;
pub mod stage;
pub mod tensor_parallel;

pub use chunk::{ChunkStash, DeferredWeightGrads, ForwardOutput, Microbatch, Mode, ModelChunk};
pub use dist::{NamedTensor, TensorGroup};
pub use kernels::QkNormSpan;
pub use layers::activation::Activation;
pub use layers::norm::{Norm, NormPlacement};
pub use model::{Architecture, DropoutProbs, LinearBiases, ModelShape, Naming, Positions, SlidingWindow};
pub use offload::{ActivationOffload, OffloadModule};
pub use optimizer_shard::OptimizerShard;
pub use params::{ChunkLayout, Parameters};
pub use recompute::{FullMethod, RecomputePolicy, SelectiveModules};
pub use tensor_parallel::{Shard, TensorParallel};
