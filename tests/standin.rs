//! `device: cuda` end to end on the CUDA stand-in (standin/): the real host path, cudarc,
//! cuBLAS calls and NCCL collectives included, with the kernels under the SIMT emulator.
//! Each run is a child process whose library path puts the stand-in first, under the
//! names cudarc loads. The stand-in is a dev-dependency, so cargo builds its library beside
//! the test binaries; NVRTC is the real library. Where NVRTC is missing each test skips, saying so.
#![cfg(feature = "cuda")]

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The stand-in library, where cargo builds it for the workspace's tests: beside this
/// test's binary.
fn standin_library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().expect("target/<profile>/deps").join("libcuda_standin.so")
}

/// A directory of links to the stand-in under the names cudarc loads, made once per test
/// process: tests that made them each at once raced between a link's removal and creation.
fn standin_libs() -> PathBuf {
    static LIBS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIBS.get_or_init(|| {
        let lib = standin_library();
        assert!(
            lib.exists(),
            "{} is not built: cargo builds it for this test (a dev-dependency)",
            lib.display()
        );
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("standin-libs");
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["libcuda.so", "libcublas.so", "libcublasLt.so", "libnccl.so"] {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&lib, &link).unwrap();
        }
        dir
    })
    .clone()
}

/// Whether the kernels can be compiled; if not, says why and the caller skips.
fn nvrtc(test: &str) -> bool {
    let ok = kernels::cuda::compile::nvrtc_available();
    if !ok {
        eprintln!("SKIP {test}: no NVRTC library to compile the kernels (eval \"$(.ci/install-nvrtc.sh)\")");
    }
    ok
}

/// `command` with the stand-in in place of the CUDA libraries, `gpus` stand-in GPUs.
fn on_standin(mut command: Command, gpus: usize) -> Command {
    let libs = standin_libs();
    let path = std::env::var("LD_LIBRARY_PATH")
        .map_or(libs.display().to_string(), |p| format!("{}:{p}", libs.display()));
    command.env("LD_LIBRARY_PATH", path).env("CUDA_STANDIN_GPUS", gpus.to_string());
    command
}

/// `config` (a shipped config's text) at a micro batch of 2 and a vocabulary of 96 on
/// synthetic tokens, so a step of the emulated kernels takes a second or two: every kernel
/// the step launches still runs. GPT-2's vocabulary would spend most of these tests'
/// minutes in the emulated classifier, which `cuda_ops.rs` and `bench gpu` (below) check at
/// that size.
fn on_small_batches(dir: &Path, config: &str) -> String {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(config)).unwrap();
    let data = synthetic_data(dir).display().to_string();
    let edits = [
        ("micro_batch_size: 16", "micro_batch_size: 2"),
        ("global_batch_size: 16", "global_batch_size: 4"),
        ("vocab_size: 50257", "vocab_size: 96"),
        ("data/corpus/train.bin", &data),
        ("data/corpus/val.bin", &data),
    ];
    edits.iter().fold(text, |text, (from, to)| {
        assert!(text.contains(from), "{config} has no {from:?}");
        text.replace(from, to)
    })
}

/// configs/tiny.yaml [`on_small_batches`].
fn tiny(dir: &Path) -> PathBuf {
    write_config(dir, "tiny.yaml", &on_small_batches(dir, "configs/tiny.yaml"))
}

/// configs/tiny.yaml at a micro batch of 2 with GPT-2's vocabulary and the corpus: where a
/// test compares peaks with the memory model's, whose small terms a vocabulary of 96 would
/// make the peak's larger part.
fn tiny_at_gpt2_vocabulary(dir: &Path) -> PathBuf {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/tiny.yaml")).unwrap();
    let text = text
        .replace("micro_batch_size: 16", "micro_batch_size: 2")
        .replace("global_batch_size: 16", "global_batch_size: 4");
    assert!(text.contains("micro_batch_size: 2") && text.contains("global_batch_size: 4"), "{text}");
    write_config(dir, "tiny-gpt2-vocabulary.yaml", &text)
}

const STEPS: [&str; 8] =
    ["--train-iters", "3", "--eval-interval", "0", "--save-interval", "0", "--peak-flops", "1e12"];

/// Trains `cfg` into `dir/name` on the stand-in (or the CPU with `--device cpu` in
/// `extra`), panicking unless the run succeeds.
fn run(cfg: &Path, dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let run_dir = dir.join(name);
    let mut command = on_standin(bin(), 2);
    command
        .args(["train", "--quiet", "--config"])
        .arg(cfg)
        .arg("--run-dir")
        .arg(&run_dir)
        .args(STEPS)
        .args(extra);
    let out = command.output().unwrap();
    assert!(out.status.success(), "{name}: {}", stderr(&out));
    run_dir
}

fn loss_values(run_dir: &Path) -> Vec<f64> {
    losses(run_dir).iter().map(|l| f64::from_bits(l.1)).collect()
}

fn assert_within(what: &str, a: &[f64], b: &[f64], rtol: f64) {
    assert_eq!(a.len(), b.len(), "{what}: step counts");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= rtol * x.abs(), "{what}: {x} vs {y} (rtol {rtol})");
    }
}

/// `cfg` with `extra` flags trains on the stand-in's fp32 path within 1e-5 of the CPU.
fn assert_cuda_is_the_cpu(cfg: &Path, dir: &Path, extra: &[&str]) {
    let cpu = run(cfg, dir, "cpu", &[extra, &["--device", "cpu"]].concat());
    let gpu = run(cfg, dir, "gpu", &[extra, &["--device", "cuda"]].concat());
    assert_within("cpu vs stand-in", &loss_values(&cpu), &loss_values(&gpu), 1e-5);
}

