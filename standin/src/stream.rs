//! Streams and events. A stream is a host thread that runs its work in the order it was
//! enqueued, asynchronously to the caller, as a CUDA stream does; two streams run at the
//! same time with nothing ordering them but events. A missing wait is therefore a real race
//! here, as on a GPU.

use cudarc::driver::sys::CUstream;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Instant;

/// One piece of a stream's work: a kernel, a copy, a collective, an event's mark.
pub type Job = Box<dyn FnOnce() + Send>;

pub struct Stream {
    /// The ordinal of the stand-in GPU the stream belongs to.
    pub device: usize,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Jobs enqueued so far; job `n` (from 1) is done once `completed >= n`.
    submitted: u64,
    completed: u64,
    /// Destroyed: the thread ends once the queue is empty.
    closing: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Stream {
    /// A stream of stand-in GPU `device`, its thread started.
    pub fn new(device: usize) -> Arc<Stream> {
        let stream = Arc::new(Stream { device, state: Mutex::default(), changed: Condvar::new() });
        let mut all = lock(&STREAMS);
        all.retain(|s| s.strong_count() > 0);
        all.push(Arc::downgrade(&stream));
        drop(all);
        let worker = stream.clone();
        std::thread::Builder::new()
            .name(format!("standin-gpu{device}-stream"))
            .spawn(move || worker.run())
            .expect("the stand-in starts a stream thread");
        stream
    }

    fn run(&self) {
        loop {
            let job = {
                let mut state = lock(&self.state);
                loop {
                    if let Some(job) = state.queue.pop_front() {
                        break job;
                    }
                    if state.closing {
                        return;
                    }
                    state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            };
            job();
            lock(&self.state).completed += 1;
            self.changed.notify_all();
        }
    }

    /// Enqueues `job`; returns its position, for [`Stream::wait_for`].
    pub fn enqueue(&self, job: Job) -> u64 {
        let mut state = lock(&self.state);
        state.queue.push_back(job);
        state.submitted += 1;
        let position = state.submitted;
        drop(state);
        self.changed.notify_all();
        position
    }

    /// Blocks until the job at `position` (and so every job before it) has run.
    pub fn wait_for(&self, position: u64) {
        let mut state = lock(&self.state);
        while state.completed < position {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub fn is_done(&self, position: u64) -> bool {
        lock(&self.state).completed >= position
    }

    /// Blocks until everything enqueued so far has run.
    pub fn synchronize(&self) {
        let submitted = lock(&self.state).submitted;
        self.wait_for(submitted);
    }

    /// Lets the thread end once its queue has run (cuStreamDestroy returns at once and the
    /// work already enqueued still completes).
    pub fn close(&self) {
        lock(&self.state).closing = true;
        self.changed.notify_all();
    }
}

/// Every stream, for a whole-GPU synchronisation.
static STREAMS: Mutex<Vec<Weak<Stream>>> = Mutex::new(Vec::new());

/// Waits for everything enqueued so far on every stream of GPU `device`
/// (`cuCtxSynchronize`, and the synchronous copies, which CUDA orders after all prior work).
pub fn synchronize_device(device: usize) {
    let streams: Vec<Arc<Stream>> = lock(&STREAMS).iter().filter_map(Weak::upgrade).collect();
    for s in streams.iter().filter(|s| s.device == device) {
        s.synchronize();
    }
}

/// The stream a handle this library made with [`into_handle`] names; None for CUDA's null
/// stream handles (0, and the legacy and per-thread 0x1 and 0x2), whose stream is the
/// current context's.
pub fn made_stream(handle: CUstream) -> Option<Arc<Stream>> {
    if (handle as usize) <= 2 {
        return None;
    }
    let raw = handle as *const Stream;
    // SAFETY: a handle above 2 came from `into_handle` and is live until `release_handle`
    // (a handle used after cuStreamDestroy is the caller's bug, as in CUDA).
    unsafe {
        Arc::increment_strong_count(raw);
        Some(Arc::from_raw(raw))
    }
}

pub fn into_handle(stream: Arc<Stream>) -> CUstream {
    Arc::into_raw(stream) as CUstream
}

/// Ends a handle from [`into_handle`]: the stream finishes its queue, then its thread ends.
///
/// # Safety
/// `handle` came from [`into_handle`] and is not used again.
pub unsafe fn release_handle(handle: CUstream) {
    // SAFETY: per the contract, this is the reference `into_handle` gave away.
    let stream = unsafe { Arc::from_raw(handle as *const Stream) };
    stream.close();
}

/// An event: the point of one stream where it was last recorded, and when the stream
/// reached it.
#[derive(Default)]
pub struct Event {
    mark: Mutex<Option<Mark>>,
}

#[derive(Clone)]
struct Mark {
    stream: Arc<Stream>,
    position: u64,
    reached: Arc<Mutex<Option<Instant>>>,
}

/// Why an event cannot answer yet.
#[derive(Debug, PartialEq, Eq)]
pub enum NotReady {
    /// Never recorded.
    Unrecorded,
    /// Recorded, but its stream has not reached it.
    Pending,
}

impl Event {
    /// Marks the work enqueued on `stream` so far; a later record moves the mark, as in
    /// CUDA, without changing what earlier waits wait for.
    pub fn record(&self, stream: &Arc<Stream>) {
        let reached = Arc::new(Mutex::new(None));
        let stamp = reached.clone();
        let position = stream.enqueue(Box::new(move || *lock(&stamp) = Some(Instant::now())));
        *lock(&self.mark) = Some(Mark { stream: stream.clone(), position, reached });
    }

    /// Makes `stream`'s later work wait until this event's mark is reached. An event never
    /// recorded is no wait, as CUDA defines.
    pub fn make_wait(&self, stream: &Stream) {
        if let Some(mark) = lock(&self.mark).clone() {
            stream.enqueue(Box::new(move || mark.stream.wait_for(mark.position)));
        }
    }

    /// Blocks until the mark is reached (at once if never recorded).
    pub fn synchronize(&self) {
        if let Some(mark) = lock(&self.mark).clone() {
            mark.stream.wait_for(mark.position);
        }
    }

    pub fn is_done(&self) -> bool {
        lock(&self.mark).as_ref().is_none_or(|m| m.stream.is_done(m.position))
    }

    /// When the stream reached the mark.
    pub fn reached(&self) -> Result<Instant, NotReady> {
        let mark = lock(&self.mark).clone().ok_or(NotReady::Unrecorded)?;
        let at = *lock(&mark.reached);
        at.ok_or(NotReady::Pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[test]
    fn a_stream_runs_its_jobs_in_order_after_the_caller_returns() {
        let stream = Stream::new(0);
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let g = gate.clone();
        stream.enqueue(Box::new(move || {
            let mut open = lock(&g.0);
            while !*open {
                open = g.1.wait(open).unwrap();
            }
        }));
        for i in 0..3 {
            let log = log.clone();
            stream.enqueue(Box::new(move || lock(&log).push(i)));
        }
        // Enqueueing returned while the first job still blocks: nothing has run.
        assert!(lock(&log).is_empty());
        *lock(&gate.0) = true;
        gate.1.notify_all();
        stream.synchronize();
        assert_eq!(*lock(&log), vec![0, 1, 2]);
    }

    #[test]
    fn a_wait_on_an_event_orders_two_streams() {
        let (a, b) = (Stream::new(0), Stream::new(0));
        let value = Arc::new(AtomicU32::new(0));
        let v = value.clone();
        a.enqueue(Box::new(move || {
            std::thread::sleep(Duration::from_millis(50));
            v.store(7, Ordering::SeqCst);
        }));
        let event = Event::default();
        event.record(&a);
        event.make_wait(&b);
        let (v, seen) = (value.clone(), Arc::new(AtomicU32::new(0)));
        let s = seen.clone();
        b.enqueue(Box::new(move || s.store(v.load(Ordering::SeqCst), Ordering::SeqCst)));
        b.synchronize();
        assert_eq!(seen.load(Ordering::SeqCst), 7, "b ran before a's mark");
        assert!(event.is_done() && event.reached().is_ok());
    }

    #[test]
    fn without_the_wait_the_second_stream_runs_first() {
        let (a, b) = (Stream::new(0), Stream::new(0));
        let value = Arc::new(AtomicU32::new(0));
        let v = value.clone();
        a.enqueue(Box::new(move || {
            std::thread::sleep(Duration::from_millis(200));
            v.store(7, Ordering::SeqCst);
        }));
        let (v, seen) = (value.clone(), Arc::new(AtomicU32::new(u32::MAX)));
        let s = seen.clone();
        b.enqueue(Box::new(move || s.store(v.load(Ordering::SeqCst), Ordering::SeqCst)));
        b.synchronize();
        assert_eq!(seen.load(Ordering::SeqCst), 0, "streams are not serialised behind one another");
        a.synchronize();
    }

    #[test]
    fn an_event_never_recorded_is_no_wait() {
        let event = Event::default();
        assert_eq!(event.reached(), Err(NotReady::Unrecorded));
        assert!(event.is_done());
        let stream = Stream::new(0);
        event.make_wait(&stream);
        stream.synchronize();
    }
}
