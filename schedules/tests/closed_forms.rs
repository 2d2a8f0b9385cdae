//! The textbook figures, asserted exactly: every time is a small integer (exact in binary
//! floating point) and transfers are free, so the simulated bubble rate is the correctly
//! rounded value of the same rational number as the closed form.

use schedules::{generate, lower, simulate, ChunkCosts, InFlight, Link, ScheduleKind, SimInput, SimReport};

fn costs(forward: f64, backward_input: f64, backward_weight: f64) -> ChunkCosts {
    ChunkCosts { forward, backward_input, backward_weight, ..Default::default() }
}

fn run(kind: ScheduleKind, p: usize, v: usize, m: usize, c: ChunkCosts) -> SimReport {
    let lowered = lower(&generate(kind, p, v, m).unwrap()).unwrap();
    simulate(&lowered, &SimInput::uniform(p, v, c, 0, Link::INSTANT).unwrap()).unwrap()
}

fn ratio(num: usize, den: usize) -> f64 {
    num as f64 / den as f64
}

#[test]
fn gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1() {
    for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
        for p in 1..=8 {
            for m in 1..=16 {
                // Any forward/backward times give the same rate; use unequal ones.
                let report = run(kind, p, 1, m, costs(1.0, 1.0, 1.0));
                assert_eq!(report.iteration_time, 3.0 * (m + p - 1) as f64, "{kind} p={p} m={m}");
                assert_eq!(report.bubble_rate, ratio(p - 1, m + p - 1), "{kind} p={p} m={m}");
            }
        }
    }
}

#[test]
fn interleaved_bubble_is_p_minus_1_over_v_m_plus_p_minus_1() {
    // Convention: a chunk's forward and backward take unit-scale times (forward = backward,
    // and forward = 1, backward = 2), so one stage's whole work per microbatch is v times a
    // chunk's: the same model split into v chunks per stage has every chunk cost 1/v of a
    // non-interleaved stage, scaled here by v to stay exact. The ramp is then p - 1
    // chunk-steps against v m of them.
    for (forward, backward) in [(1.0, 1.0), (1.0, 2.0)] {
        let c = costs(forward, backward / 2.0, backward / 2.0);
        let step = forward + backward;
        for p in 2..=6 {
            for v in 2..=4 {
                for m in (p..=4 * p).step_by(p) {
                    let report = run(ScheduleKind::Interleaved1F1B, p, v, m, c);
                    let at = format!("F={forward} B={backward} p={p} v={v} m={m}");
                    assert_eq!(report.iteration_time, step * (v * m + p - 1) as f64, "{at}");
                    assert_eq!(report.bubble_rate, ratio(p - 1, v * m + p - 1), "{at}");
                }
            }
        }
    }
}

#[test]
fn zb_h1_bubble_is_p_minus_1_over_3m_plus_p_minus_1() {
    for p in 1..=8 {
        for m in p..=16 {
            let report = run(ScheduleKind::ZeroBubbleH1, p, 1, m, costs(1.0, 1.0, 1.0));
            assert_eq!(report.iteration_time, (3 * m + p - 1) as f64, "p={p} m={m}");
            assert_eq!(report.bubble_rate, ratio(p - 1, 3 * m + p - 1), "p={p} m={m}");
        }
    }
}

#[test]
fn zb_h1_beats_1f1b_by_the_weight_pass_on_every_ramp_step() {
    // (p-1)(F+B+W) of bubble for 1F1B against (p-1)(F+B-W) for ZB-H1.
    let (p, m) = (4, 8);
    let c = costs(2.0, 3.0, 1.0);
    let one_f_one_b = run(ScheduleKind::OneFOneB, p, 1, m, c);
    let zb = run(ScheduleKind::ZeroBubbleH1, p, 1, m, c);
    assert_eq!(one_f_one_b.iteration_time, (m * 6 + (p - 1) * 6) as f64);
    assert_eq!(zb.iteration_time, (m * 6 + (p - 1) * 4) as f64);
}