#[test]
fn fp32_on_the_standin_is_the_cpu_within_1e_5() {
    if !nvrtc("fp32_on_the_standin_is_the_cpu_within_1e_5") {
        return;
    }
    let dir = temp_dir("standin-fp32");
    let cfg = tiny(&dir);
    assert_cuda_is_the_cpu(&cfg, &dir, &[]);
}

/// RMSNorm, at Llama 2's epsilon rather than LayerNorm's 1e-5, in a GPT-2 otherwise: the
/// epsilon reaches the CUDA kernels.
#[test]
fn rmsnorm_on_the_standin_is_the_cpu_within_1e_5() {
    if !nvrtc("rmsnorm_on_the_standin_is_the_cpu_within_1e_5") {
        return;
    }
    let dir = temp_dir("standin-rmsnorm");
    let text =
        std::fs::read_to_string(tiny(&dir)).unwrap() + "normalization: RMSNorm\nnorm_epsilon: 1.0e-6\n";
    let cfg = write_config(&dir, "rmsnorm.yaml", &text);
    assert_cuda_is_the_cpu(&cfg, &dir, &[]);
}

/// bf16 is fp32 within 2e-2 and the same bits run to run. With `bias_gelu_fusion` off, the
/// bias add and GELU's backward round once more each: other bits, as near fp32.
#[test]
fn bf16_on_the_standin_is_fp32_within_2e_2_and_bitwise_run_to_run() {
    if !nvrtc("bf16_on_the_standin_is_fp32_within_2e_2_and_bitwise_run_to_run") {
        return;
    }
    let dir = temp_dir("standin-bf16");
    let cfg = tiny(&dir);
    let fp32 = run(&cfg, &dir, "fp32", &["--device", "cuda"]);
    let a = run(&cfg, &dir, "bf16-a", &["--device", "cuda", "--precision", "bf16"]);
    let b = run(&cfg, &dir, "bf16-b", &["--device", "cuda", "--precision", "bf16"]);
    assert_eq!(losses(&a), losses(&b), "bf16 run to run");
    assert_within("fp32 vs bf16", &loss_values(&fp32), &loss_values(&a), 2e-2);
    let unfused = ["--device", "cuda", "--precision", "bf16", "--bias-gelu-fusion", "false"];
    let unfused = run(&cfg, &dir, "bf16-unfused", &unfused);
    assert_ne!(losses(&unfused), losses(&a), "bias_gelu_fusion: false rounds the bias and the GELU apart");
    assert_within("fp32 vs bf16 unfused", &loss_values(&fp32), &loss_values(&unfused), 2e-2);
}

/// The distributed optimizer under bf16 on the stand-in, dp = 2 over two GPUs: each replica
/// keeps only its part of every block matrix's fp32 master beside the whole bf16 copy, with
/// the losses bitwise the unsharded run's, in threads and over NCCL (whose gather
/// broadcasts the parts' bf16 copies on the GPUs); its parameters' bytes fall by exactly
/// the masters' saving the memory model predicts. A checkpoint it saves (the parts
/// gathered) resumes without sharding bit for bit.
#[test]
fn bf16_masters_shard_with_the_distributed_optimizer_and_keep_the_bits() {
    if !nvrtc("bf16_masters_shard_with_the_distributed_optimizer_and_keep_the_bits") {
        return;
    }
    let dir = temp_dir("standin-bf16-zero1");
    let cfg = tiny(&dir);
    let dp2 = ["--device", "cuda", "--precision", "bf16", "--data-parallel-size", "2"];
    let sharded = [&dp2[..], &["--use-distributed-optimizer", "true"]].concat();
    let whole_run = run(&cfg, &dir, "whole", &dp2);
    let sharded_run = run(&cfg, &dir, "sharded", &sharded);
    assert_eq!(losses(&sharded_run), losses(&whole_run), "bf16 with the distributed optimizer");
    let ranks = |run: &Path| {
        let mut ranks: Vec<[u64; 4]> = (report(run)["stages"].as_array().unwrap().iter())
            .map(|r| {
                let at = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
                let category = |k: &str| r["peak_bytes_by_category"][k].as_u64().unwrap();
                [
                    at("replica"),
                    category("parameters"),
                    category("optimizerstate"),
                    at("predicted_peak_bytes"),
                ]
            })
            .collect();
        ranks.sort();
        ranks
    };
    for (whole, sharded) in ranks(&whole_run).into_iter().zip(ranks(&sharded_run)) {
        let [replica, parameters, moments, predicted] = whole;
        let [_, sharded_parameters, sharded_moments, sharded_predicted] = sharded;
        let masters_saved = (predicted - sharded_predicted) - (moments - sharded_moments);
        assert!(masters_saved > 0 && sharded_moments < moments, "replica {replica}");
        assert_eq!(parameters - sharded_parameters, masters_saved, "replica {replica}: the masters' saving");
    }
    let cuda = ["--train-iters", "4", "--lr-decay-iters", "4"];
    let full = run(&cfg, &dir, "full", &[&dp2[..], &cuda].concat());
    let first = ["--train-iters", "2", "--lr-decay-iters", "4"];
    run(&cfg, &dir, "split", &[&sharded[..], &first].concat());
    let resumed = run(&cfg, &dir, "split", &[&dp2[..], &cuda, &["--resume"]].concat());
    let train_only = |v: Vec<(u64, u64, Option<u64>)>| v.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>();
    assert_eq!(train_only(losses(&resumed)), train_only(losses(&full)), "resumed without sharding");
    let Some(nccl) = run_mpi(2, &cfg, &dir, "nccl-sharded", &sharded) else { return };
    assert_eq!(losses(&nccl), losses(&whole_run), "bf16 with the distributed optimizer over NCCL");
}

