//! What each rank tells the others after a step, and rank 0 at the end of a run: host
//! bytes through the collective. Action timings travel as bare (start, end) pairs, since
//! every rank holds every stage's action list and can name them.

use kernels::{Category, MemorySnapshot};
use kernels::{Mark, Readings};
use schedules::Action;
use stages::dist::{DistError, Reader, Writer};
use stages::runtime::{ActionTiming, StageStepReport};

/// One rank's step.
#[derive(Debug, Default)]
pub struct StepReport {
    /// (global microbatch, mean loss), from the stage that holds the head.
    pub losses: Vec<(usize, f64)>,
    pub timings: Vec<ActionTiming>,
    pub max_in_flight: usize,
    /// (start, end) of the AdamW update this step began with (the previous step's
    /// gradients'), in seconds from the step's start; None where none was pending.
    pub update: Option<(f64, f64)>,
    /// Seconds from the step's start to the end of this rank's post-schedule phase (its
    /// gradient reductions and the grad norm's readout).
    pub end_s: f64,
    /// When this rank's step started, in seconds since the Unix epoch: ranks' step clocks
    /// start a few hundred microseconds apart, and this lines them up.
    pub start_wall_s: f64,
    /// This rank was asked to stop (Ctrl-C, or SIGTERM from a launcher).
    pub stop: bool,
    /// This rank's non-finite gradient of the highest global parameter index, as (index,
    /// sum of squares), for `check_for_nan_in_loss_and_grad`.
    pub non_finite_grad: Option<(usize, f64)>,
}

impl StepReport {
    /// The report of a step whose losses were read from the device, and whose device clock
    /// read `readings`: its update between the marks `update`, its post-schedule phase
    /// ending at `end`.
    pub fn new(
        r: &StageStepReport,
        losses: Vec<(usize, f64)>,
        readings: &Readings,
        update: Option<(Mark, Mark)>,
        end: Mark,
    ) -> Self {
        StepReport {
            losses,
            timings: r.timings(readings),
            max_in_flight: r.max_in_flight,
            update: update.map(|(start, end)| (readings.at(start), readings.at(end))),
            end_s: readings.at(end),
            start_wall_s: 0.0,
            stop: false,
            non_finite_grad: None,
        }
    }

    /// When this rank's last action ended (0 with none).
    pub fn last_action_end(&self) -> f64 {
        self.timings.iter().map(|t| t.end_s).fold(0.0, f64::max)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.indexed(&self.losses).u64(self.timings.len() as u64);
        for t in &self.timings {
            w.u64(t.start_s.to_bits()).u64(t.end_s.to_bits());
        }
        let (update_start, update_end) = self.update.unwrap_or_default();
        w.u64(self.max_in_flight as u64).u64(self.update.is_some() as u64);
        w.u64(update_start.to_bits()).u64(update_end.to_bits());
        w.u64(self.end_s.to_bits()).u64(self.start_wall_s.to_bits());
        w.u64(self.stop as u64);
        let (index, sum) = self.non_finite_grad.unwrap_or_default();
        w.u64(self.non_finite_grad.is_some() as u64).u64(index as u64).u64(sum.to_bits());
        w.0
    }

    /// Reads a report of the rank whose action list is `actions`.
    pub fn decode(bytes: &[u8], actions: &[Action]) -> Result<Self, DistError> {
        let mut r = Reader(bytes);
        let losses = r.indexed()?;
        let n = r.usize()?;
        if n != actions.len() {
            return Err(DistError::Protocol(format!("{n} timings for {} actions", actions.len())));
        }
        let timings = actions
            .iter()
            .map(|a| {
                Ok(ActionTiming {
                    action: *a,
                    start_s: f64::from_bits(r.u64()?),
                    end_s: f64::from_bits(r.u64()?),
                })
            })
            .collect::<Result<_, DistError>>()?;
        let (max_in_flight, updated) = (r.usize()?, r.u64()? != 0);
        let (update_start, update_end) = (f64::from_bits(r.u64()?), f64::from_bits(r.u64()?));
        let update = updated.then_some((update_start, update_end));
        let (end_s, start_wall_s, stop) = (f64::from_bits(r.u64()?), f64::from_bits(r.u64()?), r.u64()? != 0);
        let (non_finite, index, sum) = (r.u64()? != 0, r.usize()?, f64::from_bits(r.u64()?));
        let non_finite_grad = non_finite.then_some((index, sum));
        Ok(StepReport { losses, timings, max_in_flight, update, end_s, start_wall_s, stop, non_finite_grad })
    }
}

