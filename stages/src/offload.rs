//! Activation offload: which of the tensors a block keeps for its backward wait in host
//! memory instead of the device's, moved there after the block's forward and back just
//! before its backward.
//!
//! Two kinds, as in the tools users know:
//! - Megatron-LM's fine-grained offload names modules; a module offloads the tensors its
//!   backward reads (its input, and what it saves inside): each [`BlockTensor`] belongs to
//!   one module ([`OffloadModule::of`]). It applies to the blocks that keep their tensors (no
//!   recompute, selective, or full block recompute's stored blocks).
//! - DeepSpeed's `cpu_checkpointing`: full recompute's kept group inputs go to the host.
//!
//! Either applies to the first `num_layers` blocks of each chunk of a stage: under 1F1B those
//! wait longest for their backward, which comes last, so their copies back have the most
//! time to finish.

use crate::layers::norm::NormPlacement;
use crate::recompute::BlockKeep;
use crate::saved::BlockTensor;

/// A module whose saved tensors offload: Megatron's names where Megatron has the module,
/// `mlp_fc1`, `mlp_act` and `mlp_fc2` for a dense MLP's (Megatron names only its experts').
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffloadModule {
    /// The first norm: the block's input and the norm's statistics, and the norm's input
    /// where it is on the branch's output (the block's input, which the qkv projection
    /// reads there, stays this module's).
    AttnNorm,
    /// The qkv projection: its input, norm_1's output.
    QkvLinear,
    /// The attention core: q, k, v and what the core keeps (probabilities or log-sum-exp),
    /// and QK-norm's input and statistics where the model normalises q and k.
    CoreAttn,
    /// The attention's output projection: its input, the attention output.
    AttnProj,
    /// The second norm: the residual stream and the norm's statistics, and the norm's input
    /// where it is on the branch's output (the residual stream, which fc1 reads there, stays
    /// this module's).
    MlpNorm,
    /// The MLP's first projection: its input, norm_2's output.
    MlpFc1,
    /// The MLP's activation: its input, fc1's output.
    MlpAct,
    /// The MLP's second projection: its input, the activation's output.
    MlpFc2,
}

impl OffloadModule {
    pub const ALL: [OffloadModule; 8] = [
        OffloadModule::AttnNorm,
        OffloadModule::QkvLinear,
        OffloadModule::CoreAttn,
        OffloadModule::AttnProj,
        OffloadModule::MlpNorm,
        OffloadModule::MlpFc1,
        OffloadModule::MlpAct,
        OffloadModule::MlpFc2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OffloadModule::AttnNorm => "attn_norm",
            OffloadModule::QkvLinear => "qkv_linear",
            OffloadModule::CoreAttn => "core_attn",
            OffloadModule::AttnProj => "attn_proj",
            OffloadModule::MlpNorm => "mlp_norm",
            OffloadModule::MlpFc1 => "mlp_fc1",
            OffloadModule::MlpAct => "mlp_act",
            OffloadModule::MlpFc2 => "mlp_fc2",
        }
    }

    /// Whether the module keeps anything in a block whose norms sit at `placement`: the qkv
    /// projection's and fc1's inputs are norms' outputs only pre-norm; with the norms on the
    /// outputs they are the residual stream, which `attn_norm` and `mlp_norm` hold.
    pub fn keeps_anything(self, placement: NormPlacement) -> bool {
        placement == NormPlacement::Input || !matches!(self, OffloadModule::QkvLinear | OffloadModule::MlpFc1)
    }

    /// The module whose backward reads `t` (each kept tensor belongs to exactly one).
    pub fn of(t: BlockTensor) -> OffloadModule {
        match t {
            BlockTensor::Input | BlockTensor::Norm1Stats | BlockTensor::AttProj => OffloadModule::AttnNorm,
            BlockTensor::Norm1Out => OffloadModule::QkvLinear,
            BlockTensor::QkNormIn
            | BlockTensor::QkNormStats
            | BlockTensor::Qkv
            | BlockTensor::AttProbs
            | BlockTensor::AttDropped
            | BlockTensor::AttLogSumExp => OffloadModule::CoreAttn,
            BlockTensor::AttOut => OffloadModule::AttnProj,
            BlockTensor::Residual | BlockTensor::Norm2Stats | BlockTensor::FcProj => OffloadModule::MlpNorm,
            BlockTensor::Norm2Out => OffloadModule::MlpFc1,
            BlockTensor::FcOut => OffloadModule::MlpAct,
            BlockTensor::ActOut => OffloadModule::MlpFc2,
        }
    }
}

