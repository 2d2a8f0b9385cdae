//! What the simulator needs to know: per (stage, chunk) compute times and memory, per stage
//! static memory, and the link between stages. Times are in seconds, sizes in bytes.

use crate::ir::Payload;
use crate::ScheduleError;

/// Time and memory of one microbatch through one model chunk on one stage.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ChunkCosts {
    pub forward: f64,
    /// The input-gradient half of the backward (zero-bubble "B").
    pub backward_input: f64,
    /// The weight-gradient half of the backward (zero-bubble "W"). An unsplit `Backward`
    /// costs `backward_input + backward_weight`.
    pub backward_weight: f64,
    /// The extra forward a recompute policy runs just before the backward (or before
    /// BackwardInput when split); 0 without recompute.
    pub recompute: f64,
    pub memory: ChunkMemory,
}

/// Memory of one microbatch through one model chunk. Timing conventions:
/// * `activation_bytes` are allocated when the Forward starts (conservatively: the forward
///   builds them as it goes) and freed when the Backward ends, or, when split, when the
///   BackwardInput ends, which leaves `weight_grad_bytes` held until the BackwardWeight ends
///   (the layer inputs and output gradients W multiplies: kept activations, recomputed ones
///   and gradients computed by BackwardInput, so possibly more than `activation_bytes`).
/// * Each `*_working_bytes` is live only while its pass runs: the recompute's while the
///   recompute runs, the others while their action runs; an unsplit Backward uses the larger
///   of the two backward figures.
/// * `host_bytes` (activations offloaded to host memory) are held in host memory as
///   `activation_bytes` are on the device: from the Forward's start to the end of the
///   Backward or BackwardInput.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkMemory {
    /// What the forward keeps for the backward, after the recompute policy's drops.
    pub activation_bytes: u64,
    /// What BackwardInput leaves for BackwardWeight, held from the end of one to the end of
    /// the other.
    pub weight_grad_bytes: u64,
    pub forward_working_bytes: u64,
    /// Live during the recompute (so unused when `recompute` is 0): typically the recomputed
    /// activations, which the backward right after consumes, so count them in
    /// `backward_input_working_bytes` too.
    pub recompute_working_bytes: u64,
    pub backward_input_working_bytes: u64,
    pub backward_weight_working_bytes: u64,
    /// What the forward keeps in host memory instead (activation offload).
    pub host_bytes: u64,
}

/// The point-to-point link between pipeline neighbours (every hop alike).
///
/// A message occupies its link (one per direction and pair of stages) for
/// `bytes / bandwidth`, so messages on one link queue behind each other, and arrives
/// `latency` after it has been pushed out: `latency + bytes / bandwidth` for a lone message.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    pub latency: f64,
    /// Bytes per second; may be infinite.
    pub bandwidth: f64,
    /// Size of one activation message (forward output of a chunk for one microbatch).
    pub activation_bytes: u64,
    /// Size of one gradient message.
    pub grad_bytes: u64,
}

impl Link {
    /// Transfers that take no time.
    pub const INSTANT: Link =
        Link { latency: 0.0, bandwidth: f64::INFINITY, activation_bytes: 0, grad_bytes: 0 };

    /// How long one message keeps the link busy.
    pub fn occupancy(&self, payload: Payload) -> f64 {
        let bytes = match payload {
            Payload::Activation => self.activation_bytes,
            Payload::Grad => self.grad_bytes,
        };
        if bytes == 0 {
            0.0
        } else {
            bytes as f64 / self.bandwidth
        }
    }

    /// Send-to-arrival time of a message on an idle link.
    pub fn hop_time(&self, payload: Payload) -> f64 {
        self.latency + self.occupancy(payload)
    }
}

/// Everything the simulator needs besides the schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct SimInput {
    stages: usize,
    chunks: usize,
    costs: Vec<ChunkCosts>,
    static_bytes: Vec<u64>,
    link: Link,
    /// Per stage: the time after the lists (see [`SimInput::with_optimizer_times`]).
    optimizer: Vec<f64>,
    /// Per stage: bytes held on top during that time (see
    /// [`SimInput::with_optimizer_working_bytes`]).
    optimizer_working: Vec<u64>,
}

impl SimInput {
    /// `costs[stage * chunks + chunk]` for each (stage, chunk); `static_bytes[stage]` is what
    /// the stage holds all along (parameters, gradients, optimizer state, buffers).
    pub fn new(
        stages: usize,
        chunks: usize,
        costs: Vec<ChunkCosts>,
        static_bytes: Vec<u64>,
        link: Link,
    ) -> Result<Self, ScheduleError> {
        let fail = |msg: String| Err(ScheduleError::Input(msg));
        if costs.len() != stages * chunks {
            return fail(format!("{} chunk costs for {stages} stages x {chunks} chunks", costs.len()));
        }
        if static_bytes.len() != stages {
            return fail(format!("{} static memory figures for {stages} stages", static_bytes.len()));
        }
        for (i, c) in costs.iter().enumerate() {
            let (stage, chunk) = (i / chunks, i % chunks);
            let times = [
                ("forward", c.forward),
                ("backward_input", c.backward_input),
                ("backward_weight", c.backward_weight),
                ("recompute", c.recompute),
            ];
            for (name, t) in times {
                if !(t.is_finite() && t >= 0.0) {
                    return fail(format!(
                        "stage {stage} chunk {chunk}: {name} time {t} is not a finite time >= 0"
                    ));
                }
            }
        }
        if !(link.latency.is_finite() && link.latency >= 0.0) {
            return fail(format!("link latency {} is not a finite time >= 0", link.latency));
        }
        if link.bandwidth.is_nan() || link.bandwidth <= 0.0 {
            return fail(format!("link bandwidth {} must be positive", link.bandwidth));
        }
        let (optimizer, optimizer_working) = (vec![0.0; stages], vec![0; stages]);
        Ok(Self { stages, chunks, costs, static_bytes, link, optimizer, optimizer_working })
    }

