//! User mistakes versus internal failures.
//!
//! A [`UserError`] is a mistake in a config, flag or file: the CLI prints its one line and
//! exits with code 2. [`NoDevice`] is hardware a command needs and this machine lacks
//! (exit code 3). Anything else is a bug or an environment failure (exit code 1).

use std::fmt;

#[derive(Debug)]
pub struct UserError(pub String);

impl fmt::Display for UserError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UserError {}

/// Writes `line` and its newline to stderr in one write: under mpirun, whose forwarding
/// interleaves what ranks and mpirun itself print, a line written in pieces can be split.
pub fn print_line(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(format!("{line}\n").as_bytes());
}

/// An `anyhow::Error` that the CLI reports as a user mistake (exit code 2).
pub fn user_error(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UserError(msg.into()))
}

/// Whether an error, or anything in its chain, is a user mistake.
pub fn is_user_error(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.is::<UserError>())
}

/// The run stopped because the user asked it to (Ctrl-C), after saving: exit code 130, as a
/// shell reports an interrupted command.
#[derive(Debug)]
pub struct Interrupted(pub String);

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Interrupted {}

/// The run stopped at a step whose loss or gradient was not finite, before its update
/// (exit code 1). Every rank reaches it from the same step reports, so the line names the
/// rank where the value arose, and only rank 0 prints it.
#[derive(Debug)]
pub struct NonFinite(pub String);

impl fmt::Display for NonFinite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NonFinite {}

/// A failure already reported by another rank (rank 0 says it once for all): exit with this
/// code and print nothing.
#[derive(Debug)]
pub struct Quiet(pub u8);

impl fmt::Display for Quiet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "exit {}", self.0)
    }
}

impl std::error::Error for Quiet {}

/// The command measures hardware this machine lacks (`bench gpu` with no usable GPU): one
/// line and exit code 3, so a script tells "nothing to measure here" from a failure.
#[derive(Debug)]
pub struct NoDevice(pub String);

impl fmt::Display for NoDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoDevice {}
