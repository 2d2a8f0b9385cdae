//! The tensor-parallel group as the layers see it: Megatron's all-reduces of a row-parallel
//! output and of a column-parallel input gradient, and the all-gather of the vocabulary-
//! parallel loss's row statistics, run on the collective seam over [`Group::Tensor`].
//!
//! A layer cannot stop halfway through its arithmetic to return an error, so a failed
//! collective is kept, as a device keeps its asynchronous errors: every later one is
//! skipped, and the stage runtime takes the error after the action
//! ([`TensorGroup::take_error`]) and ends the step with it. Whatever the skipped
//! collectives leave in their tensors is never read.

use super::{Collective, DistError, Group};
use kernels::{Device, Tensor};

pub struct TensorGroup<'a> {
    /// None for t = 1: nothing crosses.
    collective: Option<&'a mut dyn Collective>,
    error: Option<DistError>,
}

impl<'a> TensorGroup<'a> {
    /// A stage whose layers are whole (t = 1).
    pub fn whole() -> TensorGroup<'static> {
        TensorGroup { collective: None, error: None }
    }

    /// The group of `collective`'s rank; t = 1 crosses nothing.
    pub fn of(collective: &'a mut dyn Collective) -> TensorGroup<'a> {
        let t = collective.topology().tensor;
        TensorGroup { collective: (t > 1).then_some(collective), error: None }
    }

    /// t, the group's ranks.
    pub fn size(&self) -> usize {
        self.collective.as_deref().map_or(1, |c| c.topology().tensor)
    }

    /// Replaces `t` by the sum of the group's tensors, in tensor rank order.
    pub fn all_reduce(&mut self, t: &mut Tensor, dev: &dyn Device) {
        if let (Some(c), None) = (self.collective.as_deref_mut(), &self.error) {
            self.error = c.all_reduce_sum(Group::Tensor, t, dev).err();
        }
    }

    /// Every member's bytes, in tensor rank order. After a failure, `bytes` stands in for
    /// each member's (never read: the action ends in the error).
    pub fn all_gather(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        let size = self.size();
        if let (Some(c), None) = (self.collective.as_deref_mut(), &self.error) {
            match c.all_gather(Group::Tensor, bytes) {
                Ok(all) => return all,
                Err(e) => self.error = Some(e),
            }
        }
        vec![bytes.to_vec(); size]
    }

    /// The failure of a collective since the last call, if one failed.
    pub fn take_error(&mut self) -> Option<DistError> {
        self.error.take()
    }
}
