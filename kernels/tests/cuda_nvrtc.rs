//! The CUDA kernels, checked without a GPU: every source is listed, the listed kernels are
//! exactly each module's entry points, and NVRTC compiles each file to PTX for the GPU
//! generations we target. Only
//! the NVRTC library is needed (`.ci/install-nvrtc.sh`); without it the compile test skips
//! and says so.
#![cfg(feature = "cuda")]

use kernels::cuda::compile::{compile, nvrtc_available, nvrtc_version};
use kernels::cuda::sources::{KernelSource, HEADERS, SOURCES};
use std::collections::BTreeSet;

/// A100 and H100/H200: PTX as the device loads it (compute_*), and machine code (sm_*),
/// for which NVRTC also runs the assembler that the driver would run at load time.
const ARCHS: [&str; 4] = ["compute_80", "compute_90", "sm_80", "sm_90"];

fn cuda_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda")
}

#[test]
fn every_file_in_the_cuda_directory_is_listed() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(cuda_dir())
        .expect("kernels/cuda exists")
        .map(|e| e.expect("readable entry").file_name().into_string().expect("utf-8 name"))
        .collect();
    let listed: BTreeSet<String> =
        SOURCES.iter().map(|s| s.name).chain(HEADERS.iter().map(|h| h.0)).map(String::from).collect();
    assert_eq!(on_disk, listed, "kernels/cuda and sources.rs disagree");
}

#[test]
fn nvrtc_compiles_every_kernel() {
    if !nvrtc_available() {
        eprintln!("SKIP nvrtc_compiles_every_kernel: libnvrtc not found (run .ci/install-nvrtc.sh)");
        return;
    }
    let (major, minor) = nvrtc_version().expect("NVRTC reports its version");
    eprintln!("NVRTC {major}.{minor}");
    for arch in ARCHS {
        for source in SOURCES {
            let ptx = compile(source, arch).unwrap_or_else(|e| panic!("{e}"));
            // The table the build script read from the declarations is exactly what NVRTC
            // compiled: a kernel declared in a form the build script misses would be absent.
            let entries: BTreeSet<&str> = ptx
                .split(".entry ")
                .skip(1)
                .map(|rest| rest.split('(').next().expect("an entry name").trim())
                .collect();
            let listed: BTreeSet<&str> = source.kernels.iter().copied().collect();
            assert_eq!(entries, listed, "{}: the PTX's entries vs the listed kernels", source.name);
            // Determinism: float atomics would make sums depend on timing. No kernel uses any;
            // the only atomics are the u32 counters by which the chained attention backward's
            // blocks take their tickets and turns (turns.cuh), which order a sum, never add
            // to one.
            let atomics: BTreeSet<&str> = ptx
                .split_whitespace()
                .filter(|op| op.starts_with("atom.") || op.starts_with("red."))
                .collect();
            let counters: BTreeSet<&str> = match source.name {
                "fused_attention_mma.cu" => ["atom.global.add.u32", "red.release.gpu.global.add.u32"].into(),
                _ => BTreeSet::new(),
            };
            assert_eq!(atomics, counters, "{}: the PTX for {arch}'s atomics", source.name);
        }
    }
}

#[test]
fn a_kernel_that_does_not_compile_is_an_error_with_nvrtcs_log() {
    if !nvrtc_available() {
        eprintln!("SKIP a_kernel_that_does_not_compile...: libnvrtc not found (run .ci/install-nvrtc.sh)");
        return;
    }
    let broken = KernelSource {
        name: "broken.cu",
        source: "extern \"C\" __global__ void k(float* x) { x[0] = no_such_name; }\n",
        kernels: &["k"],
    };
    let err = compile(&broken, ARCHS[0]).expect_err("an undefined name must not compile");
    assert!(err.contains("broken.cu") && err.contains("no_such_name"), "{err}");
}

