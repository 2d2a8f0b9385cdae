//! Schedule generators and the one entry point, [`generate`].
//!
//! | name               | module          | chunks per stage | microbatches            |
//! |--------------------|-----------------|------------------|-------------------------|
//! | `gpipe`            | [`gpipe`]       | 1                | any                     |
//! | `1f1b`             | [`one_f_one_b`] | 1                | any                     |
//! | `interleaved-1f1b` | [`interleaved`] | >= 2 (p >= 2)    | a multiple of p         |
//! | `zb-h1`            | [`zb_h1`]       | 1                | any                     |
//! | `zb-v`             | [`zb_v`]        | 2, in a V        | any                     |
//! | `dualpipe-v`       | [`dualpipe_v`]  | 2, in a V        | at least 2p             |
//!
//! Each generator also states the peak in-flight activations it promises per stage
//! ([`ScheduleKind::promised_in_flight`]), which the tests hold it to.

pub mod dualpipe_v;
pub mod gpipe;
pub mod interleaved;
pub mod one_f_one_b;
pub mod zb_h1;
pub mod zb_v;

use crate::ir::{Action, ActionKind, InFlight, Placement, Schedule, Shape};
use crate::ScheduleError;
use std::fmt;
use std::str::FromStr;

/// The schedules, named as in the config key `pipeline_schedule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScheduleKind {
    GPipe,
    OneFOneB,
    Interleaved1F1B,
    ZeroBubbleH1,
    ZeroBubbleV,
    DualPipeV,
}

impl ScheduleKind {
    pub const ALL: [ScheduleKind; 6] = [
        Self::GPipe,
        Self::OneFOneB,
        Self::Interleaved1F1B,
        Self::ZeroBubbleH1,
        Self::ZeroBubbleV,
        Self::DualPipeV,
    ];

    /// The config name: `gpipe | 1f1b | interleaved-1f1b | zb-h1 | zb-v | dualpipe-v`.
    pub fn name(self) -> &'static str {
        match self {
            Self::GPipe => "gpipe",
            Self::OneFOneB => "1f1b",
            Self::Interleaved1F1B => "interleaved-1f1b",
            Self::ZeroBubbleH1 => "zb-h1",
            Self::ZeroBubbleV => "zb-v",
            Self::DualPipeV => "dualpipe-v",
        }
    }

    /// The model chunks per stage this schedule implies when
    /// `virtual_pipeline_model_parallel_size` is unset: 2 for the V schedules, else 1.
    pub fn default_chunks(self) -> usize {
        if self.is_v() {
            2
        } else {
            1
        }
    }

    /// Where the schedule places its chunks: in a V (two per stage) for zb-v and dualpipe-v.
    pub fn placement(self) -> Placement {
        match self {
            Self::ZeroBubbleV | Self::DualPipeV => Placement::V,
            _ => Placement::Interleaved,
        }
    }

    /// Whether the schedule places two chunks per stage in a V.
    pub fn is_v(self) -> bool {
        self.placement() == Placement::V
    }

    /// Checks that this schedule supports p stages, v chunks per stage and m microbatches.
    pub fn shape(self, p: usize, v: usize, m: usize) -> Result<Shape, ScheduleError> {
        match self {
            Self::Interleaved1F1B => interleaved::shape(p, v, m, p),
            _ if self.is_v() && v != 2 => Err(ScheduleError::Shape(format!(
                "{self} places two model chunks per stage in a V, so \
                 virtual_pipeline_model_parallel_size must be 2 (or unset), not {v}"
            ))),
            Self::ZeroBubbleV => Shape::v(p, m),
            Self::DualPipeV => dualpipe_v::shape(p, m),
            _ => {
                if v != 1 {
                    return Err(ScheduleError::Shape(format!(
                        "{self} runs one model chunk per stage, so virtual_pipeline_model_parallel_size \
                         must be 1, not {v} (interleaved-1f1b runs several)"
                    )));
                }
                Shape::new(p, v, m)
            }
        }
    }

    /// The most (chunk, microbatch) activation sets each stage holds at once under this
    /// schedule, per stage; see [`InFlight`] and [`Schedule::measured_in_flight`].
    pub fn promised_in_flight(self, p: usize, v: usize, m: usize) -> Result<Vec<InFlight>, ScheduleError> {
        let shape = self.shape(p, v, m)?;
        Ok(match self {
            Self::GPipe => gpipe::promised(shape),
            Self::OneFOneB => one_f_one_b::promised(shape),
            Self::Interleaved1F1B => interleaved::promised(shape, p),
            Self::ZeroBubbleH1 => zb_h1::promised(shape),
            Self::ZeroBubbleV => zb_v::promised(shape),
            Self::DualPipeV => dualpipe_v::promised(shape),
        })
    }
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ScheduleKind {
    type Err = ScheduleError;

    fn from_str(name: &str) -> Result<Self, ScheduleError> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| ScheduleError::UnknownKind { name: name.to_string() })
    }
}

