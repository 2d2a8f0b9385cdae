//! How long each pass of one microbatch through one chunk takes, and each stage's
//! post-schedule phase (tied-gradient exchange, grad norm, optimizer step): from the layer
//! shapes and a hardware profile, or as given on the command line (`--op-times`, per stage as
//! papers report them), or as measured (`--measured`, see measured.rs).

use super::hardware::{Hardware, HOST_COPY_EFFICIENCY};
use super::memory::stage_parameters;
use super::setup::Setup;
use crate::config::DeviceKind;
use crate::error::user_error;
use kernels::{AttentionSaves, CausalMask, ChainedDq};
use stages::flops::{
    blocks_flops, head_flops, mask_counts, scored_area, typical_block_flops, window_mask, Flops,
};
use stages::saved::{BlockTensor, F32_BYTES};
use stages::tensor_parallel::{Collective, LayerCollectives, Split};
use stages::{Activation, ModelShape, NormPlacement, RecomputePolicy, TensorParallel};

/// Seconds of one microbatch through one chunk.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpTimes {
    pub forward: f64,
    pub backward_input: f64,
    pub backward_weight: f64,
    /// The forward work the recompute policy redoes before the backward.
    pub recompute: f64,
}

/// The link between neighbouring stages.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum P2p {
    /// Latency plus bytes over bandwidth per message (a hardware profile).
    Link { latency: f64, bandwidth: f64 },
    /// Seconds per message, however large (given or measured).
    PerMessage(f64),
}

/// Op times per (stage, chunk), indexed `stage * v + chunk`, the link, and per stage the
/// seconds from the end of the last list to the end of its optimizer step.
#[derive(Clone, Debug, PartialEq)]
pub struct Durations {
    pub chunks: Vec<OpTimes>,
    pub p2p: P2p,
    pub optimizer: Vec<f64>,
}

/// FLOPs of one microbatch through chunk `chunk` of stage `stage`, on one tensor-parallel
/// rank. The embedding, a gather of B*T rows, costs next to nothing against a block and is
/// left out.
fn chunk_flops(setup: &Setup, stage: usize, chunk: usize) -> Flops {
    let s = &setup.shape;
    let layout = setup.layout(stage, chunk);
    let head = if layout.head { head_flops(s) } else { Flops::default() };
    (blocks_flops(s, layout.blocks.clone()) + head).per_rank(setup.tp)
}

/// Seconds of `collectives` among the t ranks of a layer on [B,T,C] activations: ring bytes
/// over the bandwidth of ranks 1 apart (the tensor dimension is the fastest), plus a
/// latency each.
fn tensor_parallel_seconds(setup: &Setup, collectives: LayerCollectives, hw: &Hardware) -> f64 {
    let t = setup.tp.size;
    let count = collectives.count();
    let bytes = (setup.shape.tokens() * setup.shape.hidden * setup.activation_bytes_per_element()) as f64;
    collectives.ring_bytes(bytes, t) / hw.collective_bandwidth(1, t) + count as f64 * hw.link_latency
}

/// Seconds of one microbatch's collectives per pass of a chunk: its blocks', and the
/// embedding's and head's own (see `TensorParallel`).
fn chunk_collective_seconds(setup: &Setup, stage: usize, chunk: usize, hw: &Hardware) -> [f64; 3] {
    if setup.tp.size == 1 {
        return [0.0; 3];
    }
    let layout = setup.layout(stage, chunk);
    let blocks = layout.blocks.len() as f64;
    let tp = setup.tp;
    let seconds = |c| tensor_parallel_seconds(setup, c, hw);
    let ends = if layout.embedding { seconds(tp.embedding_forward()) } else { 0.0 }
        + if layout.head { seconds(tp.head_forward()) } else { 0.0 };
    [
        blocks * seconds(tp.block_forward(&setup.shape)) + ends,
        blocks * seconds(tp.block_backward_input(&setup.shape)),
        blocks * seconds(tp.block_backward_weight()),
    ]
}