#[test]
fn peak_in_flight_is_min_p_minus_r_m_for_1f1b_and_m_for_gpipe() {
    for p in 1..=8 {
        for m in 1..=16 {
            let measured = generate(ScheduleKind::OneFOneB, p, 1, m).unwrap().measured_in_flight();
            let expected: Vec<_> =
                (0..p).map(|r| InFlight { full: (p - r).min(m), total: (p - r).min(m) }).collect();
            assert_eq!(measured, expected, "1f1b p={p} m={m}");
            let measured = generate(ScheduleKind::GPipe, p, 1, m).unwrap().measured_in_flight();
            assert_eq!(measured, vec![InFlight { full: m, total: m }; p], "gpipe p={p} m={m}");
        }
    }
}

#[test]
fn every_promise_is_met_exactly_and_zb_v_stays_within_its_bounds() {
    for kind in ScheduleKind::ALL {
        for p in 1..=8 {
            for v in 1..=3 {
                for m in 1..=16 {
                    let Ok(schedule) = generate(kind, p, v, m) else { continue };
                    let promised = kind.promised_in_flight(p, v, m).unwrap();
                    let measured = schedule.measured_in_flight();
                    if kind == ScheduleKind::ZeroBubbleV {
                        // A greedy order: bounds, not counts (the memory test below holds it to
                        // the paper's accounting).
                        let within = measured
                            .iter()
                            .zip(&promised)
                            .all(|(m, p)| m.full <= p.full && m.total <= p.total);
                        assert!(within, "{kind} p={p} m={m}: {measured:?} over {promised:?}");
                    } else {
                        assert_eq!(measured, promised, "{kind} p={p} v={v} m={m}");
                    }
                }
            }
        }
    }
}

#[test]
fn peak_memory_follows_in_flight_activations() {
    // 1F1B, 3 bytes of activations per microbatch, 100 static, no working memory.
    let (p, m) = (4, 8);
    let mut c = costs(1.0, 1.0, 1.0);
    c.memory.activation_bytes = 3;
    let lowered = lower(&generate(ScheduleKind::OneFOneB, p, 1, m).unwrap()).unwrap();
    let report = simulate(&lowered, &SimInput::uniform(p, 1, c, 100, Link::INSTANT).unwrap()).unwrap();
    let peaks: Vec<u64> = report.stages.iter().map(|s| s.peak_memory).collect();
    assert_eq!(peaks, [112, 109, 106, 103]);
    for (r, stage) in report.stages.iter().enumerate() {
        // Stage 0 allocates at time 0, so its series starts above the static bytes.
        let first = stage.memory.first().unwrap();
        assert_eq!((first.time, first.bytes), (0.0, if r == 0 { 103 } else { 100 }));
        assert_eq!(stage.memory.last().unwrap().bytes, 100);
    }
}

#[test]
fn weight_pass_keeps_its_bytes_until_it_ends() {
    // ZB-H1, p = 2, m = 2, unit times: stage 1 runs F0 [1,2] I0 [2,3] F1 [3,4] I1 [4,5]
    // W0 [5,6] W1 [6,7]; activations are 4 bytes of which W needs 1.
    let mut c = costs(1.0, 1.0, 1.0);
    c.memory.activation_bytes = 4;
    c.memory.weight_grad_bytes = 1;
    let lowered = lower(&generate(ScheduleKind::ZeroBubbleH1, 2, 1, 2).unwrap()).unwrap();
    let report = simulate(&lowered, &SimInput::uniform(2, 1, c, 100, Link::INSTANT).unwrap()).unwrap();
    let series: Vec<(f64, u64)> = report.stages[1].memory.iter().map(|pt| (pt.time, pt.bytes)).collect();
    assert_eq!(series, [(0.0, 100), (1.0, 104), (3.0, 105), (5.0, 102), (6.0, 101), (7.0, 100)]);
    assert_eq!(report.stages[1].peak_memory, 105);
    assert_eq!(report.stages[0].peak_memory, 108);
}

