//! The f32 -> bf16 cast that refreshes parameters' bf16 copies, bit for bit against the
//! `half` crate's rounding (round to nearest even, NaNs kept quiet), which the host side
//! of bf16 uploads uses.

use crate::harness::{Family, Rng, Run};
use kernels::cuda::launch::per_pack;
use kernels::DType;

#[test]
fn the_cast_rounds_as_the_half_crate() {
    let Some(family) = Family::of("the_cast_rounds_as_the_half_crate", "cast.cu") else { return };
    // Every exponent with assorted mantissas (ties, just above and below them), the
    // extremes, subnormals, infinities and NaNs of both signs; then the MLP's hidden
    // activations' size of GPT-2 124M (B * T * 4C).
    let mut bits: Vec<u32> = Vec::new();
    for exponent in 0..256u32 {
        for mantissa in [0, 1, 0x7fff, 0x8000, 0x8001, 0x1_7fff, 0x1_8000, 0x1_8001, 0x7f_ffff, 0x12_3456] {
            for sign in [0, 1u32 << 31] {
                bits.push(sign | exponent << 23 | mantissa);
            }
        }
    }
    let mut values: Vec<f32> = bits.into_iter().map(f32::from_bits).collect();
    values.extend(Rng::new(18).uniform(4 * 1024 * 3072, 10.0));
    // A last pack of 3: the tail a thread casts element by element.
    values.extend([0.1, -7.0e-39, 3.4e38]);
    let n = values.len();
    let mut run = Run::new(19);
    let (inp, bf) = (run.buffer(&values), run.buffer(&vec![0xffffu16; n]));
    run.launch("f32_to_bf16", per_pack(n, DType::Bf16), &[bf.into(), inp.into(), (n as u64).into()]);
    run.read(bf);
    let got = family.run(run).unwrap();
    let bf = got.get::<u16>(bf);
    for (i, &x) in values.iter().enumerate() {
        // NaNs included: both keep the payload's top bits and set the quiet bit.
        assert_eq!(bf[i], half::bf16::from_f32(x).to_bits(), "{x:e} ({:#x})", x.to_bits());
    }
}
