//! The memory of each stage: what it holds all along (parameters, gradients, optimizer
//! state) and, per microbatch in flight, what each chunk keeps under its recompute policy,
//! plus the transient bytes of each action.
//!
//! Kept and static bytes come from the trainer's own declarations (stages::memory_model,
//! saved.rs), in the element types it stores (`ModelShape::activations`): under
//! `precision: bf16` activations and their gradients take 2 bytes per element, and each
//! stage holds a bf16 copy of its parameters beside the fp32 master weights, gradients and
//! AdamW moments. Megatron-LM's flat rule (2 bytes per activation element, 18 per
//! parameter) differs by little: the trainer keeps the LayerNorm statistics and the
//! attention's log-sum-exp in fp32 (16 values per token and layer for GPT-2 small, 128 KiB
//! more of a layer's 96 MiB at micro batch 4) and pads wte's copy to 50304 rows (70.5 KiB
//! more than 2 bytes per parameter for GPT-2 small).
//!
//! Working bytes (estimates; the schedule simulator holds each only while its action runs):
//! * forward: the tensors a block drops or offloads, alive until its forward ends (the
//!   largest block's),
//!   two [B,T,C] residual-branch temporaries, and the [B,T,C] output being sent; on the
//!   head's chunk, the head's forward-and-backward: ln_f's output [B,T,C] and the
//!   logits, which become dlogits, [B,T,V] (padded on CUDA at t = 1), both in the activations'
//!   element size;
//! * recompute: what one recompute step rebuilds — a full-recompute group's blocks with all
//!   their tensors, or one block's selectively dropped tensors;
//! * backward-input: the recomputed tensors it consumes, a stored block's offloaded tensors
//!   brought back with the previous block's, whose copy back starts a block early (the
//!   largest such pair), one block's gradient scratch (two [B,T,F], or one on CUDA under
//!   GELU, whose backward is the epilogue of fc2's input-gradient product; one [B,T,3C];
//!   and the attention core's: the [B,NH,T,T] score gradient, or the fused core's [B,NH,T]
//!   row sums, beside which its one-kernel bf16 backward at head sizes up to 64 holds dq's
//!   fp32 partial sums, [B,NH,ceil(T/64),64,64], and its turns' counters,
//!   `kernels::ChainedDq`), and the received and the sent gradient [B,T,C];
//! * backward-weight: nothing (it reads what backward-input left and adds into the
//!   gradients, which are static).
//!
//! The received activation is not a separate buffer: it becomes the first block's stashed
//! input.

use super::setup::Setup;
use kernels::{AttentionSaves, ChainedDq};
use schedules::ChunkMemory;
use stages::memory_model::{
    block_stash, deferred_weight_grad_bytes, param_elements, stash_bytes, static_bytes,
};
use stages::recompute::BlockKeep;
use stages::saved::{block_kept_bytes, F32_BYTES};
use stages::tensor_parallel::Split;
use stages::{RecomputePolicy, SelectiveModules};

