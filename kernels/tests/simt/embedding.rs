//! Token + position embedding, forward and backward, as kernels/src/cuda/embedding.rs
//! launches them: bitwise against the CPU, which adds in the same order. The bf16-storage
//! twins likewise, from a dout rounded to bf16: their output is the CPU's rounded, and the
//! f32 table gradients the CPU's bit for bit.

use crate::harness::{bitwise, Arg, Family, Rng, Run, Storage, Tolerance};
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::{per_item, per_pack, per_token, rows_by_token};
use kernels::{Category, Device};

/// Forward and backward at [b, t, c] with a vocabulary of v tokens, the output and dout in
/// `storage` (the tables and their gradients f32); with a position table where `learned`,
/// else with the null one of a model with rotary positions.
fn embedding(
    family: &Family,
    storage: Storage,
    (b, t, c, v): (usize, usize, usize, usize),
    learned: bool,
    seed: u64,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let max_t = t + 3;
    // Every seventh token another tensor-parallel rank's: a zero row, and no gradient.
    let mut tokens = rng.below(b * t, v as u32);
    tokens.iter_mut().step_by(7).for_each(|tok| *tok = kernels::OTHER_SHARD);
    let (wte, wpe, dout) =
        (rng.uniform(v * c, 1.0), rng.uniform(max_t * c, 1.0), storage.round(rng.uniform(b * t * c, 1.0)));
    let (dwte0, dwpe0) = (rng.uniform(v * c, 1.0), rng.uniform(max_t * c, 1.0));
    let (layout, groups) = rows_by_token(&tokens);
    let (n, ti, ci) = (b * t, t as i32, c as i32);

    let mut run = Run::new(seed);
    let (gt, gwte, gwpe, out) =
        (run.buffer(&tokens), run.buffer(&wte), run.buffer(&wpe), storage.output(&mut run, n * c));
    let position_table = if learned { gwpe.into() } else { Arg::Null };
    run.launch(
        storage.kernel("embedding_forward"),
        per_pack(n * c, storage.dtype()),
        &[out.into(), gt.into(), gwte.into(), position_table, (n as u64).into(), ti.into(), ci.into()],
    );
    let (gd, glayout, dwte, dwpe) =
        (storage.buffer(&mut run, &dout), run.buffer(&layout), run.buffer(&dwte0), run.buffer(&dwpe0));
    run.launch(
        storage.kernel("embedding_backward_wte"),
        per_token(groups),
        &[dwte.into(), gd.into(), glayout.into(), (groups as i32).into(), ci.into()],
    );
    if learned {
        run.launch(
            storage.kernel("embedding_backward_wpe"),
            per_item(t * c),
            &[dwpe.into(), gd.into(), (b as i32).into(), ti.into(), ci.into()],
        );
    }
    for buf in [out, dwte, dwpe] {
        run.read(buf);
    }
    let got = family.run(run)?;

    let dev = CpuDevice::new(2);
    let put = |x: &[f32], shape: &[usize]| dev.from_host(x, shape, Category::Workspace);
    let mut tout = dev.zeros(&[b, t, c], Category::Workspace);
    let twpe_table = put(&wpe, &[max_t, c]);
    dev.embedding_forward(&mut tout, &tokens, &put(&wte, &[v, c]), learned.then_some(&twpe_table));
    let (mut twte, mut twpe) = (put(&dwte0, &[v, c]), put(&dwpe0, &[max_t, c]));
    dev.embedding_backward(&mut twte, learned.then_some(&mut twpe), &put(&dout, &[b, t, c]), &tokens);
    let what = |part: &str| format!("{part} in {storage}");
    // One f32 addition, as the CPU's (then bf16's rounding, in bf16).
    storage.check(&what("embedding out"), &storage.read(&got, out), &dev.to_host(&tout), Tolerance::Exact)?;
    bitwise(&what("dwte"), &got.get(dwte), &dev.to_host(&twte))?;
    bitwise(&what("dwpe"), &got.get(dwpe), &dev.to_host(&twpe))
}

#[test]
fn embedding_matches_the_cpu_bit_for_bit_in_f32_and_bf16() {
    let test = "embedding_matches_the_cpu_bit_for_bit_in_f32_and_bf16";
    let Some(family) = Family::of(test, "embedding.cu") else { return };
    for storage in Storage::BOTH {
        // GPT-2 124M in full (B = 4, T = 1024, C = 768, V = 50257), then a vocabulary of 7
        // tokens, so that each token's rows are many, and C not a multiple of the block.
        embedding(&family, storage, (4, 1024, 768, 50257), true, 12).unwrap();
        embedding(&family, storage, (3, 37, 300, 7), true, 13).unwrap();
    }
}

/// Without a position table (rotary positions, the Llama family): a null wpe, the output
/// the token's row bit for bit, no wpe gradient.
#[test]
fn embedding_without_positions_is_the_token_row() {
    let test = "embedding_without_positions_is_the_token_row";
    let Some(family) = Family::of(test, "embedding.cu") else { return };
    for storage in Storage::BOTH {
        // Llama 3 8B's width, 2 of its rows of 1024 tokens, its vocabulary cut to 1000.
        embedding(&family, storage, (2, 64, 4096, 1000), false, 14).unwrap();
        embedding(&family, storage, (3, 37, 300, 7), false, 15).unwrap();
    }
}
