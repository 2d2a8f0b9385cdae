//! The hub: the one process-wide meeting point of a communicator, run by threads of the
//! process that made its unique id. It admits the ranks (each once, all agreeing on the
//! size), then routes their elements: a `Data` frame from one rank is written to its
//! receiver's connection (or every other rank's) and acknowledged to its sender. It never
//! waits for a receive, so a send never blocks on its peer.
//!
//! A rank's frames are forwarded in the order it sent them, and its `Left` notice after all
//! of them, so a receiver holds everything a departed rank sent before it learns it left.

use super::id::Key;
use super::lock;
use super::wire::{shut, Channel, Frame, Kind, ALL};
use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a connection may take to say which rank it is.
const GREETING: Duration = Duration::from_secs(60);

/// Listens for the ranks of the communicator `key` names, on a thread of its own.
pub fn start(key: Key) -> io::Result<()> {
    let listener = UnixListener::bind_addr(&key.address())?;
    std::thread::Builder::new().name("standin-nccl-hub".into()).spawn(move || admit(listener))?;
    Ok(())
}

/// Admits ranks until all have joined, then routes; after a refusal, refuses every later
/// rank too (the communicator can no longer form).
fn admit(listener: UnixListener) {
    let mut joined: Vec<Option<UnixStream>> = Vec::new();
    let mut refusal: Option<String> = None;
    while let Ok((socket, _)) = listener.accept() {
        let admitted = match &refusal {
            Some(reason) => Err(reason.clone()),
            None => greet(&socket, &mut joined),
        };
        match admitted {
            Ok(rank) => {
                joined[rank] = Some(socket);
                if joined.iter().all(Option::is_some) {
                    return route(joined.into_iter().flatten().collect());
                }
            }
            Err(reason) => {
                refuse(joined.drain(..).flatten().chain([socket]), &reason);
                refusal = Some(reason);
            }
        }
    }
}

/// The rank a new connection says it is, if it may join.
fn greet(socket: &UnixStream, joined: &mut Vec<Option<UnixStream>>) -> Result<usize, String> {
    let _ = socket.set_read_timeout(Some(GREETING));
    let hello = match Frame::read(socket) {
        Ok(f) if f.kind == Kind::Hello => f,
        _ => return Err("a connection to the hub did not say which rank it is".into()),
    };
    let _ = socket.set_read_timeout(None);
    let (rank, size) = (hello.peer as usize, hello.seq as usize);
    if joined.is_empty() {
        joined.resize_with(size, || None);
    }
    if size != joined.len() {
        Err(format!(
            "rank {rank} says the communicator has {size} ranks, an earlier rank said {}",
            joined.len()
        ))
    } else if rank >= size {
        Err(format!("rank {rank} is out of range for a communicator of {size} ranks"))
    } else if joined[rank].is_some() {
        Err(format!("rank {rank} joined twice"))
    } else {
        Ok(rank)
    }
}

fn refuse(sockets: impl IntoIterator<Item = UnixStream>, reason: &str) {
    for s in sockets {
        let _ = Frame::new(Kind::Refused, 0, Channel::PointToPoint, 0, reason.as_bytes().to_vec()).write(&s);
    }
}

/// Each rank's connection, for writing; None once the rank has left.
struct Router {
    ranks: Vec<Mutex<Option<UnixStream>>>,
}

impl Router {
    fn deliver(&self, to: usize, frame: &Frame) -> bool {
        lock(&self.ranks[to]).as_ref().is_some_and(|s| frame.write(s).is_ok())
    }

    fn leave(&self, rank: usize, on_purpose: bool) {
        if let Some(s) = lock(&self.ranks[rank]).take() {
            shut(&s);
        }
        let notice = Frame::control(Kind::Left, rank as u32, on_purpose as u64);
        for other in (0..self.ranks.len()).filter(|&r| r != rank) {
            self.deliver(other, &notice);
        }
    }
}

/// Tells every rank the communicator is ready and serves each on a thread of its own.
fn route(sockets: Vec<UnixStream>) {
    let writers = match sockets.iter().map(UnixStream::try_clone).collect::<io::Result<Vec<_>>>() {
        Ok(w) => w,
        Err(e) => return refuse(sockets, &format!("the hub could not share a connection: {e}")),
    };
    let router = Arc::new(Router { ranks: writers.into_iter().map(|w| Mutex::new(Some(w))).collect() });
    // Every rank hears it is ready before any rank's data can be forwarded to it (a rank
    // that cannot hear it has gone, which its server finds).
    for (rank, socket) in sockets.iter().enumerate() {
        let _ = Frame::control(Kind::Ready, rank as u32, 0).write(socket);
    }
    for (rank, socket) in sockets.into_iter().enumerate() {
        let server = router.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("standin-nccl-hub-rank{rank}"))
            .spawn(move || serve(&server, rank, socket));
        if spawned.is_err() {
            // The rank cannot be served: to its peers, it has gone.
            router.leave(rank, false);
        }
    }
}

/// Forwards rank `rank`'s frames until it leaves.
fn serve(router: &Router, rank: usize, socket: UnixStream) {
    let size = router.ranks.len();
    let on_purpose = loop {
        match Frame::read(&socket) {
            Ok(f) if f.kind == Kind::Data && (f.peer == ALL || (f.peer as usize) < size) => {
                let to = f.peer;
                let out = Frame::new(Kind::Data, rank as u32, f.channel, f.seq, f.payload);
                let delivered = if to == ALL {
                    // Every receiver gets it, even after one has gone.
                    (0..size).filter(|&r| r != rank && !router.deliver(r, &out)).count() == 0
                } else {
                    router.deliver(to as usize, &out)
                };
                router.deliver(rank, &Frame::new(Kind::Ack, to, f.channel, f.seq, vec![delivered as u8]));
            }
            Ok(f) if f.kind == Kind::Goodbye => break true,
            // The end of the connection, a broken one, or a frame no rank sends.
            _ => break false,
        }
    };
    router.leave(rank, on_purpose);
}