/// Memory of one microbatch through chunk `chunk` of stage `stage`, on one tensor-parallel
/// rank.
pub fn chunk_memory(setup: &Setup, stage: usize, chunk: usize) -> ChunkMemory {
    let (s, tp) = (&setup.shape, setup.tp);
    let layout = setup.layout(stage, chunk);
    let policy = &setup.policies[stage];
    let eb = setup.activation_bytes_per_element();
    let blocks = layout.blocks.len();
    let stash = stash_bytes(s, tp, layout, policy, &setup.offloads[stage]);

    let element = |elements: usize, split: Split| (tp.per_rank(elements, split) * eb) as u64;
    let message = element(s.tokens() * s.hidden, Split::Sequence);
    let (b, nh, t) = (s.micro_batch, s.heads, s.seq_len);
    let attention_scratch = match s.attention {
        // The score gradient, an activation gradient like the probabilities it comes from
        // (16-bit in Megatron-LM under bf16; the trainer's cores that keep probabilities
        // run only in fp32).
        AttentionSaves::Probabilities => element(b * nh * t * t, Split::Interior),
        // The fused core's row sums: fp32 scratch under either precision, as its
        // log-sum-exp is; and where its backward is one kernel (bf16), dq's fp32 partial
        // sums and the counters its blocks take turns by.
        AttentionSaves::RowLogSumExp => {
            let (heads, kv_heads) =
                (tp.per_rank(b * nh, Split::Interior), tp.per_rank(b * s.kv_heads, Split::Interior));
            let chained =
                ChainedDq::of(s.activations, s.head_size(), t, heads, kv_heads).map_or(0, |c| c.bytes());
            (tp.per_rank(b * nh * t, Split::Interior) * F32_BYTES + chained) as u64
        }
    };
    let block = |keep| block_kept_bytes(s, tp, keep) as u64;
    let full_block = block(BlockKeep::Stored(SelectiveModules::NONE));
    let kept = |o| block_stash(s, tp, (policy, &setup.offloads[stage]), blocks, o);
    // What a block's forward builds and does not keep on the device (what it drops, and
    // what leaves for the host when it ends), alive until then.
    let dropped_in_forward = (0..blocks).map(|o| full_block - kept(o).device as u64).max().unwrap_or(0);
    // A stored block's offloaded tensors, back as workspace for its backward, beside the
    // previous stored block's, which start back while it runs.
    let host = |o| kept(o).host as u64;
    let stored_segments = policy.segments(blocks).into_iter().filter(|g| !g.recompute);
    let reloaded = stored_segments
        .flat_map(|g| (g.start..g.end).map(move |o| host(o) + if o > g.start { host(o - 1) } else { 0 }))
        .max()
        .unwrap_or(0);
    let sends_activation = !layout.head;
    let head_working = if layout.head {
        element(s.tokens() * s.hidden, Split::Sequence)
            + element(s.tokens() * setup.logits_columns(), Split::Interior)
    } else {
        0
    };

    let recompute_working = match policy {
        RecomputePolicy::None => 0,
        RecomputePolicy::Full { .. } => {
            let longest =
                policy.segments(blocks).iter().filter(|g| g.recompute).map(|g| g.end - g.start).max();
            longest.unwrap_or(0) as u64 * full_block
        }
        RecomputePolicy::Selective(modules) if blocks > 0 => full_block - block(BlockKeep::Stored(*modules)),
        RecomputePolicy::Selective(_) => 0,
    };
    let grad_scratch = if blocks > 0 {
        element(s.tokens() * (fc2_input_grad_width(setup) + s.fc1_width() + s.qkv_width()), Split::Interior)
            + attention_scratch
    } else {
        0
    };
    let grad_messages = message * (u64::from(!layout.head) + u64::from(!layout.embedding));

    // A split backward (ZB-H1) leaves the matmul inputs and output gradients for
    // backward-weight: kept, recomputed or computed by backward-input alike, so possibly more
    // than the stash. Unsplit backwards ignore it.
    let weight_grad_bytes = deferred_weight_grad_bytes(s, tp, layout) as u64;
    ChunkMemory {
        activation_bytes: stash.device as u64,
        host_bytes: stash.host as u64,
        weight_grad_bytes,
        forward_working_bytes: dropped_in_forward
            + 2 * message
            + if sends_activation { message } else { 0 }
            + head_working,
        recompute_working_bytes: recompute_working,
        backward_input_working_bytes: recompute_working + reloaded + grad_scratch + grad_messages,
        backward_weight_working_bytes: 0,
    }
}

/// The width of fc2's input gradient [B,T,F] that backward-input holds beside fc1's output
/// gradient: F, or none where CUDA computes the GELU's gradient in fc2's product
/// (`Device::matmul_backward_input_gelu`, under `bias_gelu_fusion`).
fn fc2_input_grad_width(setup: &Setup) -> usize {
    if setup.fuses_gelu_backward() {
        0
    } else {
        setup.shape.ffn
    }
}

