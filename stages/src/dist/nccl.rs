//! The NCCL backend (features `cuda` and `mpi`): one process per GPU, tensors GPU to GPU
//! with no host copy. MPI launches the ranks and carries what is small or host-side: each
//! communicator's unique id, the tensor headers, and the byte collectives (losses,
//! reports, checkpoints).
//!
//! NEVER RUN ON A GPU: this file compiles and is lint-clean in CI; no machine with several
//! GPUs has been available to the project (the README's status table says what has run where).
//!
//! Deadlock freedom: an NCCL send waits on the GPU until its receive is posted, so a stream
//! that holds both directions could wait on itself (1F1B neighbours send to each other at
//! the same time). Activations and gradients therefore travel on two communicators, each
//! with its own stream: a rank's activation sends never queue behind its gradient
//! receives, or the reverse.
//!
//! Streams: a communicator's stream is not the device's, and the order between them is
//! explicit. A send's stream waits for the device's fence (the tensor's producer), and the
//! device's stream then waits for the send before the tensor is freed on it. A receive
//! buffer is allocated on the communicator's own stream (allocated on the device's, another
//! stream may not touch it before the device's stream reaches the allocation, and a fresh
//! slice's cudarc events, never recorded, would not say so), and the device's stream waits
//! for the receive before using it. A collective's stream waits for the device's fence (the
//! gradients, the copies' allocations) and the device's for it.
//!
//! Sums are deterministic and equal to the other backends': each member broadcasts its
//! tensor (one NCCL group), and every member adds the copies in member order on its GPU.
//!
//! The distributed timeout: every header and byte collective goes over MPI, whose waits
//! are bounded, and a tensor's header precedes its elements, so a peer that is gone before
//! a transfer is caught there. The NCCL operations themselves are enqueued on streams and
//! never waited for by the host here; the host waits for them before it reads the device
//! (`Collective::wait_for_device`), polling the device's fence up to the timeout, as
//! PyTorch's NCCL watchdog polls its work. The timeout so bounds the device's queued work,
//! its own kernels included (minutes, against a step's milliseconds to seconds). Past it,
//! the rank ends the run naming the peers of its communicators; dropping the communicators then aborts them (cudarc's `Comm` calls
//! `ncclCommAbort`), which releases the streams that wait on them.

use super::mpi::{MpiCollective, MpiWorld};
use super::wire::Reader;
use super::{member_part, poll_until, Collective, DistError, Group, Message, Topology, Transport};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut};
use cudarc::nccl::{Comm, Id};
use kernels::{Category, DType, Device, Fence, Storage, Tensor};
use schedules::Payload;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

fn nccl_error(what: &str, e: impl std::fmt::Debug) -> DistError {
    DistError::Protocol(format!("NCCL {what}: {e:?}"))
}

/// `comm`'s stream waits for everything `dev` has issued so far.
fn comm_after_device(comm: &Comm, dev: &dyn Device) -> Result<(), DistError> {
    match dev.fence() {
        Fence::Event(event) => comm.stream().wait(&event).map_err(|e| nccl_error("stream wait", e)),
        Fence::Done => Ok(()),
    }
}

/// `dev`'s stream waits for everything `comm` has issued so far.
fn device_after_comm(comm: &Comm, dev: &dyn Device) -> Result<(), DistError> {
    dev.wait_for(&Fence::after(&comm.stream()).map_err(|e| nccl_error("event", e))?);
    Ok(())
}

/// An NCCL communicator over `group`'s members, its unique id made by the first member
/// and handed to the others over MPI.
fn comm_over(mpi: &mut MpiCollective, group: Group, stream: Arc<CudaStream>) -> Result<Comm, DistError> {
    let (members, me) = mpi.topology().members_and_place(group, mpi.rank());
    let id = if me == 0 { Some(Id::new().map_err(|e| nccl_error("unique id", e))?) } else { None };
    let mine: Vec<u8> = id.map(|id| id.internal().iter().map(|&c| c as u8).collect()).unwrap_or_default();
    let all = mpi.all_gather(group, &mine)?;
    let bytes: [std::ffi::c_char; 128] =
        std::array::from_fn(|i| all[0].get(i).copied().unwrap_or(0) as std::ffi::c_char);
    Comm::from_rank(stream, me, members.len(), Id::uninit(bytes)).map_err(|e| nccl_error("communicator", e))
}