#[test]
fn working_memory_lives_only_during_its_pass() {
    // One stage, one microbatch: F [0,1] with 10 working, recompute [1,2] with 20, backward
    // [2,4] with 30 (the larger of 30 and 5), activations 7.
    let mut c = ChunkCosts {
        forward: 1.0,
        recompute: 1.0,
        backward_input: 1.0,
        backward_weight: 1.0,
        ..Default::default()
    };
    c.memory = schedules::ChunkMemory {
        activation_bytes: 7,
        weight_grad_bytes: 0,
        forward_working_bytes: 10,
        recompute_working_bytes: 20,
        backward_input_working_bytes: 30,
        backward_weight_working_bytes: 5,
        host_bytes: 3,
    };
    let lowered = lower(&generate(ScheduleKind::OneFOneB, 1, 1, 1).unwrap()).unwrap();
    let report = simulate(&lowered, &SimInput::uniform(1, 1, c, 0, Link::INSTANT).unwrap()).unwrap();
    let series: Vec<(f64, u64)> = report.stages[0].memory.iter().map(|pt| (pt.time, pt.bytes)).collect();
    assert_eq!(series, [(0.0, 17), (1.0, 27), (2.0, 37), (4.0, 0)]);
    assert_eq!(report.stages[0].peak_memory, 37);
    // The offloaded bytes sit in host memory from the forward to the backward, apart.
    assert_eq!(report.stages[0].peak_host, 3);
    assert_eq!(report.stages[0].busy, 4.0);
    let kinds: Vec<_> = report.timeline.iter().map(|e| (e.kind, e.start, e.end)).collect();
    use schedules::EventKind::*;
    assert_eq!(kinds, [(Forward, 0.0, 1.0), (Recompute, 1.0, 2.0), (Backward, 2.0, 4.0)]);
}

#[test]
fn recompute_lengthens_every_backward() {
    // 1F1B with recompute: the rate formula holds with B' = B + recompute.
    let (p, m) = (4, 8);
    let c = ChunkCosts {
        forward: 1.0,
        backward_input: 1.0,
        backward_weight: 1.0,
        recompute: 1.0,
        ..Default::default()
    };
    let report = run(ScheduleKind::OneFOneB, p, 1, m, c);
    assert_eq!(report.iteration_time, (4 * (m + p - 1)) as f64);
    assert_eq!(report.stages[0].busy, (4 * m) as f64);
}

#[test]
fn transfers_overlap_compute_and_queue_on_their_link() {
    // GPipe p = 2, m = 2, forward 0.5, backward 0: one byte per activation at one byte/s.
    // Stage 0 computes F1 while F0's activation is on the wire; F1's activation waits for the
    // link: [1.5, 2.5]. Stage 1 runs F0 [1.5, 2] and F1 [2.5, 3].
    let link = Link { latency: 0.0, bandwidth: 1.0, activation_bytes: 1, grad_bytes: 0 };
    let lowered = lower(&generate(ScheduleKind::GPipe, 2, 1, 2).unwrap()).unwrap();
    let report =
        simulate(&lowered, &SimInput::uniform(2, 1, costs(0.5, 0.0, 0.0), 0, link).unwrap()).unwrap();
    let transfers: Vec<(f64, f64)> = report
        .timeline
        .iter()
        .filter(|e| matches!(e.kind, schedules::EventKind::Transfer { .. }))
        .map(|e| (e.start, e.end))
        .collect();
    assert_eq!(transfers, [(0.5, 1.5), (1.5, 2.5), (3.0, 3.0), (3.0, 3.0)]);
    assert_eq!(report.iteration_time, 3.0);
    assert_eq!(report.stages[1].busy, 1.0);
    assert_eq!(report.stages[1].idle, 2.0);
}

#[test]
fn latency_delays_each_hop() {
    // 1F1B p = 2, m = 1, unit forward and backward, 0.5 per hop: F0 [0,1] -> [1.5,2.5] on
    // stage 1, B0 [2.5,3.5] -> stage 0's B0 [4,5].
    let link = Link { latency: 0.5, ..Link::INSTANT };
    let lowered = lower(&generate(ScheduleKind::OneFOneB, 2, 1, 1).unwrap()).unwrap();
    let report =
        simulate(&lowered, &SimInput::uniform(2, 1, costs(1.0, 1.0, 0.0), 0, link).unwrap()).unwrap();
    assert_eq!(report.iteration_time, 5.0);
    assert_eq!(report.bubble_rate, 0.6);
    assert_eq!(report.tokens_per_second(10.0), 2.0);
    assert_eq!(report.mfu(10.0, 1.0), 1.0);
}