/// The mean of the microbatches' mean losses, in global microbatch order (so the same bits
/// for any stage count and any data-parallel size).
pub fn mean_loss(mut losses: Vec<(usize, f64)>) -> f64 {
    losses.sort_by_key(|(mb, _)| *mb);
    losses.iter().map(|(_, l)| l).sum::<f64>() / losses.len().max(1) as f64
}

/// One rank's figures at the end of a run.
#[derive(Debug)]
pub struct RankSummary {
    pub memory: MemorySnapshot,
    /// Seconds spent recomputing dropped activations.
    pub recompute_s: f64,
    /// The most bytes of offloaded activations the rank held in host memory.
    pub host_peak_bytes: u64,
}

impl RankSummary {
    pub fn encode(&self) -> Vec<u8> {
        let m = &self.memory;
        let mut w = Writer::default();
        w.u64(m.live_bytes as u64).u64(m.peak_bytes as u64).u64(m.categories.len() as u64);
        for (c, live, peak) in &m.categories {
            let index = Category::ALL.iter().position(|x| x == c).expect("a known category");
            w.u64(index as u64).u64(*live as u64).u64(*peak as u64);
        }
        w.u64(self.recompute_s.to_bits()).u64(self.host_peak_bytes);
        w.0
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DistError> {
        let mut r = Reader(bytes);
        let (live_bytes, peak_bytes) = (r.usize()?, r.usize()?);
        let categories = (0..r.usize()?)
            .map(|_| {
                let c = *Category::ALL
                    .get(r.usize()?)
                    .ok_or_else(|| DistError::Protocol("unknown category".into()))?;
                Ok((c, r.usize()?, r.usize()?))
            })
            .collect::<Result<_, DistError>>()?;
        let (recompute_s, host_peak_bytes) = (f64::from_bits(r.u64()?), r.u64()?);
        let memory = MemorySnapshot { live_bytes, peak_bytes, categories };
        Ok(RankSummary { memory, recompute_s, host_peak_bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use schedules::ActionKind;

    #[test]
    fn step_reports_round_trip() {
        let actions = [Action::new(1, 0, 2, ActionKind::Forward), Action::new(1, 0, 2, ActionKind::Backward)];
        let report = StepReport {
            losses: vec![(5, 1.25)],
            timings: actions
                .iter()
                .enumerate()
                .map(|(i, a)| ActionTiming { action: *a, start_s: i as f64, end_s: i as f64 + 0.5 })
                .collect(),
            max_in_flight: 2,
            update: Some((0.25, 0.5)),
            end_s: 3.0,
            start_wall_s: 1.8e9,
            stop: true,
            non_finite_grad: Some((9, f64::INFINITY)),
        };
        let bytes = report.encode();
        assert!(StepReport::decode(&bytes, &actions[..1]).is_err());
        let back = StepReport::decode(&bytes, &actions).unwrap();
        assert_eq!(
            (
                back.losses,
                back.timings,
                back.max_in_flight,
                back.update,
                back.end_s,
                back.start_wall_s,
                back.stop,
                back.non_finite_grad
            ),
            (report.losses, report.timings, 2, Some((0.25, 0.5)), 3.0, 1.8e9, true, Some((9, f64::INFINITY)))
        );
        let first_step = StepReport { update: None, ..StepReport::default() };
        let back = StepReport::decode(&first_step.encode(), &[]).unwrap();
        assert_eq!((back.update, back.non_finite_grad), (None, None));
    }

    #[test]
    fn the_mean_loss_is_taken_in_microbatch_order() {
        assert_eq!(mean_loss(vec![(1, 3.0), (0, 1.0)]), 2.0);
    }
}
