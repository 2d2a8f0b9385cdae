//! The MPI backend (feature `mpi`): a rank per process, across processes and machines,
//! launched by `mpirun` or Slurm's `srun` on the system's OpenMPI.
//!
//! Point-to-point tensors go as one message each (a small header, then the elements) with
//! non-blocking sends, so a send never waits for its receive: the lowered lists, proven to
//! complete with bounded FIFO channels, complete here too, and a 1F1B neighbour that sends
//! while its peer sends cannot deadlock. Each (sender, payload) pair is its own tag, and
//! MPI keeps messages of one tag in order. Collectives run on communicators split by
//! [`Group`]; sums are taken in member order by [`sum_in_order`], as on every backend.
//!
//! A rank that dies takes the job with it: OpenMPI's launcher ends every rank and names
//! the one that failed. A rank that fails with an error calls `MPI_Abort` after printing it.
//!
//! No wait blocks in MPI: receives probe and then receive without blocking, sends and
//! collectives are non-blocking (`MPI_Isend`, `MPI_Iallgatherv`, `MPI_Ialltoallv`), and each
//! request is polled with `MPI_Test` (yielding the core between polls, reading the clock
//! only every 64 polls) until it completes or the distributed timeout passes. A request
//! that times out is abandoned to MPI with the buffers it writes (they are leaked, never
//! freed), as the rank ends the job next. What is not bounded: the communicators' creation
//! at the start (`MPI_Comm_split`, blocking, before any step) and `MPI_Finalize` at the end.

use super::wire::{Reader, Writer};
use super::{
    member_part, poll_until, sum_in_order, Collective, DistError, Group, Message, Topology, Transport,
};
use kernels::{Category, DType, Device, Tensor};
use mpi::datatype::{Partition, PartitionMut};
use mpi::request::{Request, Scope, StaticScope};
use mpi::topology::{Color, Communicator, SimpleCommunicator};
use mpi::traits::*;
use mpi::Count;
use schedules::Payload;
use std::time::Duration;

/// MPI's message sizes are C ints: larger transfers go in pieces of this many bytes.
const PIECE: usize = 1 << 30;

/// This process's place in an MPI job. Dropping it finalises MPI, so it must outlive the
/// rank's transport and collective.
pub struct MpiWorld {
    universe: mpi::environment::Universe,
    /// Ranks on this machine (for sharing its cores).
    pub local_ranks: usize,
}

impl MpiWorld {
    /// Initialises MPI with full thread support, so a rank's handles may move to the thread
    /// that runs it.
    pub fn init() -> Result<MpiWorld, String> {
        let (universe, level) =
            mpi::initialize_with_threading(mpi::Threading::Multiple).ok_or("MPI was already initialised")?;
        if level != mpi::Threading::Multiple {
            return Err(format!(
                "this MPI library offers thread support {level:?}, and pipetrain needs Multiple"
            ));
        }
        let local_ranks = universe.world().split_shared(0).size() as usize;
        Ok(MpiWorld { universe, local_ranks })
    }

    pub fn rank(&self) -> usize {
        self.universe.world().rank() as usize
    }

    pub fn size(&self) -> usize {
        self.universe.world().size() as usize
    }

    /// Ends every rank of the job (after this rank has said why).
    pub fn abort(&self, code: i32) -> ! {
        self.universe.world().abort(code)
    }

    /// This rank's transport and collective for `topology` (world = its size), none of
    /// whose waits on a peer lasts longer than `timeout`.
    pub fn endpoints(&self, topology: Topology, timeout: Duration) -> (MpiTransport, MpiCollective) {
        let world = self.universe.world();
        let rank = world.rank() as usize;
        assert_eq!(topology.world(), world.size() as usize, "the topology covers the whole job");
        let (stage, replica, tensor) =
            (topology.stage_of(rank), topology.replica_of(rank), topology.tensor_of(rank));
        let t = topology.tensor;
        // Every rank takes part in every split, in the same order.
        let split = |color: Option<usize>, key: usize| {
            let color = color.map_or_else(Color::undefined, |c| Color::with_value(c as i32));
            world.split_by_color_with_key(color, key as i32)
        };
        let pipeline = split(Some(replica * t + tensor), stage).expect("every rank is in a pipeline");
        let data = split(Some(stage * t + tensor), replica).expect("every rank is in a data-parallel group");
        let tensor_group =
            split(Some(stage * topology.data + replica), tensor).expect("every rank is in a tensor group");
        let model =
            split(Some(replica), stage * t + tensor).expect("every rank is in a model-parallel group");
        // The holders as the topology names them: under a V placement the last chunk is on
        // stage 0 too, and the last stage holds no copy.
        let holds_tied = topology.members(Group::TiedEmbedding, rank).contains(&rank);
        let tied = split(holds_tied.then_some(replica * t + tensor), stage);
        let transport =
            MpiTransport { comm: world.duplicate(), topology, rank, timeout, pending: Vec::new() };
        let collective = MpiCollective {
            world: world.duplicate(),
            pipeline,
            data,
            tied,
            tensor: tensor_group,
            model,
            topology,
            rank,
            timeout,
        };
        (transport, collective)
    }
}