/// This rank's NCCL transport and collective on GPU `ordinal`.
pub fn endpoints(
    mpi: &MpiWorld,
    topology: Topology,
    ordinal: usize,
    timeout: Duration,
) -> Result<(NcclTransport, NcclCollective), DistError> {
    let (headers, mut bytes) = mpi.endpoints(topology, timeout);
    let ctx = CudaContext::new(ordinal).map_err(|e| nccl_error("context", e))?;
    let stream = || ctx.new_stream().map_err(|e| nccl_error("stream", e));
    let activations = comm_over(&mut bytes, Group::Pipeline, stream()?)?;
    let grads = comm_over(&mut bytes, Group::Pipeline, stream()?)?;
    let mut sums = HashMap::new();
    let holds_tied = topology.members(Group::TiedEmbedding, bytes.rank()).contains(&bytes.rank());
    // The groups tensors are summed over: the tensor-parallel one only where t > 1 (the
    // model-parallel group only gathers bytes, over MPI).
    for group in [Group::World, Group::Pipeline, Group::DataParallel, Group::TiedEmbedding, Group::Tensor] {
        let needed = match group {
            Group::TiedEmbedding => holds_tied,
            Group::Tensor => topology.tensor > 1,
            _ => true,
        };
        if needed {
            sums.insert(group, comm_over(&mut bytes, group, stream()?)?);
        }
    }
    Ok((NcclTransport { headers, activations, grads }, NcclCollective { bytes, sums, timeout }))
}

/// Point-to-point tensors: the header over MPI, the elements over NCCL.
pub struct NcclTransport {
    headers: super::mpi::MpiTransport,
    activations: Comm,
    grads: Comm,
}

// SAFETY (both): an NCCL communicator may be used from any thread as long as calls on it do
// not overlap; each value has one owner at a time, and MPI runs with MPI_THREAD_MULTIPLE.
unsafe impl Send for NcclTransport {}
unsafe impl Send for NcclCollective {}

/// A GPU tensor's elements as bytes, which is how a tensor crosses whatever its dtype
/// (NCCL has no bf16 type in cudarc): a message's, or a sum's operand.
fn bytes(t: &Tensor) -> CudaView<'_, u8> {
    let n = t.bytes();
    // SAFETY: a view of the same allocation's first `n` bytes (the elements: messages and
    // gradients are never parameters, which alone have a bf16 copy), read-only, as bytes.
    let view = match t.storage() {
        Storage::Cuda(s) => unsafe { s.transmute::<u8>(n) },
        Storage::CudaBf16(s) => unsafe { s.transmute::<u8>(n) },
        _ => None,
    };
    view.unwrap_or_else(|| panic!("nccl: {t:?} is not on a GPU (or is a parameter)"))
}

fn bytes_mut(t: &mut Tensor) -> CudaViewMut<'_, u8> {
    let n = t.bytes();
    // SAFETY: as `bytes`; the receive writes every byte.
    let view = match t.storage_mut() {
        Storage::Cuda(s) => unsafe { s.transmute_mut::<u8>(n) },
        Storage::CudaBf16(s) => unsafe { s.transmute_mut::<u8>(n) },
        _ => None,
    };
    view.expect("nccl: a tensor NCCL writes is on a GPU")
}

/// Broadcasts elements `part` of `t` from member `root` of `comm` into every member's `t`:
/// a plain tensor's elements (f32 or bf16); a parameter's bf16 copy, and its fp32 master
/// where the master is whole (a master sharded to the member's own part takes no other).
fn broadcast_part(comm: &Comm, t: &mut Tensor, part: Range<usize>, root: i32) -> Result<(), DistError> {
    let len = t.len();
    match t.storage_mut() {
        Storage::Cuda(s) => broadcast_range(comm, s, part, root),
        Storage::CudaBf16(s) => broadcast_range(comm, s, part, root),
        Storage::CudaMaster { master, bf16, part: held } => {
            if held.len() == len {
                broadcast_range(comm, master, part.clone(), root)?;
            }
            broadcast_range(comm, bf16, part, root)
        }
        _ => panic!("nccl: a parameter {t:?} that is not on a GPU"),
    }
}

