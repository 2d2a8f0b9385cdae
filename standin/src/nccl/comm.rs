//! A rank's side of a communicator: its connection to the hub, a thread that files what
//! arrives (elements by sender, channel and sequence number; acknowledgements; departures),
//! and the failure that ends the communicator, which every later wait reports.

use super::id::Key;
use super::lock;
use super::wire::{shut, Channel, Frame, Kind};
use cudarc::nccl::sys::ncclResult_t;
use std::collections::{HashMap, HashSet};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a rank retries reaching the hub: the id's creator may still be starting it.
const CONNECT: Duration = Duration::from_secs(60);

/// What ended a communicator: the code `ncclCommGetAsyncError` returns, and why.
#[derive(Debug)]
pub struct Failure {
    pub code: ncclResult_t,
    pub message: String,
}

/// Elements and acknowledgements are filed under (peer, channel, sequence number).
type Tag = (u32, Channel, u64);

#[derive(Default)]
struct Inbox {
    data: HashMap<Tag, Vec<u8>>,
    /// Whether each `Data` this rank sent, by (receiver, channel, seq), was delivered.
    acks: HashMap<Tag, bool>,
    /// The ranks that have left.
    left: HashSet<u32>,
    hub_gone: bool,
}

/// What the filing thread and the callers share.
struct Shared {
    inbox: Mutex<Inbox>,
    changed: Condvar,
    failure: OnceLock<Failure>,
    aborted: AtomicBool,
}

impl Shared {
    /// Records the communicator's failure (the first one stands) and wakes every wait.
    fn fail(&self, code: ncclResult_t, message: String) -> ncclResult_t {
        let quiet = self.aborted.load(Ordering::SeqCst);
        if !quiet && self.failure.get().is_none() {
            eprintln!("nccl stand-in: {message}");
        }
        let _ = self.failure.set(Failure { code, message });
        drop(lock(&self.inbox));
        self.changed.notify_all();
        self.failure.get().expect("just set").code
    }

    /// Files every frame the hub sends until the connection ends.
    fn file(&self, socket: UnixStream) {
        loop {
            let frame = Frame::read(&socket);
            let mut inbox = lock(&self.inbox);
            match frame {
                Ok(f) if f.kind == Kind::Data => {
                    inbox.data.insert((f.peer, f.channel, f.seq), f.payload);
                }
                Ok(f) if f.kind == Kind::Ack => {
                    inbox.acks.insert((f.peer, f.channel, f.seq), f.payload == [1]);
                }
                Ok(f) if f.kind == Kind::Left => {
                    inbox.left.insert(f.peer);
                    if f.seq != 1 {
                        drop(inbox);
                        let why = format!("rank {} lost its connection (its process ended?)", f.peer);
                        self.fail(ncclResult_t::ncclRemoteError, why);
                        continue;
                    }
                }
                _ => {
                    inbox.hub_gone = true;
                    drop(inbox);
                    self.changed.notify_all();
                    return;
                }
            }
            drop(inbox);
            self.changed.notify_all();
        }
    }
}

/// The sequence numbers the calls hand out, so that matching does not depend on which
/// stream runs an operation first.
struct Counters {
    sends: Vec<u64>,
    receives: Vec<u64>,
    collectives: u64,
}

pub struct Comm {
    pub rank: usize,
    pub size: usize,
    /// The stand-in GPU the communicator was made on.
    pub device: usize,
    writer: Mutex<UnixStream>,
    /// The same socket, to shut without waiting for a writer.
    control: UnixStream,
    shared: Arc<Shared>,
    counters: Mutex<Counters>,
}

