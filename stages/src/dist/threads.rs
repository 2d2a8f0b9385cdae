//! The embedded backend: every rank is a thread of this process.
//!
//! The transport links the stages of a replica with bounded FIFO channels, one per (sender,
//! receiver, payload); a tensor moves through them without a copy (its storage leaves the
//! sender's ledger and joins the receiver's). The collective is a rendezvous per group:
//! each member posts its part, the last to arrive completes the round, and every member
//! reads the same parts. A rank's ends, dropped when its thread ends (an error or a panic
//! included), fail every peer still waiting on it with `PeerStopped`; a peer that neither
//! answers nor stops (a hung thread) fails a waiting rank with `Timeout`.

use super::{member_part, Collective, DistError, Group, Message, Topology, Transport};
use kernels::{Category, Detached, Device, Tensor};
use schedules::Payload;
use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Every rank's transport and collective for a world of `topology`, indexed by rank. Each
/// channel buffers `capacity` messages: at least what the lowered lists were proven to
/// complete with. No wait on a peer lasts longer than `timeout`.
pub fn world(topology: Topology, capacity: usize, timeout: Duration) -> Vec<(InProcess, ThreadsCollective)> {
    let shared = Arc::new(Shared::default());
    let mut transports: Vec<InProcess> = (0..topology.world())
        .map(|rank| InProcess { rank, topology, timeout, senders: HashMap::new(), receivers: HashMap::new() })
        .collect();
    for rank in 0..topology.world() {
        let from = topology.stage_of(rank);
        for to in (0..topology.pipeline).filter(|&to| to != from) {
            for payload in [Payload::Activation, Payload::Grad] {
                let (tx, rx) = sync_channel(capacity.max(1));
                transports[rank].senders.insert((to, payload), tx);
                transports[topology.peer(rank, to)].receivers.insert((from, payload), rx);
            }
        }
    }
    transports
        .into_iter()
        .enumerate()
        .map(|(rank, t)| (t, ThreadsCollective { rank, topology, timeout, shared: shared.clone() }))
        .collect()
}

/// A tensor between two threads: its storage, detached from the sender's ledger.
struct InFlight {
    virtual_stage: usize,
    microbatch: usize,
    tensor: Detached,
}

/// One stage's ends of its replica's channels.
pub struct InProcess {
    rank: usize,
    topology: Topology,
    timeout: Duration,
    senders: HashMap<(usize, Payload), SyncSender<InFlight>>,
    receivers: HashMap<(usize, Payload), Receiver<InFlight>>,
}

impl InProcess {
    /// The timeout of a wait on stage `stage` of this replica, which did `what`.
    fn timed_out(&self, stage: usize, what: &str) -> DistError {
        let peer = self.topology.peer(self.rank, stage);
        DistError::Timeout {
            what: format!("{} {what}", self.topology.describe(&[peer])),
            timeout: self.timeout,
        }
    }
}

impl Transport for InProcess {
    fn send(&mut self, to: usize, payload: Payload, msg: Message, dev: &dyn Device) -> Result<(), DistError> {
        let stage = self.topology.stage_of(self.rank);
        let tx = self.senders.get(&(to, payload)).ok_or(DistError::NoChannel { from: stage, to, payload })?;
        let mut flight = Some(InFlight {
            virtual_stage: msg.virtual_stage,
            microbatch: msg.microbatch,
            // The receiver's stream waits on this fence, taken after the producing ops.
            tensor: msg.tensor.detach(dev.fence()),
        });
        // A full channel (the receiver is behind) is waited on, within the timeout.
        let sent = super::poll_until(self.timeout, || {
            match tx.try_send(flight.take().expect("a message until it is sent")) {
                Ok(()) => Some(Ok(())),
                Err(TrySendError::Full(back)) => {
                    flight = Some(back);
                    None
                }
                Err(TrySendError::Disconnected(_)) => Some(Err(DistError::PeerStopped { peer: to })),
            }
        });
        sent.unwrap_or_else(|| Err(self.timed_out(to, "took nothing")))
    }

