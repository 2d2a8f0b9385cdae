//! Properties over p <= 16, m <= 64, v <= 4 (interleaved: m a multiple of p, as required;
//! dualpipe-v: m >= 2p).

use proptest::prelude::*;
use proptest::sample::Index;
use schedules::{
    generate, lower, simulate, validate, ActionKind, ChannelCapacity, ChunkCosts, EventKind, Link,
    LoweredSchedule, Schedule, ScheduleKind, SimInput,
};

/// (kind, p, v, m) that `generate` accepts.
fn config() -> impl Strategy<Value = (ScheduleKind, usize, usize, usize)> {
    let single = |kind| (1..=16usize, 1..=64usize).prop_map(move |(p, m)| (kind, p, 1, m));
    prop_oneof![
        single(ScheduleKind::GPipe),
        single(ScheduleKind::OneFOneB),
        single(ScheduleKind::ZeroBubbleH1),
        (1..=16usize, 1..=64usize).prop_map(|(p, m)| (ScheduleKind::ZeroBubbleV, p, 2, m)),
        (1..=16usize).prop_flat_map(|p| (Just(p), 2 * p..=64)).prop_map(|(p, m)| (
            ScheduleKind::DualPipeV,
            p,
            2,
            m
        )),
        (2..=16usize).prop_flat_map(|p| (Just(p), 2..=4usize, 1..=64 / p)).prop_map(|(p, v, k)| (
            ScheduleKind::Interleaved1F1B,
            p,
            v,
            p * k
        )),
    ]
}