/// Seconds the chunk's recompute takes on `hw`, on one tensor-parallel rank: the forward of
/// what the policy recomputes. Full: the recomputed blocks' whole forward, its collectives
/// and unfused bias adds included, and with distributed saves each group's all-gather of
/// its input. Selective: the attention core's forward (compute-bound, no collectives), GELU
/// and LayerNorm (memory-bound: one read and one write of their output-sized tensors each).
fn recompute_seconds(setup: &Setup, stage: usize, chunk: usize, hw: &Hardware) -> f64 {
    let (s, tp) = (&setup.shape, setup.tp);
    let blocks = setup.layout(stage, chunk).blocks.len();
    // A block's: where a window covers some layers and not others, their mean.
    let block = typical_block_flops(s).per_rank(tp);
    let eb = setup.activation_bytes_per_element() as f64;
    let streamed =
        |elements: usize, split| 2.0 * tp.per_rank(elements, split) as f64 * eb / hw.achieved_bandwidth();
    match setup.policies[stage] {
        RecomputePolicy::None => 0.0,
        RecomputePolicy::Full { .. } => {
            let segments = setup.policies[stage].segments(blocks);
            let recomputed: usize = segments.iter().filter(|g| g.recompute).map(|g| g.end - g.start).sum();
            let forward = block.forward / hw.achieved_flops()
                + tensor_parallel_seconds(setup, tp.block_forward(s), hw)
                + unfused_epilogue_seconds(setup, hw)[0];
            let groups = segments.iter().filter(|g| g.recompute).count();
            let gather = LayerCollectives { all_gather: 1, ..Default::default() };
            let gathers = if tp.distribute_saved {
                groups as f64 * tensor_parallel_seconds(setup, gather, hw)
            } else {
                0.0
            };
            recomputed as f64 * forward + gathers
        }
        RecomputePolicy::Selective(m) => {
            // The attention core has no weights, so its FLOPs are the block's forward FLOPs
            // less the matmuls' (which equal the weight-gradient FLOPs). A fused core drops
            // nothing (see saved.rs), so nothing of it is recomputed.
            let core_attn = (block.forward - block.backward_weight) / hw.achieved_flops();
            let core_dropped = BlockTensor::attention_saved(s).dropped_by(m);
            let per_block = if core_dropped { core_attn } else { 0.0 }
                + if m.mlp { streamed(s.tokens() * s.ffn, Split::Interior) } else { 0.0 }
                // The norms' outputs are kept, and so dropped, only pre-norm.
                + if m.layernorm && s.arch.norm_placement == NormPlacement::Input {
                    2.0 * streamed(s.tokens() * s.hidden, Split::Sequence)
                } else {
                    0.0
                };
            blocks as f64 * per_block
        }
    }
}

/// Bytes per parameter the optimizer phase streams, all fp32 (the trainer's tensors, a
/// mixed-precision trainer's master copies): AdamW reads the parameter, its gradient and
/// both moments and writes the parameter and the moments (28); the trainer then zeroes the
/// gradient for the next step (4).
const ADAMW_BYTES: f64 = 28.0 + 4.0;
/// The global grad norm reads every gradient once.
const GRAD_NORM_BYTES: f64 = 4.0;

/// Seconds one block's forward and backward-input spend on `hw`, on one tensor-parallel
/// rank, in the passes CUDA runs as kernels of their own where it does not fold them into a
/// product's cuBLASLt epilogue (`bias_gelu_fusion`, docs/gpu.md): each bias add reads and
/// writes its product's output again (qkv and fc1 split across the ranks, proj and fc2
/// after their reduction), and GELU's backward reads back the [B,T,F] gradient that fc2's
/// product wrote. The GPU profiles' efficiencies, calibrated on Megatron-LM's runs, whose
/// step fuses both, hold neither pass; the CPU's, measured on the trainer, holds both.
fn unfused_epilogue_seconds(setup: &Setup, hw: &Hardware) -> [f64; 2] {
    let (s, tp) = (&setup.shape, setup.tp);
    if setup.cfg.device != DeviceKind::Cuda {
        return [0.0; 2];
    }
    let n = s.tokens();
    let eb = setup.activation_bytes_per_element() as f64;
    let read_and_write = |elements: usize, split| 2.0 * tp.per_rank(elements, split) as f64 * eb;
    let bias_adds = if setup.fuses_bias() {
        0.0
    } else {
        let qkv =
            if s.arch.biases.on_qkv() { read_and_write(n * s.qkv_width(), Split::Interior) } else { 0.0 };
        let rest = if s.arch.biases.on_the_rest() {
            read_and_write(n * s.fc1_width(), Split::Interior)
                + 2.0 * read_and_write(n * s.hidden, Split::Sequence)
        } else {
            0.0
        };
        qkv + rest
    };
    let gelu_gradient = if s.arch.activation == Activation::Gelu && !setup.fuses_gelu_backward() {
        read_and_write(n * s.ffn, Split::Interior)
    } else {
        0.0
    };
    [bias_adds, gelu_gradient].map(|bytes| bytes / hw.achieved_bandwidth())
}

/// FLOPs the backward of blocks `layers` adds beyond the model's count on one rank. The
/// model counts the attention core's backward as four products of 2 B T^2 A each (dP, dv,
/// dq and dk, full T x T as `stages::flops` counts the core, or its window's share). The
/// fused kernels (device cuda) also rebuild S = q k^T tile by tile: one product more where
/// one kernel takes the whole backward (bf16, `kernels::ChainedDq`), three more where the
/// query side and the key side each compute S and dP (fp32).
fn fused_backward_extra_flops(s: &ModelShape, tp: TensorParallel, layers: std::ops::Range<usize>) -> f64 {
    let products = match s.attention {
        AttentionSaves::Probabilities => 0.0,
        AttentionSaves::RowLogSumExp if ChainedDq::chains(s.activations) => 1.0,
        AttentionSaves::RowLogSumExp => 3.0,
    };
    let extra = |mask| {
        let product = 2.0 * s.micro_batch as f64 * scored_area(mask, s.seq_len) * s.attention_width() as f64
            / tp.size as f64;
        products * product
    };
    let (full, windowed) = mask_counts(s, layers);
    full as f64 * extra(CausalMask::Full) + windowed as f64 * extra(window_mask(s))
}

