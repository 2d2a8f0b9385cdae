//! The elementwise kernels: residual add and accumulation, GELU, dropout and AdamW.

use crate::harness::{bitwise, close, Family, Rng, Run};
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::per_item;
use kernels::{Category, Device};

/// GPT-2 124M: B * T * C, the residual stream, and B * T * 4C, the MLP's hidden layer.
const RESIDUAL: usize = 4 * 1024 * 768;
const HIDDEN: usize = 4 * RESIDUAL;

fn cpu() -> CpuDevice {
    CpuDevice::new(2)
}

#[test]
fn add_and_accumulate_are_exact() {
    let Some(family) = Family::of("add_and_accumulate_are_exact", "elementwise.cu") else { return };
    let mut rng = Rng::new(1);
    for n in [RESIDUAL, 1001] {
        let (a, b) = (rng.uniform(n, 2.0), rng.uniform(n, 2.0));
        let mut run = Run::new(n as u64);
        let (ga, gb, out) = (run.buffer(&a), run.buffer(&b), run.buffer(&vec![f32::NAN; n]));
        run.launch("add", per_item(n), &[out.into(), ga.into(), gb.into(), (n as u64).into()]);
        run.launch("accumulate", per_item(n), &[ga.into(), out.into(), (n as u64).into()]);
        run.read(out);
        run.read(ga);
        let got = family.run(run).unwrap();
        let dev = cpu();
        let (ta, tb) = (dev.from_host(&a, &[n], Category::Workspace), dev.from_host(&b, &[n], Category::Workspace));
        let mut sum = dev.zeros(&[n], Category::Workspace);
        dev.add(&mut sum, &ta, &tb);
        let mut acc = ta;
        dev.accumulate(&mut acc, &sum);
        bitwise("add", &got.get(out), &dev.to_host(&sum)).unwrap();
        bitwise("accumulate", &got.get(ga), &dev.to_host(&acc)).unwrap();
    }
}
