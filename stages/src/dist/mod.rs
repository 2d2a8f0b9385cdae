//! Every crossing between ranks, behind two interfaces:
//!
//! - a [`Transport`] moves the point-to-point tensors of the lowered action lists (one
//!   stage's activation to the next, a gradient back);
//! - a [`Collective`] does everything after the lists: the tied-embedding gradient sum, the
//!   data-parallel gradient reduction, the global grad norm, losses and reports to rank 0,
//!   checkpoint gather and scatter, and evaluation's losses.
//!
//! A backend implements both, in one file: [`threads`] (every rank a thread of one process,
//! the embedded default), `mpi` (feature `mpi`: a rank per process, across machines) and
//! `nccl` (feature `cuda`: GPU to GPU, bootstrapped over MPI). Ranks follow Megatron's
//! default order, tensor fastest and pipeline slowest: `rank = tp_rank + t * (dp_rank + dp *
//! pp_rank)` ([`Topology`]).
//!
//! Every wait on a peer — a receive, a send's completion, a collective — is bounded by the
//! distributed timeout (Megatron's `distributed_timeout_minutes`): past it, the wait ends in
//! [`DistError::Timeout`], naming the peers it waited for, and the rank ends the run.

#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(all(feature = "cuda", feature = "mpi"))]
pub mod nccl;
mod tensor_group;
pub mod threads;
mod wire;

use kernels::{Category, Device, Tensor};
use schedules::{Payload, Placement};
use std::time::{Duration, Instant};

pub use tensor_group::{own_part, TensorGroup};
pub use wire::{decode_tensors, encode_tensors, NamedTensor, Reader, Writer};

/// How the world's ranks are laid out: `pipeline` stages, each replicated `data` times and
/// each replica's stage split over `tensor` ranks, with the schedule's placement of virtual
/// stages (which decides who holds the tied embedding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    pub tensor: usize,
    pub pipeline: usize,
    pub data: usize,
    pub placement: Placement,
}

/// A set of ranks that a collective runs over, named from one member's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Group {
    /// Every rank.
    World,
    /// The stages of this rank's replica, in stage order (its own tensor rank of each).
    Pipeline,
    /// This stage's replicas, in replica order (its own tensor rank of each).
    DataParallel,
    /// The stages of this rank's replica holding the first and the last virtual stage: the
    /// two holders of the tied embedding (one rank when they are the same stage: p = 1, or
    /// stage 0 of a V placement), its own tensor rank of each: they hold the same shard.
    TiedEmbedding,
    /// The t ranks that share this stage of this replica, in tensor rank order.
    Tensor,
    /// Every stage and tensor rank of this replica: the ranks that hold one whole model.
    ModelParallel,
}

impl std::fmt::Display for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Group::World => "the world",
            Group::Pipeline => "the pipeline",
            Group::DataParallel => "the data-parallel group",
            Group::TiedEmbedding => "the tied embedding's holders",
            Group::Tensor => "the tensor-parallel group",
            Group::ModelParallel => "the model-parallel group",
        })
    }
}

impl Topology {
    pub fn world(&self) -> usize {
        self.tensor * self.pipeline * self.data
    }

    /// The rank of tensor rank `tensor` of `stage` in `replica`.
    pub fn rank(&self, stage: usize, replica: usize, tensor: usize) -> usize {
        tensor + self.tensor * (replica + self.data * stage)
    }

    pub fn stage_of(&self, rank: usize) -> usize {
        rank / (self.tensor * self.data)
    }

    pub fn replica_of(&self, rank: usize) -> usize {
        rank / self.tensor % self.data
    }

    pub fn tensor_of(&self, rank: usize) -> usize {
        rank % self.tensor
    }

    /// The rank that holds `stage` in `rank`'s replica and tensor slot: its pipeline peer.
    pub fn peer(&self, rank: usize, stage: usize) -> usize {
        self.rank(stage, self.replica_of(rank), self.tensor_of(rank))
    }

    /// [`Topology::members`], and `rank`'s place among them.
    pub fn members_and_place(&self, group: Group, rank: usize) -> (Vec<usize>, usize) {
        let members = self.members(group, rank);
        let place = members.iter().position(|&m| m == rank).expect("a rank is in its own groups");
        (members, place)
    }