/// What stage `stage` holds all along, on one tensor-parallel rank: its chunks' parameters,
/// gradients and AdamW moments (fp32; under the distributed optimizer, the moments of one
/// replica's part), plus the bf16 weight copy under bf16.
pub fn stage_static_bytes(setup: &Setup, stage: usize) -> u64 {
    // The last replica's part of a parameter is never smaller than another's: its bytes are
    // the most any replica of the stage holds.
    let optimizer = crate::plan::optimizer_shard(&setup.cfg, setup.dp - 1);
    (0..setup.v).map(|c| static_bytes(&setup.shape, setup.tp, setup.layout(stage, c), optimizer) as u64).sum()
}

/// What stage `stage` holds on top of its static bytes in the post-schedule phase: where the
/// embedding and the head sit on different stages, each of the two receives the other's
/// part of the tied gradient, [V, C] fp32 (one rank's V/t rows), before adding it to its own.
pub fn optimizer_working_bytes(setup: &Setup, stage: usize) -> u64 {
    match setup.tied_holders() {
        Some((e, h)) if stage == e || stage == h => {
            (setup.tp.per_rank(setup.shape.vocab * setup.shape.hidden, Split::Interior) * F32_BYTES) as u64
        }
        _ => 0,
    }
}

/// Parameters one tensor-parallel rank of stage `stage` holds and steps (a tied embedding
/// counts on both holders).
pub fn stage_parameters(setup: &Setup, stage: usize) -> usize {
    (0..setup.v).map(|c| param_elements(&setup.shape, setup.tp, setup.layout(stage, c))).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::simulate::predicted_stage_peaks;
    use crate::simulate::setup::tests::gpt2_small;
    use stages::saved::kept_bytes;
    use stages::TensorParallel;

    /// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
    /// Models", section 4.1): a Megatron layer stores, at 16 bits with 1-byte dropout
    /// masks, sbh(34 + 5as/h) bytes. The same sum our memory model uses gives exactly that.
    #[test]
    fn megatron_layer_matches_korthikanti_et_al() {
        let (s, b, h, a) = (2048usize, 1usize, 12288usize, 96usize);
        let (sbh, as2b) = (s * b * h, a * s * s * b);
        let (half, mask) = (2, 1);
        let layer = [
            (sbh, half),     // QKV matmul input
            (2 * sbh, half), // Q and K
            (as2b, half),    // softmax output
            (as2b, mask),    // attention dropout mask
            (as2b, half),    // attention dropout output
            (sbh, half),     // V
            (sbh, half),     // output projection input
            (sbh, mask),     // attention-residual dropout mask
            (sbh, half),     // MLP input
            (4 * sbh, half), // GELU input
            (4 * sbh, half), // GELU output (second matmul's input)
            (sbh, mask),     // MLP-residual dropout mask
            (2 * sbh, half), // the two LayerNorms' inputs
        ];
        assert_eq!(kept_bytes(&layer), sbh * 34 + 5 * a * s * s * b);
        assert_eq!(kept_bytes(&layer) as f64, sbh as f64 * (34.0 + 5.0 * (a * s) as f64 / h as f64));
    }

    /// Our fp32 block keeps 16 [B,T,C]-sized elements per token and channel (input, ln_1,
    /// qkv, attention output, residual, ln_2, and the two [B,T,4C]), the [B,NH,T,T]
    /// probabilities, their dropped copy under attention dropout, and 4 LayerNorm statistics
    /// per token: sbh(64 + 4as/h) + 16sb bytes without attention dropout, sbh(64 + 8as/h) +
    /// 16sb with it. For GPT-2 small at T=1024, B=1 (as/h = 16), selective core_attn keeps
    /// sbh 64 + 16sb either way: a cut of 50.0% without attention dropout and 66.7% with it
    /// (Megatron's sbh(34 + 5as/h) at 16 bits gives 70% with dropout, 50% without).
    #[test]
    fn gpt2_small_fp32_layer_bytes() {
        let s = crate::plan::shape(&Config { attention_dropout: 0.0, ..Config::default() });
        assert_eq!((s.seq_len, s.hidden, s.heads, s.micro_batch), (1024, 768, 12, 1));
        assert!(!s.attention_dropout);
        let none = |s| block_kept_bytes(s, TensorParallel::NONE, BlockKeep::Stored(SelectiveModules::NONE));
        let core_attn = SelectiveModules { core_attn: true, ..SelectiveModules::NONE };
        let selective = |s| block_kept_bytes(s, TensorParallel::NONE, BlockKeep::Stored(core_attn));
        assert_eq!(none(&s), 100_679_680);
        assert_eq!(none(&s), 1024 * 768 * 64 + 4 * 12 * 1024 * 1024 + 16 * 1024);
        assert_eq!(selective(&s), 50_348_032);

        // Megatron's default attention_dropout, 0.1.
        let dropout = crate::plan::shape(&Config::default());
        assert!(dropout.attention_dropout);
        assert_eq!(none(&dropout), 151_011_328);
        assert_eq!(none(&dropout), 1024 * 768 * 64 + 8 * 12 * 1024 * 1024 + 16 * 1024);
        assert_eq!(selective(&dropout), 50_348_032);
        let cut = |s| 1.0 - selective(s) as f64 / none(s) as f64;
        assert_eq!((cut(&s) * 1000.0).round(), 500.0);
        assert_eq!((cut(&dropout) * 1000.0).round(), 667.0);
    }

    /// On a GPU the fused attention core keeps, per query row, the log-sum-exp of its scores
    /// ([B,NH,T], 48 KiB at fp32) instead of the probabilities (48 MiB, 96 with dropout), so
    /// GPT-2 small's block keeps what the CPU's keeps under selective core_attn plus those
    /// rows, with or without attention dropout; and selective core_attn changes nothing: no
    /// byte saved, no byte or second spent recomputing.
    #[test]
    fn gpt2_small_gpu_layer_bytes_and_free_selective_recompute() {
        let cuda = |attention_dropout| Config {
            device: crate::config::DeviceKind::Cuda,
            attention_dropout,
            ..Config::default()
        };
        let core_attn = SelectiveModules { core_attn: true, ..SelectiveModules::NONE };
        for s in [0.0, 0.1].map(|p| crate::plan::shape(&cuda(p))) {
            assert_eq!(s.attention, AttentionSaves::RowLogSumExp);
            let none = block_kept_bytes(&s, TensorParallel::NONE, BlockKeep::Stored(SelectiveModules::NONE));
            assert_eq!(none, 50_397_184);
            assert_eq!(none, 50_348_032 + 4 * 12 * 1024);
            assert_eq!(block_kept_bytes(&s, TensorParallel::NONE, BlockKeep::Stored(core_attn)), none);
        }
        let selective = Config {
            recompute_granularity: Some(crate::config::RecomputeGranularity::Selective),
            ..cuda(0.1)
        };
        let (none, selective) = (setup(cuda(0.1)), setup(selective));
        for stage in 0..none.p {
            let (a, b) = (chunk_memory(&none, stage, 0), chunk_memory(&selective, stage, 0));
            assert_eq!(a, b, "stage {stage}");
            assert_eq!(b.recompute_working_bytes, 0, "stage {stage}");
        }
        // Backward's attention scratch is the fused core's delta rows, [B,NH,T]; and fc2's
        // input gradient through GELU is one product, with no [B,T,F] gradient beside
        // fc1's (`the_fused_gelu_backward_holds_one_ffn_gradient_less`).
        let cpu = chunk_memory(&setup(gpt2_small(4, "1f1b", 1, 8)), 1, 0);
        let gpu = chunk_memory(
            &setup(Config { device: crate::config::DeviceKind::Cuda, ..gpt2_small(4, "1f1b", 1, 8) }),
            1,
            0,
        );
        let (scores, rows, ffn_gradient) = (4 * 12 * 1024 * 1024, 4 * 12 * 1024, 1024 * 3072 * 4);
        assert_eq!(
            cpu.backward_input_working_bytes - gpu.backward_input_working_bytes,
            scores - rows + ffn_gradient
        );
    }

    fn setup(cfg: Config) -> Setup {
        Setup::new(&cfg).unwrap()
    }

    /// GPT-2 small at seq 1024 on one CUDA stage, micro batch 4 (configs/gpt2-124m.yaml).
    fn on_one_gpu(precision: &str) -> Config {
        Config {
            device: crate::config::DeviceKind::Cuda,
            precision: crate::config::Named::parse(precision).unwrap(),
            micro_batch_size: 4,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
            ..gpt2_small(1, "1f1b", 1, 8)
        }
    }

    /// The trainer stores bf16 activations and their gradients at 2 bytes but the row
    /// statistics at 4, and keeps a bf16 copy of each parameter: the peak predicted for
    /// bf16 is fp32's with everything above the static bytes halved but the statistics,
    /// plus the copy.
    #[test]
    fn bf16_halves_what_a_stage_holds_but_the_statistics_and_adds_a_copy_of_the_parameters() {
        let (fp32, bf16) = (setup(on_one_gpu("fp32")), setup(on_one_gpu("bf16")));
        let peak = |cfg: &Config| predicted_stage_peaks(cfg).unwrap()[0];
        let (peak32, peak16) = (peak(&fp32.cfg), peak(&bf16.cfg));
        let (static32, static16) = (stage_static_bytes(&fp32, 0), stage_static_bytes(&bf16, 0));

        // wte with its rows padded to 50304, wpe, each block's [C,3C], [C,C], [C,4C], [4C,C],
        // and the vectors: each block's biases (3C, C, 4C, C) and two LayerNorms', ln_f's.
        let (t, c) = (1024u64, 768u64);
        let matrices = 50304 * c + t * c + 12 * (3 * c * c + c * c + 4 * c * c + 4 * c * c);
        let vectors = 12 * (3 * c + c + 4 * c + c + 4 * c) + 2 * c;
        assert_eq!(static16 - static32, 2 * (matrices + vectors));
        // 70.5 KiB more than 2 bytes for each of the 124M parameters (memory.rs's header).
        let parameters = stages::params::total_params(&fp32.shape) as u64;
        assert_eq!(2 * (matrices + vectors - parameters), 72_192);

        // The peak is the head's forward: every block's stash and the head's beside ln_f's
        // output and the logits [4096, 50304]. Of the stash, each block's two LayerNorms'
        // mean and rstd and its 12 heads' log-sum-exp per token, and ln_f's mean and rstd,
        // stay fp32.
        let n = 4 * 1024;
        let statistics = 4 * n * (12 * (4 + 12) + 2);
        assert!(peak32 - static32 > 4 * n * 50304);
        assert_eq!(peak16 - static16, (peak32 - static32 - statistics) / 2 + statistics);
    }

    /// Under bf16 the CUDA backward's attention scratch holds, beside delta, the one-kernel
    /// backward's dq partial sums, a [64, 64] fp32 tile a query tile of each head, and its
    /// counters, one a query tile of each head and one a key/value head
    /// (`kernels::ChainedDq`); the rest of what a backward holds halves.
    #[test]
    fn the_bf16_backward_holds_dqs_partial_sums_beside_delta() {
        let (fp32, bf16) = (setup(on_one_gpu("fp32")), setup(on_one_gpu("bf16")));
        let (a, b) = (chunk_memory(&fp32, 0, 0), chunk_memory(&bf16, 0, 0));
        let (heads, tiles) = (4 * 12, 1024 / 64);
        let delta = heads * 1024 * 4;
        let chained = 4 * (heads * tiles * 64 * 64 + heads * tiles + heads);
        assert_eq!(chained, 12_586_176);
        assert_eq!(
            b.backward_input_working_bytes - delta - chained,
            (a.backward_input_working_bytes - delta) / 2
        );
    }

    /// The CUDA device's logits rows are padded from 50257 to 50304 columns: the head's
    /// stage works with that much more, the other stages as much as on the CPU.
    #[test]
    fn cuda_pads_the_heads_logits_rows() {
        let cpu = setup(gpt2_small(4, "1f1b", 1, 8));
        let cuda = setup(Config { device: crate::config::DeviceKind::Cuda, ..gpt2_small(4, "1f1b", 1, 8) });
        let (a, b) = (chunk_memory(&cpu, 3, 0), chunk_memory(&cuda, 3, 0));
        // 1024 tokens (micro batch 1) x 47 more fp32 columns.
        assert_eq!(b.forward_working_bytes - a.forward_working_bytes, 1024 * (50304 - 50257) * 4);
        // The other stages' forward working bytes are the CPU's; the rest of what they hold
        // differs by the fused attention core (see the tests below).
        for r in 0..3 {
            let (a, b) = (chunk_memory(&cpu, r, 0), chunk_memory(&cuda, r, 0));
            assert_eq!(a.forward_working_bytes, b.forward_working_bytes, "stage {r}");
        }
    }

    /// A tensor-parallel rank's logits are its shard of the vocabulary, never padded
    /// (`vocab_parallel.rs`): at t = 2 over 50258 columns (50304 if padded) the CUDA head
    /// works with the CPU's bytes, 25129 columns a token.
    #[test]
    fn a_tensor_parallel_ranks_logits_are_not_padded() {
        let t2 = |device| {
            let cfg =
                Config { vocab_size: 50258, tensor_model_parallel_size: 2, ..gpt2_small(4, "1f1b", 1, 8) };
            setup(Config { device, ..cfg })
        };
        let (cpu, cuda) = (t2(crate::config::DeviceKind::Cpu), t2(crate::config::DeviceKind::Cuda));
        assert_eq!(cuda.logits_columns(), 50258);
        assert_eq!(
            chunk_memory(&cpu, 3, 0).forward_working_bytes,
            chunk_memory(&cuda, 3, 0).forward_working_bytes
        );
    }

    /// On CUDA, fc2's input gradient through GELU is one cuBLASLt product: backward-input
    /// holds one [B,T,F] gradient less than with `bias_gelu_fusion` off, and nothing else
    /// changes.
    #[test]
    fn the_fused_gelu_backward_holds_one_ffn_gradient_less() {
        let cuda = |fusion| {
            let cfg = Config { device: crate::config::DeviceKind::Cuda, ..gpt2_small(4, "1f1b", 1, 8) };
            setup(Config { bias_gelu_fusion: fusion, ..cfg })
        };
        let (on, off) = (chunk_memory(&cuda(true), 1, 0), chunk_memory(&cuda(false), 1, 0));
        // 1024 tokens (micro batch 1) x F = 3072, fp32.
        assert_eq!(off.backward_input_working_bytes - on.backward_input_working_bytes, 1024 * 3072 * 4);
        let same = ChunkMemory { backward_input_working_bytes: on.backward_input_working_bytes, ..off };
        assert_eq!(on, same);
    }

    /// One GPU of t holds 1/t of the split parameters (the vocab-parallel embedding, the
    /// attention's and MLP's matrices, their column-parallel biases) and all of the others;
    /// with sequence parallelism 1/t of every activation byte. A split backward's deferred
    /// weight gradients keep the column-parallel inputs and the row-parallel output
    /// gradients gathered whole, as the trainer does, and 1/t of the others.
    #[test]
    fn tensor_parallelism_splits_parameters_and_activations() {
        let tp = |t, sequence_parallel| {
            setup(Config { tensor_model_parallel_size: t, sequence_parallel, ..gpt2_small(4, "1f1b", 1, 8) })
        };
        let (c, f) = (768usize, 3072usize);
        let split = 3 * c * c + 3 * c + c * c + c * f + f + f * c;
        let (one, two) = (tp(1, false), tp(2, true));
        assert_eq!(stage_parameters(&one, 1), 4 * (6 * c + split));
        assert_eq!(stage_parameters(&two, 1), 4 * (6 * c + split / 2));
        assert_eq!(stage_parameters(&two, 0), 50257 * c / 2 + 1024 * c + 4 * (6 * c + split / 2));
        let n = 1024;
        for r in 0..4 {
            let (a, b) = (chunk_memory(&one, r, 0), chunk_memory(&two, r, 0));
            assert_eq!(a.activation_bytes, 2 * b.activation_bytes, "stage {r}");
            // Per block: n1, the attention's output gradient, n2 and the MLP's whole; dqkv,
            // atty, dfc1 and the MLP's activation split.
            let blocks = one.layout(r, 0).blocks.len();
            let split_bytes = (blocks * 4 * n * (3 * c + c + f + f)) as u64;
            assert_eq!(b.weight_grad_bytes, a.weight_grad_bytes - split_bytes / 2, "stage {r}");
        }
        // Without sequence parallelism, the LayerNorm side stays whole: 16 of a block's 64
        // bytes per token and channel (and the statistics), and the attention (8 probabilities
        // per head and token pair at fp32 with dropout) splits.
        let plain = chunk_memory(&tp(2, false), 1, 0).activation_bytes;
        let (n, h) = (1024u64, 768u64);
        let whole = 4 * (4 * n * h + 4 * n) * 4;
        let split = 4 * (12 * n * h * 4 + 8 * 12 * n * n) / 2;
        assert_eq!(plain, whole + split);
        assert_eq!(chunk_memory(&tp(1, true), 1, 0), chunk_memory(&one, 1, 0));
    }

    #[test]
    fn recompute_trades_stash_for_working_bytes() {
        let full = |n| Config {
            recompute_granularity: Some(crate::config::RecomputeGranularity::Full),
            recompute_method: Some(crate::config::RecomputeMethod::Uniform),
            recompute_num_layers: Some(n),
            ..gpt2_small(4, "1f1b", 1, 8)
        };
        let block = 151_011_328u64;
        let (one, two) = (chunk_memory(&setup(full(1)), 1, 0), chunk_memory(&setup(full(2)), 1, 0));
        // Stage 1 holds h.4-h.7: groups of 1 keep 4 inputs, groups of 2 keep 2.
        assert_eq!((one.activation_bytes, two.activation_bytes), (4 * 1024 * 768 * 4, 2 * 1024 * 768 * 4));
        assert_eq!((one.recompute_working_bytes, two.recompute_working_bytes), (block, 2 * block));
        let none = chunk_memory(&setup(gpt2_small(4, "1f1b", 1, 8)), 1, 0);
        assert_eq!((none.recompute_working_bytes, none.activation_bytes), (0, 4 * block));
        // Full recompute's forward holds one block's dropped tensors at a time.
        assert_eq!(one.forward_working_bytes - none.forward_working_bytes, block - 1024 * 768 * 4);
    }

    #[test]
    fn split_backwards_hold_the_weight_gradient_inputs_until_backward_weight() {
        let full = Config {
            recompute_granularity: Some(crate::config::RecomputeGranularity::Full),
            recompute_method: Some(crate::config::RecomputeMethod::Uniform),
            recompute_num_layers: Some(4),
            ..gpt2_small(4, "zb-h1", 1, 8)
        };
        let zb = setup(full);
        let m = chunk_memory(&zb, 1, 0);
        let deferred = deferred_weight_grad_bytes(&zb.shape, TensorParallel::NONE, zb.layout(1, 0)) as u64;
        // Full recompute keeps one input, W holds every block's matmul inputs and gradients.
        assert_eq!((m.activation_bytes, m.weight_grad_bytes), (1024 * 768 * 4, deferred));
        assert!(m.weight_grad_bytes > m.activation_bytes);
    }
}