    fn recv(&mut self, from: usize, payload: Payload, dev: &dyn Device) -> Result<Message, DistError> {
        let rx = self.receivers.get(&(from, payload)).ok_or(DistError::NoChannel {
            from,
            to: self.topology.stage_of(self.rank),
            payload,
        })?;
        let f = rx.recv_timeout(self.timeout).map_err(|e| match e {
            RecvTimeoutError::Timeout => self.timed_out(from, "sent nothing"),
            RecvTimeoutError::Disconnected => DistError::PeerStopped { peer: from },
        })?;
        Ok(Message {
            virtual_stage: f.virtual_stage,
            microbatch: f.microbatch,
            tensor: dev.adopt(f.tensor, Category::Transfer),
        })
    }

    /// A send completes as it returns: the message is in the channel.
    fn complete_sends(&mut self) -> Result<(), DistError> {
        Ok(())
    }
}

/// What a member posts to a round.
enum Part {
    Bytes(Vec<u8>),
    /// A device copy of a member's tensor for each other member (none for itself), each
    /// taken by the member it is for.
    Tensors(Mutex<Vec<Option<Detached>>>),
    /// Rank 0's parts of a scatter, one per rank.
    Parts(Vec<Vec<u8>>),
}

/// The copy another member posted in `part` for member `me` ([`ThreadsCollective::post_copies`]),
/// adopted by `dev`.
fn take_copy(part: &Part, me: usize, dev: &dyn Device) -> Tensor {
    let Part::Tensors(copies) = part else { unreachable!("a round of device copies") };
    let copy = copies.lock().unwrap_or_else(|e| e.into_inner())[me].take();
    dev.adopt(copy.expect("each copy is taken once"), Category::Workspace)
}

/// One group's rendezvous.
struct Board {
    /// Rounds completed.
    round: u64,
    slots: Vec<Option<Part>>,
    /// The parts of the last completed round, in member order.
    result: Arc<Vec<Part>>,
}

#[derive(Default)]
struct State {
    /// Keyed by the group's members: a group instance is its member list.
    boards: HashMap<Vec<usize>, Board>,
    /// Ranks whose thread has ended.
    stopped: HashSet<usize>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One rank's handle on the world's rendezvous boards.
pub struct ThreadsCollective {
    rank: usize,
    topology: Topology,
    timeout: Duration,
    shared: Arc<Shared>,
}

impl ThreadsCollective {
    /// A round of `group` in which this member posts, for each other member, a device copy
    /// that `copy` makes: the tensors cross as the transport's do, without a download. Take
    /// each other member's copy for this one from its part with [`take_copy`].
    fn post_copies(
        &self,
        op: &str,
        group: Group,
        dev: &dyn Device,
        copy: impl Fn() -> Tensor,
    ) -> Result<Arc<Vec<Part>>, DistError> {
        let (members, me) = self.topology.members_and_place(group, self.rank);
        let copies = (0..members.len()).map(|k| (k != me).then(|| copy().detach(dev.fence()))).collect();
        self.round(op, group, Part::Tensors(Mutex::new(copies)))
    }

