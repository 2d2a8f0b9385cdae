//! `check_for_nan_in_loss_and_grad`: a step whose loss or gradient is NaN or infinite stops
//! the run before its update. The check reads only what every step already brings to the
//! host (each rank's losses and per-parameter gradient sums of squares, in its step
//! report), so it adds no sync, and every rank, holding every rank's report, reaches the
//! same verdict at the same step.

use super::report::StepReport;
use stages::dist::Topology;
use std::cmp::Reverse;

/// Where a non-finite value of a step showed first.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Origin {
    pub rank: usize,
    pub what: Quantity,
    /// The value itself: NaN, inf or -inf.
    pub value: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantity {
    Loss,
    Gradient,
}

/// This rank's non-finite gradient of the highest global parameter index, as (index, sum of
/// squares), from its (index, sum of squares) pairs.
pub fn highest_non_finite(sum_squares: &[(usize, f64)]) -> Option<(usize, f64)> {
    sum_squares.iter().copied().filter(|(_, s)| !s.is_finite()).max_by_key(|&(i, _)| i)
}

/// Where the step's first non-finite value arose, if any. A loss comes from the forward,
/// before any gradient of the step: the lowest rank holding a non-finite loss. Otherwise a
/// gradient: the backward runs from the last layer to the first and carries a non-finite
/// value into every layer before the one where it arose, so that is the parameter of
/// highest global index whose gradient is non-finite (its lowest rank, if data-parallel
/// replicas hold it: their gradient sum spreads one replica's to all).
pub fn origin(reports: &[StepReport]) -> Option<Origin> {
    let loss = reports.iter().enumerate().find_map(|(rank, r)| {
        let &(_, value) = r.losses.iter().find(|(_, l)| !l.is_finite())?;
        Some(Origin { rank, what: Quantity::Loss, value })
    });
    loss.or_else(|| {
        let (_, Reverse(rank), value) = reports
            .iter()
            .enumerate()
            .filter_map(|(rank, r)| r.non_finite_grad.map(|(index, value)| (index, Reverse(rank), value)))
            .max_by_key(|&(index, rank, _)| (index, rank))?;
        Some(Origin { rank, what: Quantity::Gradient, value })
    })
}

/// The line that ends the run: the step, what was not finite, and its stage and rank.
pub fn message(step: usize, origin: Origin, topology: Topology, last_checkpoint: Option<usize>) -> String {
    let what = match origin.what {
        Quantity::Loss => "the loss",
        Quantity::Gradient => "the gradient",
    };
    let checkpoint = match last_checkpoint {
        Some(s) => format!("the newest checkpoint is step {s}"),
        None => "no checkpoint was written".into(),
    };
    format!(
        "step {step}: {what} is {}, first on stage {} (rank {}); stopped before its update, {checkpoint} \
         (check_for_nan_in_loss_and_grad)",
        origin.value,
        topology.stage_of(origin.rank),
        origin.rank
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(losses: &[f64], grad: Option<(usize, f64)>) -> StepReport {
        StepReport {
            losses: losses.iter().enumerate().map(|(i, &l)| (i, l)).collect(),
            non_finite_grad: grad,
            ..StepReport::default()
        }
    }

    #[test]
    fn the_highest_non_finite_gradient_of_a_rank() {
        assert_eq!(highest_non_finite(&[(3, 1.0), (5, 2.0)]), None);
        let found = highest_non_finite(&[(7, f64::NAN), (9, f64::INFINITY), (12, 0.5)]).unwrap();
        assert_eq!(found, (9, f64::INFINITY));
    }

    #[test]
    fn a_loss_comes_before_any_gradient() {
        let reports = [report(&[], Some((4, f64::NAN))), report(&[2.0, f64::INFINITY], Some((30, f64::NAN)))];
        assert_eq!(origin(&reports), Some(Origin { rank: 1, what: Quantity::Loss, value: f64::INFINITY }));
    }

    /// A NaN that arose in the backward of stage 2 reaches the gradients of stages 0 and 1
    /// too: the highest parameter names stage 2, not the lowest rank.
    #[test]
    fn a_gradient_is_traced_to_the_last_layer_holding_one() {
        let reports = [
            report(&[], Some((5, f64::NAN))),
            report(&[], Some((11, f64::NAN))),
            report(&[], Some((17, f64::INFINITY))),
            report(&[1.0], None),
        ];
        let found = origin(&reports).unwrap();
        assert_eq!((found.rank, found.what), (2, Quantity::Gradient));
        assert_eq!(found.value, f64::INFINITY);
        // Replicas share a gradient after their sum: the lowest rank holding it is named.
        let replicas = [report(&[], Some((8, f64::NAN))), report(&[], Some((8, f64::NAN)))];
        assert_eq!(origin(&replicas).unwrap().rank, 0);
        assert_eq!(origin(&[report(&[3.0], None), report(&[], None)]), None);
    }

    #[test]
    fn the_line_names_step_stage_and_rank() {
        let topology =
            Topology { tensor: 1, pipeline: 2, data: 2, placement: schedules::Placement::Interleaved };
        let origin = Origin { rank: 3, what: Quantity::Gradient, value: f64::NAN };
        assert_eq!(
            message(7, origin, topology, Some(6)),
            "step 7: the gradient is NaN, first on stage 1 (rank 3); stopped before its update, \
             the newest checkpoint is step 6 (check_for_nan_in_loss_and_grad)"
        );
        let loss = Origin { rank: 0, what: Quantity::Loss, value: f64::INFINITY };
        assert_eq!(
            message(1, loss, topology, None),
            "step 1: the loss is inf, first on stage 0 (rank 0); stopped before its update, \
             no checkpoint was written (check_for_nan_in_loss_and_grad)"
        );
    }
}