/// Seconds of each stage's post-schedule phase on `hw`: the data-parallel gradient
/// all-reduce (network-bound), the tied embedding's gradient exchange and the global grad
/// norm (memory-bound; each stage reads its gradients on its own device, in parallel), which
/// every stage waits for, then its own AdamW. `data_parallel` overrides the all-reduce.
fn optimizer_seconds(setup: &Setup, hw: &Hardware, data_parallel: Option<f64>) -> Vec<f64> {
    let bandwidth = hw.achieved_bandwidth();
    let params: Vec<f64> = (0..setup.p).map(|r| stage_parameters(setup, r) as f64).collect();
    let reduced = |n: f64| {
        n * GRAD_NORM_BYTES / bandwidth + data_parallel.unwrap_or_else(|| all_reduce_seconds(setup, n, hw))
    };
    let norm = params.iter().map(|&n| reduced(n)).fold(0.0, f64::max);
    let shared = tied_exchange_seconds(setup, hw) + norm;
    // Under the distributed optimizer each replica steps its 1/dp part of the parameters.
    let stepped = if setup.cfg.use_distributed_optimizer { setup.dp as f64 } else { 1.0 };
    params.iter().map(|n| shared + n / stepped * ADAMW_BYTES / bandwidth).collect()
}

/// The ring all-reduce of `params` fp32 gradients across the dp replicas, 2(dp-1)/dp of the
/// bytes per rank, among ranks t apart (Megatron's order: tensor, then data); under the
/// distributed optimizer the reduce-scatter of the gradients and the all-gather of the
/// stepped parameters, which move as many bytes.
pub fn all_reduce_seconds(setup: &Setup, params: f64, hw: &Hardware) -> f64 {
    let dp = setup.dp;
    if dp == 1 {
        return 0.0;
    }
    let fp32 = params * F32_BYTES as f64;
    let bytes = match setup.cfg.use_distributed_optimizer {
        true => Collective::ReduceScatter.ring_bytes(fp32, dp) + Collective::AllGather.ring_bytes(fp32, dp),
        false => Collective::AllReduce.ring_bytes(fp32, dp),
    };
    hw.link_latency + bytes / hw.collective_bandwidth(setup.tp.size, dp)
}

/// The tied embedding's gradient [V, C] (one rank's V/t rows): when the embedding and the
/// head are on different stages, each holder's part crosses the link (both directions at
/// once); then each holder adds the two (reads two, writes one).
fn tied_exchange_seconds(setup: &Setup, hw: &Hardware) -> f64 {
    let rows = setup.tp.per_rank(setup.shape.vocab, Split::Interior);
    let bytes = (rows * setup.shape.hidden * F32_BYTES) as f64;
    let link =
        if setup.tied_holders().is_some() { hw.link_latency + bytes / p2p_bandwidth(setup, hw) } else { 0.0 };
    link + 3.0 * bytes / hw.achieved_bandwidth()
}

/// Seconds to copy what a microbatch's forward through chunk `chunk` of stage `stage`
/// offloads, over the host link; the same bytes come back for its backward. A copy stream
/// overlaps each with the pass's compute, so a pass takes the longer of the two: the copy
/// shows only where it outlasts the compute it hides behind.
fn offload_copy_seconds(setup: &Setup, stage: usize, chunk: usize, hw: &Hardware) -> f64 {
    let (s, layout) = (&setup.shape, setup.layout(stage, chunk));
    let policy = &setup.policies[stage];
    let host = stages::memory_model::stash_bytes(s, setup.tp, layout, policy, &setup.offloads[stage]).host;
    host as f64 / (hw.host_link_bandwidth * HOST_COPY_EFFICIENCY)
}

/// Bytes per second between pipeline stages: NVLink while the whole run fits one node,
/// else the network (the pipeline is the slowest dimension of the rank order, so some
/// stage boundary crosses nodes).
fn p2p_bandwidth(setup: &Setup, hw: &Hardware) -> f64 {
    if hw.within_node(1, setup.world_size()) {
        hw.link_bandwidth
    } else {
        hw.network_bandwidth
    }
}

/// Op times from the model's FLOPs on `hw`, each pass taking at least its offload copy.
pub fn from_hardware(setup: &Setup, hw: &Hardware) -> Durations {
    with_offload_copies(setup, hw, compute_durations(setup, hw, None))
}

/// `d` with each forward and backward-input taking at least its chunk's offload copy over
/// `hw`'s host link ([`offload_copy_seconds`]), whatever gave the compute times.
pub(super) fn with_offload_copies(setup: &Setup, hw: &Hardware, mut d: Durations) -> Durations {
    for (i, t) in d.chunks.iter_mut().enumerate() {
        let copy = offload_copy_seconds(setup, i / setup.v, i % setup.v, hw);
        t.forward = t.forward.max(copy);
        t.backward_input = t.backward_input.max(copy);
    }
    d
}

