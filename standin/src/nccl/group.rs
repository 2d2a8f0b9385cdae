//! ncclGroupStart/End. The calls of a group (on this thread, as NCCL's groups are) are held
//! until its outermost end, then each stream gets one job with its share, so that the
//! group's receives cannot wait on sends issued after them (see [`super::ops`]).

use super::ops::{self, Op};
use crate::stream::Stream;
use cudarc::nccl::sys::ncclResult_t;
use std::cell::RefCell;
use std::sync::Arc;

#[derive(Default)]
struct Group {
    depth: usize,
    calls: Vec<(Arc<Stream>, Op)>,
    /// The first call the group refused: its end fails with it, and runs nothing.
    refused: Option<ncclResult_t>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::default();
}

pub fn start() {
    GROUP.with_borrow_mut(|g| g.depth += 1);
}

pub fn end() -> ncclResult_t {
    let ended = GROUP.with_borrow_mut(|g| {
        if g.depth == 0 {
            return Err(ncclResult_t::ncclInvalidUsage);
        }
        g.depth -= 1;
        Ok((g.depth == 0).then(|| (std::mem::take(&mut g.calls), g.refused.take())))
    });
    match ended {
        Err(code) => code,
        Ok(None) => ncclResult_t::ncclSuccess,
        Ok(Some((calls, Some(code)))) => {
            // Their sequence numbers are spent: later operations on these communicators
            // would match the wrong peers' data, so they fail instead.
            for (_, op) in calls {
                op.comm.fail(code, "a group with a refused call ran none of its operations".into());
            }
            code
        }
        Ok(Some((calls, None))) => {
            launch(calls);
            ncclResult_t::ncclSuccess
        }
    }
}

/// Runs `op` on `stream`: now, or at the end of the open group.
pub fn submit(stream: Arc<Stream>, op: Op) {
    let now = GROUP.with_borrow_mut(|g| match g.depth {
        0 => Some((stream, op)),
        _ => {
            g.calls.push((stream, op));
            None
        }
    });
    if let Some(call) = now {
        launch(vec![call]);
    }
}

/// Notes a refused call: inside a group, the group's end fails too, as NCCL's does.
pub fn refuse(code: ncclResult_t) -> ncclResult_t {
    GROUP.with_borrow_mut(|g| {
        if g.depth > 0 {
            g.refused.get_or_insert(code);
        }
    });
    code
}

fn launch(calls: Vec<(Arc<Stream>, Op)>) {
    let mut by_stream: Vec<(Arc<Stream>, Vec<Op>)> = Vec::new();
    for (stream, op) in calls {
        match by_stream.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &stream)) {
            Some((_, ops)) => ops.push(op),
            None => by_stream.push((stream, vec![op])),
        }
    }
    for (stream, ops) in by_stream {
        stream.enqueue(Box::new(move || ops::run(ops)));
    }
}