/// The tensor-core attention's PTX for each of ARCHS, compiled once for the tests that read
/// it; None, said for `test`, without NVRTC.
fn attention_ptx(test: &str) -> Option<&'static [(&'static str, String)]> {
    static PTX: std::sync::OnceLock<Vec<(&'static str, String)>> = std::sync::OnceLock::new();
    if !nvrtc_available() {
        eprintln!("SKIP {test}: libnvrtc not found (run .ci/install-nvrtc.sh)");
        return None;
    }
    let source =
        SOURCES.iter().find(|s| s.name == "fused_attention_mma.cu").expect("the tensor-core kernels");
    let compiled = PTX.get_or_init(|| {
        ARCHS.iter().map(|&arch| (arch, compile(source, arch).unwrap_or_else(|e| panic!("{e}")))).collect()
    });
    Some(compiled)
}

#[test]
fn the_bf16_attention_runs_on_tensor_cores_on_every_target() {
    let Some(compiled) = attention_ptx("the_bf16_attention_runs_on_tensor_cores_on_every_target") else {
        return;
    };
    // mma.cuh compiles to a trap below sm_80; every target here is sm_80 or later, so the
    // PTX must hold the instructions themselves and no trap, and no local memory.
    for (arch, ptx) in compiled {
        assert!(ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), "{arch}: no bf16 mma");
        // The B fragments come from shared memory through ldmatrix, straight and transposed,
        // and the exponentials are the one instruction (mma.cuh, fused_attention_mma.cu).
        for instruction in [
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
            "ex2.approx.ftz.f32",
        ] {
            assert!(ptx.contains(instruction), "{arch}: no {instruction}");
        }
        assert!(!ptx.contains("trap;"), "{arch}: the PTX traps");
        // Fragments, accumulators and fetched tiles are register arrays indexed only by
        // constants; one indexed at run time would go to local memory, far slower.
        assert!(!ptx.contains(".local"), "{arch}: the kernels put an array in local memory");
    }
}

/// Between two branches the tensor-core kernels' products come whole: the 32 mma.sync of
/// a tile's product (scores, dP, P'V and the others) or more. A branch between two of them,
/// as the test of the run-time head size inside the products' loop was until 2026-11-27,
/// makes each column tile's products a chain that waits out every product's latency with
/// nothing beside it to overlap (docs/benchmarks.md, "The attention kernels' code").
#[test]
fn the_attention_products_run_with_no_branch_between_them() {
    let Some(compiled) = attention_ptx("the_attention_products_run_with_no_branch_between_them") else {
        return;
    };
    for (arch, ptx) in compiled {
        for entry in ptx.split(".entry ").skip(1) {
            let name = entry.split('(').next().unwrap_or_default();
            if name.starts_with("fused_attention_backward_delta_bf16") {
                continue; // dot products of rows on CUDA cores: no matrix product
            }
            let (mut runs, mut run) = (Vec::new(), 0);
            for line in entry.lines().map(str::trim) {
                if line.starts_with("mma.sync") {
                    run += 1;
                } else if (line.starts_with("bra") || line.contains(" bra")) && run > 0 {
                    runs.push(run);
                    run = 0;
                }
            }
            runs.extend((run > 0).then_some(run));
            assert!(
                !runs.is_empty() && runs.iter().all(|r| r % 32 == 0),
                "{arch} {name}: mma.sync between branches in runs of {runs:?}"
            );
        }
    }
}

/// Whether the PTX `body` holds a 128-bit global load (`op` "ld") or store ("st"), with or
/// without a cache hint: `ld.global.v4.f32`, `st.global.cs.v4.u32`.
fn accesses_128_bits(body: &str, op: &str) -> bool {
    body.lines()
        .filter_map(|line| line.split_whitespace().next())
        .any(|instruction| instruction.starts_with(&format!("{op}.global.")) && instruction.contains(".v4."))
}