/// The schedule `kind` for p stages, v model chunks per stage and m microbatches.
pub fn generate(kind: ScheduleKind, p: usize, v: usize, m: usize) -> Result<Schedule, ScheduleError> {
    let shape = kind.shape(p, v, m)?;
    match kind {
        ScheduleKind::GPipe => gpipe::build(shape),
        ScheduleKind::OneFOneB => one_f_one_b::build(shape),
        ScheduleKind::Interleaved1F1B => interleaved::build(shape, p),
        ScheduleKind::ZeroBubbleH1 => zb_h1::build(shape),
        ScheduleKind::ZeroBubbleV => zb_v::build(shape),
        ScheduleKind::DualPipeV => dualpipe_v::build(shape),
    }
}

/// Builds one list per stage from a closure that appends (chunk, microbatch, kind) steps.
fn per_stage(
    shape: Shape,
    mut fill: impl FnMut(usize, &mut dyn FnMut(usize, usize, ActionKind)),
) -> Result<Schedule, ScheduleError> {
    let lists = (0..shape.stages)
        .map(|stage| {
            let mut list = Vec::new();
            fill(stage, &mut |chunk, microbatch, kind| {
                list.push(Action::new(stage, chunk, microbatch, kind))
            });
            list
        })
        .collect();
    Schedule::new(shape, lists)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_listed() {
        for kind in ScheduleKind::ALL {
            assert_eq!(kind.to_string().parse::<ScheduleKind>().unwrap(), kind);
        }
        let err = "pipedream".parse::<ScheduleKind>().unwrap_err().to_string();
        assert_eq!(
            err,
            "unknown pipeline schedule \"pipedream\" (expected one of: gpipe, 1f1b, interleaved-1f1b, zb-h1, \
             zb-v, dualpipe-v)"
        );
    }

    #[test]
    fn single_chunk_schedules_reject_chunks() {
        let err = generate(ScheduleKind::OneFOneB, 4, 2, 8).unwrap_err().to_string();
        assert!(err.starts_with("1f1b runs one model chunk per stage"), "{err}");
        assert!(generate(ScheduleKind::GPipe, 0, 1, 8).is_err());
        assert!(generate(ScheduleKind::ZeroBubbleH1, 2, 1, 0).is_err());
    }

    #[test]
    fn v_schedules_take_two_chunks_and_dualpipe_v_2p_microbatches() {
        let err = generate(ScheduleKind::ZeroBubbleV, 4, 3, 8).unwrap_err().to_string();
        assert_eq!(
            err,
            "zb-v places two model chunks per stage in a V, so virtual_pipeline_model_parallel_size \
             must be 2 (or unset), not 3"
        );
        let err = generate(ScheduleKind::DualPipeV, 4, 2, 7).unwrap_err().to_string();
        assert_eq!(err, "dualpipe-v needs at least 2p = 8 microbatches, not 7");
        assert_eq!(generate(ScheduleKind::DualPipeV, 4, 2, 8).unwrap().shape(), Shape::v(4, 8).unwrap());
    }
}