/// GPT-2 without linear biases and with an untied output layer (two of the Llama family's
/// flags): the matmuls without their bias kernels, the head's own weight and its gradient.
#[test]
fn no_biases_and_an_untied_head_on_the_standin_are_the_cpu_within_1e_5() {
    if !nvrtc("no_biases_and_an_untied_head_on_the_standin_are_the_cpu_within_1e_5") {
        return;
    }
    let dir = temp_dir("standin-untied");
    let cfg = tiny(&dir);
    let flags = ["--disable-bias-linear", "true", "--untie-embeddings-and-output-weights", "true"];
    assert_cuda_is_the_cpu(&cfg, &dir, &flags);
}

/// configs/llama-tiny.yaml [`on_small_batches`], with `edits` to its text.
fn llama_tiny(dir: &Path, edits: &[(&str, &str)]) -> PathBuf {
    let text = on_small_batches(dir, "configs/llama-tiny.yaml");
    let text = edits.iter().fold(text, |text, (from, to)| {
        assert!(text.contains(from), "llama-tiny.yaml has no {from:?}");
        text.replace(from, to)
    });
    write_config(dir, "llama.yaml", &text)
}

/// The Llama family (RMSNorm, rotary positions, SwiGLU, grouped-query attention with 2 query
/// heads a key/value head, no biases, an untied output layer): configs/llama-tiny.yaml, on
/// the stand-in as on the CPU. Its heads of 16 run the fused attention kernels.
#[test]
fn the_llama_family_on_the_standin_is_the_cpu_within_1e_5() {
    if !nvrtc("the_llama_family_on_the_standin_is_the_cpu_within_1e_5") {
        return;
    }
    let dir = temp_dir("standin-llama");
    assert_cuda_is_the_cpu(&llama_tiny(&dir, &[]), &dir, &[]);
}

/// Qwen2: llama-tiny.yaml with biases on q, k and v alone, the bias in the fused projection's
/// cuBLASLt epilogue under Linear's [out, in] layout, on the stand-in as on the CPU.
#[test]
fn qwen2s_biases_on_q_k_and_v_on_the_standin_are_the_cpu_within_1e_5() {
    if !nvrtc("qwen2s_biases_on_q_k_and_v_on_the_standin_are_the_cpu_within_1e_5") {
        return;
    }
    let dir = temp_dir("standin-qwen2");
    let qkv_bias = [("disable_bias_linear: true", "disable_bias_linear: true\nadd_qkv_bias: true")];
    assert_cuda_is_the_cpu(&llama_tiny(&dir, &qkv_bias), &dir, &[]);
}

/// Qwen3: llama-tiny.yaml with QK-norm, the per-head RMSNorm of q and k in place on the
/// fused projection's output before rope, on the stand-in as on the CPU.
#[test]
fn qwen3s_qk_norm_on_the_standin_is_the_cpu_within_1e_5() {
    if !nvrtc("qwen3s_qk_norm_on_the_standin_is_the_cpu_within_1e_5") {
        return;
    }
    let dir = temp_dir("standin-qwen3");
    let qk_norm = [("disable_bias_linear: true", "disable_bias_linear: true\nqk_layernorm: true")];
    assert_cuda_is_the_cpu(&llama_tiny(&dir, &qk_norm), &dir, &[]);
}

/// Nemotron: llama-tiny.yaml with zero-centred LayerNorms (the kernels scale by a shifted
/// weight), squared ReLU and rope on half of each head, on the stand-in as on the CPU.
#[test]
fn nemotron_on_the_standin_is_the_cpu_within_1e_5() {
    if !nvrtc("nemotron_on_the_standin_is_the_cpu_within_1e_5") {
        return;
    }
    let dir = temp_dir("standin-nemotron");
    let nemotron = [
        ("normalization: RMSNorm", "normalization: LayerNorm\napply_layernorm_1p: true"),
        ("swiglu: true", "squared_relu: true"),
        ("rotary_base: 10000", "rotary_base: 10000\nrotary_percent: 0.5"),
    ];
    assert_cuda_is_the_cpu(&llama_tiny(&dir, &nemotron), &dir, &[]);
}

/// Gemma: llama-tiny.yaml with zero-centred RMSNorms, GeGLU and its embeddings multiplied
/// by sqrt(64), on the stand-in as on the CPU.
#[test]
fn gemma_on_the_standin_is_the_cpu_within_1e_5() {
    if !nvrtc("gemma_on_the_standin_is_the_cpu_within_1e_5") {
        return;
    }
    let dir = temp_dir("standin-gemma");
    let gemma = [
        ("normalization: RMSNorm", "normalization: RMSNorm\napply_layernorm_1p: true"),
        ("swiglu: true", "geglu: true\nembedding_multiplier: 8"),
    ];
    assert_cuda_is_the_cpu(&llama_tiny(&dir, &gemma), &dir, &[]);
}

/// OLMo 2: llama-tiny.yaml with its norms on the attention's and MLP's outputs and QK-norm
/// over the whole projections (one query row and one key row a token), as many key/value
/// heads as query heads, on the stand-in as on the CPU.
#[test]
fn olmo2_on_the_standin_is_the_cpu_within_1e_5() {
    if !nvrtc("olmo2_on_the_standin_is_the_cpu_within_1e_5") {
        return;
    }
    let dir = temp_dir("standin-olmo2");
    let olmo2 = [
        (
            "disable_bias_linear: true",
            "disable_bias_linear: true\nqk_layernorm: true\nqk_norm_span: projection\nnorm_placement: output",
        ),
        ("num_query_groups: 2", "num_query_groups: 4"),
    ];
    assert_cuda_is_the_cpu(&llama_tiny(&dir, &olmo2), &dir, &[]);
}

