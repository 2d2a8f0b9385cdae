//! `tokenize`'s progress line on stderr: bytes read and tokens written, each per second,
//! redrawn in place at most twice a second, and only on a terminal (a log gets the summary).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

const REDRAW: Duration = Duration::from_millis(500);

pub struct Progress {
    start: Instant,
    last: Instant,
    shown: bool,
}

impl Progress {
    /// `None` when quiet or when stderr is not a terminal.
    pub fn new(quiet: bool) -> Option<Progress> {
        let now = Instant::now();
        (!quiet && std::io::stderr().is_terminal()).then_some(Progress {
            start: now,
            last: now,
            shown: false,
        })
    }

    pub fn update(&mut self, bytes: u64, tokens: usize) {
        let now = Instant::now();
        if now - self.last < REDRAW {
            return;
        }
        self.last = now;
        self.shown = true;
        let secs = (now - self.start).as_secs_f64();
        let line = format!(
            "\r{:.1} MB read, {:.2} MB/s, {tokens} tokens, {:.0} tokens/s   ",
            bytes as f64 / 1e6,
            bytes as f64 / 1e6 / secs,
            tokens as f64 / secs
        );
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    /// Ends the line so the summary starts on its own.
    pub fn finish(self) {
        if self.shown {
            let _ = std::io::stderr().lock().write_all(b"\n");
        }
    }
}