/// Polls `request` until it completes (true) or `timeout` passes (false). A request that
/// times out is abandoned: unregistered from its scope and left to MPI, never freed. The
/// caller then leaks the buffers it writes (`mem::forget`), which MPI may still fill. The
/// buffers it only reads are the caller's; MPI reads them only inside an MPI call, and
/// after a timeout the rank makes none before `MPI_Abort` but freeing its communicators.
fn complete<'a, D: ?Sized, S: Scope<'a>>(request: Request<'a, D, S>, timeout: Duration) -> bool {
    let mut pending = Some(request);
    let done = poll_until(timeout, || match pending.take().expect("polled until it completes").test() {
        Ok(_) => Some(()),
        Err(request) => {
            pending = Some(request);
            None
        }
    });
    if let Some(request) = pending {
        // SAFETY: the request is never used again, and its buffers are leaked by the caller.
        let _ = unsafe { request.into_raw() };
    }
    done.is_some()
}

/// The next message from `source` with `tag` on `comm`, as bytes, within `timeout` (None
/// past it); `idle` runs between polls for it.
fn receive(
    comm: &SimpleCommunicator,
    source: usize,
    tag: i32,
    timeout: Duration,
    mut idle: impl FnMut(),
) -> Option<Vec<u8>> {
    let process = comm.process_at_rank(source as i32);
    let (message, status) = poll_until(timeout, || {
        let matched = process.immediate_matched_probe_with_tag(tag);
        if matched.is_none() {
            idle();
        }
        matched
    })?;
    // A message of any size arrives in pieces, and its receive is polled like the probe.
    let mut bytes = vec![0u8; status.count(u8::equivalent_datatype()) as usize];
    let done =
        mpi::request::scope(|s| complete(message.immediate_matched_receive_into(s, &mut bytes[..]), timeout));
    if !done {
        std::mem::forget(bytes);
        return None;
    }
    Some(bytes)
}

/// A send in progress to `to` and the buffer it reads, freed once the request completes.
struct PendingSend {
    to: usize,
    request: Request<'static, [u8], StaticScope>,
    buffer: *mut [u8],
}

impl PendingSend {
    fn start(comm: &SimpleCommunicator, to: usize, tag: i32, bytes: Vec<u8>) -> PendingSend {
        let buffer: &'static mut [u8] = Box::leak(bytes.into_boxed_slice());
        let ptr: *mut [u8] = buffer;
        let request = comm.process_at_rank(to as i32).immediate_send_with_tag(StaticScope, &*buffer, tag);
        PendingSend { to, request, buffer: ptr }
    }

    /// Frees the buffer if the send is done; gives the send back if not.
    fn test(self) -> Option<PendingSend> {
        let PendingSend { to, request, buffer } = self;
        match request.test() {
            Ok(_) => {
                // SAFETY: the request completed, so MPI no longer reads the buffer, and it
                // came from `Box::leak` in `start`.
                drop(unsafe { Box::from_raw(buffer) });
                None
            }
            Err(request) => Some(PendingSend { to, request, buffer }),
        }
    }
}

/// Frees the buffers of the sends that are done; keeps the others.
fn reap(pending: &mut Vec<PendingSend>) {
    *pending = std::mem::take(pending).into_iter().filter_map(PendingSend::test).collect();
}

// SAFETY (both): MPI runs with MPI_THREAD_MULTIPLE (checked in `init`), under which its
// handles may be used from any thread; each value has one owner at a time.
unsafe impl Send for MpiTransport {}
unsafe impl Send for MpiCollective {}

/// One rank's point-to-point channels to the other stages of its replica (its own tensor
/// rank of each).
pub struct MpiTransport {
    comm: SimpleCommunicator,
    topology: Topology,
    rank: usize,
    timeout: Duration,
    pending: Vec<PendingSend>,
}