/// Broadcasts elements `range` of `s` from member `root` of `comm`, as bytes.
fn broadcast_range<T>(
    comm: &Comm,
    s: &mut CudaSlice<T>,
    range: Range<usize>,
    root: i32,
) -> Result<(), DistError> {
    if range.is_empty() {
        return Ok(());
    }
    let n = range.len() * std::mem::size_of::<T>();
    let mut view = s.slice_mut(range);
    // SAFETY: the view's own bytes, as bytes.
    let mut bytes = unsafe { view.transmute_mut::<u8>(n) }.expect("a view's own bytes");
    comm.broadcast_in_place(&mut bytes, root).map(|_| ()).map_err(|e| nccl_error("broadcast", e))
}

impl NcclTransport {
    fn comm(&self, payload: Payload) -> &Comm {
        match payload {
            Payload::Activation => &self.activations,
            Payload::Grad => &self.grads,
        }
    }
}

impl Transport for NcclTransport {
    fn send(&mut self, to: usize, payload: Payload, msg: Message, dev: &dyn Device) -> Result<(), DistError> {
        let header = super::mpi::header(msg.virtual_stage, msg.microbatch, &msg.tensor);
        self.headers.send_bytes(to, payload, header.0);
        let comm = self.comm(payload);
        comm_after_device(comm, dev)?;
        comm.send(&bytes(&msg.tensor), to as i32).map_err(|e| nccl_error("send", e))?;
        // The tensor is freed on the device's stream when `msg` drops: after the send.
        device_after_comm(comm, dev)
    }

    fn recv(&mut self, from: usize, payload: Payload, dev: &dyn Device) -> Result<Message, DistError> {
        let bytes = self.headers.recv_bytes(from, payload)?;
        let (virtual_stage, microbatch, shape, dtype) = super::mpi::read_header(&mut Reader(&bytes))?;
        let comm = self.comm(payload);
        // The buffer is allocated on the communicator's stream, so the receive follows its
        // allocation without waiting for the device: waiting for the device's fence would
        // tie this receive to the device's earlier waits on its own sends, and through the
        // peers' sends, close a cycle.
        let len = shape.iter().product::<usize>().max(1);
        // SAFETY (both): no invalid bit patterns, and the receive writes every element.
        let storage = match dtype {
            DType::F32 => unsafe { comm.stream().alloc::<f32>(len) }.map(Storage::Cuda),
            DType::Bf16 => unsafe { comm.stream().alloc::<u16>(len) }.map(Storage::CudaBf16),
        };
        let storage = storage.map_err(|e| nccl_error("alloc", e))?;
        let mut tensor = Tensor::new(&shape, storage, Category::Transfer, dev.ledger().clone());
        comm.recv(&mut bytes_mut(&mut tensor), from as i32).map_err(|e| nccl_error("recv", e))?;
        // The device adopts the buffer: its stream waits for the receive, and frees the
        // buffer after its own last use of it, which the communicator's stream cannot see.
        let received = Fence::after(&comm.stream()).map_err(|e| nccl_error("event", e))?;
        let tensor = dev.adopt(tensor.detach(received), Category::Transfer);
        Ok(Message { virtual_stage, microbatch, tensor })
    }

    /// The headers' sends; the elements' are the streams' (see the module's note).
    fn complete_sends(&mut self) -> Result<(), DistError> {
        self.headers.complete_sends()
    }
}

/// Byte collectives over MPI; tensor sums over NCCL.
pub struct NcclCollective {
    bytes: MpiCollective,
    sums: HashMap<Group, Comm>,
    timeout: Duration,
}

impl NcclCollective {
    /// The ranks this rank's communicators connect it to: its pipeline (the transport's
    /// peers) and every group it sums over, in rank order.
    fn peers(&self) -> Vec<usize> {
        let (topology, me) = (self.bytes.topology(), self.bytes.rank());
        let mut peers: Vec<usize> = (self.sums.keys().chain([&Group::Pipeline]))
            .flat_map(|&g| topology.members(g, me))
            .filter(|&r| r != me)
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }

