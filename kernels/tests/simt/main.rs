//! The SIMT emulation harness: every kernel of kernels/cuda/ compiled for the host with
//! the emulator of simt.hpp (a fiber per CUDA thread, blocks as launched, real barriers and
//! warp exchanges, shuffled orders from a fixed seed), launched as the CUDA backend launches
//! it at GPT-2 124M's training sizes (B = 4, T = 1024, C = 768, V = 50257) and odd ones,
//! and compared with the CPU backend's op. Where a full-size run would be too slow for CI,
//! the test says which part of the real dimensions it keeps. Each test skips, saying why,
//! where there is no C++ compiler.
#![cfg(feature = "cuda")]

mod attention;
mod barriers;
mod cast;
mod embedding;
mod harness;
mod philox;
mod pointwise;
mod rowwise;