/// The model's compute and collective times on `hw` (the data-parallel all-reduce given,
/// or modelled), without offload: what given times borrow their proportions from.
pub(super) fn compute_durations(setup: &Setup, hw: &Hardware, data_parallel: Option<f64>) -> Durations {
    let rate = hw.achieved_flops();
    let chunks = (0..setup.p)
        .flat_map(|r| (0..setup.v).map(move |c| (r, c)))
        .map(|(r, c)| {
            let f = chunk_flops(setup, r, c);
            let [forward, backward_input, backward_weight] = chunk_collective_seconds(setup, r, c, hw);
            let layout = setup.layout(r, c);
            let blocks = layout.blocks.len() as f64;
            let kernel_extra = fused_backward_extra_flops(&setup.shape, setup.tp, layout.blocks.clone());
            let [bias_adds, gelu_gradient] = unfused_epilogue_seconds(setup, hw).map(|t| blocks * t);
            OpTimes {
                forward: f.forward / rate + forward + bias_adds,
                backward_input: (f.backward_input + kernel_extra) / rate + backward_input + gelu_gradient,
                backward_weight: f.backward_weight / rate + backward_weight,
                recompute: recompute_seconds(setup, r, c, hw),
            }
        })
        .collect();
    Durations {
        chunks,
        p2p: P2p::Link { latency: hw.link_latency, bandwidth: p2p_bandwidth(setup, hw) },
        optimizer: optimizer_seconds(setup, hw, data_parallel),
    }
}

/// `--op-times`: milliseconds per stage and microbatch, e.g.
/// `forward=18.5,backward-input=18.1,backward-weight=9.3,p2p=0.6`. `backward=` may stand
/// for both halves; `recompute=`, `p2p=`, `optimizer=` (per stage and step: the
/// post-schedule phase, exchange and grad norm included) and `dp-allreduce=` (per stage and
/// step: the data-parallel gradient all-reduce, else modelled from the hardware) are
/// optional. The ops in [`FREE_OPS`] may take 0 ms: the textbook bubble formulas assume
/// free transfers.
#[derive(Clone, Debug, PartialEq)]
pub struct GivenTimes {
    forward: f64,
    backward: Backward,
    recompute: Option<f64>,
    p2p: f64,
    optimizer: f64,
    data_parallel: Option<f64>,
}

const GIVEN_OPS: [&str; 8] = [
    "forward",
    "backward-input",
    "backward-weight",
    "backward",
    "recompute",
    "p2p",
    "optimizer",
    "dp-allreduce",
];

/// Ops that may cost nothing: transfers, the optimizer phase, a recompute and the weight
/// gradient can each be left out of a model of the step. A forward or an input gradient
/// always computes something, so those stay > 0.
const FREE_OPS: [&str; 5] = ["backward-weight", "recompute", "p2p", "optimizer", "dp-allreduce"];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Backward {
    Split { input: f64, weight: f64 },
    Whole(f64),
}

impl GivenTimes {
    pub fn parse(text: &str) -> anyhow::Result<GivenTimes> {
        let err = |msg: String| user_error(format!("command line: --op-times {text}: {msg}"));
        let mut values: Vec<(&str, f64)> = Vec::new();
        for item in text.split(',').map(str::trim) {
            let (key, value) = item.split_once('=').ok_or_else(|| err(format!("`{item}` is not NAME=MS")))?;
            let key = key.trim();
            if !GIVEN_OPS.contains(&key) {
                return Err(err(format!("unknown op `{key}` (expected {})", GIVEN_OPS.join(", "))));
            }
            let ms: f64 =
                value.trim().parse().map_err(|_| err(format!("{key}={value}: not a number of ms")))?;
            if FREE_OPS.contains(&key) {
                if !(ms.is_finite() && ms >= 0.0) {
                    return Err(err(format!("{key}={value}: a time must be >= 0 ms")));
                }
            } else if !(ms.is_finite() && ms > 0.0) {
                return Err(err(format!("{key}={value}: a time must be > 0 ms")));
            }
            if values.iter().any(|(k, _)| *k == key) {
                return Err(err(format!("{key} is given twice")));
            }
            values.push((key, ms / 1e3));
        }
        let get = |key: &str| values.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let forward = get("forward").ok_or_else(|| err("forward=MS is missing".into()))?;
        let backward = match (get("backward"), get("backward-input"), get("backward-weight")) {
            (Some(b), None, None) => Backward::Whole(b),
            (None, Some(input), Some(weight)) => Backward::Split { input, weight },
            _ => return Err(err("give backward-input=MS and backward-weight=MS, or backward=MS".into())),
        };
        Ok(GivenTimes {
            forward,
            backward,
            recompute: get("recompute"),
            p2p: get("p2p").unwrap_or(0.0),
            optimizer: get("optimizer").unwrap_or(0.0),
            data_parallel: get("dp-allreduce"),
        })
    }

