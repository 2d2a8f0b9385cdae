//! DualPipeV (DeepSeek's DualPipe folded into a V, as in deepseek-ai/DualPipe's `dualpipev`):
//! stage r holds virtual stages r (chunk 0) and 2p-1-r (chunk 1), so a microbatch goes down
//! the stages on chunk 0, turns on stage p-1 and comes back up on chunk 1; stage 0 holds both
//! the embedding and the head.
//!
//! Stage r, with p stages and m >= 2p microbatches, runs eight phases:
//! 1. `2(p-1-r)` chunk-0 forwards;
//! 2. `r+1` times: chunk-0 forward, chunk-1 forward;
//! 3. `p-1-r` times: chunk-1 input gradient, the oldest weight gradient, chunk-1 forward;
//! 4. `m-2p+r+1` times: chunk-0 forward, chunk-1 backward, chunk-1 forward, chunk-0 backward
//!    (DualPipe overlaps each forward with the backward beside it; we run them in turn);
//! 5. `p-1-r` times: chunk-1 backward, chunk-1 forward, chunk-0 backward;
//! 6. `r+1` times: chunk-1 backward, chunk-0 backward, the second half of them split so
//!    their weight gradients can fill the drain;
//! 7. `p-1-r` times: the oldest weight gradient, a split chunk-0 backward;
//! 8. `r+1` weight gradients.
//!
//! Every stage holds at most 2p + 1 (chunk, microbatch) activation sets: one more than 1F1B's
//! peak of p whole-stage microbatches, because each forward here runs just before the
//! backward that DualPipe overlaps it with (DualPipe's published figure is likewise PP + 1).

use super::per_stage;
use crate::ir::{ActionKind, InFlight, Schedule, Shape};
use crate::ScheduleError;
use std::collections::VecDeque;

pub(super) fn shape(p: usize, m: usize) -> Result<Shape, ScheduleError> {
    if m < 2 * p {
        return Err(ScheduleError::Shape(format!(
            "dualpipe-v needs at least 2p = {} microbatches, not {m}",
            2 * p
        )));
    }
    Shape::v(p, m)
}

pub(super) fn build(shape: Shape) -> Result<Schedule, ScheduleError> {
    let (p, m) = (shape.stages, shape.microbatches);
    per_stage(shape, |r, push| {
        let mut stage = Order { forward: [0; 2], backward: [0; 2], weights: VecDeque::new(), push };
        (0..2 * (p - 1 - r)).for_each(|_| stage.forward(0));
        for _ in 0..=r {
            stage.forward(0);
            stage.forward(1);
        }
        for _ in 0..p - 1 - r {
            stage.backward(1, true);
            stage.weight();
            stage.forward(1);
        }
        for _ in 0..m + r + 1 - 2 * p {
            stage.forward(0);
            stage.backward(1, false);
            stage.forward(1);
            stage.backward(0, false);
        }
        for _ in 0..p - 1 - r {
            stage.backward(1, false);
            stage.forward(1);
            stage.backward(0, false);
        }
        // The split starts halfway through phase 6: at the chunk-1 backward on odd stages, at
        // the chunk-0 one on even stages, which makes r + 1 split backwards either way.
        let half = r.div_ceil(2);
        for i in 0..=r {
            stage.backward(1, i > half || (i == half && r % 2 == 1));
            stage.backward(0, i >= half);
        }
        for _ in 0..p - 1 - r {
            stage.weight();
            stage.backward(0, true);
        }
        (0..=r).for_each(|_| stage.weight());
        debug_assert!(stage.weights.is_empty());
    })
}

/// Each chunk's forwards and backwards go in microbatch order; split backwards queue their
/// weight gradients, which run oldest first.
struct Order<'a> {
    forward: [usize; 2],
    backward: [usize; 2],
    weights: VecDeque<(usize, usize)>,
    push: &'a mut dyn FnMut(usize, usize, ActionKind),
}

impl Order<'_> {
    fn forward(&mut self, chunk: usize) {
        (self.push)(chunk, self.forward[chunk], ActionKind::Forward);
        self.forward[chunk] += 1;
    }

    fn backward(&mut self, chunk: usize, split: bool) {
        let mb = self.backward[chunk];
        self.backward[chunk] += 1;
        if split {
            (self.push)(chunk, mb, ActionKind::BackwardInput);
            self.weights.push_back((chunk, mb));
        } else {
            (self.push)(chunk, mb, ActionKind::Backward);
        }
    }

    fn weight(&mut self) {
        let (chunk, mb) = self.weights.pop_front().expect("a split backward before each weight pass");
        (self.push)(chunk, mb, ActionKind::BackwardWeight);
    }
}

/// `full = total = 2p + 1` chunk activation sets on every stage (see the module docs).
pub(super) fn promised(shape: Shape) -> Vec<InFlight> {
    let p = shape.stages;
    vec![InFlight { full: 2 * p + 1, total: 2 * p + 1 }; p]
}
