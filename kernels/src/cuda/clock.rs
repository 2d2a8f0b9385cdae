//! A CUDA device's clock: events recorded on its stream. Marking records an event and
//! returns; reading waits for the last mark, then takes every mark's time from the start
//! event. The trainer reads after its step's readout, which every mark precedes, so the
//! read finds them complete and waits for nothing.

use crate::timing::{Mark, Readings};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream, DriverError};
use std::sync::{Mutex, MutexGuard};

#[derive(Default)]
pub(super) struct EventClock(Mutex<Events>);

#[derive(Default)]
struct Events {
    epoch: u64,
    start: Option<CudaEvent>,
    marks: Vec<CudaEvent>,
}

/// An event recorded on `stream` now, with timing on (cudarc's default turns it off).
fn timed_event(stream: &CudaStream) -> CudaEvent {
    stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .unwrap_or_else(|e| panic!("cuda: cannot record a timing event: {e:?}"))
}

impl EventClock {
    fn events(&self) -> MutexGuard<'_, Events> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn start(&self, stream: &CudaStream) {
        let mut e = self.events();
        e.epoch += 1;
        e.start = Some(timed_event(stream));
        e.marks.clear();
    }

    pub fn mark(&self, stream: &CudaStream) -> Mark {
        let mut e = self.events();
        if e.start.is_none() {
            // Marks before any start (an evaluation before training) count from the first.
            e.start = Some(timed_event(stream));
        }
        e.marks.push(timed_event(stream));
        Mark::new(e.epoch, e.marks.len() - 1)
    }

    /// Every mark's time, and whether the host had to wait for the last mark.
    pub fn read(&self) -> (Readings, bool) {
        let e = self.events();
        // At most one wait: for the last mark, after which every earlier one is complete too.
        let mut waited = false;
        if let Some(last) = e.marks.last() {
            if !last.try_is_complete().unwrap_or_else(|err| read_failed(err)) {
                waited = true;
                last.synchronize().unwrap_or_else(|err| read_failed(err));
            }
        }
        let seconds = match &e.start {
            Some(start) => e
                .marks
                .iter()
                .map(|m| match start.elapsed_ms(m) {
                    Ok(ms) => f64::from(ms) / 1e3,
                    Err(err) => read_failed(err),
                })
                .collect(),
            None => Vec::new(),
        };
        (Readings::new(e.epoch, seconds), waited)
    }
}

fn read_failed(err: DriverError) -> ! {
    panic!("cuda: cannot read a timing event: {err:?}")
}