    /// Every stage alike, each of its v chunks doing 1/v of it. What the times leave open
    /// (a recompute, or the split of a whole backward) follows the model's proportions on
    /// `hw`.
    pub fn durations(&self, setup: &Setup, hw: &Hardware) -> anyhow::Result<Durations> {
        let model = compute_durations(setup, hw, self.data_parallel);
        let recomputes = setup.policies.iter().any(|p| *p != RecomputePolicy::None);
        if self.recompute.is_some() && !recomputes {
            return Err(user_error("command line: --op-times recompute=...: the config recomputes nothing"));
        }
        let v = setup.v as f64;
        let chunks = model
            .chunks
            .iter()
            .map(|m| {
                let (input, weight) = match self.backward {
                    Backward::Split { input, weight } => (input, weight),
                    Backward::Whole(b) => {
                        let share = m.backward_input / (m.backward_input + m.backward_weight);
                        (b * share, b * (1.0 - share))
                    }
                };
                let recompute = match self.recompute {
                    Some(r) if m.recompute > 0.0 => r,
                    Some(_) => 0.0,
                    None => self.forward * m.recompute / m.forward,
                };
                OpTimes {
                    forward: self.forward / v,
                    backward_input: input / v,
                    backward_weight: weight / v,
                    recompute: recompute / v,
                }
            })
            .collect();
        if self.data_parallel.is_some() && setup.dp == 1 {
            return Err(user_error(
                "command line: --op-times dp-allreduce=...: the config has data_parallel_size 1",
            ));
        }
        // What the given optimizer time leaves out: the data-parallel all-reduce.
        let all_reduce = |r: usize| {
            self.data_parallel
                .unwrap_or_else(|| all_reduce_seconds(setup, stage_parameters(setup, r) as f64, hw))
        };
        let optimizer = (0..setup.p).map(|r| self.optimizer + all_reduce(r)).collect();
        Ok(with_offload_copies(setup, hw, Durations { chunks, p2p: P2p::PerMessage(self.p2p), optimizer }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Named};
    use crate::simulate::setup::tests::gpt2_small;

    fn setup(cfg: Config) -> Setup {
        Setup::new(&cfg).unwrap()
    }

    fn h100() -> Hardware {
        Hardware::lookup("h100-sxm", crate::config::Precision::Bf16).unwrap()
    }

    #[test]
    fn model_times_are_flops_over_achieved_rate() {
        let s = setup(gpt2_small(4, "1f1b", 1, 8));
        let d = from_hardware(&s, &h100());
        let block = typical_block_flops(&s.shape);
        let rate = 989e12 * 0.5;
        assert_eq!(d.chunks[1].forward, 4.0 * block.forward / rate);
        assert_eq!(d.chunks[1].backward_weight, 4.0 * block.backward_weight / rate);
        assert_eq!(d.chunks[3].forward, head_flops(&s.shape).forward / rate);
        assert_eq!(d.chunks[1].recompute, 0.0);
        assert_eq!(d.p2p, P2p::Link { latency: 10e-6, bandwidth: 450e9 });
    }

    /// The distributed optimizer: the reduce-scatter and all-gather take the all-reduce's
    /// time (as many bytes), and each replica's AdamW reads and writes half the parameters.
    #[test]
    fn the_distributed_optimizer_steps_a_replicas_part() {
        let dp2 =
            Config { data_parallel_size: Some(2), global_batch_size: 16, ..gpt2_small(4, "1f1b", 1, 8) };
        let (whole, sharded) = (setup(dp2.clone()), setup(Config { use_distributed_optimizer: true, ..dp2 }));
        let (hw, n) = (h100(), 85e6);
        assert_eq!(all_reduce_seconds(&sharded, n, &hw), all_reduce_seconds(&whole, n, &hw));
        let (a, b) = (optimizer_seconds(&whole, &hw, None), optimizer_seconds(&sharded, &hw, None));
        let bandwidth = hw.achieved_bandwidth();
        for (r, (a, b)) in a.iter().zip(&b).enumerate() {
            let adamw = stage_parameters(&whole, r) as f64 * ADAMW_BYTES / bandwidth;
            assert!((a - b - adamw / 2.0).abs() <= 1e-12 * a, "stage {r}: {a} vs {b}");
        }
    }

    /// On CUDA with `bias_gelu_fusion` off, each block's forward streams its four biased
    /// products' outputs once more (read and written: qkv and fc1, 2304 + 3072 columns,
    /// proj and fc2, 768 each) and its backward-input the [B,T,F] GELU gradient, at the
    /// achieved bandwidth; the fused step (the default) is what the profile's efficiency
    /// models. A model with neither biases nor GELU (SwiGLU), and the CPU, whose profile is
    /// measured on the unfused trainer, are the same both ways.
    #[test]
    fn unfused_epilogues_cost_their_bytes_at_the_achieved_bandwidth() {
        use crate::config::{DeviceKind, Precision};
        let cfg = |device, fusion| Config {
            device,
            precision: Precision::Bf16,
            bias_gelu_fusion: fusion,
            ..gpt2_small(4, "1f1b", 1, 8)
        };
        let times = |cfg| from_hardware(&setup(cfg), &h100());
        let (on, off) = (times(cfg(DeviceKind::Cuda, true)), times(cfg(DeviceKind::Cuda, false)));
        let bandwidth = h100().achieved_bandwidth();
        // 1024 tokens (micro batch 1), 2 bytes an element, read and written.
        let bias_adds = 2.0 * 1024.0 * 2.0 * (2304.0 + 3072.0 + 768.0 + 768.0);
        let gelu_gradient = 2.0 * 1024.0 * 2.0 * 3072.0;
        // Stage 1 holds 4 blocks.
        assert_eq!(off.chunks[1].forward, on.chunks[1].forward + 4.0 * (bias_adds / bandwidth));
        assert_eq!(
            off.chunks[1].backward_input,
            on.chunks[1].backward_input + 4.0 * (gelu_gradient / bandwidth)
        );
        assert_eq!(off.chunks[1].backward_weight, on.chunks[1].backward_weight);
        // The head's stage has no block.
        assert_eq!(off.chunks[3], on.chunks[3]);
        // Full recompute reruns the blocks' forward, bias adds and all.
        let full = |fusion| {
            let cfg = Config {
                recompute_granularity: Some(Named::parse("full").unwrap()),
                recompute_method: Some(Named::parse("uniform").unwrap()),
                recompute_num_layers: Some(2),
                ..cfg(DeviceKind::Cuda, fusion)
            };
            times(cfg).chunks[1].recompute
        };
        assert!((full(false) - full(true) - 4.0 * bias_adds / bandwidth).abs() < 1e-15);
        let llama =
            |fusion| Config { swiglu: true, disable_bias_linear: true, ..cfg(DeviceKind::Cuda, fusion) };
        assert_eq!(times(llama(false)), times(llama(true)));
        // Qwen2's biases on q, k and v alone: the qkv product's add, no other.
        let qkv_only = |fusion| Config { add_qkv_bias: true, ..llama(fusion) };
        let (off, on) = (times(qkv_only(false)), times(qkv_only(true)));
        let qkv_add = 2.0 * 1024.0 * 2.0 * 2304.0;
        assert_eq!(off.chunks[1].forward, on.chunks[1].forward + 4.0 * (qkv_add / bandwidth));
        assert_eq!(off.chunks[1].backward_input, on.chunks[1].backward_input);
        assert_eq!(times(cfg(DeviceKind::Cpu, false)), times(cfg(DeviceKind::Cpu, true)));
    }

    /// The fused attention's backward computes q k^T once more, and in two kernels (fp32)
    /// q k^T and dout v^T once more on each side: 2 or 6 B T^2 C FLOPs per block on top of
    /// the model's count; nothing else changes.
    #[test]
    fn fused_attention_backward_rebuilds_the_scores() {
        let materialized = from_hardware(&setup(gpt2_small(4, "1f1b", 1, 8)), &h100());
        let cuda = Config { device: crate::config::DeviceKind::Cuda, ..gpt2_small(4, "1f1b", 1, 8) };
        let chained = Config { precision: Named::parse("bf16").unwrap(), ..cuda.clone() };
        let rate = 989e12 * 0.5;
        let product = 2.0 * 1024.0 * 1024.0 * 768.0 / rate;
        for (cfg, products) in [(cuda, 3.0), (chained, 1.0)] {
            let fused = from_hardware(&setup(cfg), &h100());
            let (a, b) = (materialized.chunks[1], fused.chunks[1]);
            let extra = b.backward_input - a.backward_input;
            assert!((extra - 4.0 * products * product).abs() < 1e-15, "{extra} for {products} products");
            assert_eq!(
                (b.forward, b.backward_weight, b.recompute),
                (a.forward, a.backward_weight, a.recompute)
            );
            // The head's chunk holds no block: the same either way.
            assert_eq!(fused.chunks[3], materialized.chunks[3]);
        }
    }

    #[test]
    fn recompute_is_the_forward_of_what_the_policy_drops() {
        let with = |granularity: &str, method: Option<&str>, n: Option<usize>, modules: Option<&[&str]>| {
            let cfg = Config {
                recompute_granularity: Some(Named::parse(granularity).unwrap()),
                recompute_method: method.map(|m| Named::parse(m).unwrap()),
                recompute_num_layers: n,
                recompute_modules: modules.map(|m| m.iter().map(|s| Named::parse(s).unwrap()).collect()),
                ..gpt2_small(4, "1f1b", 1, 8)
            };
            from_hardware(&setup(cfg), &h100()).chunks[1]
        };
        let s = setup(gpt2_small(4, "1f1b", 1, 8)).shape;
        let rate = 989e12 * 0.5;
        let forward = with("none", None, None, None).forward;
        assert_eq!(with("full", Some("uniform"), Some(2), None).recompute, forward);
        assert_eq!(with("full", Some("block"), Some(1), None).recompute, forward / 4.0);
        // The attention core: 4 B T^2 C FLOPs per block.
        let core = 4.0 * (1024.0 * 1024.0 * 768.0) * 4.0 / rate;
        assert!((with("selective", None, None, None).recompute - core).abs() < 1e-15);
        // GELU: read [B,T,F] and write [B,T,F] at 4 bytes, 80% of 3.35 TB/s, four blocks.
        let gelu = 4.0 * 2.0 * (1024.0 * 3072.0 * 4.0) / (3.35e12 * 0.8);
        let both = with("selective", None, None, Some(&["core_attn", "mlp"])).recompute;
        assert!((both - core - gelu).abs() < 1e-15, "{both} {core} {gelu} {s:?}");
    }

    /// On a GPU the fused attention core keeps its row statistics under selective core_attn
    /// (see saved.rs): its backward recomputes the probabilities anyway, and nothing more.
    #[test]
    fn selective_recompute_of_the_fused_core_costs_nothing() {
        let cfg = |device: &str| Config {
            device: Named::parse(device).unwrap(),
            recompute_granularity: Some(crate::config::RecomputeGranularity::Selective),
            ..gpt2_small(4, "1f1b", 1, 8)
        };
        let recompute = |device| from_hardware(&setup(cfg(device)), &h100()).chunks[1].recompute;
        assert!(recompute("cpu") > 0.0);
        assert_eq!(recompute("cuda"), 0.0);
    }

    #[test]
    fn the_optimizer_phase_streams_each_stage_parameters() {
        let bandwidth = 3.35e12 * 0.8;
        let (block, wte, wpe, ln_f) = (7_087_872.0, 50257.0 * 768.0, 1024.0 * 768.0, 1536.0);
        let first = wte + wpe + 4.0 * block;
        // The tied gradient crosses the link (10 us + bytes / 450 GB/s) and is added (3
        // passes); the norm waits for the largest stage's read; then each stage's AdamW.
        let exchange = 10e-6 + 4.0 * wte / 450e9 + 12.0 * wte / bandwidth;
        let shared = exchange + 4.0 * first / bandwidth;
        let want = [first, 4.0 * block, 4.0 * block, wte + ln_f].map(|n| shared + 32.0 * n / bandwidth);
        let got = from_hardware(&setup(gpt2_small(4, "1f1b", 1, 8)), &h100()).optimizer;
        for (got, want) in got.iter().zip(want) {
            assert!((got - want).abs() < 1e-15, "{got} s, expected {want} s");
        }
        // One stage holds both ends: nothing crosses a link.
        let all = wte + wpe + 12.0 * block + ln_f;
        let got = from_hardware(&setup(gpt2_small(1, "1f1b", 1, 8)), &h100()).optimizer;
        let want = (12.0 * wte + 4.0 * all + 32.0 * all) / bandwidth;
        assert!((got[0] - want).abs() < 1e-15, "{got:?} s, expected {want} s");
    }

    fn with_tp(t: usize, sequence_parallel: bool) -> Config {
        Config { tensor_model_parallel_size: t, sequence_parallel, ..gpt2_small(4, "1f1b", 1, 8) }
    }

    /// Each rank computes 1/t of every FLOP and adds its collectives: per block two
    /// all-reduces each way without sequence parallelism; with it two all-gathers and two
    /// reduce-scatters each way plus the weight gradients' two all-gathers. t = 1 is today's
    /// model exactly, with or without the flag.
    #[test]
    fn tensor_parallel_splits_flops_and_adds_collectives() {
        let h100 = h100();
        let today = from_hardware(&setup(gpt2_small(4, "1f1b", 1, 8)), &h100);
        assert_eq!(from_hardware(&setup(with_tp(1, true)), &h100), today);
        let block = typical_block_flops(&setup(with_tp(4, false)).shape);
        let rate = 989e12 * 0.5;
        // [1024, 768] fp32 activations; a ring moves 3/4 of them per all-gather among 4
        // GPUs of a node, at 80% of NVLink's 450 GB/s, 10 us per collective.
        let share = 0.75 * (1024.0 * 768.0 * 4.0) / (0.8 * 450e9);
        let tp = from_hardware(&setup(with_tp(4, false)), &h100).chunks[1];
        let close = |got: f64, want: f64| assert!((got - want).abs() < 1e-15, "{got} s, expected {want} s");
        close(tp.forward, 4.0 * (block.forward / 4.0 / rate + 2.0 * (2.0 * share + 10e-6)));
        close(tp.backward_input, 4.0 * (block.backward_input / 4.0 / rate + 2.0 * (2.0 * share + 10e-6)));
        close(tp.backward_weight, 4.0 * block.backward_weight / 4.0 / rate);
        let sp = from_hardware(&setup(with_tp(4, true)), &h100).chunks[1];
        close(sp.forward, tp.forward + 4.0 * 2.0 * 10e-6);
        close(sp.backward_input, tp.backward_input + 4.0 * 2.0 * 10e-6);
        close(sp.backward_weight, tp.backward_weight + 4.0 * 2.0 * (share + 10e-6));
        // Selective recompute redoes the attention core alone: 1/t of it, no collective.
        let selective = Config {
            recompute_granularity: Some(crate::config::RecomputeGranularity::Selective),
            ..with_tp(4, true)
        };
        let core = 4.0 * (1024.0 * 1024.0 * 768.0) * 4.0 / 4.0 / rate;
        close(from_hardware(&setup(selective), &h100).chunks[1].recompute, core);
    }

    /// The data-parallel all-reduce: a ring over dp replicas moves 2(dp-1)/dp of each
    /// stage's fp32 gradients, within a node over NVLink, across nodes over the network;
    /// every stage waits for the slowest (stage 0, which holds the embedding).
    #[test]
    fn data_parallel_all_reduce_joins_the_optimizer_phase() {
        let h100 = h100();
        let with_dp = |dp: usize| Config { data_parallel_size: Some(dp), ..gpt2_small(4, "1f1b", 1, 8 * dp) };
        let first = (50257.0 + 1024.0) * 768.0 + 4.0 * 7_087_872.0;
        let one = from_hardware(&setup(with_dp(1)), &h100).optimizer;
        let two = from_hardware(&setup(with_dp(2)), &h100).optimizer;
        let ring = 10e-6 + 2.0 * 0.5 * first * 4.0 / (0.8 * 450e9);
        for (a, b) in one.iter().zip(&two) {
            assert!((b - a - ring).abs() < 1e-12, "{b} - {a} s, expected {ring} s");
        }
        // 16 replicas of a 1-GPU stage span two nodes: the network's 50 GB/s, for the ring
        // and for the tied gradient between stages 0 and 3 (nodes apart now).
        let sixteen = from_hardware(&setup(with_dp(16)), &h100).optimizer;
        let ring = 10e-6 + 2.0 * 15.0 / 16.0 * first * 4.0 / (0.8 * 50e9);
        let exchange = 50257.0 * 768.0 * 4.0 * (1.0 / 50e9 - 1.0 / 450e9);
        assert!((sixteen[3] - one[3] - ring - exchange).abs() < 1e-12, "{sixteen:?} {one:?}");
        // Given instead: added to each stage's given optimizer time.
        let given = GivenTimes::parse("forward=1,backward=2,optimizer=3,dp-allreduce=5").unwrap();
        assert_eq!(given.durations(&setup(with_dp(2)), &h100).unwrap().optimizer, [0.008; 4]);
        assert_eq!(
            given.durations(&setup(with_dp(1)), &h100).unwrap_err().to_string(),
            "command line: --op-times dp-allreduce=...: the config has data_parallel_size 1"
        );
    }

    #[test]
    fn given_times_are_per_stage_and_checked() {
        let given =
            GivenTimes::parse("forward=18.5,backward-input=18.1,backward-weight=9.3,p2p=0.6,optimizer=2.5")
                .unwrap();
        let d = given.durations(&setup(gpt2_small(2, "interleaved-1f1b", 2, 4)), &h100()).unwrap();
        assert_eq!(d.chunks.len(), 4);
        let ms = |t: OpTimes| [t.forward, t.backward_input, t.backward_weight, t.recompute].map(|x| x * 1e3);
        for (got, want) in ms(d.chunks[0]).iter().zip([9.25, 9.05, 4.65, 0.0]) {
            assert!((got - want).abs() < 1e-12, "{got} ms, expected {want} ms");
        }
        assert_eq!(d.p2p, P2p::PerMessage(0.0006));
        assert_eq!(d.optimizer, [0.0025, 0.0025]);
        let whole = GivenTimes::parse("forward=1,backward=2").unwrap();
        let d = whole.durations(&setup(gpt2_small(4, "1f1b", 1, 8)), &h100()).unwrap();
        assert!((d.chunks[1].backward_input + d.chunks[1].backward_weight - 0.002).abs() < 1e-15);
        assert_eq!((d.p2p, d.optimizer), (P2p::PerMessage(0.0), vec![0.0; 4]));
        let err = |text: &str| GivenTimes::parse(text).unwrap_err().to_string();
        assert_eq!(
            err("forward=0,backward=1"),
            "command line: --op-times forward=0,backward=1: forward=0: a time must be > 0 ms"
        );
        assert_eq!(
            err("forward=1,backward=-2"),
            "command line: --op-times forward=1,backward=-2: backward=-2: a time must be > 0 ms"
        );
        assert_eq!(
            err("forward=1,backward=2,p2p=-0.5"),
            "command line: --op-times forward=1,backward=2,p2p=-0.5: p2p=-0.5: a time must be >= 0 ms"
        );
        assert_eq!(
            err("forward=1,backward=2,optimizer=NaN"),
            "command line: --op-times forward=1,backward=2,optimizer=NaN: optimizer=NaN: a time must be >= 0 ms"
        );
        assert_eq!(
            err("forward=1,backward-input=0,backward-weight=1"),
            "command line: --op-times forward=1,backward-input=0,backward-weight=1: backward-input=0: a time must be > 0 ms"
        );
        assert!(err("forward=1").ends_with("give backward-input=MS and backward-weight=MS, or backward=MS"));
        assert!(err("fwd=1").contains("unknown op `fwd`"));
        assert!(err("forward=fast,backward=1").ends_with("forward=fast: not a number of ms"));
    }

    #[test]
    fn free_ops_may_take_zero_ms() {
        let given =
            GivenTimes::parse("forward=2,backward-input=3,backward-weight=0,recompute=0,p2p=0,optimizer=0")
                .unwrap();
        let cfg = Config {
            recompute_granularity: Some(crate::config::RecomputeGranularity::Full),
            recompute_method: Some(crate::config::RecomputeMethod::Uniform),
            recompute_num_layers: Some(1),
            ..gpt2_small(4, "zb-h1", 1, 8)
        };
        let d = given.durations(&setup(cfg), &h100()).unwrap();
        let want = OpTimes { forward: 0.002, backward_input: 0.003, backward_weight: 0.0, recompute: 0.0 };
        assert_eq!(d.chunks, vec![want; 4]);
        assert_eq!((d.p2p, d.optimizer), (P2p::PerMessage(0.0), vec![0.0; 4]));
    }
}