#[test]
fn the_elementwise_kernels_move_128_bit_packs() {
    if !nvrtc_available() {
        eprintln!(
            "SKIP the_elementwise_kernels_move_128_bit_packs: libnvrtc not found (run .ci/install-nvrtc.sh)"
        );
        return;
    }
    let families: [(&str, &[&str]); 13] = [
        ("rope.cu", &["rope_forward", "rope_forward_bf16", "rope_backward", "rope_backward_bf16"]),
        ("embedding.cu", &["embedding_forward", "embedding_forward_bf16"]),
        ("dropout.cu", &["dropout_apply", "dropout_apply_bf16", "dropout_apply_inplace"]),
        (
            "elementwise.cu",
            &[
                "add",
                "add_bf16",
                "accumulate",
                "accumulate_bf16",
                "add_scalar",
                "add_scalar_bf16",
                "scale",
                "scale_bf16",
            ],
        ),
        ("classifier.cu", &["fused_classifier", "fused_classifier_bf16"]),
        ("gelu.cu", &["gelu_forward", "gelu_forward_bf16", "gelu_backward", "gelu_backward_bf16"]),
        ("bias.cu", &["bias_add", "bias_add_bf16"]),
        ("adamw.cu", &["adamw"]),
        ("cast.cu", &["f32_to_bf16"]),
        (
            "glu.cu",
            &[
                "swiglu_forward",
                "swiglu_forward_bf16",
                "swiglu_backward",
                "swiglu_backward_bf16",
                "geglu_forward",
                "geglu_forward_bf16",
                "geglu_backward",
                "geglu_backward_bf16",
            ],
        ),
        (
            "squared_relu.cu",
            &[
                "squared_relu_forward",
                "squared_relu_forward_bf16",
                "squared_relu_backward",
                "squared_relu_backward_bf16",
            ],
        ),
        // The norms' row passes, in runs of a pack (warp_row.cuh's load_run and store_run).
        (
            "layernorm.cu",
            &[
                "layernorm_forward",
                "layernorm_forward_bf16",
                "layernorm_residual_forward",
                "layernorm_residual_forward_bf16",
                "layernorm_backward_input",
                "layernorm_backward_input_bf16",
                "layernorm_residual_backward_input",
                "layernorm_residual_backward_input_bf16",
            ],
        ),
        (
            "rmsnorm.cu",
            &[
                "rmsnorm_forward",
                "rmsnorm_forward_bf16",
                "rmsnorm_residual_forward",
                "rmsnorm_residual_forward_bf16",
                "rmsnorm_backward_input",
                "rmsnorm_backward_input_bf16",
                "rmsnorm_residual_backward_input",
                "rmsnorm_residual_backward_input_bf16",
            ],
        ),
    ];
    // The PTX of each family, and of a kernel in it.
    let ptx = |name: &str| {
        let source = SOURCES.iter().find(|s| s.name == name).expect("an elementwise family");
        compile(source, ARCHS[0]).unwrap_or_else(|e| panic!("{e}"))
    };
    let entry = |ptx: &str, kernel: &str| -> String {
        let start = ptx.find(&format!(".entry {kernel}(")).unwrap_or_else(|| panic!("no {kernel}"));
        let body = &ptx[start..];
        body[..body.find("\n}\n").expect("the end of the entry")].to_string()
    };
    for (name, kernels) in families {
        let ptx = ptx(name);
        // Each kernel, fp32 and bf16, loads and stores its whole packs in one access each;
        // the pack, indexed only by unrolled loops, stays in registers.
        for kernel in kernels {
            let body = entry(&ptx, kernel);
            assert!(accesses_128_bits(&body, "ld"), "{name}: {kernel} has no 128-bit load");
            assert!(accesses_128_bits(&body, "st"), "{name}: {kernel} has no 128-bit store");
            assert!(!body.contains(".local"), "{name}: {kernel} puts its pack in local memory");
        }
    }
    // Zeroing loads nothing.
    let zero = entry(&ptx("zero.cu"), "zero_tensors");
    assert!(accesses_128_bits(&zero, "st"), "zero.cu: zero_tensors has no 128-bit store");
    // The gradient norm's first stage stores one sum a block.
    let squares = entry(&ptx("sum_squares.cu"), "sum_squares_chunks");
    assert!(accesses_128_bits(&squares, "ld"), "sum_squares.cu: sum_squares_chunks has no 128-bit load");
}