    /// Each member broadcasts its part ([`member_part`]) of `t` into every member's, in
    /// place, on the GPU (one NCCL group): no arithmetic, so the bits are the host gather's.
    fn gather_by_broadcasts(&self, group: Group, t: &mut Tensor, dev: &dyn Device) -> Result<(), DistError> {
        let comm = self.sums.get(&group).expect("a communicator for each of this rank's groups");
        let n = comm.world_size();
        if n == 1 {
            return Ok(());
        }
        comm_after_device(comm, dev)?;
        {
            let _group = comm.group();
            for root in 0..n {
                broadcast_part(comm, t, member_part(t.len(), n, root), root as i32)?;
            }
        }
        device_after_comm(comm, dev)
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.bytes.rank()
    }

    fn topology(&self) -> Topology {
        self.bytes.topology()
    }

    fn all_gather(&mut self, group: Group, bytes: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        self.bytes.all_gather(group, bytes)
    }

    fn all_reduce_sum(&mut self, group: Group, t: &mut Tensor, dev: &dyn Device) -> Result<(), DistError> {
        let comm = self.sums.get(&group).expect("a communicator for each of this rank's groups");
        let n = comm.world_size();
        if n == 1 {
            return Ok(());
        }
        let me = comm.rank();
        // Every other member's copy of the tensor, broadcast by that member.
        let mut copies: Vec<Option<Tensor>> = (0..n)
            .map(|i| (i != me).then(|| dev.empty_of(t.dtype(), t.shape(), Category::Workspace)))
            .collect();
        comm_after_device(comm, dev)?;
        {
            let _group = comm.group();
            for (i, copy) in copies.iter_mut().enumerate() {
                let mut buffer = match copy {
                    Some(c) => bytes_mut(c),
                    None => bytes_mut(t),
                };
                comm.broadcast_in_place(&mut buffer, i as i32).map_err(|e| nccl_error("broadcast", e))?;
            }
        }
        device_after_comm(comm, dev)?;
        // ((t0 + t1) + t2) + ... in member order, as every backend adds, into member 0's
        // copy (t itself on member 0): no accumulator beside the copies.
        match copies[0].take() {
            None => {
                for copy in copies.iter().flatten() {
                    dev.accumulate(t, copy);
                }
            }
            Some(mut acc) => {
                for copy in &copies[1..] {
                    dev.accumulate(&mut acc, copy.as_ref().unwrap_or(t));
                }
                dev.copy(t, &acc);
            }
        }
        Ok(())
    }

    fn all_gather_param(&mut self, group: Group, t: &mut Tensor, dev: &dyn Device) -> Result<(), DistError> {
        self.gather_by_broadcasts(group, t, dev)
    }

    fn all_gather_activation(
        &mut self,
        group: Group,
        t: &mut Tensor,
        dev: &dyn Device,
    ) -> Result<(), DistError> {
        self.gather_by_broadcasts(group, t, dev)
    }

    fn gather(&mut self, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>, DistError> {
        self.bytes.gather(bytes)
    }

    fn scatter(&mut self, parts: Option<Vec<Vec<u8>>>) -> Result<Vec<u8>, DistError> {
        self.bytes.scatter(parts)
    }

    /// Polls the device's fence, which follows every transfer the device waits on. A
    /// device error counts as done: the read that follows reports it.
    fn wait_for_device(&mut self, dev: &dyn Device) -> Result<(), DistError> {
        let Fence::Event(event) = dev.fence() else { return Ok(()) };
        match poll_until(self.timeout, || (event.try_is_complete() != Ok(false)).then_some(())) {
            Some(()) => Ok(()),
            None => {
                let peers = self.peers();
                Err(DistError::Timeout {
                    what: format!(
                        "the GPU's queued work, NCCL transfers with {} included, did not complete",
                        self.bytes.topology().describe(&peers)
                    ),
                    timeout: self.timeout,
                })
            }
        }
    }
}
