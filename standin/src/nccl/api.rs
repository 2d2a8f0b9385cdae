//! The exported NCCL entry points that make, query and end communicators, and group
//! calls; the operations' are in [`super::calls`].

use super::comm::Comm;
use super::group;
use super::hub;
use super::id::Key;
use super::lock;
use crate::devices;
use cudarc::nccl::sys::{ncclComm_t, ncclResult_t, ncclUniqueId};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ncclResult_t::{ncclInvalidArgument, ncclSuccess, ncclSystemError};

/// NCCL 2.30.0, as `ncclGetVersion` encodes it (the version cudarc's bindings describe).
const VERSION: c_int = 23000;

pub(super) fn refused(code: ncclResult_t, message: String) -> ncclResult_t {
    eprintln!("nccl stand-in: {message}");
    group::refuse(code)
}

/// The live communicators by handle. A handle is a number never given out twice, so one
/// used after ncclCommDestroy or ncclCommAbort (a use after free with NCCL, such as a
/// watchdog's abort followed by cudarc's drop, which aborts again) is refused by name.
static LIVE: Mutex<BTreeMap<usize, Arc<Comm>>> = Mutex::new(BTreeMap::new());
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);

fn into_handle(comm: Comm) -> ncclComm_t {
    let handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    lock(&LIVE).insert(handle, Arc::new(comm));
    handle as ncclComm_t
}

/// The communicator `handle` names, or the refusal a caller returns.
pub(super) fn comm_of(handle: ncclComm_t, what: &str) -> Result<Arc<Comm>, ncclResult_t> {
    lock(&LIVE).get(&(handle as usize)).cloned().ok_or_else(|| not_live(handle, what))
}

fn not_live(handle: ncclComm_t, what: &str) -> ncclResult_t {
    let why = match handle.is_null() {
        true => "a null communicator".to_string(),
        false => format!("communicator {handle:?} was destroyed or aborted, or never made"),
    };
    refused(ncclInvalidArgument, format!("{what}: {why}"))
}

/// Writes `value` through `out`, or refuses a null `out`.
///
/// # Safety
/// `out` is null or valid for a write.
unsafe fn answer<T>(out: *mut T, value: T, what: &str) -> ncclResult_t {
    if out.is_null() {
        return refused(ncclInvalidArgument, format!("{what}: a null output pointer"));
    }
    // SAFETY: checked non-null; valid per the contract.
    unsafe { out.write(value) };
    ncclSuccess
}

/// # Safety
/// `version` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    // SAFETY: per the contract.
    unsafe { answer(version, VERSION, "ncclGetVersion") }
}

#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    use ncclResult_t::*;
    let text = match result {
        ncclSuccess => c"no error",
        ncclUnhandledCudaError => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        ncclSystemError => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        ncclInternalError => c"internal error - please report this issue to the NCCL developers",
        ncclInvalidArgument => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        ncclInvalidUsage => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        ncclRemoteError => c"remote process exited or there was a network error",
        ncclInProgress => c"NCCL operation in progress",
        ncclTimeout => c"NCCL operation timed out",
        ncclNumResults => c"unknown result code",
    };
    text.as_ptr()
}

/// Makes a unique id and starts its communicator's hub in this process.
///
/// # Safety
/// `id` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut ncclUniqueId) -> ncclResult_t {
    let started = Key::random().and_then(|key| hub::start(key).map(|()| key));
    match started {
        // SAFETY: per the contract.
        Ok(key) => unsafe { answer(id, key.to_id(), "ncclGetUniqueId") },
        Err(e) => refused(ncclSystemError, format!("ncclGetUniqueId: {e}")),
    }
}

/// Joins the communicator `id` names; returns once all `nranks` ranks have.
///
/// # Safety
/// `comm` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    if comm.is_null() || nranks < 1 || rank < 0 || rank >= nranks {
        return refused(ncclInvalidArgument, format!("ncclCommInitRank: rank {rank} of {nranks}"));
    }
    let Some(key) = Key::from_id(&id) else {
        return refused(ncclInvalidArgument, "ncclCommInitRank: not a unique id of this library".into());
    };
    let device = devices::current().map_or(0, |c| c.device);
    match Comm::join(key, nranks as usize, rank as usize, device) {
        // SAFETY: checked non-null; valid per the contract.
        Ok(joined) => unsafe { answer(comm, into_handle(joined), "ncclCommInitRank") },
        Err(f) => refused(f.code, format!("ncclCommInitRank: {}", f.message)),
    }
}