impl Comm {
    /// Joins the communicator `key` names as `rank` of `size`; returns once every rank has.
    pub fn join(key: Key, size: usize, rank: usize, device: usize) -> Result<Comm, Failure> {
        let system = |what: &str, e: std::io::Error| Failure {
            code: ncclResult_t::ncclSystemError,
            message: format!("{what}: {e}"),
        };
        let deadline = Instant::now() + CONNECT;
        let socket = loop {
            match UnixStream::connect_addr(&key.address()) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => {
                    let what = format!(
                        "no hub answered for {}s (the process that made the unique id has ended, or \
                         a communicator was made with the id already)",
                        CONNECT.as_secs()
                    );
                    return Err(system(&what, e));
                }
            }
        };
        Frame::control(Kind::Hello, rank as u32, size as u64)
            .write(&socket)
            .map_err(|e| system("joining", e))?;
        match Frame::read(&socket) {
            Ok(f) if f.kind == Kind::Ready => {}
            Ok(f) if f.kind == Kind::Refused => {
                let why = String::from_utf8_lossy(&f.payload);
                let message = format!("the communicator cannot form: {why}");
                return Err(Failure { code: ncclResult_t::ncclInvalidUsage, message });
            }
            Ok(f) => {
                let message = format!("the hub answered {:?}", f.kind);
                return Err(Failure { code: ncclResult_t::ncclInternalError, message });
            }
            Err(e) => return Err(system("waiting for the other ranks", e)),
        }
        let clone = |s: &UnixStream| s.try_clone().map_err(|e| system("sharing the connection", e));
        let (reader, control) = (clone(&socket)?, clone(&socket)?);
        let shared = Arc::new(Shared {
            inbox: Mutex::default(),
            changed: Condvar::new(),
            failure: OnceLock::new(),
            aborted: Default::default(),
        });
        let filer = shared.clone();
        std::thread::Builder::new()
            .name(format!("standin-nccl-rank{rank}"))
            .spawn(move || filer.file(reader))
            .map_err(|e| system("starting the communicator's thread", e))?;
        Ok(Comm {
            rank,
            size,
            device,
            writer: Mutex::new(socket),
            control,
            shared,
            counters: Mutex::new(Counters { sends: vec![0; size], receives: vec![0; size], collectives: 0 }),
        })
    }

    pub fn next_send(&self, to: usize) -> u64 {
        let mut c = lock(&self.counters);
        c.sends[to] += 1;
        c.sends[to]
    }

    pub fn next_receive(&self, from: usize) -> u64 {
        let mut c = lock(&self.counters);
        c.receives[from] += 1;
        c.receives[from]
    }

    pub fn next_collective(&self) -> u64 {
        let mut c = lock(&self.counters);
        c.collectives += 1;
        c.collectives
    }

    pub fn failure(&self) -> Option<&Failure> {
        self.shared.failure.get()
    }

    /// Ends the communicator with an error (printed unless it was aborted).
    pub fn fail(&self, code: ncclResult_t, message: String) -> ncclResult_t {
        self.shared.fail(code, message)
    }

    fn check(&self) -> Result<(), ncclResult_t> {
        self.failure().map_or(Ok(()), |f| Err(f.code))
    }

    /// Hands `payload` to the hub for `to` (or [`super::wire::ALL`]).
    pub fn post(&self, to: u32, channel: Channel, seq: u64, payload: Vec<u8>) -> Result<(), ncclResult_t> {
        self.check()?;
        let frame = Frame::new(Kind::Data, to, channel, seq, payload);
        frame.write(&lock(&self.writer)).map_err(|e| {
            self.fail(
                ncclResult_t::ncclRemoteError,
                format!("rank {}: the hub is unreachable: {e}", self.rank),
            )
        })
    }

    /// Waits until `ready` finds what it waits for in the inbox, the communicator fails,
    /// or `gone` says it can never arrive (then the communicator fails with its message).
    fn wait<T>(
        &self,
        mut ready: impl FnMut(&mut Inbox) -> Option<T>,
        gone: impl Fn(&Inbox) -> Option<String>,
    ) -> Result<T, ncclResult_t> {
        let mut inbox = lock(&self.shared.inbox);
        loop {
            self.check()?;
            if let Some(found) = ready(&mut inbox) {
                return Ok(found);
            }
            if let Some(why) = gone(&inbox) {
                drop(inbox);
                return Err(self.fail(ncclResult_t::ncclRemoteError, why));
            }
            inbox = self.shared.changed.wait(inbox).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The elements `from` sent on `channel` with `seq`, once they arrive.
    pub fn take(&self, from: usize, channel: Channel, seq: u64) -> Result<Vec<u8>, ncclResult_t> {
        let me = self.rank;
        self.wait(
            |inbox| inbox.data.remove(&(from as u32, channel, seq)),
            |inbox| match inbox.left.contains(&(from as u32)) {
                true => Some(format!("rank {me} waits for rank {from}, which has left the communicator")),
                false => inbox.hub_gone.then(|| hub_gone(me)),
            },
        )
    }

    /// Waits until the hub has delivered this rank's `Data` to `to` on `channel` with `seq`.
    pub fn delivered(&self, to: u32, channel: Channel, seq: u64) -> Result<(), ncclResult_t> {
        let me = self.rank;
        let ack = self.wait(
            |inbox| inbox.acks.remove(&(to, channel, seq)),
            |inbox| inbox.hub_gone.then(|| hub_gone(me)),
        )?;
        match ack {
            true => Ok(()),
            false => Err(self.fail(
                ncclResult_t::ncclRemoteError,
                format!("rank {me} sent to a rank that had left the communicator"),
            )),
        }
    }

    /// Makes every wait on this communicator return at once, and leaves it.
    pub fn abort(&self) {
        self.shared.aborted.store(true, Ordering::SeqCst);
        self.fail(ncclResult_t::ncclInvalidUsage, "the communicator was aborted".into());
        self.leave();
    }

    /// Says goodbye to the hub if the connection is free at once (a writer blocked on a
    /// hub that stopped reading must not hold this up), then closes the connection.
    fn leave(&self) {
        if let Ok(writer) = self.writer.try_lock() {
            let _ = writer.set_nonblocking(true);
            let _ = Frame::control(Kind::Goodbye, self.rank as u32, 0).write(&writer);
        }
        shut(&self.control);
    }
}

fn hub_gone(rank: usize) -> String {
    format!("rank {rank}: the communicator's hub has gone (the process that made its unique id has ended?)")
}

impl Drop for Comm {
    fn drop(&mut self) {
        self.leave();
    }
}