/// OLMo 3: OLMo 2 above with a sliding window of 21 keys at 64 positions, every second
/// layer seeing every key: the fused kernels skip the key tiles before the window, as the
/// CPU does. On llama-tiny's 2 key/value heads for 4, as OLMo 3 32B's grouped-query
/// attention, so the query row is twice the key row.
#[test]
fn olmo3_on_the_standin_is_the_cpu_within_1e_5() {
    if !nvrtc("olmo3_on_the_standin_is_the_cpu_within_1e_5") {
        return;
    }
    let dir = temp_dir("standin-olmo3");
    let olmo3 = [(
        "disable_bias_linear: true",
        "disable_bias_linear: true\nqk_layernorm: true\nqk_norm_span: projection\nnorm_placement: output\n\
             window_size: [20, 0]\nwindow_attn_skip_freq: 2",
    )];
    assert_cuda_is_the_cpu(&llama_tiny(&dir, &olmo3), &dir, &[]);
}

/// Tensor parallelism on the stand-in at t = 2, dropout 0.1 on the attention and the
/// residuals, so that every rank draws its part of each layer's masks (its heads' of the
/// attention's, its rows' of the residuals' under sequence parallelism):
/// - OLMo 3's block (QK-norm over the whole projection, its sums over the group; a sliding
///   window; grouped query heads; the untied head's vocabulary-parallel loss) within 1e-5
///   of the CPU's t = 2;
/// - the same bits with sequence parallelism (its all-gathers and row cuts on the device),
///   in threads and over NCCL (two processes on two GPUs), and with full recompute's saved
///   inputs distributed over the group;
/// - in bf16, bitwise run to run, with sequence parallelism too, and within 2e-2 of the CPU;
/// - GPT-2's block (LayerNorm, biases, the tied embedding, learned positions on tensor rank
///   0) at t = 2 x p = 2 within 1e-5 of the CPU.
#[test]
fn tensor_parallelism_on_the_standin_is_the_cpus_and_over_nccl_the_same_bits() {
    if !nvrtc("tensor_parallelism_on_the_standin_is_the_cpus_and_over_nccl_the_same_bits") {
        return;
    }
    let dir = temp_dir("standin-tp");
    let t2 = ["--tensor-model-parallel-size", "2", "--hidden-dropout", "0.1", "--attention-dropout", "0.1"];
    let olmo3 = llama_tiny(
        &dir,
        &[(
            "disable_bias_linear: true",
            "disable_bias_linear: true\nqk_layernorm: true\nqk_norm_span: projection\nnorm_placement: output\n\
             window_size: [20, 0]\nwindow_attn_skip_freq: 2",
        )],
    );
    let cpu = run(&olmo3, &dir, "olmo3-cpu", &[&t2[..], &["--device", "cpu"]].concat());
    let on_gpu = [&t2[..], &["--device", "cuda"]].concat();
    let gpu = run(&olmo3, &dir, "olmo3-gpu", &on_gpu);
    assert_within("t = 2, cpu vs stand-in", &loss_values(&cpu), &loss_values(&gpu), 1e-5);
    let sequence = [&on_gpu[..], &["--sequence-parallel", "true"]].concat();
    let gpu_sequence = run(&olmo3, &dir, "olmo3-gpu-sequence", &sequence);
    assert_eq!(losses(&gpu_sequence), losses(&gpu), "sequence parallelism, threads");
    if let Some(nccl) = run_mpi(2, &olmo3, &dir, "olmo3-nccl-sequence", &sequence) {
        assert_eq!(losses(&nccl), losses(&gpu), "sequence parallelism over NCCL");
    }
    let full =
        ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"];
    let distributed = [&on_gpu[..], &full[..], &["--distribute-saved-activations", "true"]].concat();
    let gpu_distributed = run(&olmo3, &dir, "olmo3-gpu-distributed", &distributed);
    assert_eq!(losses(&gpu_distributed), losses(&gpu), "distributed saved activations");
    assert_bf16_repeats_and_is_near(&cpu, &olmo3, &dir, &t2);
    let bf16_sequence = [&sequence[..], &["--precision", "bf16"]].concat();
    let bf16_sequence = run(&olmo3, &dir, "olmo3-bf16-sequence", &bf16_sequence);
    assert_eq!(losses(&bf16_sequence), losses(&dir.join("bf16-a")), "bf16 with sequence parallelism");
    let gpt2 = tiny(&dir);
    let t2p2 = [&t2[..], &["--pipeline-model-parallel-size", "2"]].concat();
    let cpu = run(&gpt2, &dir, "gpt2-cpu", &[&t2p2[..], &["--device", "cpu"]].concat());
    let gpu = run(&gpt2, &dir, "gpt2-gpu", &[&t2p2[..], &["--device", "cuda"]].concat());
    assert_within("t = 2 x p = 2, cpu vs stand-in", &loss_values(&cpu), &loss_values(&gpu), 1e-5);
}

/// A sliding window of 21 keys at heads of 128: the unfused core (fp32), whose softmax
/// masks the keys before the window, within 1e-5 of the CPU; the tensor-core kernels
/// (bf16), bitwise run to run and within 2e-2.
#[test]
fn a_window_at_heads_of_128_on_the_standin_is_the_cpu_in_fp32_and_near_it_in_bf16() {
    if !nvrtc("a_window_at_heads_of_128_on_the_standin_is_the_cpu_in_fp32_and_near_it_in_bf16") {
        return;
    }
    let dir = temp_dir("standin-window-128");
    let cfg = llama_tiny(&dir, &HEADS_OF_128);
    let window = ["--window-size", "20,0"];
    let cpu = run(&cfg, &dir, "cpu", &[&window[..], &["--device", "cpu"]].concat());
    let fp32 = run(&cfg, &dir, "fp32", &[&window[..], &["--device", "cuda"]].concat());
    assert_within("cpu vs stand-in", &loss_values(&cpu), &loss_values(&fp32), 1e-5);
    assert_bf16_repeats_and_is_near(&cpu, &cfg, &dir, &window);
}

