//! The SIMT emulation harness: every kernel of kernels/cuda/ compiled for the host with
//! the emulator of simt.hpp (a fiber per CUDA thread, blocks as launched, real barriers and
//! warp exchanges, shuffled orders from a fixed seed), launched as the CUDA backend launches
//! it at GPT-2 124M's training sizes (B = 4, T = 1024, C = 768, V = 50257), the Llama ops
//! at Llama-3-8B's per-layer sizes, and odd ones,
//! and compared with the CPU backend's op. Where a full-size run would be too slow for CI,
//! the test says which part of the real dimensions it keeps. Each test skips, saying why,
//! where there is no C++ compiler.
#![cfg(feature = "cuda")]

mod attention;
mod barriers;
mod cast;
mod classifier;
mod embedding;
mod emulator;
mod fused_attention;
mod fused_attention_mma;
mod glu;
mod harness;
mod mma;
mod philox;
mod pointwise;
mod residual_norm;
mod rmsnorm;
mod rope;
mod rowwise;

use kernels::cuda::sources::SOURCES;

#[test]
fn every_kernel_is_launched_by_a_test() {
    // Every file of the harness as it is on disk, so a new test file needs no list here.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/simt");
    let tests: String = std::fs::read_dir(dir)
        .expect("the harness's directory")
        .map(|e| e.expect("a readable entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .map(|path| std::fs::read_to_string(path).expect("a readable test file"))
        .collect::<String>()
        .split_whitespace()
        .collect();
    for kernel in SOURCES.iter().flat_map(|s| s.kernels) {
        // Launched by name, or named in a table of the kernels a test launches (a field of a
        // `Fused`; the text has no whitespace here), or, a kernel and its bf16 twin both, by
        // the name a test that runs in every `Storage` gives `Storage::kernel`.
        let by_name = ["launch(", "launch_blocks(", ":"]
            .iter()
            .any(|call| tests.contains(&format!("{call}\"{kernel}\"")));
        let f32_name = kernel.strip_suffix("_bf16").unwrap_or(kernel);
        let by_storage = tests.contains(&format!(".kernel(\"{f32_name}\")"));
        assert!(by_name || by_storage, "no harness test launches {kernel}");
    }
}