fn tag(payload: Payload) -> i32 {
    match payload {
        Payload::Activation => 0,
        Payload::Grad => 1,
    }
}

impl MpiTransport {
    /// Sends `bytes` to stage `to` of this replica, without waiting for the receive.
    pub(super) fn send_bytes(&mut self, to: usize, payload: Payload, bytes: Vec<u8>) {
        reap(&mut self.pending);
        let dest = self.topology.peer(self.rank, to);
        self.pending.push(PendingSend::start(&self.comm, dest, tag(payload), bytes));
    }

    /// The next message from stage `from` of this replica; the sends in flight are reaped
    /// while it waits.
    pub(super) fn recv_bytes(&mut self, from: usize, payload: Payload) -> Result<Vec<u8>, DistError> {
        let source = self.topology.peer(self.rank, from);
        let pending = &mut self.pending;
        receive(&self.comm, source, tag(payload), self.timeout, || reap(pending)).ok_or_else(|| {
            DistError::Timeout {
                what: format!("{} sent nothing", self.topology.describe(&[source])),
                timeout: self.timeout,
            }
        })
    }
}

impl Transport for MpiTransport {
    fn send(&mut self, to: usize, payload: Payload, msg: Message, dev: &dyn Device) -> Result<(), DistError> {
        let mut w = header(msg.virtual_stage, msg.microbatch, &msg.tensor);
        // bf16 crosses as f32 (exact both ways): the host path has one element format.
        w.f32s(&dev.to_host(&msg.tensor));
        drop(msg.tensor);
        self.send_bytes(to, payload, w.0);
        Ok(())
    }

    fn recv(&mut self, from: usize, payload: Payload, dev: &dyn Device) -> Result<Message, DistError> {
        let bytes = self.recv_bytes(from, payload)?;
        let mut r = Reader(&bytes);
        let (virtual_stage, microbatch, shape, dtype) = read_header(&mut r)?;
        let data = r.f32s()?;
        if data.len() != shape.iter().product::<usize>() {
            return Err(DistError::Protocol(format!(
                "a message of {} values for shape {shape:?}",
                data.len()
            )));
        }
        let tensor = dev.from_host_of(dtype, &data, &shape, Category::Transfer);
        Ok(Message { virtual_stage, microbatch, tensor })
    }

    fn complete_sends(&mut self) -> Result<(), DistError> {
        let pending = &mut self.pending;
        let done = poll_until(self.timeout, || {
            reap(pending);
            pending.is_empty().then_some(())
        });
        done.ok_or_else(|| {
            let mut peers: Vec<usize> = self.pending.iter().map(|s| s.to).collect();
            peers.dedup();
            DistError::Timeout {
                what: format!("{} took nothing of the last sends", self.topology.describe(&peers)),
                timeout: self.timeout,
            }
        })
    }
}

/// What a point-to-point message says of its tensor: (virtual stage, microbatch, shape,
/// dtype).
pub(super) fn header(virtual_stage: usize, microbatch: usize, tensor: &Tensor) -> Writer {
    let mut w = Writer::default();
    w.u64(virtual_stage as u64).u64(microbatch as u64).u64(tensor.shape().len() as u64);
    for &d in tensor.shape() {
        w.u64(d as u64);
    }
    w.u64(match tensor.dtype() {
        DType::F32 => 0,
        DType::Bf16 => 1,
    });
    w
}

pub(super) fn read_header(r: &mut Reader) -> Result<(usize, usize, Vec<usize>, DType), DistError> {
    let (virtual_stage, microbatch, ndim) = (r.usize()?, r.usize()?, r.usize()?);
    let shape = (0..ndim).map(|_| r.usize()).collect::<Result<Vec<_>, _>>()?;
    let dtype = match r.u64()? {
        0 => DType::F32,
        1 => DType::Bf16,
        other => return Err(DistError::Protocol(format!("a message of element type {other}"))),
    };
    Ok((virtual_stage, microbatch, shape, dtype))
}

/// A send still in flight here was never waited for ([`Transport::complete_sends`] was
/// not reached: the rank failed, and ends the job next). It is abandoned to MPI, its buffer
/// leaked: waiting could last forever, and freeing it while MPI may read it is not safe.
impl Drop for MpiTransport {
    fn drop(&mut self) {
        for send in self.pending.drain(..) {
            // SAFETY: the request is never used again, and its buffer is never freed.
            let _ = unsafe { send.request.into_raw() };
        }
    }
}