/// What one chunk offloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivationOffload {
    /// The modules whose tensors go to the host, in blocks that keep them.
    pub modules: Vec<OffloadModule>,
    /// Full recompute's kept inputs go to the host too.
    pub recompute_inputs: bool,
    /// How many of the chunk's blocks, from its first, offload ([`ActivationOffload::EVERY_LAYER`]:
    /// all).
    pub num_layers: usize,
}

impl ActivationOffload {
    pub const NONE: ActivationOffload =
        ActivationOffload { modules: Vec::new(), recompute_inputs: false, num_layers: 0 };
    /// `num_layers` for every block of a chunk, however many it holds.
    pub const EVERY_LAYER: usize = usize::MAX;

    /// Whether block `offset` of the chunk, keeping its tensors as `keep`, moves `t` to the
    /// host (if it keeps it at all).
    pub fn offloads(&self, offset: usize, keep: BlockKeep, t: BlockTensor) -> bool {
        offset < self.num_layers
            && match keep {
                BlockKeep::Stored(_) => self.modules.contains(&OffloadModule::of(t)),
                BlockKeep::InputOnly { group_start } => {
                    group_start && self.recompute_inputs && t == BlockTensor::Input
                }
            }
    }

    pub fn is_none(&self) -> bool {
        self.num_layers == 0 || (self.modules.is_empty() && !self.recompute_inputs)
    }

    /// One line for reports, e.g. "core_attn, attn_proj on every layer", "recompute inputs
    /// on each chunk's first 2 layers" or "none".
    pub fn describe(&self) -> String {
        if self.is_none() {
            return "none".into();
        }
        let mut what: Vec<&str> = self.modules.iter().map(|m| m.name()).collect();
        if self.recompute_inputs {
            what.push("recompute inputs");
        }
        match self.num_layers {
            ActivationOffload::EVERY_LAYER => format!("{} on every layer", what.join(", ")),
            1 => format!("{} on each chunk's first layer", what.join(", ")),
            n => format!("{} on each chunk's first {n} layers", what.join(", ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recompute::SelectiveModules;

    #[test]
    fn every_module_offloads_the_tensors_its_backward_reads() {
        use BlockTensor::*;
        let of = |m: OffloadModule| -> Vec<BlockTensor> {
            BlockTensor::ALL.into_iter().filter(|&t| OffloadModule::of(t) == m).collect()
        };
        let expected: [&[BlockTensor]; 8] = [
            &[Input, Norm1Stats, AttProj],
            &[Norm1Out],
            &[QkNormIn, QkNormStats, Qkv, AttProbs, AttDropped, AttLogSumExp],
            &[AttOut],
            &[Residual, Norm2Stats, FcProj],
            &[Norm2Out],
            &[FcOut],
            &[ActOut],
        ];
        for (m, tensors) in OffloadModule::ALL.into_iter().zip(expected) {
            assert_eq!(of(m), tensors, "{}", m.name());
        }
    }

    #[test]
    fn the_first_layers_offload_their_modules_or_recompute_inputs() {
        let offload = ActivationOffload {
            modules: vec![OffloadModule::AttnProj],
            recompute_inputs: true,
            num_layers: 2,
        };
        let stored = BlockKeep::Stored(SelectiveModules::NONE);
        assert!(offload.offloads(1, stored, BlockTensor::AttOut));
        assert!(!offload.offloads(2, stored, BlockTensor::AttOut));
        assert!(!offload.offloads(0, stored, BlockTensor::Input));
        assert!(offload.offloads(0, BlockKeep::InputOnly { group_start: true }, BlockTensor::Input));
        assert!(!offload.offloads(1, BlockKeep::InputOnly { group_start: false }, BlockTensor::Input));
        assert_eq!(offload.describe(), "attn_proj, recompute inputs on each chunk's first 2 layers");
        let every = ActivationOffload { num_layers: ActivationOffload::EVERY_LAYER, ..offload };
        assert_eq!(every.describe(), "attn_proj, recompute inputs on every layer");
        assert_eq!(ActivationOffload::NONE.describe(), "none");
    }
}
