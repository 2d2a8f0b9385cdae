//! The exported NCCL operations. Each checks its arguments when called, as NCCL does, and
//! then runs on its stream ([`super::ops`]), now or at its group's end.

use super::api::{comm_of, refused};
use super::comm::Comm;
use super::group;
use super::ops::{Op, What};
use super::reduce;
use crate::{devices, memory};
use cudarc::nccl::sys::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

use ncclResult_t::{ncclInvalidArgument, ncclSuccess};

/// What an operation call is checked against and builds from.
struct Call<'a> {
    name: &'a str,
    comm: Arc<Comm>,
    elem: usize,
    dtype: ncclDataType_t,
}

impl Call<'_> {
    fn rank(&self, value: c_int, what: &str) -> Result<usize, String> {
        let size = self.comm.size;
        usize::try_from(value)
            .ok()
            .filter(|&r| r < size)
            .ok_or_else(|| format!("{what} {value} is out of range for a communicator of {size} ranks"))
    }

    fn bytes(&self, count: usize) -> Result<usize, String> {
        count.checked_mul(self.elem).ok_or_else(|| format!("a count of {count} overflows"))
    }

    /// Checks that `bytes` at `ptr` lie in one allocation on the communicator's GPU (or in
    /// page-locked host memory), as NCCL's pointer checks do.
    fn buffer(&self, ptr: *const c_void, bytes: usize, what: &str) -> Result<usize, String> {
        let addr = ptr as usize;
        if bytes == 0 || memory::is_pinned(ptr.cast(), bytes) {
            return Ok(addr);
        }
        match memory::device_of(addr as u64, bytes) {
            Some(d) if d == self.comm.device => Ok(addr),
            Some(d) => Err(format!("{what} is on GPU {d}, the communicator's is GPU {}", self.comm.device)),
            None => Err(format!("{what} {ptr:?} does not hold {bytes} bytes of device memory")),
        }
    }

    fn reducible(&self, op: ncclRedOp_t) -> Result<ncclRedOp_t, String> {
        match reduce::supported(self.dtype, op) {
            true => Ok(op),
            false => Err(format!("the stand-in does not reduce {:?} with {op:?}", self.dtype)),
        }
    }

    fn op(&self, what: What, send: usize, recv: usize, bytes: usize, seq: u64) -> Op {
        Op { comm: self.comm.clone(), what, dtype: self.dtype, send, recv, bytes, seq }
    }
}

/// Checks an operation's communicator, stream and type, lets `build` check the rest and
/// number it, and runs it on its stream.
///
/// # Safety
/// `stream` is a stream handle of this library or null.
unsafe fn issue(
    name: &str,
    comm: ncclComm_t,
    stream: cudaStream_t,
    dtype: ncclDataType_t,
    build: impl FnOnce(&Call) -> Result<Op, String>,
) -> ncclResult_t {
    let comm = match comm_of(comm, name) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(f) = comm.failure() {
        return group::refuse(f.code);
    }
    let Some(stream) = devices::stream_of(stream as _) else {
        return refused(ncclInvalidArgument, format!("{name}: the null stream, with no current context"));
    };
    let Some(elem) = reduce::size_of(dtype) else {
        return refused(ncclInvalidArgument, format!("{name}: data type {dtype:?}"));
    };
    let call = Call { name, comm, elem, dtype };
    match build(&call) {
        Ok(op) => {
            group::submit(stream, op);
            ncclSuccess
        }
        Err(why) => refused(ncclInvalidArgument, format!("{}: {why}", call.name)),
    }
}

/// # Safety
/// As for NCCL: `sendbuff` holds `count` elements of device memory, which nothing else
/// writes until the operation has run; `stream` is a live stream handle.
#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: per the contract.
    unsafe {
        issue("ncclSend", comm, stream, datatype, |c| {
            let (to, bytes) = (c.rank(peer, "peer")?, c.bytes(count)?);
            let send = c.buffer(sendbuff, bytes, "sendbuff")?;
            Ok(c.op(What::Send { to }, send, 0, bytes, c.comm.next_send(to)))
        })
    }
}

/// # Safety
/// As [`ncclSend`], for `recvbuff`.
#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: per the contract.
    unsafe {
        issue("ncclRecv", comm, stream, datatype, |c| {
            let (from, bytes) = (c.rank(peer, "peer")?, c.bytes(count)?);
            let recv = c.buffer(recvbuff, bytes, "recvbuff")?;
            Ok(c.op(What::Recv { from }, 0, recv, bytes, c.comm.next_receive(from)))
        })
    }
}

/// # Safety
/// As [`ncclSend`], for both buffers.
#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: per the contract.
    unsafe {
        issue("ncclAllReduce", comm, stream, datatype, |c| {
            let (op, bytes) = (c.reducible(op)?, c.bytes(count)?);
            let send = c.buffer(sendbuff, bytes, "sendbuff")?;
            let recv = c.buffer(recvbuff, bytes, "recvbuff")?;
            Ok(c.op(What::AllReduce { op }, send, recv, bytes, c.comm.next_collective()))
        })
    }
}

/// # Safety
/// As [`ncclSend`]; `sendbuff` is read on the root only.
#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: per the contract.
    unsafe {
        issue("ncclBroadcast", comm, stream, datatype, |c| {
            let (root, bytes) = (c.rank(root, "root")?, c.bytes(count)?);
            let send = match root == c.comm.rank {
                true => c.buffer(sendbuff, bytes, "sendbuff")?,
                false => 0,
            };
            let recv = c.buffer(recvbuff, bytes, "recvbuff")?;
            Ok(c.op(What::Broadcast { root }, send, recv, bytes, c.comm.next_collective()))
        })
    }
}

/// # Safety
/// As [`ncclSend`]; `recvbuff` is written on the root only.
#[no_mangle]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: per the contract.
    unsafe {
        issue("ncclReduce", comm, stream, datatype, |c| {
            let (op, root, bytes) = (c.reducible(op)?, c.rank(root, "root")?, c.bytes(count)?);
            let send = c.buffer(sendbuff, bytes, "sendbuff")?;
            let recv = match root == c.comm.rank {
                true => c.buffer(recvbuff, bytes, "recvbuff")?,
                false => 0,
            };
            Ok(c.op(What::Reduce { op, root }, send, recv, bytes, c.comm.next_collective()))
        })
    }
}

/// # Safety
/// As [`ncclSend`]: `sendbuff` holds `sendcount` elements, `recvbuff` that many per rank.
#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: per the contract.
    unsafe {
        issue("ncclAllGather", comm, stream, datatype, |c| {
            let bytes = c.bytes(sendcount)?;
            let send = c.buffer(sendbuff, bytes, "sendbuff")?;
            let recv = c.buffer(recvbuff, bytes * c.comm.size, "recvbuff")?;
            Ok(c.op(What::AllGather, send, recv, bytes, c.comm.next_collective()))
        })
    }
}

/// # Safety
/// As [`ncclSend`]: `recvbuff` holds `recvcount` elements, `sendbuff` that many per rank.
#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: per the contract.
    unsafe {
        issue("ncclReduceScatter", comm, stream, datatype, |c| {
            let (op, bytes) = (c.reducible(op)?, c.bytes(recvcount)?);
            let send = c.buffer(sendbuff, bytes * c.comm.size, "sendbuff")?;
            let recv = c.buffer(recvbuff, bytes, "recvbuff")?;
            Ok(c.op(What::ReduceScatter { op }, send, recv, bytes, c.comm.next_collective()))
        })
    }
}
