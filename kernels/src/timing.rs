//! Time as a device sees it. The trainer times its actions, its recompute and its optimizer
//! by marking points in a device's work ([`Clock::clock_mark`]) and reading them all
//! once, after the step's readout ([`Clock::clock_read`]). On the CPU a mark is the
//! host clock, since an op is done when it returns; on CUDA it is an event recorded on the
//! device's stream, so marking never waits, and since the readout's sync follows every
//! mark, reading them waits for nothing more.

use std::sync::Mutex;
use std::time::Instant;

/// A point in a device's work, read back through [`Readings`]. It belongs to one start of
/// the device's clock (its epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    epoch: u64,
    index: usize,
}

impl Mark {
    /// The `index`-th mark since the clock's start number `epoch` (for backends).
    pub fn new(epoch: u64, index: usize) -> Mark {
        Mark { epoch, index }
    }
}

/// Seconds from a clock's start to each of its marks.
#[derive(Clone, Debug, PartialEq)]
pub struct Readings {
    epoch: u64,
    seconds: Vec<f64>,
}

impl Readings {
    /// The readings of the clock's start number `epoch`, one per mark in mark order.
    pub fn new(epoch: u64, seconds: Vec<f64>) -> Readings {
        Readings { epoch, seconds }
    }

    /// Seconds from the clock's start to `mark`. A mark of another start of the clock is a
    /// bug in the caller (it would read another step's times).
    pub fn at(&self, mark: Mark) -> f64 {
        assert_eq!(mark.epoch, self.epoch, "a mark read against another start of the device clock");
        self.seconds[mark.index]
    }
}

/// The host clock behind the CPU device's marks.
pub struct HostClock(Mutex<HostMarks>);

struct HostMarks {
    epoch: u64,
    start: Instant,
    seconds: Vec<f64>,
}

impl Default for HostClock {
    fn default() -> Self {
        HostClock(Mutex::new(HostMarks { epoch: 0, start: Instant::now(), seconds: Vec::new() }))
    }
}

impl HostClock {
    fn marks(&self) -> std::sync::MutexGuard<'_, HostMarks> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn start(&self) {
        let mut m = self.marks();
        m.epoch += 1;
        m.start = Instant::now();
        m.seconds.clear();
    }

    pub fn mark(&self) -> Mark {
        let mut m = self.marks();
        let now = m.start.elapsed().as_secs_f64();
        m.seconds.push(now);
        Mark::new(m.epoch, m.seconds.len() - 1)
    }

    pub fn read(&self) -> Readings {
        let m = self.marks();
        Readings::new(m.epoch, m.seconds.clone())
    }
}

/// A device's clock: marks in its work, read all at once. Every [`crate::Device`] is one.
pub trait Clock {
    /// Restarts the clock at the point the device's issued work has reached; marks taken
    /// before are forgotten.
    fn clock_start(&self);
    /// Marks the point the device's issued work has reached, without waiting for it: the
    /// host clock on the CPU (an op is done when it returns), an event on the stream on CUDA.
    fn clock_mark(&self) -> Mark;
    /// Seconds from the clock's start to every mark since. CUDA waits here for the last
    /// mark's work unless it is done: read after a step's readout (which every mark
    /// precedes), timing adds no wait at all.
    fn clock_read(&self) -> Readings;
}

/// Spans of a device's work, summed once its clock is read: the recompute time of a chunk.
#[derive(Debug, Default)]
pub struct Stopwatch {
    open: Vec<(Mark, Mark)>,
    /// Seconds of every span settled so far.
    pub total_s: f64,
}

impl Stopwatch {
    /// Runs `f`, marking `dev`'s work before and after it.
    pub fn time<T>(&mut self, dev: &(impl Clock + ?Sized), f: impl FnOnce() -> T) -> T {
        let start = dev.clock_mark();
        let out = f();
        self.open.push((start, dev.clock_mark()));
        out
    }

    /// Adds the spans timed since the last settle to `total_s`.
    pub fn settle(&mut self, readings: &Readings) {
        self.total_s += self.open.drain(..).map(|(a, b)| readings.at(b) - readings.at(a)).sum::<f64>();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuDevice;
    use std::time::Duration;

    #[test]
    fn host_marks_read_the_host_clock_from_its_start() {
        let clock = HostClock::default();
        clock.start();
        let before = clock.mark();
        std::thread::sleep(Duration::from_millis(30));
        let after = clock.mark();
        let r = clock.read();
        assert!(r.at(before) < 0.01, "a mark at the start reads {}", r.at(before));
        assert!(r.at(after) - r.at(before) >= 0.03, "30 ms apart read {}", r.at(after) - r.at(before));
    }

    #[test]
    #[should_panic(expected = "a mark read against another start of the device clock")]
    fn a_mark_of_an_earlier_start_is_refused() {
        let clock = HostClock::default();
        let stale = clock.mark();
        clock.start();
        clock.mark();
        clock.read().at(stale);
    }

    #[test]
    fn a_stopwatch_sums_its_spans_when_the_clock_is_read() {
        let dev = CpuDevice::new(1);
        dev.clock_start();
        let mut watch = Stopwatch::default();
        let out = watch.time(&dev, || {
            std::thread::sleep(Duration::from_millis(20));
            7
        });
        watch.time(&dev, || std::thread::sleep(Duration::from_millis(20)));
        assert_eq!((out, watch.total_s), (7, 0.0), "nothing counts before the clock is read");
        watch.settle(&dev.clock_read());
        assert!(watch.total_s >= 0.04, "two spans of 20 ms summed to {}", watch.total_s);
        let settled = watch.total_s;
        watch.settle(&dev.clock_read());
        assert_eq!(watch.total_s, settled, "a span counts once");
    }
}
