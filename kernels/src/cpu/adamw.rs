//! AdamW with PyTorch's semantics: decoupled weight decay, bias-corrected moments.

use super::CHUNK;
use crate::op_args::{AdamWConstants, AdamWStep};
use rayon::prelude::*;

/// One step on param [n] with grad [n] (times hp.grad_scale), moments m [n], v [n]:
///   p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g²;
///   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
pub fn step(param: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], hp: &AdamWStep) {
    let AdamWConstants { step_size, bias2_sqrt, decay } = hp.constants();
    let moments = m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK));
    param.par_chunks_mut(CHUNK).zip(grad.par_chunks(CHUNK)).zip(moments).for_each(|((p, g), (m, v))| {
        for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
            let g = g * hp.grad_scale;
            *m = hp.beta1 * *m + (1.0 - hp.beta1) * g;
            *v = hp.beta2 * *v + (1.0 - hp.beta2) * g * g;
            let denom = v.sqrt() / bias2_sqrt + hp.eps;
            *p = *p * decay - step_size * *m / denom;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::{assert_close, random};

    #[test]
    fn three_steps_match_an_f64_reference() {
        let n = CHUNK + 9;
        let p0 = random(1, n, 1.0);
        let mut p = p0.clone();
        let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
        let (mut p64, mut m64, mut v64) = (vec![0.0f64; n], vec![0.0f64; n], vec![0.0f64; n]);
        p64.iter_mut().zip(&p).for_each(|(a, &b)| *a = b as f64);
        for step_no in 1..=3u32 {
            let grad = random(10 + step_no as u64, n, 0.1);
            let hp = AdamWStep {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.1,
                step: step_no,
                grad_scale: 0.5,
            };
            step(&mut p, &grad, &mut m, &mut v, &hp);
            let (b1, b2, lr) = (0.9f64, 0.95f64, 1e-2f64);
            for i in 0..n {
                let g = grad[i] as f64 * 0.5;
                p64[i] -= lr * 0.1 * p64[i];
                m64[i] = b1 * m64[i] + (1.0 - b1) * g;
                v64[i] = b2 * v64[i] + (1.0 - b2) * g * g;
                let mhat = m64[i] / (1.0 - b1.powi(step_no as i32));
                let vhat = v64[i] / (1.0 - b2.powi(step_no as i32));
                p64[i] -= lr * mhat / (vhat.sqrt() + 1e-8);
            }
        }
        // Tolerance: 1e-5 of the largest value (f32 rounding of a few operations per step);
        // the parameter is compared by its change, which is what the step computes.
        let change: Vec<f32> = p.iter().zip(&p0).map(|(&p, &p0)| p - p0).collect();
        let want_change: Vec<f64> = p64.iter().zip(&p0).map(|(&p, &p0)| p - p0 as f64).collect();
        assert_close(&change, &want_change, 1e-5, "param change");
        assert_close(&m, &m64, 1e-5, "m");
        assert_close(&v, &v64, 1e-5, "v");
    }
}