#[test]
fn split_backward_hands_its_weight_grad_bytes_to_w() {
    // One stage, one microbatch: F keeps 10 bytes; B frees them and leaves 30 (recomputed
    // inputs and output gradients) for W, which frees them.
    let mut c = costs(1.0, 1.0, 1.0);
    c.memory.activation_bytes = 10;
    c.memory.weight_grad_bytes = 30;
    let report = run(ScheduleKind::ZeroBubbleH1, 1, 1, 1, c);
    let levels: Vec<u64> = report.stages[0].memory.iter().map(|p| p.bytes).collect();
    assert_eq!(levels, vec![10, 30, 0]);
    assert_eq!(report.stages[0].peak_memory, 30);
}

#[test]
fn v_schedules_take_6m_plus_p_minus_1_units_zero_bubble_in_the_steady_state() {
    // F = B = W = 1 per chunk, two chunks per stage: a stage's work is 6m units. ZB-V's
    // published figure (Qi et al.) is no bubble but the ramp: stage r starts r units late and
    // ends p-1-r early, so the iteration takes 6m + p - 1 and the bubble rate is
    // (p-1)/(6m+p-1), against 1F1B's (p-1)/(m+p-1) for the same model. Both V schedules
    // reach it exactly, DualPipeV with each overlapped forward/backward pair run in turn.
    for p in 1..=16 {
        for m in 2 * p..=4 * p {
            let best = 6 * m + p - 1;
            for kind in [ScheduleKind::ZeroBubbleV, ScheduleKind::DualPipeV] {
                let report = run(kind, p, 2, m, costs(1.0, 1.0, 1.0));
                assert_eq!(report.iteration_time, best as f64, "{kind} p={p} m={m}");
                assert_eq!(report.bubble_rate, ratio(p - 1, best), "{kind} p={p} m={m}");
                for (r, stage) in report.stages.iter().enumerate() {
                    assert_eq!(stage.idle, (p - 1) as f64, "{kind} p={p} m={m} stage {r}");
                }
            }
        }
    }
}

#[test]
fn zb_v_holds_1f1b_peak_activations_on_every_stage_and_dualpipe_v_half_a_stage_more() {
    // A V chunk is half a stage: 1F1B's stage 0 holds p whole-stage microbatches (4 bytes
    // each here), ZB-V 2p half-stage ones (2 bytes each) on every stage: the same peak, now
    // level across the stages, also when half of a chunk's bytes wait for its W as the
    // paper counts them. DualPipeV holds one half-stage set more.
    let c = |activation_bytes, weight_grad_bytes| {
        let mut c = costs(1.0, 1.0, 1.0);
        c.memory.activation_bytes = activation_bytes;
        c.memory.weight_grad_bytes = weight_grad_bytes;
        c
    };
    for p in 1..=8 {
        for m in [2 * p, 3 * p + 1, 8 * p] {
            let one_f_one_b = run(ScheduleKind::OneFOneB, p, 1, m, c(4, 0));
            let peak = one_f_one_b.stages[0].peak_memory;
            assert_eq!(peak, 4 * p as u64);
            for weight_grad_bytes in [0, 1] {
                let zb_v = run(ScheduleKind::ZeroBubbleV, p, 2, m, c(2, weight_grad_bytes));
                let peaks: Vec<u64> = zb_v.stages.iter().map(|s| s.peak_memory).collect();
                assert_eq!(peaks, vec![peak; p], "zb-v p={p} m={m} W bytes {weight_grad_bytes}");
            }
            let dualpipe_v = run(ScheduleKind::DualPipeV, p, 2, m, c(2, 0));
            assert!(dualpipe_v.stages.iter().all(|s| s.peak_memory == peak + 2), "dualpipe-v p={p} m={m}");
        }
    }
}
