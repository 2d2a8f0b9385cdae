//! The compact text form of a [`Schedule`], printed by `Display` and read by `FromStr`;
//! printing then parsing gives the same schedule back.
//!
//! ```text
//! schedule stages=2 chunks=1 microbatches=3
//! stage 0: F0 F1 B0 F2 B1 B2
//! stage 1: F0 B0 F1 B1 F2 B2
//! ```
//!
//! Grammar (EBNF; tokens are separated by whitespace):
//!
//! ```text
//! schedule   = header , { stage-line } ;
//! header     = "schedule" , "stages=" INT , "chunks=" INT , "microbatches=" INT ,
//!              [ "placement=v" ] ;
//! stage-line = "stage" , INT , ":" , { action } ;
//! action     = kind , INT , [ "c" , INT ] , [ "@" , INT ] ;
//! kind       = "F" | "B" | "I" | "W" | "SA" | "RA" | "SG" | "RG" ;
//! ```
//!
//! * The first `INT` of an action is the microbatch; `c` gives the model chunk (default 0,
//!   printed only when `chunks > 1`); `@` gives the peer stage, required on the transfers
//!   and forbidden on compute.
//! * Kinds: `F` forward, `B` full backward, `I` backward for inputs only, `W` backward for
//!   weights only; `SA`/`RA` send/receive an activation, `SG`/`RG` send/receive a gradient.
//!   So `SA3c1@2` is "send chunk 1's forward output for microbatch 3 to stage 2", and
//!   `RG3c1@2` is "receive from stage 2 the gradient of chunk 1's output for microbatch 3".
//! * `placement=v` marks a V placement (two chunks, stage r holding virtual stages r and
//!   2p-1-r); without it chunks are interleaved. The header's keys appear in that order. Each stage has exactly one line, in order
//!   `0..stages`; an empty list is `stage 3:`.
//! * `#` starts a comment that runs to the end of the line; blank lines are ignored.
//!
//! Parse errors give the line number and the offending token.

use crate::ir::{Action, ActionKind, Placement, Schedule, Shape};
use crate::ScheduleError;
use std::fmt;
use std::str::FromStr;

impl Action {
    /// The action's token, with the chunk suffix when the schedule has `chunks > 1`.
    pub fn token(&self, chunks: usize) -> ActionToken {
        ActionToken { action: *self, show_chunk: chunks > 1 }
    }
}

/// Display adapter for one action in the text form (see [`Action::token`]).
#[derive(Clone, Copy, Debug)]
pub struct ActionToken {
    action: Action,
    show_chunk: bool,
}