    /// The members of `group` as seen from `rank`, in the order collectives combine them.
    pub fn members(&self, group: Group, rank: usize) -> Vec<usize> {
        let (stage, replica, tensor) = (self.stage_of(rank), self.replica_of(rank), self.tensor_of(rank));
        match group {
            Group::World => (0..self.world()).collect(),
            Group::Pipeline => (0..self.pipeline).map(|s| self.rank(s, replica, tensor)).collect(),
            Group::DataParallel => (0..self.data).map(|r| self.rank(stage, r, tensor)).collect(),
            Group::TiedEmbedding => {
                let last = match self.placement {
                    Placement::V => 0,
                    Placement::Interleaved => self.pipeline - 1,
                };
                let mut ends = vec![self.rank(0, replica, tensor), self.rank(last, replica, tensor)];
                ends.dedup();
                ends
            }
            Group::Tensor => (0..self.tensor).map(|t| self.rank(stage, replica, t)).collect(),
            Group::ModelParallel => (0..self.pipeline)
                .flat_map(|s| (0..self.tensor).map(move |t| (s, t)))
                .map(|(s, t)| self.rank(s, replica, t))
                .collect(),
        }
    }

    /// `ranks` as an error names them: "rank 1 (stage 1)", "ranks 1 (stage 0, replica 1), 3
    /// (stage 1, replica 1)", "rank 5 (stage 1, tensor rank 1)".
    pub fn describe(&self, ranks: &[usize]) -> String {
        let one = |r: usize| {
            let mut at = vec![format!("stage {}", self.stage_of(r))];
            if self.data > 1 {
                at.push(format!("replica {}", self.replica_of(r)));
            }
            if self.tensor > 1 {
                at.push(format!("tensor rank {}", self.tensor_of(r)));
            }
            format!("{r} ({})", at.join(", "))
        };
        let list: Vec<String> = ranks.iter().map(|&r| one(r)).collect();
        format!("rank{} {}", if ranks.len() == 1 { "" } else { "s" }, list.join(", "))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DistError {
    /// The peer is gone: it stopped (failed) before this crossing could happen.
    #[error("rank {peer} stopped before the transfer")]
    PeerStopped { peer: usize },
    #[error("no {payload:?} channel between stage {from} and stage {to}")]
    NoChannel { from: usize, to: usize, payload: Payload },
    /// A message that is not what the protocol expects (a bug, or mismatched binaries).
    #[error("{0}")]
    Protocol(String),
    /// A wait on peers that did not end within the distributed timeout; `what` names the
    /// peers and what they did not do.
    #[error("{what} within {} s (distributed_timeout_minutes)", .timeout.as_secs_f64())]
    Timeout { what: String, timeout: Duration },
}

/// Polls `ready` until it gives a value, or gives None once `timeout` has passed. A wait
/// yields the core, then naps: with more ranks than cores, a waiting rank must not take the
/// core its peer computes on. The clock is read only once a wait has begun, and then every
/// 64 polls, so a wait that ends at once costs one poll.
fn poll_until<T>(timeout: Duration, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
    if let Some(x) = ready() {
        return Some(x);
    }
    let start = Instant::now();
    let mut polls = 0u32;
    loop {
        polls = polls.wrapping_add(1);
        if polls < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
        if let Some(x) = ready() {
            return Some(x);
        }
        if polls.is_multiple_of(64) && start.elapsed() >= timeout {
            return None;
        }
    }
}

/// A tensor in flight, tagged with what it is so the receiver can check it got the right one.
#[derive(Debug)]
pub struct Message {
    /// The virtual stage that sent it.
    pub virtual_stage: usize,
    pub microbatch: usize,
    pub tensor: Tensor,
}

/// One stage's ends of the point-to-point channels of its replica. `to` and `from` are
/// pipeline stages, as the action lists name them. Each (peer, payload) is a FIFO channel;
/// a send never waits for its receive beyond the buffering the lowered lists were proven
/// to complete with, so no schedule can deadlock.
pub trait Transport: Send {
    /// Sends `msg`, whose tensor lives on `dev`.
    fn send(&mut self, to: usize, payload: Payload, msg: Message, dev: &dyn Device) -> Result<(), DistError>;
    /// The next message from `from` on `payload`, its tensor on `dev`.
    fn recv(&mut self, from: usize, payload: Payload, dev: &dyn Device) -> Result<Message, DistError>;
    /// Waits until every message sent has been taken by its peer (a backend whose sends
    /// complete as they return has nothing to wait for): the last wait before the process
    /// may end. A rank that fails does not wait; its sends are abandoned.
    fn complete_sends(&mut self) -> Result<(), DistError>;
}

/// Collective operations among the ranks of a [`Group`]. Every member calls the same
/// operations in the same order. Results combine members in group order, so they are the
/// same bits on every member, on every backend, run after run.
pub trait Collective: Send {
    fn rank(&self) -> usize;
    fn topology(&self) -> Topology;
    /// Every member's bytes, in member order, at every member.
    fn all_gather(&mut self, group: Group, bytes: &[u8]) -> Result<Vec<Vec<u8>>, DistError>;
    /// Every member's `part`, concatenated in member order, at every member: the whole of
    /// something cut into [`member_part`]s.
    fn all_gather_parts(&mut self, group: Group, part: &[f32]) -> Result<Vec<f32>, DistError> {
        let mut w = Writer::default();
        w.f32s(part);
        let mut whole = Vec::new();
        for bytes in self.all_gather(group, &w.0)? {
            whole.extend(Reader(&bytes).f32s()?);
        }
        Ok(whole)
    }
    /// Replaces `t` on every member by the members' elementwise sum, added in member order:
    /// ((t0 + t1) + t2) + ...
    fn all_reduce_sum(&mut self, group: Group, t: &mut Tensor, dev: &dyn Device) -> Result<(), DistError>;
    /// Makes parameter `t` whole on every member from each member's part ([`member_part`] of
    /// its elements, the part it stepped), in member order: the distributed optimizer's
    /// gather after the step. By default through the host: the part downloaded, gathered as
    /// bytes, the whole written back ([`Device::write_at`], so a master sharded to its part
    /// keeps that part and its bf16 copy takes the whole).
    fn all_gather_param(&mut self, group: Group, t: &mut Tensor, dev: &dyn Device) -> Result<(), DistError> {
        let (members, me) = self.topology().members_and_place(group, self.rank());
        let part = dev.to_host_part(t, member_part(t.len(), members.len(), me));
        let whole = self.all_gather_parts(group, &part)?;
        dev.write_at(t, 0, &whole);
        Ok(())
    }
    /// Makes activation `t` whole on every member from each member's part ([`member_part`]
    /// of its elements, which this member has written), in member order: sequence
    /// parallelism's all-gather, and distributed saves'. By default through the host: the
    /// part downloaded, gathered as f32, the whole uploaded in `t`'s dtype. The threads and
    /// NCCL backends move the parts on the device.
    fn all_gather_activation(
        &mut self,
        group: Group,
        t: &mut Tensor,
        dev: &dyn Device,
    ) -> Result<(), DistError> {
        let (members, me) = self.topology().members_and_place(group, self.rank());
        let part = dev.to_host_part(t, member_part(t.len(), members.len(), me));
        let whole = self.all_gather_parts(group, &part)?;
        dev.copy(t, &dev.from_host_of(t.dtype(), &whole, t.shape(), Category::Workspace));
        Ok(())
    }
    /// Leaves in `t`, at this member's part ([`member_part`]), that part of the members'
    /// elementwise sum, added in member order as [`Collective::all_reduce_sum`] adds; the
    /// rest of `t` is unspecified. By default the all-reduce's sum, on the device: the same
    /// bits, twice a reduce-scatter's bytes where there is a wire. MPI moves the parts alone,
    /// through the host (`t` f32: gradients, and the CPU's activations).
    fn reduce_scatter_sum(
        &mut self,
        group: Group,
        t: &mut Tensor,
        dev: &dyn Device,
    ) -> Result<(), DistError> {
        self.all_reduce_sum(group, t, dev)
    }
    /// Rank 0 receives every rank's bytes in rank order; the others get None.
    fn gather(&mut self, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>, DistError>;
    /// Rank 0 hands each rank its part (`parts`, one per rank, given on rank 0 only).
    fn scatter(&mut self, parts: Option<Vec<Vec<u8>>>) -> Result<Vec<u8>, DistError>;
    /// Waits, up to the distributed timeout, until `dev` has done the work issued to it,
    /// transfers with peers included: the wait before the host reads the device. A backend
    /// whose transfers run on the device's streams (NCCL) leaves them to the device, so
    /// without this a peer that stops answering would hold that read forever; the others'
    /// transfers are bounded where they cross, and leave nothing to wait for here.
    fn wait_for_device(&mut self, dev: &dyn Device) -> Result<(), DistError> {
        let _ = dev;
        Ok(())
    }
}

/// Member `j`'s part of a tensor of `len` elements among `n` members, as reduce-scatters
/// hand them out: elements j * len / n .. (j + 1) * len / n.
pub fn member_part(len: usize, n: usize, j: usize) -> std::ops::Range<usize> {
    j * len / n..(j + 1) * len / n
}

/// Elementwise sum in member order of equally long host vectors: what every backend's
/// [`Collective::all_reduce_sum`] computes, here once so all give the same bits.
pub fn sum_in_order<'a>(parts: impl IntoIterator<Item = &'a [f32]>) -> Vec<f32> {
    let mut parts = parts.into_iter();
    let mut acc = parts.next().expect("a group has at least one member").to_vec();
    for p in parts {
        assert_eq!(p.len(), acc.len(), "all_reduce_sum: members hold different sizes");
        for (a, x) in acc.iter_mut().zip(p) {
            *a += x;
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_rank_order_with_pipeline_outermost() {
        let t = Topology { tensor: 1, pipeline: 3, data: 2, placement: Placement::Interleaved };
        assert_eq!(t.world(), 6);
        assert_eq!(t.rank(0, 1, 0), 1);
        assert_eq!(t.rank(2, 0, 0), 4);
        assert_eq!((t.stage_of(5), t.replica_of(5)), (2, 1));
        assert_eq!(t.members(Group::Pipeline, 3), vec![1, 3, 5]);
        assert_eq!(t.members(Group::DataParallel, 3), vec![2, 3]);
        assert_eq!(t.members(Group::TiedEmbedding, 2), vec![0, 4]);
        assert_eq!(t.members(Group::World, 0), (0..6).collect::<Vec<_>>());
        let single = Topology { tensor: 1, pipeline: 1, data: 2, placement: Placement::Interleaved };
        assert_eq!(single.members(Group::TiedEmbedding, 1), vec![1]);
        // A V holds the embedding and the head both on stage 0.
        let v = Topology { tensor: 1, pipeline: 3, data: 2, placement: Placement::V };
        assert_eq!(v.members(Group::TiedEmbedding, 5), vec![1]);
        assert_eq!(t.describe(&[3]), "rank 3 (stage 1, replica 1)");
        assert_eq!(t.describe(&[0, 4]), "ranks 0 (stage 0, replica 0), 4 (stage 2, replica 0)");
        let p2 = Topology { tensor: 1, pipeline: 2, data: 1, placement: Placement::Interleaved };
        assert_eq!(p2.describe(&[1]), "rank 1 (stage 1)");
    }

    /// Megatron's order with t = 2, p = 2, dp = 2: tensor ranks fastest, then replicas, then
    /// stages.
    #[test]
    fn tensor_ranks_are_fastest() {
        let t = Topology { tensor: 2, pipeline: 2, data: 2, placement: Placement::Interleaved };
        assert_eq!(t.world(), 8);
        assert_eq!(t.rank(1, 0, 1), 5);
        assert_eq!((t.stage_of(5), t.replica_of(5), t.tensor_of(5)), (1, 0, 1));
        assert_eq!((t.stage_of(6), t.replica_of(6), t.tensor_of(6)), (1, 1, 0));
        assert_eq!(t.members(Group::Tensor, 6), vec![6, 7]);
        assert_eq!(t.members(Group::Pipeline, 3), vec![3, 7]);
        assert_eq!(t.members(Group::DataParallel, 5), vec![5, 7]);
        assert_eq!(t.members(Group::TiedEmbedding, 1), vec![1, 5]);
        assert_eq!(t.members(Group::ModelParallel, 2), vec![2, 3, 6, 7]);
        assert_eq!(t.peer(7, 0), 3);
        assert_eq!(t.describe(&[7]), "rank 7 (stage 1, replica 1, tensor rank 1)");
    }

    #[test]
    fn a_poll_gives_up_after_the_timeout_and_not_before() {
        let start = Instant::now();
        assert_eq!(poll_until(Duration::from_millis(30), || None::<()>), None);
        assert!(start.elapsed() >= Duration::from_millis(30));
        let mut polls = 0;
        let got = poll_until(Duration::from_secs(60), || {
            polls += 1;
            (polls == 100).then_some(polls)
        });
        assert_eq!(got, Some(100));
    }

    #[test]
    fn sums_in_member_order() {
        // (1e8 + 1) - 1e8 is 0 in f32 and 1 in the other order: the order is the contract.
        let (a, b, c) = ([1e8f32], [1.0f32], [-1e8f32]);
        assert_eq!(sum_in_order([&a[..], &b[..], &c[..]]), vec![0.0]);
        assert_eq!(sum_in_order([&a[..], &c[..], &b[..]]), vec![1.0]);
    }
}