/// One rank's collectives.
pub struct MpiCollective {
    world: SimpleCommunicator,
    pipeline: SimpleCommunicator,
    data: SimpleCommunicator,
    /// None on the stages that hold no copy of the tied embedding.
    tied: Option<SimpleCommunicator>,
    tensor: SimpleCommunicator,
    model: SimpleCommunicator,
    topology: Topology,
    rank: usize,
    timeout: Duration,
}

impl MpiCollective {
    fn comm(&self, group: Group) -> &SimpleCommunicator {
        match group {
            Group::World => &self.world,
            Group::Pipeline => &self.pipeline,
            Group::DataParallel => &self.data,
            Group::TiedEmbedding => {
                self.tied.as_ref().expect("only the tied embedding's holders use its group")
            }
            Group::Tensor => &self.tensor,
            Group::ModelParallel => &self.model,
        }
    }

    /// `op` over `group` did not complete: it names the other members, one of which did
    /// not join (which one, a non-blocking collective does not say).
    /// This member's part ([`member_part`]) of the members' sum of `host`, in member order:
    /// each member sends every other its part, one all-to-all, and adds the parts it gets.
    fn reduce_scatter_host(&mut self, group: Group, host: &[f32], what: &str) -> Result<Vec<f32>, DistError> {
        let comm = self.comm(group);
        let n = comm.size() as usize;
        let len = host.len();
        let mine = member_part(len, n, comm.rank() as usize).len();
        let (slice_counts, slice_displs) = member_part_counts(len, n)?;
        let (recv_counts, recv_displs) = counts(&vec![mine; n])?;
        let mut pieces = vec![0f32; mine * n];
        let send = Partition::new(host, slice_counts, slice_displs);
        let mut into = PartitionMut::new(&mut pieces[..], recv_counts, recv_displs);
        if !mpi::request::scope(|s| {
            complete(comm.immediate_all_to_all_varcount_into(s, &send, &mut into), self.timeout)
        }) {
            std::mem::forget(into);
            std::mem::forget(pieces);
            return Err(self.timed_out(what, group));
        }
        drop(into);
        Ok(sum_in_order((0..n).map(|i| &pieces[i * mine..(i + 1) * mine])))
    }

    fn timed_out(&self, op: &str, group: Group) -> DistError {
        let others: Vec<usize> =
            self.topology.members(group, self.rank).into_iter().filter(|&m| m != self.rank).collect();
        DistError::Timeout {
            what: format!("{op} over {group}: {} did not join", self.topology.describe(&others)),
            timeout: self.timeout,
        }
    }

    /// Sends `bytes` to `to` on the world communicator: its length, then pieces MPI's
    /// counts can hold, each waited for within the timeout.
    fn send_large(&self, to: usize, bytes: &[u8]) -> Result<(), DistError> {
        let p = self.world.process_at_rank(to as i32);
        let len = (bytes.len() as u64).to_le_bytes();
        for piece in std::iter::once(&len[..]).chain(bytes.chunks(PIECE)) {
            if !mpi::request::scope(|s| complete(p.immediate_send(s, piece), self.timeout)) {
                let what = format!("{} took nothing", self.topology.describe(&[to]));
                return Err(DistError::Timeout { what, timeout: self.timeout });
            }
        }
        Ok(())
    }

    fn recv_large(&self, from: usize) -> Result<Vec<u8>, DistError> {
        let timed_out = || DistError::Timeout {
            what: format!("{} sent nothing", self.topology.describe(&[from])),
            timeout: self.timeout,
        };
        let next = || receive(&self.world, from, 0, self.timeout, || {}).ok_or_else(timed_out);
        let len = next()?;
        let len = u64::from_le_bytes(
            len.try_into().map_err(|_| DistError::Protocol("a length of other than 8 bytes".into()))?,
        );
        let mut out = Vec::with_capacity(len as usize);
        while out.len() < len as usize {
            out.extend_from_slice(&next()?);
        }
        Ok(out)
    }
}

/// The counts and displacements of the n members' parts ([`member_part`]) of `len`
/// elements: how a reduce-scatter cuts a buffer and an all-gather puts it back together.
fn member_part_counts(len: usize, n: usize) -> Result<(Vec<Count>, Vec<Count>), DistError> {
    counts(&(0..n).map(|j| member_part(len, n, j).len()).collect::<Vec<_>>())
}

fn counts(lens: &[usize]) -> Result<(Vec<Count>, Vec<Count>), DistError> {
    let too_large = || DistError::Protocol("a collective of more than 2^31 elements".into());
    let counts: Vec<Count> =
        lens.iter().map(|&l| Count::try_from(l).map_err(|_| too_large())).collect::<Result<_, _>>()?;
    let mut displs = Vec::with_capacity(counts.len());
    let mut at: Count = 0;
    for &c in &counts {
        displs.push(at);
        at = at.checked_add(c).ok_or_else(too_large)?;
    }
    Ok((counts, displs))
}

