//! CUDA code that is plain C++ apart from a few built-ins, compiled for the host with
//! those built-ins defined and checked against the Rust definitions, since it cannot run
//! as CUDA without a GPU: philox.cuh (the dropout masks, word for word against
//! kernels/src/philox.rs) and cast.cu (bf16 rounding, bit for bit against the `half`
//! crate). Kernels run as a serial loop over their threads. Each test skips, saying so,
//! where there is no C++ compiler (`c++`, or $CXX); the GPU tests in cuda_ops.rs cover the
//! real thing.
#![cfg(feature = "cuda")]

use kernels::philox::{block_words, counter_base, drop_threshold, key_words};
use kernels::{DropoutKey, DropoutSite};
use std::io::Write;
use std::process::{Command, Stdio};

/// The CUDA built-ins the code uses, for the host; a kernel becomes a plain function of
/// the thread indices below.
const SHIM: &str = r#"
#include <cstdio>
#include <cstring>
#define __device__
#define __global__
#define __forceinline__ inline
struct uint4 { unsigned int x, y, z, w; };
struct uint2 { unsigned int x, y; };
struct dim3 { unsigned int x, y, z; };
static dim3 threadIdx, blockIdx, blockDim;
static uint4 make_uint4(unsigned int a, unsigned int b, unsigned int c, unsigned int d) { return {a, b, c, d}; }
static uint2 make_uint2(unsigned int a, unsigned int b) { return {a, b}; }
static unsigned int __umulhi(unsigned int a, unsigned int b) {
    return (unsigned int)(((unsigned long long)a * b) >> 32);
}
static unsigned int __float_as_uint(float x) { unsigned int u; std::memcpy(&u, &x, 4); return u; }
static float __uint_as_float(unsigned int u) { float x; std::memcpy(&x, &u, 4); return x; }
"#;

/// Builds `code` (after the shim) with the host C++ compiler, runs it on `input` and
/// returns its output, or None (having said why) where there is no compiler.
fn run_on_host(test: &str, code: &str, input: &str) -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let dir = std::env::temp_dir().join(format!("pipetrain-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let (src, exe) = (dir.join("main.cpp"), dir.join("main"));
    std::fs::write(&src, format!("{SHIM}\n{code}")).expect("write the C++ source");
    let built = match Command::new(&cxx).arg("-O1").arg("-o").arg(&exe).arg(&src).output() {
        Ok(out) => out,
        Err(e) => {
            eprintln!("SKIP {test}: no C++ compiler ({cxx}): {e}");
            return None;
        }
    };
    assert!(built.status.success(), "{cxx} failed:\n{}", String::from_utf8_lossy(&built.stderr));
    let mut child = Command::new(&exe).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("run it");
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write the input");
    let out = child.wait_with_output().expect("its output");
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success(), "the host program failed");
    Some(String::from_utf8(out.stdout).expect("text output"))
}

#[test]
fn philox_cuh_draws_the_rust_masks() {
    // Reads "counter0 counter1 counter2 key0 key1 threshold index" lines; prints the
    // element's random word and whether the mask keeps it, as the dropout kernel does.
    let main = r#"
int main() {
    DropoutMask m;
    unsigned long long index;
    while (scanf("%u %u %u %u %u %llu %llu", &m.counter[0], &m.counter[1], &m.counter[2], &m.key[0],
                 &m.key[1], &m.threshold, &index) == 7) {
        const uint4 words = mask_block_words(m, (unsigned int)(index / 4));
        const unsigned int word = uint4_word(words, (unsigned int)(index % 4));
        printf("%u %d\n", word, mask_keeps(m, word) ? 1 : 0);
    }
}
"#;
    let keys = [
        DropoutKey { seed: 0, step: 0, microbatch: 0, layer: 0, site: DropoutSite::Embedding },
        DropoutKey { seed: 1337, step: 3, microbatch: 1, layer: 2, site: DropoutSite::MlpResidual },
        DropoutKey {
            seed: u64::MAX - 5,
            step: 100_000,
            microbatch: 63,
            layer: 95,
            site: DropoutSite::AttentionProbs,
        },
    ];
    let mut cases = Vec::new();
    for key in keys {
        for p in [0.0f32, 0.1, 0.5, 0.9] {
            for index in (0..64).chain([1_000_003, (1 << 33) + 7]) {
                cases.push((key, p, index));
            }
        }
    }
    let input: String = cases
        .iter()
        .map(|(key, p, index)| {
            let [c0, c1, c2] = counter_base(key);
            let [k0, k1] = key_words(key.seed);
            format!("{c0} {c1} {c2} {k0} {k1} {} {index}\n", drop_threshold(*p))
        })
        .collect();
    let code = format!("{}\n{main}", include_str!("../cuda/philox.cuh"));
    let Some(out) = run_on_host("philox_cuh_draws_the_rust_masks", &code, &input) else { return };
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), cases.len(), "one answer per case");
    for ((key, p, index), line) in cases.iter().zip(lines) {
        let word = block_words(key, (index / 4) as u32)[index % 4];
        let keep = word as u64 >= drop_threshold(*p);
        assert_eq!(line, format!("{word} {}", keep as i32), "{key:?}, p {p}, element {index}");
    }
}

#[test]
fn cast_kernels_round_as_the_half_crate() {
    // Reads f32 bit patterns; runs both cast kernels over them, one "thread" at a time;
    // prints each bf16 and its f32 round trip as bits.
    let main = r#"
int main() {
    static float in[1 << 16], back[1 << 16];
    static unsigned short bf[1 << 16];
    unsigned int bits;
    unsigned long long n = 0;
    while (n < (1 << 16) && scanf("%u", &bits) == 1) in[n++] = __uint_as_float(bits);
    blockDim.x = 256;
    for (blockIdx.x = 0; blockIdx.x * 256 < n; ++blockIdx.x)
        for (threadIdx.x = 0; threadIdx.x < 256; ++threadIdx.x) f32_to_bf16(bf, in, n);
    for (blockIdx.x = 0; blockIdx.x * 256 < n; ++blockIdx.x)
        for (threadIdx.x = 0; threadIdx.x < 256; ++threadIdx.x) bf16_to_f32(back, bf, n);
    for (unsigned long long i = 0; i < n; ++i) printf("%u %u\n", bf[i], __float_as_uint(back[i]));
}
"#;
    // Every exponent with assorted mantissas (ties, just above and below them), the
    // extremes, subnormals, infinities and NaNs of both signs.
    let mut values: Vec<u32> = Vec::new();
    for exponent in 0..256u32 {
        for mantissa in [0, 1, 0x7fff, 0x8000, 0x8001, 0x1_7fff, 0x1_8000, 0x1_8001, 0x7f_ffff, 0x12_3456] {
            for sign in [0, 1u32 << 31] {
                values.push(sign | exponent << 23 | mantissa);
            }
        }
    }
    let input: String = values.iter().map(|v| format!("{v}\n")).collect();
    let code = format!("{}\n{main}", include_str!("../cuda/cast.cu"));
    let Some(out) = run_on_host("cast_kernels_round_as_the_half_crate", &code, &input) else { return };
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), values.len(), "one answer per value");
    for (&v, line) in values.iter().zip(lines) {
        let x = f32::from_bits(v);
        let bf = half::bf16::from_f32(x);
        // NaNs included: both keep the payload's top bits and set the quiet bit.
        assert_eq!(line, format!("{} {}", bf.to_bits(), bf.to_f32().to_bits()), "{x:e} ({v:#x})");
    }
}
