//! NCCL: communicators between ranks in threads or processes of one machine, with NCCL's
//! call-time argument checks and stream-ordered operations.
//!
//! Modelled: `ncclGetUniqueId` starts a hub (threads of the calling process, reached by a
//! Unix socket named from the id's random key); `ncclCommInitRank` joins it and returns
//! once every rank has (admission checks every rank agrees on the size and joins once).
//! Send/Recv, AllReduce, Broadcast, Reduce, AllGather and ReduceScatter run on their
//! streams: the hub forwards each rank's elements, sends never wait for their receives,
//! and groups complete whatever the order of their sends and receives. Reductions combine
//! the ranks in rank order, each step rounded to the element type, so results are the
//! same bits every run. A peer whose process ends, sizes that disagree, or an abort end
//! the communicator: waiting operations return, and `ncclCommGetAsyncError` reports it.
//!
//! Not modelled: topology, channels, protocols and transports (every byte crosses the
//! hub, and nothing is fast); communicators spanning machines or network namespaces (the
//! socket is in the abstract namespace); the hub outlives neither its process (the
//! creator's) nor its ranks; reduction orders other than rank order (a GPU's ring or tree
//! orders differ, so bits are compared with the other backends, not with real NCCL);
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