/// Small integer times (exact sums) and a link that may cost something.
fn costs() -> impl Strategy<Value = (ChunkCosts, Link)> {
    (1..=4u32, 0..=4u32, 0..=4u32, 0..=2u32, 0..=2u32, 0..=2u64).prop_map(|(f, bi, bw, rc, lat, bytes)| {
        let costs = ChunkCosts {
            forward: f as f64,
            backward_input: bi as f64,
            backward_weight: bw as f64,
            recompute: rc as f64,
            memory: schedules::ChunkMemory {
                activation_bytes: 8,
                weight_grad_bytes: 2,
                forward_working_bytes: 1,
                recompute_working_bytes: 3,
                backward_input_working_bytes: 4,
                backward_weight_working_bytes: 5,
                host_bytes: 6,
            },
        };
        (costs, Link { latency: lat as f64, bandwidth: 1.0, activation_bytes: bytes, grad_bytes: bytes })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn generated_schedules_validate_lower_run_and_keep_their_promises(
        (kind, p, v, m) in config(),
        (chunk_costs, link) in costs(),
    ) {
        let schedule = generate(kind, p, v, m).unwrap();
        validate(&schedule).unwrap();
        // Three passes per (chunk, microbatch) where the backward is split, else two;
        // DualPipeV splits 2p-1-r backwards on stage r (see its module docs).
        let len = match kind {
            ScheduleKind::ZeroBubbleH1 | ScheduleKind::ZeroBubbleV => 3 * p * v * m,
            ScheduleKind::DualPipeV => 2 * p * v * m + p * (3 * p - 1) / 2,
            _ => 2 * p * v * m,
        };
        prop_assert_eq!(schedule.len(), len);

        let promised = kind.promised_in_flight(p, v, m).unwrap();
        for (measured, promised) in schedule.measured_in_flight().iter().zip(&promised) {
            prop_assert!(measured.full <= promised.full && measured.total <= promised.total);
        }

        let lowered = lower(&schedule).unwrap();
        // One message per channel suffices for every generator but ZB-V's greedy order, which
        // from p = 6 on may send a second message before the first is taken (never a third).
        let capacity = lowered.required_capacity().get();
        if kind == ScheduleKind::ZeroBubbleV {
            prop_assert!(capacity <= 2);
        } else {
            prop_assert_eq!(capacity, 1);
        }
        lowered.execute(ChannelCapacity::Bounded(lowered.required_capacity())).unwrap();
        prop_assert_eq!(lowered.schedule().measured_in_flight(), schedule.measured_in_flight());

        // The text form round-trips, lowered or not.
        prop_assert_eq!(&schedule.to_string().parse::<Schedule>().unwrap(), &schedule);
        prop_assert_eq!(&lowered.to_string().parse::<LoweredSchedule>().unwrap(), &lowered);

        let input = SimInput::uniform(p, v, chunk_costs, 1000, link).unwrap();
        let report = simulate(&lowered, &input).unwrap();
        // Split or not, a backward costs its two halves plus the recompute.
        let backward = chunk_costs.backward_input + chunk_costs.backward_weight + chunk_costs.recompute;
        let per_stage = (v * m) as f64 * (chunk_costs.forward + backward);
        for stage in &report.stages {
            prop_assert_eq!(stage.busy, per_stage);
            prop_assert!(stage.idle >= 0.0);
            prop_assert_eq!(stage.memory.last().unwrap().bytes, 1000);
            prop_assert!(stage.peak_memory >= 1000 + 8);
        }
        prop_assert!(report.iteration_time >= per_stage);
        prop_assert!((0.0..1.0).contains(&report.bubble_rate));
        let transfers = report.timeline.iter().filter(|e| matches!(e.kind, EventKind::Transfer { .. })).count();
        // One activation and one gradient per microbatch across each boundary between stages:
        // p*v - 1 of them, less the V's turn, which stays on stage p-1.
        let boundaries = if kind.is_v() { p * v - 2 } else { p * v - 1 };
        prop_assert_eq!(transfers, 2 * m * boundaries);
        for event in &report.timeline {
            prop_assert!(event.start <= event.end && event.end <= report.iteration_time);
        }
    }

    #[test]
    fn dropping_or_duplicating_any_action_is_rejected(
        (kind, p, v, m) in config(),
        stage in any::<Index>(),
        position in any::<Index>(),
        duplicate in any::<bool>(),
    ) {
        let schedule = generate(kind, p, v, m).unwrap();
        let mut lists = schedule.stages().to_vec();
        let stage = stage.index(p);
        let list = &mut lists[stage];
        let position = position.index(list.len());
        if duplicate {
            list.insert(position, list[position]);
        } else {
            list.remove(position);
        }
        let broken = Schedule::new(schedule.shape(), lists).unwrap();
        let err = validate(&broken).unwrap_err().to_string();
        prop_assert!(err.contains(&format!("stage {stage}")), "{}", err);
    }

    #[test]
    fn a_backward_moved_before_its_forward_is_named(
        (kind, p, v, m) in config(),
        stage in any::<Index>(),
        which in any::<Index>(),
    ) {
        let schedule = generate(kind, p, v, m).unwrap();
        let mut lists = schedule.stages().to_vec();
        let stage = stage.index(p);
        let list = &mut lists[stage];
        let backwards: Vec<usize> = (0..list.len())
            .filter(|&i| matches!(list[i].kind, ActionKind::Backward | ActionKind::BackwardInput))
            .collect();
        let from = backwards[which.index(backwards.len())];
        let backward = list.remove(from);
        let forward = list.iter().position(|a| {
            a.kind == ActionKind::Forward && (a.chunk, a.microbatch) == (backward.chunk, backward.microbatch)
        });
        list.insert(forward.unwrap(), backward);
        let err = validate(&Schedule::new(schedule.shape(), lists).unwrap()).unwrap_err().to_string();
        prop_assert!(err.contains("runs before its forward"), "{}", err);
    }

    #[test]
    fn dropping_any_transfer_breaks_the_lowered_lists(
        (kind, p, v, m) in config(),
        stage in any::<Index>(),
        which in any::<Index>(),
    ) {
        prop_assume!(p * v > 1);
        let lowered = lower(&generate(kind, p, v, m).unwrap()).unwrap();
        let mut lists = lowered.schedule().stages().to_vec();
        let stage = stage.index(p);
        let transfers: Vec<usize> =
            (0..lists[stage].len()).filter(|&i| !lists[stage][i].kind.is_compute()).collect();
        prop_assume!(!transfers.is_empty());
        lists[stage].remove(transfers[which.index(transfers.len())]);
        let broken = Schedule::new(lowered.schedule().shape(), lists).unwrap();
        prop_assert!(LoweredSchedule::new(broken).is_err());
    }
}