    /// Posts `part` to the current round of `group` and waits for the round to complete;
    /// `op` names the collective for a timeout.
    fn round(&self, op: &str, group: Group, part: Part) -> Result<Arc<Vec<Part>>, DistError> {
        let (members, me) = self.topology.members_and_place(group, self.rank);
        let n = members.len();
        let mut state = self.shared.lock();
        let board = state.boards.entry(members.clone()).or_insert_with(|| Board {
            round: 0,
            slots: (0..n).map(|_| None).collect(),
            result: Arc::new(Vec::new()),
        });
        let round = board.round;
        board.slots[me] = Some(part);
        if board.slots.iter().all(Option::is_some) {
            board.result = Arc::new(board.slots.iter_mut().map(|s| s.take().expect("all posted")).collect());
            board.round += 1;
            let result = board.result.clone();
            self.shared.changed.notify_all();
            return Ok(result);
        }
        let start = Instant::now();
        loop {
            let board = &state.boards[&members];
            if board.round != round {
                return Ok(board.result.clone());
            }
            let absent = || members.iter().zip(&board.slots).filter(|(_, s)| s.is_none()).map(|(&m, _)| m);
            // A member that stopped without posting to this round never will.
            if let Some(peer) = absent().find(|m| state.stopped.contains(m)) {
                return Err(DistError::PeerStopped { peer });
            }
            let Some(left) = self.timeout.checked_sub(start.elapsed()).filter(|d| !d.is_zero()) else {
                let absent = self.topology.describe(&absent().collect::<Vec<_>>());
                let what = format!("{op} over {group}: {absent} did not join");
                return Err(DistError::Timeout { what, timeout: self.timeout });
            };
            state = self.shared.changed.wait_timeout(state, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

impl Drop for ThreadsCollective {
    fn drop(&mut self) {
        self.shared.lock().stopped.insert(self.rank);
        self.shared.changed.notify_all();
    }
}

impl Collective for ThreadsCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn topology(&self) -> Topology {
        self.topology
    }

    fn all_gather(&mut self, group: Group, bytes: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        let parts = self.round("all-gather", group, Part::Bytes(bytes.to_vec()))?;
        Ok(parts
            .iter()
            .map(|p| if let Part::Bytes(b) = p { b.clone() } else { unreachable!("a gather round") })
            .collect())
    }

    /// The members' tensors cross as device copies ([`ThreadsCollective::post_copies`]), and
    /// each member adds them on its device in member order: no host sync.
    fn all_reduce_sum(&mut self, group: Group, t: &mut Tensor, dev: &dyn Device) -> Result<(), DistError> {
        let (members, me) = self.topology.members_and_place(group, self.rank);
        if members.len() == 1 {
            return Ok(());
        }
        let parts = self.post_copies("all-reduce", group, dev, || {
            let mut copy = dev.empty_of(t.dtype(), t.shape(), Category::Workspace);
            dev.copy(&mut copy, t);
            copy
        })?;
        let mut theirs = parts.iter().enumerate().map(|(k, p)| (k != me).then(|| take_copy(p, me, dev)));
        // ((t0 + t1) + t2) + ..., as `sum_in_order` adds: member 0 adds into its own tensor,
        // the others into member 0's copy, then keep the sum.
        let Some(mut sum) = theirs.next().expect("a group has members") else {
            theirs.for_each(|x| dev.accumulate(t, &x.expect("another member's")));
            return Ok(());
        };
        for x in theirs {
            dev.accumulate(&mut sum, x.as_ref().unwrap_or(t));
        }
        dev.copy(t, &sum);
        Ok(())
    }

    /// Each member posts a copy of its part for each other member, which copies it into
    /// place: on the device, as the all-reduce's copies move.
    fn all_gather_activation(
        &mut self,
        group: Group,
        t: &mut Tensor,
        dev: &dyn Device,
    ) -> Result<(), DistError> {
        let (members, me) = self.topology.members_and_place(group, self.rank);
        let n = members.len();
        if n == 1 {
            return Ok(());
        }
        let mine = member_part(t.len(), n, me);
        let parts = self.post_copies("all-gather", group, dev, || {
            let mut copy = dev.empty_of(t.dtype(), &[mine.len()], Category::Workspace);
            dev.copy_part(&mut copy, 0, t, mine.clone());
            copy
        })?;
        for (k, p) in parts.iter().enumerate().filter(|&(k, _)| k != me) {
            let theirs = take_copy(p, me, dev);
            dev.copy_part(t, member_part(t.len(), n, k).start, &theirs, 0..theirs.len());
        }
        Ok(())
    }

    fn gather(&mut self, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>, DistError> {
        let all = self.all_gather(Group::World, bytes)?;
        Ok((self.rank == 0).then_some(all))
    }

    fn scatter(&mut self, parts: Option<Vec<Vec<u8>>>) -> Result<Vec<u8>, DistError> {
        let posted = self.round("scatter", Group::World, Part::Parts(parts.unwrap_or_default()))?;
        match &posted[0] {
            Part::Parts(p) => p.get(self.rank).cloned().ok_or_else(|| {
                DistError::Protocol(format!(
                    "scatter: rank 0 gave {} parts, none for rank {}",
                    p.len(),
                    self.rank
                ))
            }),
            _ => unreachable!("a scatter round"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::cpu::CpuDevice;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn tensors_move_between_ledgers_without_copying() {
        let topology =
            Topology { tensor: 1, pipeline: 2, data: 1, placement: schedules::Placement::Interleaved };
        let mut ends = world(topology, 1, MINUTE);
        let (mut b, _) = ends.pop().unwrap();
        let (mut a, _) = ends.pop().unwrap();
        let (da, db) = (CpuDevice::new(1), CpuDevice::new(1));
        let t = da.from_host(&[1.0, 2.0, 3.0], &[3], Category::Workspace);
        let ptr = t.cpu().as_ptr();
        a.send(1, Payload::Activation, Message { virtual_stage: 0, microbatch: 4, tensor: t }, &da).unwrap();
        assert_eq!(da.ledger().live(Category::Workspace), 0);
        let got = b.recv(0, Payload::Activation, &db).unwrap();
        assert_eq!((got.virtual_stage, got.microbatch, got.tensor.cpu()), (0, 4, &[1.0, 2.0, 3.0][..]));
        assert_eq!(got.tensor.cpu().as_ptr(), ptr);
        assert_eq!(db.ledger().live(Category::Transfer), 12);
    }

    /// `f` on every member of a world of `topology`, each in a thread of its own; the
    /// results in rank order.
    fn on_every_member<R: Send>(topology: Topology, f: impl Fn(ThreadsCollective) -> R + Sync) -> Vec<R> {
        std::thread::scope(|s| {
            let handles: Vec<_> =
                world(topology, 1, MINUTE).into_iter().map(|(_, c)| s.spawn(|| f(c))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Three members whose sum depends on the order of the additions: every member gets
    /// `sum_in_order`'s bits, with no download and nothing left in its ledger but its tensor.
    #[test]
    fn all_reduce_adds_in_member_order_on_the_device() {
        let topology =
            Topology { tensor: 1, pipeline: 1, data: 3, placement: schedules::Placement::Interleaved };
        let parts = [[1.0e8f32, 1.0], [-1.0e8, 1.0e8], [1.0, -1.0e8]];
        let want = super::super::sum_in_order(parts.iter().map(|p| &p[..]));
        let results: Vec<_> = on_every_member(topology, |mut c| {
            let dev = CpuDevice::new(1);
            let mut t = dev.from_host(&parts[c.rank()], &[2], Category::Gradients);
            let before = dev.counters();
            c.all_reduce_sum(Group::DataParallel, &mut t, &dev).unwrap();
            let syncs = dev.counters().host_syncs - before.host_syncs;
            (t.cpu().to_vec(), syncs, dev.ledger().live_bytes())
        });
        assert_eq!(want, vec![1.0, 0.0], "the order matters for these parts");
        for (rank, (sum, syncs, live)) in results.into_iter().enumerate() {
            assert_eq!((sum, syncs, live), (want.clone(), 0, 8), "rank {rank}");
        }
    }

    /// Three members, seven elements: each gets its member part (2, 2 and 3 elements) of
    /// `sum_in_order`'s bits.
    #[test]
    fn reduce_scatter_gives_each_member_its_part_of_the_ordered_sum() {
        let topology =
            Topology { tensor: 1, pipeline: 1, data: 3, placement: schedules::Placement::Interleaved };
        let parts: [Vec<f32>; 3] = [1.0e8, -1.0e8, 1.0]
            .map(|x: f32| (0..7).map(|i| if i % 2 == 0 { x } else { -x + i as f32 }).collect());
        let want = super::super::sum_in_order(parts.iter().map(|p| &p[..]));
        let results: Vec<_> = on_every_member(topology, |mut c| {
            let dev = CpuDevice::new(1);
            let mut t = dev.from_host(&parts[c.rank()], &[7], Category::Gradients);
            c.reduce_scatter_sum(Group::DataParallel, &mut t, &dev).unwrap();
            dev.to_host(&t)[super::super::member_part(7, 3, c.rank())].to_vec()
        });
        let lens: Vec<usize> = results.iter().map(Vec::len).collect();
        assert_eq!(lens, [2, 2, 3]);
        assert_eq!(results.concat(), want);
    }

    /// Three members, seven elements, each having written its member part (2, 2 and 3
    /// elements) of a tensor whose other elements are NaN: each gets the whole, with no
    /// download and nothing left in its ledger but its tensor.
    #[test]
    fn all_gather_places_each_members_part_on_the_device() {
        let topology =
            Topology { tensor: 3, pipeline: 1, data: 1, placement: schedules::Placement::Interleaved };
        let whole: Vec<f32> = (0..7).map(|i| i as f32 * 1.5 - 2.0).collect();
        let results: Vec<_> = on_every_member(topology, |mut c| {
            let dev = CpuDevice::new(1);
            let mine = super::super::member_part(7, 3, c.rank());
            let mut t = dev.from_host(&[f32::NAN; 7], &[7], Category::Activations);
            dev.write_at(&mut t, mine.start, &whole[mine]);
            let before = dev.counters();
            c.all_gather_activation(Group::Tensor, &mut t, &dev).unwrap();
            let syncs = dev.counters().host_syncs - before.host_syncs;
            (t.cpu().to_vec(), syncs, dev.ledger().live_bytes())
        });
        for (rank, got) in results.into_iter().enumerate() {
            assert_eq!(got, (whole.clone(), 0, 28), "rank {rank}");
        }
    }

    #[test]
    fn collectives_agree_and_a_stopped_member_fails_its_peers() {
        let topology =
            Topology { tensor: 1, pipeline: 1, data: 3, placement: schedules::Placement::Interleaved };
        let results: Vec<_> = on_every_member(topology, |mut c| {
            let dev = CpuDevice::new(1);
            let r = c.rank() as f32;
            let mut t = dev.from_host(&[r, 10.0 * r], &[2], Category::Gradients);
            c.all_reduce_sum(Group::DataParallel, &mut t, &dev).unwrap();
            let names = c.all_gather(Group::World, format!("r{}", c.rank()).as_bytes()).unwrap();
            let part = c.scatter((c.rank() == 0).then(|| vec![vec![7], vec![8], vec![9]])).unwrap();
            if c.rank() == 1 {
                return Err(DistError::Protocol("rank 1 leaves".into()));
            }
            let after = c.all_gather(Group::World, b"x");
            Ok((t.cpu().to_vec(), names, part, after))
        });
        for (rank, r) in results.into_iter().enumerate() {
            if rank == 1 {
                assert!(r.is_err());
                continue;
            }
            let (sum, names, part, after) = r.unwrap();
            assert_eq!(sum, vec![3.0, 30.0]);
            assert_eq!(names, vec![b"r0".to_vec(), b"r1".to_vec(), b"r2".to_vec()]);
            assert_eq!(part, vec![7 + rank as u8]);
            assert_eq!(after, Err(DistError::PeerStopped { peer: 1 }));
        }
    }

    /// A peer that neither answers nor stops (a hung thread): a receive, a send into a full
    /// channel and a collective each give up after the timeout, naming it.
    #[test]
    fn a_peer_that_never_answers_times_out_by_name() {
        let topology =
            Topology { tensor: 1, pipeline: 2, data: 1, placement: schedules::Placement::Interleaved };
        let short = Duration::from_millis(50);
        let mut ends = world(topology, 1, short);
        let (_hung_transport, _hung_collective) = ends.pop().unwrap();
        let (mut a, mut c) = ends.pop().unwrap();
        let dev = CpuDevice::new(1);
        let timeout = |what: &str| Some(DistError::Timeout { what: what.into(), timeout: short });
        assert_eq!(a.recv(1, Payload::Grad, &dev).err(), timeout("rank 1 (stage 1) sent nothing"));
        let msg =
            |mb| Message { virtual_stage: 0, microbatch: mb, tensor: dev.zeros(&[1], Category::Workspace) };
        assert_eq!(a.send(1, Payload::Activation, msg(0), &dev), Ok(()), "the channel holds one");
        assert_eq!(
            a.send(1, Payload::Activation, msg(1), &dev).err(),
            timeout("rank 1 (stage 1) took nothing")
        );
        let start = Instant::now();
        assert_eq!(
            c.all_gather(Group::Pipeline, b"x").err(),
            timeout("all-gather over the pipeline: rank 1 (stage 1) did not join")
        );
        assert!(start.elapsed() >= short);
        assert_eq!(
            DistError::Timeout { what: "rank 1 (stage 1) sent nothing".into(), timeout: short }.to_string(),
            "rank 1 (stage 1) sent nothing within 0.05 s (distributed_timeout_minutes)"
        );
    }
}
