//! How long each pass of one microbatch through one chunk takes, and each stage's
//! post-schedule phase (tied-gradient exchange, grad norm, optimizer step): from the layer
//! shapes and a hardware profile, or as given on the command line (`--op-times`, per stage as
//! papers report them), or as measured (`--measured`, see measured.rs).

use super::hardware::Hardware;
use super::memory::stage_parameters;
use super::setup::Setup;
use crate::error::user_error;
use stages::flops::{block_flops, head_flops, Flops};
use stages::saved::F32_BYTES;
use stages::{ChunkLayout, RecomputePolicy};

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

/// FLOPs of one microbatch through chunk `chunk` of stage `stage`. The embedding, a gather
/// of B*T rows, costs next to nothing against a block and is left out.
fn chunk_flops(setup: &Setup, stage: usize, chunk: usize) -> Flops {
    let s = &setup.shape;
    let layout = setup.layout(stage, chunk);
    let (block, blocks) = (block_flops(s), layout.blocks.len() as f64);
    let head = if layout.head { head_flops(s) } else { Flops::default() };
    Flops {
        forward: blocks * block.forward + head.forward,
        backward_input: blocks * block.backward_input + head.backward_input,
        backward_weight: blocks * block.backward_weight + head.backward_weight,
    }
}

/// Seconds the chunk's recompute takes on `hw`: the forward of what the policy recomputes.
/// Full: the recomputed blocks' whole forward. Selective: the attention core's forward
/// (compute-bound), GELU and LayerNorm (memory-bound: one read and one write of their
/// output-sized tensors each).
fn recompute_seconds(setup: &Setup, stage: usize, chunk: usize, hw: &Hardware) -> f64 {
    let s = &setup.shape;
    let blocks = setup.layout(stage, chunk).blocks.len();
    let block = block_flops(s);
    let eb = setup.activation_bytes_per_element() as f64;
    let streamed = |elements: usize| 2.0 * elements as f64 * eb / hw.achieved_bandwidth();
    match setup.policies[stage] {
        RecomputePolicy::None => 0.0,
        RecomputePolicy::Full { .. } => {
            let segments = setup.policies[stage].segments(blocks);
            let recomputed: usize = segments.iter().filter(|g| g.recompute).map(|g| g.end - g.start).sum();
            recomputed as f64 * block.forward / hw.achieved_flops()
        }
        RecomputePolicy::Selective(m) => {
            // The attention core has no weights, so its FLOPs are the block's forward FLOPs
            // less the matmuls' (which equal the weight-gradient FLOPs).
            let core_attn = (block.forward - block.backward_weight) / hw.achieved_flops();
            let per_block = if m.core_attn { core_attn } else { 0.0 }
                + if m.mlp { streamed(s.tokens() * s.ffn) } else { 0.0 }
                + if m.layernorm { 2.0 * streamed(s.tokens() * s.hidden) } else { 0.0 };
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

/// Seconds of each stage's post-schedule phase on `hw`, all memory-bound: the tied
/// embedding's gradient exchange and the global grad norm (each stage reads its gradients
/// on its own device, in parallel), which every stage waits for, then its own AdamW.
fn optimizer_seconds(setup: &Setup, hw: &Hardware) -> Vec<f64> {
    let bandwidth = hw.achieved_bandwidth();
    let params: Vec<f64> = (0..setup.p).map(|r| stage_parameters(setup, r) as f64).collect();
    let norm = params.iter().map(|n| n * GRAD_NORM_BYTES / bandwidth).fold(0.0, f64::max);
    let shared = tied_exchange_seconds(setup, hw) + norm;
    params.iter().map(|n| shared + n * ADAMW_BYTES / bandwidth).collect()
}

/// The tied embedding's gradient [V, C]: when the embedding and the head are on different
/// stages, each holder's part crosses the link (both directions at once); then each holder
/// adds the two (reads two, writes one).
fn tied_exchange_seconds(setup: &Setup, hw: &Hardware) -> f64 {
    let bytes = (setup.shape.vocab * setup.shape.hidden * F32_BYTES) as f64;
    let stage_with = |part: fn(&ChunkLayout) -> bool| {
        (0..setup.p).find(|&r| (0..setup.v).any(|c| part(setup.layout(r, c))))
    };
    let crosses = stage_with(|l| l.embedding) != stage_with(|l| l.head);
    let link = if crosses { hw.link_latency + bytes / hw.link_bandwidth } else { 0.0 };
    link + 3.0 * bytes / hw.achieved_bandwidth()
}

/// Op times from the model's FLOPs on `hw`.
pub fn from_hardware(setup: &Setup, hw: &Hardware) -> Durations {
    let rate = hw.achieved_flops();
    let chunks = (0..setup.p)
        .flat_map(|r| (0..setup.v).map(move |c| (r, c)))
        .map(|(r, c)| {
            let f = chunk_flops(setup, r, c);
            OpTimes {
                forward: f.forward / rate,
                backward_input: f.backward_input / rate,
                backward_weight: f.backward_weight / rate,
                recompute: recompute_seconds(setup, r, c, hw),
            }
        })
        .collect();
    Durations {
        chunks,
        p2p: P2p::Link { latency: hw.link_latency, bandwidth: hw.link_bandwidth },
        optimizer: optimizer_seconds(setup, hw),
    }
}

/// `--op-times`: milliseconds per stage and microbatch, e.g.
/// `forward=18.5,backward-input=18.1,backward-weight=9.3,p2p=0.6`. `backward=` may stand
/// for both halves; `recompute=`, `p2p=` and `optimizer=` (per stage and step: the
/// post-schedule phase, exchange and grad norm included) are optional. The ops in
/// [`FREE_OPS`] may take 0 ms: the textbook bubble formulas assume free transfers.
#[derive(Clone, Debug, PartialEq)]
pub struct GivenTimes {
    forward: f64,
    backward: Backward,
    recompute: Option<f64>,
    p2p: f64,
    optimizer: f64,
}

const GIVEN_OPS: [&str; 7] =
    ["forward", "backward-input", "backward-weight", "backward", "recompute", "p2p", "optimizer"];

/// Ops that may cost nothing: transfers, the optimizer phase, a recompute and the weight
/// gradient can each be left out of a model of the step. A forward or an input gradient
/// always computes something, so those stay > 0.
const FREE_OPS: [&str; 4] = ["backward-weight", "recompute", "p2p", "optimizer"];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Backward {
    Split { input: f64, weight: f64 },
    Whole(f64),
}

impl GivenTimes {
    pub fn parse(text: &str) -> anyhow::Result<GivenTimes> {
        let err = |msg: String| user_error(format!("--op-times {text}: {msg}"));
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
        })
    }

    /// Every stage alike, each of its v chunks doing 1/v of it. What the times leave open
    /// (a recompute, or the split of a whole backward) follows the model's proportions on
    /// `hw`.
    pub fn durations(&self, setup: &Setup, hw: &Hardware) -> anyhow::Result<Durations> {
        let model = from_hardware(setup, hw);
        let recomputes = setup.policies.iter().any(|p| *p != RecomputePolicy::None);
        if self.recompute.is_some() && !recomputes {
            return Err(user_error("--op-times recompute=...: the config recomputes nothing"));
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
        Ok(Durations { chunks, p2p: P2p::PerMessage(self.p2p), optimizer: vec![self.optimizer; setup.p] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::simulate::setup::tests::gpt2_small;
    use std::path::Path;

    fn setup(cfg: Config) -> Setup {
        Setup::new(&cfg, Path::new("c.yaml")).unwrap()
    }

    fn h100() -> Hardware {
        Hardware::lookup("h100-sxm", "bf16").unwrap()
    }

    #[test]
    fn model_times_are_flops_over_achieved_rate() {
        let s = setup(gpt2_small(4, "1f1b", 1, 8));
        let d = from_hardware(&s, &h100());
        let block = block_flops(&s.shape);
        let rate = 989e12 * 0.5;
        assert_eq!(d.chunks[1].forward, 4.0 * block.forward / rate);
        assert_eq!(d.chunks[1].backward_weight, 4.0 * block.backward_weight / rate);
        assert_eq!(d.chunks[3].forward, head_flops(&s.shape).forward / rate);
        assert_eq!(d.chunks[1].recompute, 0.0);
        assert_eq!(d.p2p, P2p::Link { latency: 10e-6, bandwidth: 450e9 });
    }

    #[test]
    fn recompute_is_the_forward_of_what_the_policy_drops() {
        let with = |granularity: &str, method: Option<&str>, n: Option<usize>, modules: Option<&[&str]>| {
            let cfg = Config {
                recompute_granularity: Some(granularity.into()),
                recompute_method: method.map(Into::into),
                recompute_num_layers: n,
                recompute_modules: modules.map(|m| m.iter().map(|s| s.to_string()).collect()),
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
            "--op-times forward=0,backward=1: forward=0: a time must be > 0 ms"
        );
        assert_eq!(
            err("forward=1,backward=-2"),
            "--op-times forward=1,backward=-2: backward=-2: a time must be > 0 ms"
        );
        assert_eq!(
            err("forward=1,backward=2,p2p=-0.5"),
            "--op-times forward=1,backward=2,p2p=-0.5: p2p=-0.5: a time must be >= 0 ms"
        );
        assert_eq!(
            err("forward=1,backward=2,optimizer=NaN"),
            "--op-times forward=1,backward=2,optimizer=NaN: optimizer=NaN: a time must be >= 0 ms"
        );
        assert_eq!(
            err("forward=1,backward-input=0,backward-weight=1"),
            "--op-times forward=1,backward-input=0,backward-weight=1: backward-input=0: a time must be > 0 ms"
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
            recompute_granularity: Some("full".into()),
            recompute_method: Some("uniform".into()),
            recompute_num_layers: Some(1),
            ..gpt2_small(4, "zb-h1", 1, 8)
        };
        let d = given.durations(&setup(cfg), &h100()).unwrap();
        let want = OpTimes { forward: 0.002, backward_input: 0.003, backward_weight: 0.0, recompute: 0.0 };
        assert_eq!(d.chunks, vec![want; 4]);
        assert_eq!((d.p2p, d.optimizer), (P2p::PerMessage(0.0), vec![0.0; 4]));
    }
}
