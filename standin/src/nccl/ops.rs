//! The operations, each in two parts: what it hands the hub (outgoing) and what it waits
//! for and writes (incoming). A stream's job runs the outgoing parts of all its operations
//! before any incoming part, so a group whose receives come before its sends completes, as
//! NCCL's fused groups do. A job returns once the hub has delivered what it sent, as a
//! send on a GPU completes once its peer holds the data.
//!
//! A failure (a peer gone, sizes that disagree, an abort) ends the communicator; the job
//! then skips its remaining work on it and leaves the buffers as they are.

use super::comm::Comm;
use super::reduce;
use super::wire::{Channel, ALL};
use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t, ncclResult_t};
use std::sync::Arc;

pub enum What {
    Send { to: usize },
    Recv { from: usize },
    AllReduce { op: ncclRedOp_t },
    Broadcast { root: usize },
    Reduce { op: ncclRedOp_t, root: usize },
    AllGather,
    ReduceScatter { op: ncclRedOp_t },
}

/// One operation, checked and numbered when it was called.
pub struct Op {
    pub comm: Arc<Comm>,
    pub what: What,
    pub dtype: ncclDataType_t,
    /// Buffer addresses (stand-in device memory is host memory).
    pub send: usize,
    pub recv: usize,
    /// The message's bytes; for AllGather and ReduceScatter, each rank's part's.
    pub bytes: usize,
    pub seq: u64,
}

/// An operation whose outgoing part has run.
struct InFlight {
    op: Op,
    /// This rank's contribution, as read when the operation's data left.
    own: Vec<u8>,
    /// The ranks (or [`ALL`]) whose delivery the hub must acknowledge.
    sent_to: Vec<u32>,
}

fn read(addr: usize, bytes: usize) -> Vec<u8> {
    if bytes == 0 {
        return Vec::new();
    }
    // SAFETY: the call checked that `bytes` at `addr` lie in one live allocation.
    unsafe { std::slice::from_raw_parts(addr as *const u8, bytes) }.to_vec()
}

fn write(addr: usize, data: &[u8]) {
    // SAFETY: as `read`; `data` is this library's own buffer, so the two do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
}

impl Op {
    fn channel(&self) -> Channel {
        match self.what {
            What::Send { .. } | What::Recv { .. } => Channel::PointToPoint,
            _ => Channel::Collective,
        }
    }

    fn outgoing(self) -> Result<InFlight, ncclResult_t> {
        let (c, me, channel, seq) = (&self.comm, self.comm.rank, self.channel(), self.seq);
        let mut sent_to = Vec::new();
        let mut post = |to: u32, data: Vec<u8>| {
            sent_to.push(to);
            c.post(to, channel, seq, data)
        };
        let own = match self.what {
            What::Send { to } => {
                post(to as u32, read(self.send, self.bytes))?;
                Vec::new()
            }
            What::Recv { .. } => Vec::new(),
            What::Broadcast { root } if root != me => Vec::new(),
            What::AllReduce { .. } | What::Broadcast { .. } | What::AllGather => {
                let own = read(self.send, self.bytes);
                post(ALL, own.clone())?;
                own
            }
            What::Reduce { root, .. } => {
                let own = read(self.send, self.bytes);
                if root == me {
                    own
                } else {
                    post(root as u32, own)?;
                    Vec::new()
                }
            }
            What::ReduceScatter { .. } => {
                let all = read(self.send, self.bytes * c.size);
                let part = |r: usize| all[r * self.bytes..(r + 1) * self.bytes].to_vec();
                for r in (0..c.size).filter(|&r| r != me) {
                    post(r as u32, part(r))?;
                }
                part(me)
            }
        };
        Ok(InFlight { op: self, own, sent_to })
    }
}

impl InFlight {
    /// Checks that a peer's data has the size this rank expects.
    fn sized(&self, data: Vec<u8>, from: usize) -> Result<Vec<u8>, ncclResult_t> {
        let (me, seq, want) = (self.op.comm.rank, self.op.seq, self.op.bytes);
        if data.len() == want {
            return Ok(data);
        }
        let why = match self.op.what {
            What::Recv { .. } => format!(
                "rank {me} posted a receive of {want} bytes from rank {from}, which sent {} bytes",
                data.len()
            ),
            _ => format!(
                "collective #{seq}: rank {me} has {want} bytes per rank, rank {from} {} (different counts, \
                 types or collectives)",
                data.len()
            ),
        };
        Err(self.op.comm.fail(ncclResult_t::ncclInvalidUsage, why))
    }

    /// Every rank's contribution, in rank order.
    fn gather(&self) -> Result<Vec<Vec<u8>>, ncclResult_t> {
        let c = &self.op.comm;
        (0..c.size)
            .map(|r| match r == c.rank {
                true => Ok(self.own.clone()),
                false => self.sized(c.take(r, Channel::Collective, self.op.seq)?, r),
            })
            .collect()
    }

    fn reduce(&self, op: ncclRedOp_t) -> Result<Vec<u8>, ncclResult_t> {
        let parts = self.gather()?;
        let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        Ok(reduce::reduce(self.op.dtype, op, &parts))
    }

    fn incoming(self) -> Result<(), ncclResult_t> {
        let (c, me, op) = (&self.op.comm, self.op.comm.rank, &self.op);
        match op.what {
            What::Send { .. } => {}
            What::Recv { from } => {
                write(op.recv, &self.sized(c.take(from, Channel::PointToPoint, op.seq)?, from)?)
            }
            What::AllReduce { op: red } | What::ReduceScatter { op: red } => {
                write(op.recv, &self.reduce(red)?)
            }
            What::Reduce { op: red, root } if root == me => write(op.recv, &self.reduce(red)?),
            What::Reduce { .. } => {}
            What::Broadcast { root } if root == me => write(op.recv, &self.own),
            What::Broadcast { root } => {
                write(op.recv, &self.sized(c.take(root, Channel::Collective, op.seq)?, root)?)
            }
            What::AllGather => {
                for (r, part) in self.gather()?.iter().enumerate() {
                    write(op.recv + r * op.bytes, part);
                }
            }
        }
        self.sent_to.iter().try_for_each(|&to| c.delivered(to, op.channel(), op.seq))
    }
}

/// Runs one stream's share of a call or a group. Failures are the communicators' to
/// report (`ncclCommGetAsyncError`), as a kernel's are.
pub fn run(ops: Vec<Op>) {
    let in_flight: Vec<InFlight> = ops.into_iter().filter_map(|op| op.outgoing().ok()).collect();
    for op in in_flight {
        let _ = op.incoming();
    }
}