/// One communicator over `ndev` GPUs of this process, rank i on `devlist[i]` (or GPU i).
///
/// # Safety
/// `comms` holds `ndev` handles; `devlist` is null or holds `ndev` ordinals.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ncclResult_t {
    if comms.is_null() || ndev < 1 {
        return refused(ncclInvalidArgument, format!("ncclCommInitAll: {ndev} devices"));
    }
    let n = ndev as usize;
    let devices: Vec<usize> = match devlist.is_null() {
        true => (0..n).collect(),
        // SAFETY: per the contract.
        false => unsafe { std::slice::from_raw_parts(devlist, n) }.iter().map(|&d| d as usize).collect(),
    };
    if let Some(d) = devices.iter().find(|&&d| d >= devices::count()) {
        return refused(ncclInvalidArgument, format!("ncclCommInitAll: there is no GPU {d}"));
    }
    let key = match Key::random().and_then(|key| hub::start(key).map(|()| key)) {
        Ok(key) => key,
        Err(e) => return refused(ncclSystemError, format!("ncclCommInitAll: {e}")),
    };
    let joined: Vec<_> = std::thread::scope(|s| {
        let ranks: Vec<_> =
            devices.iter().enumerate().map(|(r, &d)| s.spawn(move || Comm::join(key, n, r, d))).collect();
        ranks.into_iter().map(|t| t.join().expect("joining does not panic")).collect()
    });
    let mut handles = Vec::with_capacity(n);
    for comm in joined {
        match comm {
            Ok(c) => handles.push(c),
            Err(f) => return refused(f.code, format!("ncclCommInitAll: {}", f.message)),
        }
    }
    for (i, c) in handles.into_iter().enumerate() {
        // SAFETY: per the contract, `comms` holds `ndev` handles.
        unsafe { comms.add(i).write(into_handle(c)) };
    }
    ncclSuccess
}

/// Leaves the communicator once the operations already enqueued on it have run.
#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    release(comm, "ncclCommDestroy", |_| {})
}

/// Leaves the communicator now: operations waiting on it return at once, failed.
#[no_mangle]
pub extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    release(comm, "ncclCommAbort", Comm::abort)
}

/// Ends `handle` (null is allowed, as NCCL allows it), after `last`; the communicator
/// itself goes once the operations holding it have run.
fn release(handle: ncclComm_t, what: &str, last: impl FnOnce(&Comm)) -> ncclResult_t {
    if handle.is_null() {
        return ncclSuccess;
    }
    let Some(comm) = lock(&LIVE).remove(&(handle as usize)) else { return not_live(handle, what) };
    last(&comm);
    ncclSuccess
}

/// What a query on a communicator answers.
///
/// # Safety
/// `out` is null or valid for a write.
unsafe fn query<T>(comm: ncclComm_t, out: *mut T, what: &str, value: impl Fn(&Comm) -> T) -> ncclResult_t {
    match comm_of(comm, what) {
        // SAFETY: per the contract.
        Ok(c) => unsafe { answer(out, value(&c), what) },
        Err(code) => code,
    }
}

/// # Safety
/// `count` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    // SAFETY: per the contract.
    unsafe { query(comm, count, "ncclCommCount", |c| c.size as c_int) }
}

/// # Safety
/// `rank` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    // SAFETY: per the contract.
    unsafe { query(comm, rank, "ncclCommUserRank", |c| c.rank as c_int) }
}

/// # Safety
/// `device` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    // SAFETY: per the contract.
    unsafe { query(comm, device, "ncclCommCuDevice", |c| c.device as c_int) }
}

/// The communicator's failure, if it has failed: a peer gone, sizes that disagree.
///
/// # Safety
/// `async_error` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    async_error: *mut ncclResult_t,
) -> ncclResult_t {
    // SAFETY: per the contract.
    unsafe {
        query(comm, async_error, "ncclCommGetAsyncError", |c| c.failure().map_or(ncclSuccess, |f| f.code))
    }
}

#[no_mangle]
pub extern "C" fn ncclGroupStart() -> ncclResult_t {
    group::start();
    ncclSuccess
}

#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    group::end()
}
