//! The one error type of the crate. Every message names what is wrong (the token, the action
//! with its stage and position, the blocked stages of a deadlock) in one line, so the
//! application can print it as is.

/// Why a schedule could not be generated, parsed, validated, lowered or simulated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The stage/chunk/microbatch counts do not suit the requested schedule.
    #[error("{0}")]
    Shape(String),
    /// A schedule name that is not one of the known ones.
    #[error(
        "unknown pipeline schedule {name:?} (expected one of: {})",
        crate::ScheduleKind::ALL.map(|kind| kind.name()).join(", ")
    )]
    UnknownKind { name: String },
    /// The text form could not be parsed; `token` is the offending token or line start.
    #[error("line {line}: {token:?}: {reason}")]
    Parse { line: usize, token: String, reason: String },
    /// One action breaks a rule; `position` is its index in its stage's list.
    #[error("stage {stage}, action {position} ({action}): {reason}")]
    Action { stage: usize, position: usize, action: String, reason: String },
    /// An action that must appear somewhere does not.
    #[error("stage {stage}: {reason}")]
    Missing { stage: usize, reason: String },
    /// Every unfinished stage waits on something that can never happen.
    #[error("deadlock: {}", .blocked.join("; "))]
    Deadlock { blocked: Vec<String> },
    /// Simulator inputs that do not fit the schedule or are not physical.
    #[error("simulator input: {0}")]
    Input(String),
}
