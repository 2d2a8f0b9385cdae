//! A block's kept tensors to host memory after its forward and back before its backward
//! (activation offload; which ones is [`ActivationOffload`](crate::offload::ActivationOffload)'s
//! to say). The copies back are workspace: they live only while the block's backward runs.

use super::block::BlockActs;
use super::norm::NormStats;
use crate::saved::BlockTensor;
use kernels::{AttentionSaved, Category, Device, Tensor};
use std::sync::Arc;

/// Brings `t` back to the device as workspace if it waits in host memory, without waiting
/// for the copy ([`Device::await_reloads`] does).
fn start_bringing_back(dev: &dyn Device, t: &mut Tensor) {
    if Arc::ptr_eq(t.ledger(), dev.host_ledger()) {
        dev.reload(t, Category::Workspace);
    }
}

/// Brings `t` back to the device as workspace if it waits in host memory, ready for the
/// device's next op.
pub(crate) fn bring_back(dev: &dyn Device, t: &mut Tensor) {
    start_bringing_back(dev, t);
    dev.await_reloads();
}

fn stats(s: &mut NormStats) -> Vec<&mut Tensor> {
    s.mean.iter_mut().chain(std::iter::once(&mut s.rstd)).collect()
}

impl BlockActs {
    /// The tensors kept for `t`: none where the block dropped it, two for LayerNorm's
    /// statistics (mean and reciprocal std).
    fn kept_mut(&mut self, t: BlockTensor) -> Vec<&mut Tensor> {
        match t {
            BlockTensor::Input => vec![&mut self.input],
            BlockTensor::Norm1Out => self.n1.iter_mut().collect(),
            BlockTensor::Norm1Stats => stats(&mut self.n1_stats),
            BlockTensor::QkNormIn => self.qk_norm.iter_mut().map(|n| &mut n.input).collect(),
            BlockTensor::QkNormStats => self.qk_norm.iter_mut().map(|n| &mut n.rstd).collect(),
            BlockTensor::Qkv => vec![&mut self.qkv],
            BlockTensor::AttProbs => match &mut self.att {
                Some(AttentionSaved::Probabilities { probs, .. }) => vec![probs],
                _ => vec![],
            },
            BlockTensor::AttDropped => match &mut self.att {
                Some(AttentionSaved::Probabilities { dropped, .. }) => dropped.iter_mut().collect(),
                _ => vec![],
            },
            BlockTensor::AttLogSumExp => match &mut self.att {
                Some(AttentionSaved::RowLogSumExp { lse }) => vec![lse],
                _ => vec![],
            },
            BlockTensor::AttOut => vec![&mut self.atty],
            BlockTensor::AttProj => self.attproj.iter_mut().collect(),
            BlockTensor::Residual => vec![&mut self.residual],
            BlockTensor::Norm2Out => self.n2.iter_mut().collect(),
            BlockTensor::Norm2Stats => stats(&mut self.n2_stats),
            BlockTensor::FcOut => vec![&mut self.fch],
            BlockTensor::ActOut => self.fch_act.iter_mut().collect(),
            BlockTensor::FcProj => self.fcproj.iter_mut().collect(),
        }
    }

    /// Moves the kept tensors `pick` chooses to host memory, freeing their device bytes.
    pub fn offload(&mut self, dev: &dyn Device, pick: impl Fn(BlockTensor) -> bool) {
        for t in BlockTensor::ALL.into_iter().filter(|&t| pick(t)) {
            for slot in self.kept_mut(t) {
                dev.offload(slot);
            }
        }
    }

    /// Starts bringing every tensor [`BlockActs::offload`] moved back to the device, as
    /// workspace: the block's backward follows a [`Device::await_reloads`].
    pub fn reload(&mut self, dev: &dyn Device) {
        for t in BlockTensor::ALL {
            for slot in self.kept_mut(t) {
                start_bringing_back(dev, slot);
            }
        }
    }
}