/// `cfg` with `extra` flags in bf16 on the stand-in: the same losses in two runs, each
/// within 2e-2 of the CPU run `cpu` (`bench gpu`'s tolerance: bf16 keeps 8 significant bits).
fn assert_bf16_repeats_and_is_near(cpu: &Path, cfg: &Path, dir: &Path, extra: &[&str]) {
    let bf16 = [extra, &["--device", "cuda", "--precision", "bf16"]].concat();
    let (a, b) = (run(cfg, dir, "bf16-a", &bf16), run(cfg, dir, "bf16-b", &bf16));
    assert_eq!(losses(&a), losses(&b), "bf16 run to run");
    assert_within("cpu fp32 vs stand-in bf16", &loss_values(cpu), &loss_values(&a), 2e-2);
}

/// Heads of 32 at llama-tiny.yaml's width of 64 over 4 heads (Mistral Nemo's shape): the
/// attention's output 128 wide, the output projection [64, 128], on the stand-in as on the CPU.
#[test]
fn heads_wider_than_the_width_over_the_heads_on_the_standin_are_the_cpu_within_1e_5() {
    if !nvrtc("heads_wider_than_the_width_over_the_heads_on_the_standin_are_the_cpu_within_1e_5") {
        return;
    }
    let dir = temp_dir("standin-wide-heads");
    assert_cuda_is_the_cpu(&llama_tiny(&dir, &[]), &dir, &["--kv-channels", "32"]);
}

/// llama-tiny.yaml at Llama's head size of 128: 2 query heads on one key/value head.
const HEADS_OF_128: [(&str, &str); 3] = [
    ("hidden_size: 64", "hidden_size: 256"),
    ("num_attention_heads: 4", "num_attention_heads: 2"),
    ("num_query_groups: 2", "num_query_groups: 1"),
];

/// Heads of 128 in fp32 run the unfused attention core.
#[test]
fn a_llama_with_heads_of_128_on_the_standin_is_the_cpu_within_1e_5() {
    if !nvrtc("a_llama_with_heads_of_128_on_the_standin_is_the_cpu_within_1e_5") {
        return;
    }
    let dir = temp_dir("standin-llama-128");
    assert_cuda_is_the_cpu(&llama_tiny(&dir, &HEADS_OF_128), &dir, &[]);
}

/// Heads of 128 in bf16 run the tensor-core kernels compiled for them: bitwise run to run,
/// and within 2e-2 of the CPU's fp32 loss at every step (`bench gpu`'s tolerance: bf16 keeps
/// 8 significant bits).
#[test]
fn a_bf16_llama_with_heads_of_128_on_the_standin_is_deterministic_and_near_fp32() {
    if !nvrtc("a_bf16_llama_with_heads_of_128_on_the_standin_is_deterministic_and_near_fp32") {
        return;
    }
    let dir = temp_dir("standin-llama-128-bf16");
    let cfg = llama_tiny(&dir, &HEADS_OF_128);
    let cpu = run(&cfg, &dir, "cpu", &["--device", "cpu"]);
    assert_bf16_repeats_and_is_near(&cpu, &cfg, &dir, &[]);
}

/// Two stages in threads share one stand-in GPU, each on its own stream: activations and
/// gradients cross between the streams, ordered only by the device's events.
#[test]
fn two_stages_on_two_streams_of_one_gpu_match_one_stage_bitwise() {
    if !nvrtc("two_stages_on_two_streams_of_one_gpu_match_one_stage_bitwise") {
        return;
    }
    let dir = temp_dir("standin-p2");
    let cfg = tiny(&dir);
    let one = run(&cfg, &dir, "p1", &["--device", "cuda"]);
    let two = run(&cfg, &dir, "p2", &["--device", "cuda", "--pipeline-model-parallel-size", "2"]);
    assert_eq!(losses(&one), losses(&two));
}

#[test]
fn a_resumed_run_on_the_standin_continues_bit_for_bit() {
    if !nvrtc("a_resumed_run_on_the_standin_continues_bit_for_bit") {
        return;
    }
    let dir = temp_dir("standin-resume");
    let cfg = tiny(&dir);
    let cuda = ["--device", "cuda"];
    let full =
        run(&cfg, &dir, "full", &[&cuda[..], &["--train-iters", "4", "--lr-decay-iters", "4"]].concat());
    run(&cfg, &dir, "split", &[&cuda[..], &["--train-iters", "2", "--lr-decay-iters", "4"]].concat());
    let split = run(
        &cfg,
        &dir,
        "split",
        &[&cuda[..], &["--train-iters", "4", "--lr-decay-iters", "4", "--resume"]].concat(),
    );
    let train_only = |v: Vec<(u64, u64, Option<u64>)>| v.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>();
    assert_eq!(train_only(losses(&split)), train_only(losses(&full)));
}

/// A GPU too small for the run: the allocation fails as CUDA's would (after the arena has
/// handed back its cached buffers), and the run ends with one line saying so.
#[test]
fn running_out_of_standin_memory_is_an_error() {
    if !nvrtc("running_out_of_standin_memory_is_an_error") {
        return;
    }
    let dir = temp_dir("standin-oom");
    let cfg = tiny(&dir);
    let mut command = on_standin(bin(), 1);
    command.env("CUDA_STANDIN_MEMORY", "1MiB");
    let out: Output = command
        .args(["train", "--quiet", "--device", "cuda", "--config"])
        .arg(&cfg)
        .arg("--run-dir")
        .arg(dir.join("run"))
        .args(STEPS)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: rank 0: GPU 0 is out of memory: "), "{err}");
    assert!(err.contains("MiB free of 1.0 MiB; lower micro_batch_size"), "{err}");
}