    /// Sets each stage's post-schedule time (0 by default): from the end of the last stage's
    /// list to the end of this stage's optimizer step, i.e. the gradient exchange and global
    /// grad norm that every stage waits for, then its own optimizer step.
    pub fn with_optimizer_times(self, optimizer: Vec<f64>) -> Result<Self, ScheduleError> {
        let fail = |msg: String| Err(ScheduleError::Input(msg));
        if optimizer.len() != self.stages {
            return fail(format!("{} optimizer times for {} stages", optimizer.len(), self.stages));
        }
        if let Some((stage, t)) = optimizer.iter().enumerate().find(|(_, t)| !(t.is_finite() && **t >= 0.0)) {
            return fail(format!("stage {stage}: optimizer time {t} is not a finite time >= 0"));
        }
        Ok(Self { optimizer, ..self })
    }

    /// Sets the bytes each stage holds on top of what the lists left while its post-schedule
    /// phase runs (0 by default), e.g. the other holder's part of a tied gradient.
    pub fn with_optimizer_working_bytes(self, optimizer_working: Vec<u64>) -> Result<Self, ScheduleError> {
        if optimizer_working.len() != self.stages {
            let msg =
                format!("{} optimizer working sizes for {} stages", optimizer_working.len(), self.stages);
            return Err(ScheduleError::Input(msg));
        }
        Ok(Self { optimizer_working, ..self })
    }

    /// The same costs for every (stage, chunk) and the same static memory on every stage.
    pub fn uniform(
        stages: usize,
        chunks: usize,
        costs: ChunkCosts,
        static_bytes: u64,
        link: Link,
    ) -> Result<Self, ScheduleError> {
        Self::new(stages, chunks, vec![costs; stages * chunks], vec![static_bytes; stages], link)
    }

    pub fn stages(&self) -> usize {
        self.stages
    }

    pub fn chunks(&self) -> usize {
        self.chunks
    }

    pub fn chunk(&self, stage: usize, chunk: usize) -> &ChunkCosts {
        &self.costs[stage * self.chunks + chunk]
    }

    pub fn static_bytes(&self, stage: usize) -> u64 {
        self.static_bytes[stage]
    }

    pub fn link(&self) -> &Link {
        &self.link
    }

    pub fn optimizer(&self, stage: usize) -> f64 {
        self.optimizer[stage]
    }

    pub fn optimizer_working_bytes(&self, stage: usize) -> u64 {
        self.optimizer_working[stage]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_inputs_that_do_not_fit_or_are_not_physical() {
        let ok = ChunkCosts { forward: 1.0, ..Default::default() };
        let err = |r: Result<SimInput, ScheduleError>| r.unwrap_err().to_string();
        assert_eq!(
            err(SimInput::new(2, 2, vec![ok; 3], vec![0; 2], Link::INSTANT)),
            "simulator input: 3 chunk costs for 2 stages x 2 chunks"
        );
        let negative = ChunkCosts { backward_input: -1.0, ..ok };
        assert_eq!(
            err(SimInput::new(1, 2, vec![ok, negative], vec![0], Link::INSTANT)),
            "simulator input: stage 0 chunk 1: backward_input time -1 is not a finite time >= 0"
        );
        let dead = Link { bandwidth: 0.0, ..Link::INSTANT };
        assert!(err(SimInput::uniform(1, 1, ok, 0, dead)).contains("bandwidth 0 must be positive"));
        let two = || SimInput::uniform(2, 1, ok, 0, Link::INSTANT).unwrap();
        assert_eq!(
            err(two().with_optimizer_times(vec![1.0])),
            "simulator input: 1 optimizer times for 2 stages"
        );
        assert_eq!(
            err(two().with_optimizer_times(vec![1.0, f64::NAN])),
            "simulator input: stage 1: optimizer time NaN is not a finite time >= 0"
        );
    }

    #[test]
    fn a_message_costs_latency_plus_bytes_over_bandwidth() {
        let link = Link { latency: 0.25, bandwidth: 4.0, activation_bytes: 2, grad_bytes: 0 };
        assert_eq!(link.hop_time(Payload::Activation), 0.75);
        assert_eq!(link.hop_time(Payload::Grad), 0.25);
    }
}
