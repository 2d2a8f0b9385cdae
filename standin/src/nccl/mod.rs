//! NCCL: communicators between ranks in threads or processes of one machine, with NCCL's
//! call-time argument checks and stream-ordered operations.
//!
//! Modelled:
//! - `ncclGetUniqueId` starts the communicator's hub (threads of the calling process,
//!   reached by a Unix socket named from the id's random key); `ncclCommInitRank` joins it
//!   and returns once every rank has, each rank once and all agreeing on the size.
//! - Send/Recv, AllReduce, Broadcast, Reduce, AllGather and ReduceScatter run on their
//!   streams; the hub forwards each rank's elements. Sends never wait for their receives,
//!   and a group completes whatever the order of its sends and receives.
//! - Reductions combine the ranks in rank order, each step rounded to the element type:
//!   the same bits on every rank, every run.
//! - Failures end the communicator, and `ncclCommGetAsyncError` reports them: sizes that
//!   disagree (ncclInvalidUsage); a peer whose connection breaks (ncclRemoteError, at once
//!   on every rank); a peer that left on purpose, or the hub's process ended, when an
//!   operation needs them (ncclRemoteError). Waiting operations then return, as they do
//!   after `ncclCommAbort`.
//!
//! Not modelled: topology, channels, protocols and transports (every byte crosses the hub,
//! and nothing is fast); communicators across machines or network namespaces (the socket
//! is in the abstract namespace); ranks that outlive the process that made the id (NCCL's
//! ranks need it only to join); reduction orders other than rank order (a GPU's rings and
//! trees differ, so bits are compared with pipetrain's other backends, not with NCCL's);
//! user-defined reduction operators, config structs, split, register and window APIs.

pub mod api;
pub mod calls;
mod comm;
mod group;
mod hub;
mod id;
mod ops;
mod reduce;
mod wire;

#[cfg(test)]
mod tests;

/// A lock whose holder panicked is still good: every critical section here leaves its data
/// consistent.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