impl fmt::Display for ActionToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.action;
        let (kind, peer) = match a.kind {
            ActionKind::Forward => ("F", None),
            ActionKind::Backward => ("B", None),
            ActionKind::BackwardInput => ("I", None),
            ActionKind::BackwardWeight => ("W", None),
            ActionKind::SendActivation { to } => ("SA", Some(to)),
            ActionKind::RecvActivation { from } => ("RA", Some(from)),
            ActionKind::SendGrad { to } => ("SG", Some(to)),
            ActionKind::RecvGrad { from } => ("RG", Some(from)),
        };
        write!(f, "{kind}{}", a.microbatch)?;
        if self.show_chunk {
            write!(f, "c{}", a.chunk)?;
        }
        if let Some(peer) = peer {
            write!(f, "@{peer}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shape = self.shape();
        writeln!(
            f,
            "schedule stages={} chunks={} microbatches={}{}",
            shape.stages,
            shape.chunks,
            shape.microbatches,
            if shape.placement == Placement::V { " placement=v" } else { "" }
        )?;
        for (stage, list) in self.stages().iter().enumerate() {
            write!(f, "stage {stage}:")?;
            for action in list {
                write!(f, " {}", action.token(shape.chunks))?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

impl FromStr for Schedule {
    type Err = ScheduleError;

    fn from_str(text: &str) -> Result<Self, ScheduleError> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, line)| (i + 1, line.split('#').next().unwrap_or("").trim()))
            .filter(|(_, line)| !line.is_empty());

        let (line_no, header) = lines.next().ok_or_else(|| ScheduleError::Parse {
            line: 1,
            token: String::new(),
            reason: "empty text; expected \"schedule stages=P chunks=V microbatches=M\"".into(),
        })?;
        let shape = parse_header(line_no, header)?;

        let mut stages = Vec::with_capacity(shape.stages);
        for (line_no, line) in lines {
            let err = |token: &str, reason: String| ScheduleError::Parse {
                line: line_no,
                token: token.to_string(),
                reason,
            };
            let (head, body) =
                line.split_once(':').ok_or_else(|| err(line, "expected \"stage N: actions...\"".into()))?;
            let stage = head
                .strip_prefix("stage")
                .and_then(|n| n.trim().parse::<usize>().ok())
                .ok_or_else(|| err(head, "expected \"stage N\"".into()))?;
            if stage != stages.len() {
                return Err(err(head, format!("expected stage {} here", stages.len())));
            }
            if stage >= shape.stages {
                return Err(err(head, format!("the header declares only {} stages", shape.stages)));
            }
            let actions = body
                .split_whitespace()
                .map(|token| parse_action(stage, token).map_err(|reason| err(token, reason)))
                .collect::<Result<Vec<_>, _>>()?;
            stages.push(actions);
        }
        if stages.len() != shape.stages {
            return Err(ScheduleError::Parse {
                line: text.lines().count(),
                token: String::new(),
                reason: format!("missing the line of stage {}", stages.len()),
            });
        }
        Schedule::new(shape, stages)
    }
}

fn parse_header(line: usize, header: &str) -> Result<Shape, ScheduleError> {
    let mut words = header.split_whitespace();
    let err = |token: &str, reason: &str| ScheduleError::Parse {
        line,
        token: token.to_string(),
        reason: reason.to_string(),
    };
    if words.next() != Some("schedule") {
        return Err(err(header, "expected \"schedule stages=P chunks=V microbatches=M\""));
    }
    let mut values = [0usize; 3];
    for (value, key) in values.iter_mut().zip(["stages", "chunks", "microbatches"]) {
        let word = words.next().unwrap_or("");
        *value = word
            .strip_prefix(key)
            .and_then(|rest| rest.strip_prefix('='))
            .and_then(|n| n.parse().ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| err(word, &format!("expected {key}=N with N >= 1")))?;
    }
    let mut rest = words.peekable();
    let v = rest.next_if_eq(&"placement=v").is_some();
    if let Some(extra) = rest.next() {
        return Err(err(extra, "unexpected text after the header"));
    }
    if v {
        if values[1] != 2 {
            return Err(err(header, "placement=v needs chunks=2"));
        }
        return Shape::v(values[0], values[2]);
    }
    Shape::new(values[0], values[1], values[2])
}

/// Parses one action token; the error is the reason, the caller adds line and token.
fn parse_action(stage: usize, token: &str) -> Result<Action, String> {
    let split = token.find(|c: char| !c.is_ascii_uppercase()).unwrap_or(token.len());
    let (kind, rest) = token.split_at(split);
    let (rest, peer) = match rest.split_once('@') {
        Some((rest, peer)) => (rest, Some(number(peer, "peer stage")?)),
        None => (rest, None),
    };
    let (microbatch, chunk) = match rest.split_once('c') {
        Some((mb, chunk)) => (number(mb, "microbatch")?, number(chunk, "chunk")?),
        None => (number(rest, "microbatch")?, 0),
    };
    let needs_peer = |make: fn(usize) -> ActionKind| {
        peer.map(make).ok_or_else(|| format!("{kind} needs a peer stage, e.g. {kind}{microbatch}@1"))
    };
    let kind = match kind {
        "F" | "B" | "I" | "W" if peer.is_some() => {
            return Err(format!("compute action {kind} takes no @peer"));
        }
        "F" => ActionKind::Forward,
        "B" => ActionKind::Backward,
        "I" => ActionKind::BackwardInput,
        "W" => ActionKind::BackwardWeight,
        "SA" => needs_peer(|to| ActionKind::SendActivation { to })?,
        "RA" => needs_peer(|from| ActionKind::RecvActivation { from })?,
        "SG" => needs_peer(|to| ActionKind::SendGrad { to })?,
        "RG" => needs_peer(|from| ActionKind::RecvGrad { from })?,
        _ => return Err(format!("unknown action kind {kind:?} (expected F, B, I, W, SA, RA, SG or RG)")),
    };
    Ok(Action::new(stage, chunk, microbatch, kind))
}

fn number(text: &str, what: &str) -> Result<usize, String> {
    text.parse().map_err(|_| format!("expected a {what} number, found {text:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_and_parses_back_with_chunks_and_transfers() {
        let text = "schedule stages=2 chunks=2 microbatches=2\n\
                    stage 0: F0c0 SA0c0@1 RA1c1@1 F1c1 B1c1\n\
                    stage 1: RG0c1@0 I1c0 W1c0 SG0c0@0\n";
        let schedule: Schedule = text.parse().unwrap();
        assert_eq!(schedule.to_string(), text);
        assert_eq!(schedule.actions(0)[1], Action::new(0, 0, 0, ActionKind::SendActivation { to: 1 }));
    }

    #[test]
    fn chunk_suffix_is_optional_and_comments_are_skipped() {
        let schedule: Schedule =
            "# one stage\nschedule stages=1 chunks=1 microbatches=1\n\nstage 0: F0 B0 # done\n"
                .parse()
                .unwrap();
        assert_eq!(schedule.to_string(), "schedule stages=1 chunks=1 microbatches=1\nstage 0: F0 B0\n");
    }

    #[test]
    fn errors_name_line_and_token() {
        let cases = [
            ("schedule stages=1 chunks=1 microbatches=1\nstage 0: F0 X1\n", "line 2: \"X1\": unknown"),
            ("schedule stages=1 chunks=1 microbatches=1\nstage 0: F0 SA0\n", "\"SA0\": SA needs a peer"),
            ("schedule stages=1 chunks=1 microbatches=1\nstage 0: F0@1\n", "\"F0@1\": compute action F"),
            ("schedule stages=1 chunks=1 microbatches=1\nstage 0: Fx\n", "expected a microbatch number"),
            ("schedule stages=2 chunks=1 microbatches=1\nstage 0: F0\n", "missing the line of stage 1"),
            ("schedule stages=2 chunks=1 microbatches=1\nstage 1: F0\n", "\"stage 1\": expected stage 0"),
            ("schedule stages=0 chunks=1 microbatches=1\n", "\"stages=0\": expected stages=N"),
            ("schedule stages=1 chunks=1 microbatches=1\nstage 0: F1\n", "microbatch 1 out of range"),
        ];
        for (text, expected) in cases {
            let err = text.parse::<Schedule>().unwrap_err().to_string();
            assert!(err.contains(expected), "{err:?} should contain {expected:?}");
        }
    }
}
