//! The distributed optimizer's cut (Megatron's `use_distributed_optimizer`, ZeRO stage 1):
//! which elements of each parameter a data-parallel replica steps and keeps AdamW moments
//! for. Replica j of n owns part j of every parameter ([`member_part`]), the part a
//! reduce-scatter over the replicas leaves it, so the moments of a stage take 1/n of their
//! unsharded bytes (to within an element per parameter) on every replica.
//!
//! Megatron cuts one flat buffer of the stage's parameters into n ranges; cutting each
//! parameter instead keeps every part inside one tensor, so a step and a sum of squares
//! are ops on one tensor's range, and a parameter's parts are the same whatever the
//! partition into stages.
//!
//! The global gradient norm adds its squares by these parts whenever n > 1, sharded or
//! not: a sharded replica sums its own part, an unsharded one (holding the whole reduced
//! gradient) every part, and both add the parts in the same order, so clipping, and with it
//! every bit of the run, is the same with and without the distributed optimizer.

use crate::dist::member_part;
use std::ops::Range;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptimizerShard {
    /// The data-parallel replicas.
    pub replicas: usize,
    /// This replica's place among them.
    pub replica: usize,
    /// Whether the replicas share the optimizer state (each steps its own part).
    pub distributed: bool,
}

impl OptimizerShard {
    /// One replica stepping every element: no data parallelism.
    pub const WHOLE: OptimizerShard = OptimizerShard { replicas: 1, replica: 0, distributed: false };

    /// The elements of a parameter of `len` this replica steps.
    pub fn part(&self, len: usize) -> Range<usize> {
        if self.distributed {
            member_part(len, self.replicas, self.replica)
        } else {
            0..len
        }
    }

    /// Elements of the moments this replica keeps for parameters of `lens` elements.
    pub fn moment_elements(&self, lens: impl IntoIterator<Item = usize>) -> usize {
        lens.into_iter().map(|len| self.part(len).len()).sum()
    }

    /// The parts of a gradient of `len` whose sums of squares this replica adds to the
    /// global norm, as (replica, range): its own when sharded, every replica's otherwise.
    pub fn norm_parts(&self, len: usize) -> impl Iterator<Item = (usize, Range<usize>)> + '_ {
        let replicas = if self.distributed { self.replica..self.replica + 1 } else { 0..self.replicas };
        replicas.map(move |j| (j, member_part(len, self.replicas, j)))
    }

    /// The parts per gradient [`OptimizerShard::norm_parts`] gives.
    pub fn norm_parts_per_gradient(&self) -> usize {
        if self.distributed {
            1
        } else {
            self.replicas
        }
    }

    /// The order of part `j` of the parameter of global index `index` in the norm's sum.
    pub fn norm_key(&self, index: usize, j: usize) -> usize {
        index * self.replicas + j
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sharded(replicas: usize, replica: usize) -> OptimizerShard {
        OptimizerShard { replicas, replica, distributed: true }
    }

    #[test]
    fn the_parts_of_the_replicas_tile_each_parameter_in_order() {
        for (len, n) in [(10, 3), (7, 2), (2, 4), (0, 2), (768, 1)] {
            let parts: Vec<Range<usize>> = (0..n).map(|replica| sharded(n, replica).part(len)).collect();
            assert_eq!(parts[0].start, 0, "len {len}, n {n}");
            assert_eq!(parts[n - 1].end, len, "len {len}, n {n}");
            assert!(parts.windows(2).all(|w| w[0].end == w[1].start), "{parts:?}");
        }
        let third = |replica| sharded(3, replica).moment_elements([10, 7]);
        assert_eq!([third(0), third(1), third(2)], [3 + 2, 3 + 2, 4 + 3]);
        let unsharded = OptimizerShard { distributed: false, ..sharded(3, 1) };
        assert_eq!(unsharded.moment_elements([10, 7]), 17);
    }

    #[test]
    fn the_norm_adds_the_same_parts_with_and_without_sharding() {
        let unsharded = OptimizerShard { replicas: 3, replica: 2, distributed: false };
        let every: Vec<(usize, Range<usize>)> = unsharded.norm_parts(10).collect();
        assert_eq!(every, [(0, 0..3), (1, 3..6), (2, 6..10)]);
        let own: Vec<_> = (0..3).flat_map(|j| sharded(3, j).norm_parts(10).collect::<Vec<_>>()).collect();
        assert_eq!(own, every);
        assert_eq!((unsharded.norm_parts_per_gradient(), sharded(3, 0).norm_parts_per_gradient()), (3, 1));
        assert_eq!(unsharded.norm_key(4, 2), sharded(3, 0).norm_key(4, 2));
        assert_eq!(OptimizerShard::WHOLE.norm_parts(5).collect::<Vec<_>>(), [(0, 0..5)]);
    }
}
