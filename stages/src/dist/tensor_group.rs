//! The tensor-parallel group as the layers see it, on the collective seam over
//! [`Group::Tensor`]: Megatron's all-reduces of a row-parallel output and of a
//! column-parallel input gradient (with sequence parallelism, reduce-scatters into a rank's
//! rows, and the all-gathers of those rows), the all-gather of the vocabulary-parallel
//! loss's row statistics, and that of distributed saved activations.
//!
//! The reduce-scatter is [`Collective::reduce_scatter_sum`]: under MPI each rank receives
//! only its rows' parts; the threads and NCCL backends sum the whole tensor on the device.
//! The rows are then cut out on the device ([`own_part`]). The all-gathers move on the
//! device too, but under MPI, whose bytes cross the host.
//!
//! A layer cannot stop halfway through its arithmetic to return an error, so a failed
//! collective is kept, as a device keeps its asynchronous errors: every later one is
//! skipped, and the stage runtime takes the error after the action
//! ([`TensorGroup::take_error`]) and ends the step with it. Whatever the skipped
//! collectives leave in their tensors is never read.

use super::{member_part, Collective, DistError, Group};
use kernels::{Category, Device, Tensor};
use std::ops::Range;

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

    /// The whole tensor of `shape` from every member's part, concatenated in tensor rank
    /// order (sequence parallelism's all-gather, and distributed saves'), as workspace: this
    /// member's part copied into its place, the others' gathered into theirs
    /// ([`Collective::all_gather_activation`]).
    pub fn all_gather_parts(&mut self, part: &Tensor, dev: &dyn Device, shape: &[usize]) -> Tensor {
        let mut whole = dev.empty_of(part.dtype(), shape, Category::Workspace);
        let Some(c) = self.collective.as_deref_mut() else {
            dev.copy(&mut whole, part);
            return whole;
        };
        let (members, me) = c.topology().members_and_place(Group::Tensor, c.rank());
        let mine = member_part(whole.len(), members.len(), me);
        assert_eq!(mine.len(), part.len(), "all-gather: {part:?} is not this member's part of {shape:?}");
        dev.copy_part(&mut whole, mine.start, part, 0..part.len());
        if self.error.is_none() {
            // After a failure, whatever `whole` holds: never read.
            self.error = c.all_gather_activation(Group::Tensor, &mut whole, dev).err();
        }
        whole
    }

    /// This rank's rows `rows` [R, C] of the group's sum of `whole` [N, C] (sequence
    /// parallelism's reduce-scatter, in tensor rank order), under `category`. A rank's rows
    /// are its member part of the tokens, so of the elements.
    pub fn reduce_scatter_rows(
        &mut self,
        mut whole: Tensor,
        dev: &dyn Device,
        rows: Range<usize>,
        category: Category,
    ) -> Tensor {
        let c = *whole.shape().last().expect("a tensor has a shape");
        let shape = [rows.len(), c];
        let Some(collective) = self.collective.as_deref_mut() else {
            return own_part(dev, &whole, rows.start * c..rows.end * c, &shape, category);
        };
        if self.error.is_none() {
            self.error = collective.reduce_scatter_sum(Group::Tensor, &mut whole, dev).err();
        }
        // After a failure, whatever `whole` holds: never read.
        own_part(dev, &whole, rows.start * c..rows.end * c, &shape, category)
    }

    /// Replaces `t` by the sum of the group's tensors, in tensor rank order.
    pub fn all_reduce(&mut self, t: &mut Tensor, dev: &dyn Device) {
        if let (Some(c), None) = (self.collective.as_deref_mut(), &self.error) {
            self.error = c.all_reduce_sum(Group::Tensor, t, dev).err();
        }
    }

    /// The failure of a collective since the last call, if one failed.
    pub fn take_error(&mut self) -> Option<DistError> {
        self.error.take()
    }
}

/// Elements `elements` of `whole`, as a new tensor of `shape` under `category`: a rank's
/// part of a tensor the group holds whole, copied on the device.
pub fn own_part(
    dev: &dyn Device,
    whole: &Tensor,
    elements: Range<usize>,
    shape: &[usize],
    category: Category,
) -> Tensor {
    let mut part = dev.empty_of(whole.dtype(), shape, category);
    assert_eq!(part.len(), elements.len(), "own_part: {elements:?} of {whole:?} as {shape:?}");
    dev.copy_part(&mut part, 0, whole, elements);
    part
}
