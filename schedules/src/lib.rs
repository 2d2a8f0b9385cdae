//! Pipeline schedules for pipetrain: the IR, the generators, the validator, the lowering to
//! send/receive lists and a simulator. It knows nothing of tensors: a schedule says which
//! stage runs which pass of which microbatch through which model chunk, in which order.
//!
//! ```
//! use schedules::{generate, lower, simulate, ChunkCosts, Link, ScheduleKind, SimInput};
//!
//! let kind: ScheduleKind = "1f1b".parse()?;
//! let schedule = generate(kind, 4, 1, 8)?; // p = 4 stages, v = 1 chunk each, m = 8
//! let lowered = lower(&schedule)?; // adds the sends and receives; proven deadlock-free
//! println!("{lowered}"); // the text form, one line per stage
//! let costs = ChunkCosts { forward: 1.0, backward_input: 1.0, backward_weight: 1.0, ..Default::default() };
//! let report = simulate(&lowered, &SimInput::uniform(4, 1, costs, 0, Link::INSTANT)?)?;
//! assert_eq!(report.bubble_rate, 3.0 / 11.0); // (p-1)/(m+p-1)
//! # Ok::<(), schedules::ScheduleError>(())
//! ```
//!
//! Modules: [`ir`] (the types), [`text`] (the printable/parsable form and its grammar),
//! [`generators`], [`validate`], [`lower`] (with the trainer's channel guarantee),
//! [`execute`] (the executor that proves lowered lists complete) and [`simulate`].

pub mod error;
pub mod execute;
pub mod generators;
pub mod ir;
pub mod lower;
mod progress;
pub mod simulate;
pub mod text;
pub mod validate;

pub use error::ScheduleError;
pub use execute::ChannelCapacity;
pub use generators::{generate, interleaved::interleaved_1f1b, ScheduleKind};
pub use ir::{Action, ActionKind, InFlight, Payload, Placement, Schedule, Shape};
pub use lower::{lower, Channel, LoweredSchedule};
pub use simulate::{
    simulate, ChunkCosts, ChunkMemory, EventKind, Link, MemoryPoint, SimInput, SimReport, StageReport,
    TimelineEvent,
};
pub use validate::validate;