impl Collective for MpiCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn topology(&self) -> Topology {
        self.topology
    }

    fn all_gather(&mut self, group: Group, bytes: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        let comm = self.comm(group);
        let n = comm.size() as usize;
        let mine = bytes.len() as u64;
        let mut lens = vec![0u64; n];
        if !mpi::request::scope(|s| {
            complete(comm.immediate_all_gather_into(s, &mine, &mut lens[..]), self.timeout)
        }) {
            std::mem::forget(lens);
            return Err(self.timed_out("all-gather", group));
        }
        let lens: Vec<usize> = lens.into_iter().map(|l| l as usize).collect();
        if lens.iter().all(|&l| l == 0) {
            // Nothing to move (a rendezvous); OpenMPI rejects an all-empty Allgatherv.
            return Ok(vec![Vec::new(); n]);
        }
        let (c, d) = counts(&lens)?;
        let mut all = vec![0u8; lens.iter().sum()];
        let mut into = PartitionMut::new(&mut all[..], c, d);
        if !mpi::request::scope(|s| {
            complete(comm.immediate_all_gather_varcount_into(s, bytes, &mut into), self.timeout)
        }) {
            std::mem::forget(into);
            std::mem::forget(all);
            return Err(self.timed_out("all-gather", group));
        }
        let mut out = Vec::with_capacity(n);
        let mut rest = &all[..];
        for len in lens {
            let (head, tail) = rest.split_at(len);
            out.push(head.to_vec());
            rest = tail;
        }
        Ok(out)
    }

    fn all_reduce_sum(&mut self, group: Group, t: &mut Tensor, dev: &dyn Device) -> Result<(), DistError> {
        let n = self.comm(group).size() as usize;
        if n == 1 {
            return Ok(());
        }
        // A reduce-scatter then an all-gather, as a ring all-reduce moves 2(n-1)/n of the
        // bytes.
        let host = dev.to_host(t);
        let len = host.len();
        let reduced = self.reduce_scatter_host(group, &host, "all-reduce")?;
        let comm = self.comm(group);
        let (slice_counts, slice_displs) = member_part_counts(len, n)?;
        let mut sum = vec![0f32; len];
        let mut into = PartitionMut::new(&mut sum[..], slice_counts, slice_displs);
        if !mpi::request::scope(|s| {
            complete(comm.immediate_all_gather_varcount_into(s, &reduced[..], &mut into), self.timeout)
        }) {
            std::mem::forget(into);
            std::mem::forget(sum);
            return Err(self.timed_out("all-reduce", group));
        }
        drop(into);
        let host = dev.from_host(&sum, t.shape(), Category::Workspace);
        dev.copy(t, &host);
        Ok(())
    }

    fn reduce_scatter_sum(
        &mut self,
        group: Group,
        t: &mut Tensor,
        dev: &dyn Device,
    ) -> Result<(), DistError> {
        let comm = self.comm(group);
        let (n, me) = (comm.size() as usize, comm.rank() as usize);
        if n == 1 {
            return Ok(());
        }
        let part = self.reduce_scatter_host(group, &dev.to_host(t), "reduce-scatter")?;
        dev.write_at(t, member_part(t.len(), n, me).start, &part);
        Ok(())
    }

    fn gather(&mut self, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>, DistError> {
        if self.rank != 0 {
            self.send_large(0, bytes)?;
            return Ok(None);
        }
        let mut all = vec![bytes.to_vec()];
        for r in 1..self.topology.world() {
            all.push(self.recv_large(r)?);
        }
        Ok(Some(all))
    }

    fn scatter(&mut self, parts: Option<Vec<Vec<u8>>>) -> Result<Vec<u8>, DistError> {
        if self.rank != 0 {
            return self.recv_large(0);
        }
        let mut parts = parts.ok_or_else(|| DistError::Protocol("scatter: rank 0 gave no parts".into()))?;
        if parts.len() != self.topology.world() {
            return Err(DistError::Protocol(format!(
                "scatter: {} parts for {} ranks",
                parts.len(),
                self.topology.world()
            )));
        }
        for (r, part) in parts.iter().enumerate().skip(1) {
            self.send_large(r, part)?;
        }
        Ok(std::mem::take(&mut parts[0]))
    }
}