/// `mpirun` of the binary on the stand-in, one stand-in GPU per rank.
fn mpirun(np: usize) -> Option<Command> {
    if !mpi_available() {
        return None;
    }
    let mut c = Command::new("mpirun");
    c.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            "--oversubscribe",
            "--mca",
            "mpi_yield_when_idle",
            "1",
            "-x",
            "LD_LIBRARY_PATH",
            "-x",
            "CUDA_STANDIN_GPUS",
        ])
        .args(["-np", &np.to_string()])
        .arg(env!("CARGO_BIN_EXE_pipetrain"));
    Some(on_standin(c, np))
}

fn run_mpi(np: usize, cfg: &Path, dir: &Path, name: &str, extra: &[&str]) -> Option<PathBuf> {
    let mut command = mpirun(np)?;
    let run_dir = dir.join(name);
    command
        .args(["train", "--quiet", "--config"])
        .arg(cfg)
        .arg("--run-dir")
        .arg(&run_dir)
        .args(STEPS)
        .args(extra);
    let out = command.output().unwrap();
    assert!(out.status.success(), "{name}: {}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    Some(run_dir)
}

/// Two ranks in two processes, each with its own stand-in GPU, activations and gradients
/// crossing over NCCL: bitwise the two-stream run of one GPU, under 1F1B and under ZB-V
/// (whose V placement keeps both ends of the model, and the tied embedding, on rank 0).
#[test]
fn two_stages_over_nccl_match_two_streams_of_one_gpu_bitwise() {
    if !nvrtc("two_stages_over_nccl_match_two_streams_of_one_gpu_bitwise") {
        return;
    }
    let dir = temp_dir("standin-nccl-p2");
    let cfg = tiny(&dir);
    for schedule in ["1f1b", "zb-v"] {
        let p2 = ["--device", "cuda", "--pipeline-model-parallel-size", "2", "--pipeline-schedule", schedule];
        let Some(nccl) = run_mpi(2, &cfg, &dir, &format!("nccl-{schedule}"), &p2) else { return };
        let threads = run(&cfg, &dir, &format!("threads-{schedule}"), &p2);
        assert_eq!(losses(&nccl), losses(&threads), "{schedule}");
    }
}

/// dp = 2 x p = 2: four processes, four stand-in GPUs, the gradients summed over NCCL,
/// in bitwise the threads run's losses and at the memory model's peaks; with the
/// distributed optimizer, the same losses.
#[test]
fn data_and_pipeline_parallel_over_nccl_match_threads_bitwise() {
    if !nvrtc("data_and_pipeline_parallel_over_nccl_match_threads_bitwise") {
        return;
    }
    let dir = temp_dir("standin-nccl-dp2p2");
    let cfg = tiny_at_gpt2_vocabulary(&dir);
    let dp2p2 = ["--device", "cuda", "--pipeline-model-parallel-size", "2", "--data-parallel-size", "2"];
    let Some(nccl) = run_mpi(4, &cfg, &dir, "nccl", &dp2p2) else { return };
    let threads = run(&cfg, &dir, "threads", &dp2p2);
    assert_eq!(losses(&nccl), losses(&threads));
    // The distributed optimizer over NCCL: the all-reduce's sum, each replica's part stepped
    // on its GPU, the parts gathered: the same bits.
    let sharded = [&dp2p2[..], &["--use-distributed-optimizer", "true"]].concat();
    let nccl_sharded = run_mpi(4, &cfg, &dir, "nccl-sharded", &sharded).expect("mpirun ran above");
    assert_eq!(losses(&nccl_sharded), losses(&threads), "the distributed optimizer over NCCL");
    // The sum over NCCL holds no more than the memory model counts: each rank's peak is
    // its prediction, as under threads.
    for stage in report(&nccl)["stages"].as_array().unwrap() {
        let (peak, predicted) =
            (stage["peak_bytes"].as_f64().unwrap(), stage["predicted_peak_bytes"].as_f64().unwrap());
        assert!(
            (peak / predicted - 1.0).abs() < 1e-3,
            "rank {}: peak {peak} vs predicted {predicted}",
            stage["rank"]
        );
    }
}

/// Activation offload on the stand-in: every module's tensors to page-locked host memory and
/// back on each device's copy stream, at p = 2 in threads (two devices sharing a GPU, with
/// cudarc's per-buffer events) and over NCCL (each rank its GPU's sole device, ordered by
/// offload.rs's events alone). The losses are bitwise the run's without offload; each
/// stage's host peak is the predicted one, and its device activation peak drops by the
/// predicted bytes. Under bf16 the same holds, the host keeping bf16 tensors at 2 bytes.
#[test]
fn offload_on_the_standin_keeps_the_bits_and_moves_the_predicted_bytes() {
    if !nvrtc("offload_on_the_standin_keeps_the_bits_and_moves_the_predicted_bytes") {
        return;
    }
    let dir = temp_dir("standin-offload");
    let cfg = tiny(&dir);
    let p2 = ["--device", "cuda", "--pipeline-model-parallel-size", "2"];
    let every_module = "attn_norm,qkv_linear,core_attn,attn_proj,mlp_norm,mlp_fc1,mlp_act,mlp_fc2";
    let offload =
        [&p2[..], &["--fine-grained-activation-offloading", "true", "--offload-modules", every_module]]
            .concat();
    let without = run(&cfg, &dir, "without", &p2);
    let threads = run(&cfg, &dir, "threads", &offload);
    assert_eq!(losses(&threads), losses(&without), "offload in threads");
    let stages = |run: &Path| report(run)["stages"].as_array().unwrap().clone();
    let at = |s: &serde_json::Value, key: &str| s[key].as_u64().unwrap_or_else(|| panic!("{key} in {s}"));
    let activations = |s: &serde_json::Value| s["peak_bytes_by_category"]["activations"].as_u64().unwrap();
    for (with, before) in stages(&threads).iter().zip(stages(&without)) {
        assert!(at(with, "host_peak_bytes") > 0, "{with}");
        assert_eq!(at(with, "host_peak_bytes"), at(with, "predicted_host_peak_bytes"), "{with}");
        assert_eq!(
            activations(&before) - activations(with),
            at(&before, "predicted_activation_peak_bytes") - at(with, "predicted_activation_peak_bytes"),
            "{with}"
        );
    }
    // bf16 activations go to the host as bf16, 2 bytes an element.
    let bf16 = ["--precision", "bf16"];
    let bf16_without = run(&cfg, &dir, "bf16-without", &[&p2[..], &bf16].concat());
    let bf16_with = run(&cfg, &dir, "bf16-threads", &[&offload[..], &bf16].concat());
    assert_eq!(losses(&bf16_with), losses(&bf16_without), "bf16 offload in threads");
    for (fp32, half) in stages(&threads).iter().zip(stages(&bf16_with)) {
        assert!(at(&half, "host_peak_bytes") < at(fp32, "host_peak_bytes"), "{half}");
        assert_eq!(at(&half, "host_peak_bytes"), at(&half, "predicted_host_peak_bytes"), "{half}");
    }
    let Some(nccl) = run_mpi(2, &cfg, &dir, "nccl", &offload) else { return };
    assert_eq!(losses(&nccl), losses(&without), "offload over NCCL");
}

/// A replica that stops answering, as a hung process or a partitioned host does, while its
/// peer's gradient sum waits for it on the GPU: NCCL's transfers are the streams', never the
/// host's, so the peer's read of the step would wait forever. It waits up to the distributed
/// timeout, names the ranks its communicators wait on, and ends the job, the checkpoint
/// before the step whole. The timeout bounds the device's queued work, the emulated kernels'
/// seconds included, so here it is 0.25 min (15 s).
#[test]
fn a_replica_that_stops_answering_over_nccl_ends_the_job_at_the_timeout() {
    if !nvrtc("a_replica_that_stops_answering_over_nccl_ends_the_job_at_the_timeout") {
        return;
    }
    let dir = temp_dir("standin-nccl-stall");
    let cfg = tiny(&dir);
    let Some(mut mpirun) = mpirun(2) else { return };
    let child = mpirun
        .env("PIPETRAIN_INJECT_FAULT", "1:3:stall")
        .args(["train", "--quiet", "--config"])
        .arg(&cfg)
        .arg("--run-dir")
        .arg(dir.join("run"))
        .args([
            "--device",
            "cuda",
            "--data-parallel-size",
            "2",
            "--train-iters",
            "50",
            "--eval-interval",
            "0",
        ])
        .args(["--save-interval", "2", "--distributed-timeout-minutes", "0.25", "--peak-flops", "1e12"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (out, took) = wait_with_deadline(child, Duration::from_secs(120));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = "error: rank 0: step 3: the GPU's queued work, NCCL transfers with rank 1 (stage 0, replica \
                1) included, did not complete within 15 s (distributed_timeout_minutes)";
    assert!(err.lines().any(|l| l == line), "{err}");
    assert!(took >= Duration::from_secs(15), "ended after {took:?}, before the timeout");
    assert_eq!(latest(&dir.join("run")), "step_000002");
}

/// The names of the symbols an ELF64 (little-endian) file defines, from its symbol table:
/// what the linker kept, unlike the debug information, which keeps every name compiled.
fn defined_symbols(elf: &[u8]) -> Vec<&[u8]> {
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    assert_eq!(&elf[..5], b"\x7fELF\x02", "a 64-bit ELF file");
    let (sections, entry, count) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let header = |i: usize| sections + i * entry;
    let symtab = (0..count).map(header).find(|&h| u32_at(h + 4) == 2).expect("a symbol table (SHT_SYMTAB)");
    let strtab = u64_at(header(u32_at(symtab + 0x28)) + 0x18);
    let (offset, size) = (u64_at(symtab + 0x18), u64_at(symtab + 0x20));
    (offset..offset + size)
        .step_by(24)
        .filter(|&sym| u16_at(sym + 6) != 0) // defined in some section
        .map(|sym| {
            let name = &elf[strtab + u32_at(sym)..];
            &name[..name.iter().position(|&b| b == 0).unwrap()]
        })
        .collect()
}

/// The CUDA library functions the binary can call. cudarc's bindings load each function
/// on first call into a static `_S` inside the function's wrapper; the linker keeps the
/// statics of the wrappers something calls, and the symbol table names each one
/// (`cudarc::driver::sys::cuInit::_S`, mangled), so those names are the list.
fn cuda_functions_the_binary_calls(binary: &[u8]) -> Vec<String> {
    // One length-prefixed component of a mangled path, and the rest.
    fn component(s: &[u8]) -> Option<(&[u8], &[u8])> {
        let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
        let len: usize = std::str::from_utf8(&s[..digits]).ok()?.parse().ok()?;
        let rest = &s[digits..];
        (rest.len() >= len).then(|| rest.split_at(len))
    }
    let mut names = std::collections::BTreeSet::new();
    for symbol in defined_symbols(binary) {
        let Some(path) = symbol.strip_prefix(b"_ZN6cudarc") else { continue };
        let Some((library, rest)) = component(path) else { continue };
        let Some((sys, rest)) = component(rest) else { continue };
        let Some((function, rest)) = component(rest) else { continue };
        let is_binding = [&b"driver"[..], b"cublas", b"nccl"].contains(&library) && sys == b"sys";
        if is_binding && rest.starts_with(b"2_S") {
            names.insert(String::from_utf8_lossy(function).into_owned());
        }
    }
    names.into_iter().collect()
}

#[test]
fn the_standin_exports_every_cuda_function_the_binary_calls() {
    let binary = std::fs::read(env!("CARGO_BIN_EXE_pipetrain")).unwrap();
    let called = cuda_functions_the_binary_calls(&binary);
    assert!(called.iter().any(|n| n == "cuLaunchKernel"), "the scan found the kernel launch: {called:?}");
    assert!(called.iter().any(|n| n == "cublasSgemm_v2"), "the scan found cuBLAS: {called:?}");
    let lib = std::ffi::CString::new(standin_library().display().to_string()).unwrap();
    standin_libs(); // says how to build the library if it is missing
                    // SAFETY: loading the stand-in runs no initialiser that needs anything.
    let handle = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "the stand-in loads");
    let missing: Vec<&String> = called
        .iter()
        .filter(|name| {
            let symbol = std::ffi::CString::new(name.as_str()).unwrap();
            // SAFETY: a lookup by a NUL-terminated name in a loaded library.
            unsafe { libc::dlsym(handle, symbol.as_ptr()) }.is_null()
        })
        .collect();
    assert!(missing.is_empty(), "the binary calls functions the stand-in lacks: {missing:?}");
}

/// `pipetrain bench WHAT` of the small config on one stand-in GPU, with `extra` flags: its
/// table, after checking that it succeeded and that its title names the stand-in.
fn bench_on_the_standin(what: &str, extra: &[&str]) -> String {
    let dir = temp_dir(&format!("standin-bench-{what}"));
    let cfg = write_config(&dir, "c.yaml", SMALL);
    let out =
        on_standin(bin(), 1).args(["bench", what]).args(extra).arg("--config").arg(&cfg).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{table}{}", stderr(&out));
    let title = format!("pipetrain bench {what}: cuda:0 ({}, sm_90)\n", kernels::STANDIN_GPU_NAME);
    assert!(table.starts_with(&title), "{table}");
    table
}

/// `bench attention` times the bf16 attention core alone on the stand-in: a forward and a
/// backward row for each of the stand-in's shapes and for the config's own (B = 2, T = 32,
/// 4 heads of 16, under its window of 8 keys), in milliseconds of the emulator's CPU time.
#[test]
fn bench_attention_times_each_case_on_the_standin() {
    if !nvrtc("bench_attention_times_each_case_on_the_standin") {
        return;
    }
    let table = bench_on_the_standin("attention", &["--window-size", "7,0"]);
    let rows: Vec<&str> = table.lines().skip(2).collect();
    let checks: Vec<&str> = rows.iter().map(|r| r.split("  ").next().unwrap()).collect();
    let pair =
        |hs| [format!("attention forward, head size {hs}"), format!("attention backward, head size {hs}")];
    assert_eq!(checks, [pair(64), pair(128), pair(16)].concat(), "{table}");
    assert!(
        rows[4].contains("B = 2, T = 32, 4 heads over 4 key/value heads of 16, a window of 8 keys"),
        "{table}"
    );
    assert!(rows
        .iter()
        .all(|r| r.contains(" ms ") && r.contains("the stand-in's CPU time under the emulator")));
}

/// `bench gpu` prints its whole table on the stand-in: every op and both loss curves within
/// their tolerances, the attention timings, the memory rows, and the step time marked as
/// the stand-in's.
#[test]
fn bench_gpu_runs_its_table_on_the_standin() {
    if !nvrtc("bench_gpu_runs_its_table_on_the_standin") {
        return;
    }
    let table = bench_on_the_standin("gpu", &["--steps", "2"]);
    let verdict = |check: &str| {
        let line = table
            .lines()
            .find(|l| l.starts_with(check))
            .unwrap_or_else(|| panic!("no row {check}:\n{table}"));
        line.rsplit("  ").next().unwrap().to_string()
    };
    let ops: Vec<&str> = table.lines().filter(|l| l.starts_with("op vs CPU: ")).collect();
    assert!(ops.len() >= 10, "{table}");
    assert!(ops.iter().all(|l| l.ends_with("  ok")), "{table}");
    // The bf16 attention core timed at both head sizes, at the stand-in's shapes.
    for check in ["attention forward, head size 64", "attention backward, head size 128"] {
        let row = table
            .lines()
            .find(|l| l.starts_with(check))
            .unwrap_or_else(|| panic!("no row {check}:\n{table}"));
        assert!(
            row.contains(" ms ") && row.contains("the stand-in's CPU time under the emulator"),
            "{table}"
        );
    }
    assert_eq!(verdict("CUDA fp32 vs CPU loss"), "ok", "{table}");
    assert_eq!(verdict("CUDA bf16 vs fp32 loss"), "ok", "{table}");
    assert!(table.lines().any(|l| l.starts_with("peak memory, bf16, stage 0")), "{table}");
    let step = table.lines().find(|l| l.starts_with("step time, pipetrain")).expect("a step time row");
    assert!(step.contains("the stand-in: CPU time under the SIMT emulator, not a GPU's"), "{table}");
    assert_eq!(verdict("MFU, PyTorch"), "skipped: no GPU to run PyTorch on", "{table}");
}
