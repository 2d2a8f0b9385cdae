//! Token + position embedding, forward and backward, as kernels/src/cuda/embedding.rs
//! launches them: bitwise against the CPU, which adds in the same order. The bf16-storage
//! twins likewise, from a dout rounded to bf16: their output is the CPU's rounded, and the
//! f32 table gradients the CPU's bit for bit.

use crate::harness::{bf16_bits, bf16_values, bitwise, rounds_from, Family, Rng, Run};
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::{per_item, per_token, rows_by_token};
use kernels::{Category, Device};

/// Forward and backward at [b, t, c] with a vocabulary of v tokens.
fn embedding(family: &Family, (b, t, c, v): (usize, usize, usize, usize), seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let max_t = t + 3;
    let tokens = rng.below(b * t, v as u32);
    let (wte, wpe, dout) =
        (rng.uniform(v * c, 1.0), rng.uniform(max_t * c, 1.0), rng.uniform(b * t * c, 1.0));
    let (dwte0, dwpe0) = (rng.uniform(v * c, 1.0), rng.uniform(max_t * c, 1.0));
    let (layout, groups) = rows_by_token(&tokens);
    let (n, ti, ci) = (b * t, t as i32, c as i32);

    let mut run = Run::new(seed);
    let (gt, gwte, gwpe, out) =
        (run.buffer(&tokens), run.buffer(&wte), run.buffer(&wpe), run.buffer(&vec![f32::NAN; n * c]));
    run.launch(
        "embedding_forward",
        per_item(n * c),
        &[out.into(), gt.into(), gwte.into(), gwpe.into(), (n as u64).into(), ti.into(), ci.into()],
    );
    let (gd, glayout, dwte, dwpe) =
        (run.buffer(&dout), run.buffer(&layout), run.buffer(&dwte0), run.buffer(&dwpe0));
    run.launch(
        "embedding_backward_wte",
        per_token(groups),
        &[dwte.into(), gd.into(), glayout.into(), (groups as i32).into(), ci.into()],
    );
    run.launch(
        "embedding_backward_wpe",
        per_item(t * c),
        &[dwpe.into(), gd.into(), (b as i32).into(), ti.into(), ci.into()],
    );
    for buf in [out, dwte, dwpe] {
        run.read(buf);
    }
    let got = family.run(run)?;

    let dev = CpuDevice::new(2);
    let put = |x: &[f32], shape: &[usize]| dev.from_host(x, shape, Category::Workspace);
    let mut tout = dev.zeros(&[b, t, c], Category::Workspace);
    dev.embedding_forward(&mut tout, &tokens, &put(&wte, &[v, c]), &put(&wpe, &[max_t, c]));
    let (mut twte, mut twpe) = (put(&dwte0, &[v, c]), put(&dwpe0, &[max_t, c]));
    dev.embedding_backward(&mut twte, &mut twpe, &put(&dout, &[b, t, c]), &tokens);
    bitwise("embedding out", &got.get(out), &dev.to_host(&tout))?;
    bitwise("dwte", &got.get(dwte), &dev.to_host(&twte))?;
    bitwise("dwpe", &got.get(dwpe), &dev.to_host(&twpe))
}

#[test]
fn embedding_matches_the_cpu_bit_for_bit() {
    let Some(family) = Family::of("embedding_matches_the_cpu_bit_for_bit", "embedding.cu") else { return };
    // GPT-2 124M in full (B = 4, T = 1024, C = 768, V = 50257), then a vocabulary of 7
    // tokens, so that each token's rows are many, and C not a multiple of the block.
    embedding(&family, (4, 1024, 768, 50257), 12).unwrap();
    embedding(&family, (3, 37, 300, 7), 13).unwrap();
}

/// `embedding` through the bf16 twins: the output and dout bf16, the tables and their
/// gradients f32.
fn embedding_bf16(
    family: &Family,
    (b, t, c, v): (usize, usize, usize, usize),
    seed: u64,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let max_t = t + 3;
    let tokens = rng.below(b * t, v as u32);
    let (wte, wpe, dout) =
        (rng.uniform(v * c, 1.0), rng.uniform(max_t * c, 1.0), bf16_bits(&rng.uniform(b * t * c, 1.0)));
    let (dwte0, dwpe0) = (rng.uniform(v * c, 1.0), rng.uniform(max_t * c, 1.0));
    let (layout, groups) = rows_by_token(&tokens);
    let (n, ti, ci) = (b * t, t as i32, c as i32);

    let mut run = Run::new(seed);
    let (gt, gwte, gwpe, out) =
        (run.buffer(&tokens), run.buffer(&wte), run.buffer(&wpe), run.buffer(&vec![0xffffu16; n * c]));
    run.launch(
        "embedding_forward_bf16",
        per_item(n * c),
        &[out.into(), gt.into(), gwte.into(), gwpe.into(), (n as u64).into(), ti.into(), ci.into()],
    );
    let (gd, glayout, dwte, dwpe) =
        (run.buffer(&dout), run.buffer(&layout), run.buffer(&dwte0), run.buffer(&dwpe0));
    run.launch(
        "embedding_backward_wte_bf16",
        per_token(groups),
        &[dwte.into(), gd.into(), glayout.into(), (groups as i32).into(), ci.into()],
    );
    run.launch(
        "embedding_backward_wpe_bf16",
        per_item(t * c),
        &[dwpe.into(), gd.into(), (b as i32).into(), ti.into(), ci.into()],
    );
    for buf in [out, dwte, dwpe] {
        run.read(buf);
    }
    let got = family.run(run)?;

    let dev = CpuDevice::new(2);
    let put = |x: &[f32], shape: &[usize]| dev.from_host(x, shape, Category::Workspace);
    let mut tout = dev.zeros(&[b, t, c], Category::Workspace);
    dev.embedding_forward(&mut tout, &tokens, &put(&wte, &[v, c]), &put(&wpe, &[max_t, c]));
    let (mut twte, mut twpe) = (put(&dwte0, &[v, c]), put(&dwpe0, &[max_t, c]));
    dev.embedding_backward(&mut twte, &mut twpe, &put(&bf16_values(&dout), &[b, t, c]), &tokens);
    // One f32 addition, as the CPU's, then the rounding.
    rounds_from("embedding_bf16 out", &got.get(out), &dev.to_host(&tout), 0.0, 0.0)?;
    bitwise("dwte from a bf16 dout", &got.get(dwte), &dev.to_host(&twte))?;
    bitwise("dwpe from a bf16 dout", &got.get(dwpe), &dev.to_host(&twpe))
}

#[test]
fn embedding_bf16_matches_the_cpu() {
    let Some(family) = Family::of("embedding_bf16_matches_the_cpu", "embedding.cu") else { return };
    // The sizes of the f32 test: GPT-2 124M in full, and a vocabulary of 7 with an odd C.
    embedding_bf16(&family, (4, 1024, 768, 50257), 12).unwrap();
    embedding_bf16(&family, (3, 37, 300, 7), 13).unwrap();
}
