//! The fused classifier (kernels/cuda/classifier.cu) over logits rows padded as the CUDA
//! device pads them (`padded_vocab`), launched as `Device::classifier` launches it, against
//! the CPU's cross-entropy over the unpadded rows: the losses and dlogits, the padding's
//! dlogits exactly zero, and the padding never read (fillings that would change or poison
//! the losses if it were give the same bits). The bf16-storage twin the same way, its rows
//! bf16 and the CPU given the logits rounded to bf16.

use crate::harness::{bf16_bits, bf16_values, bitwise, close, rounds_from, Family, Rng, Run};
use kernels::cpu::cross_entropy::forward_backward;
use kernels::cuda::launch::per_row_block;
use kernels::padded_vocab;

/// GPT-2 124M's vocabulary.
const V: usize = 50257;
/// What fills the padding: a logit far above the rest (it would be the max, and every
/// probability would move) and NaN (it would poison any sum it entered).
pub const FILLS: [f32; 2] = [1.0e4, f32::NAN];

/// Rows [n, v] laid out [n, vp], the padding filled with `fill`.
fn pad<T: Copy>(rows: &[T], v: usize, vp: usize, fill: T) -> Vec<T> {
    rows.chunks(v).flat_map(|row| row.iter().copied().chain(std::iter::repeat_n(fill, vp - v))).collect()
}

/// The vocabulary columns and the padding columns of rows [n, vp], each flattened.
fn split<T: Copy>(padded: &[T], v: usize, vp: usize) -> (Vec<T>, Vec<T>) {
    let vocab = padded.chunks(vp).flat_map(|row| &row[..v]).copied().collect();
    let padding = padded.chunks(vp).flat_map(|row| &row[v..]).copied().collect();
    (vocab, padding)
}

/// The kernel over n rows of v logits padded to `padded_vocab(v)`, with and without the
/// gradient, once per padding filling; Err on the first difference.
pub fn classifier(family: &Family, n: usize, v: usize, fills: &[f32], seed: u64) -> Result<(), String> {
    let vp = padded_vocab(v);
    let mut rng = Rng::new(seed);
    let (logits, targets) = (rng.uniform(n * v, 8.0), rng.below(n, v as u32));
    for grad_scale in [None, Some(1.0 / 4096.0)] {
        let (mut want_losses, mut want) = (vec![f32::NAN; n], logits.clone());
        forward_backward(&mut want_losses, &mut want, &targets, grad_scale);
        let mut first_fill: Option<(Vec<f32>, Vec<f32>)> = None;
        for &fill in fills {
            let what =
                |x: &str| format!("{x} (V = {v} padded to {vp}, gradient {grad_scale:?}, padding {fill})");
            let mut run = Run::new(seed);
            let (l, t, losses) = (
                run.buffer(&pad(&logits, v, vp, fill)),
                run.buffer(&targets),
                run.buffer(&vec![f32::NAN; n]),
            );
            let (write, scale) = (grad_scale.is_some() as i32, grad_scale.unwrap_or(0.0));
            run.launch(
                "fused_classifier",
                per_row_block(n),
                &[
                    losses.into(),
                    l.into(),
                    t.into(),
                    (v as i32).into(),
                    (vp as i32).into(),
                    write.into(),
                    scale.into(),
                ],
            );
            for buf in [losses, l] {
                run.read(buf);
            }
            let got = family.run(run)?;
            let got_losses = got.get::<f32>(losses);
            let (vocab, padding) = split(&got.get::<f32>(l), v, vp);
            close(&what("losses"), &got_losses, &want_losses, 1e-5, 0.0)?;
            match grad_scale {
                Some(_) => {
                    close(&what("dlogits"), &vocab, &want, 1e-5, 0.0)?;
                    bitwise(&what("the padding's dlogits"), &padding, &vec![0.0; n * (vp - v)])?;
                }
                None => {
                    bitwise(&what("logits after a forward"), &vocab, &logits)?;
                    bitwise(&what("padding after a forward"), &padding, &vec![fill; n * (vp - v)])?;
                }
            }
            match &first_fill {
                Some((losses, vocab_first)) => {
                    bitwise(&what("losses against the first filling's"), &got_losses, losses)?;
                    bitwise(&what("logits row against the first filling's"), &vocab, vocab_first)?;
                }
                None => first_fill = Some((got_losses, vocab)),
            }
        }
    }
    Ok(())
}

/// `classifier` through fused_classifier_bf16: bf16 rows of logits, from logits rounded to
/// bf16 (the CPU's input), the losses f32 and judged as there, the dlogits bf16 and the
/// rounding of the CPU's within the same tolerance.
pub fn classifier_bf16(family: &Family, n: usize, v: usize, fills: &[f32], seed: u64) -> Result<(), String> {
    let vp = padded_vocab(v);
    let mut rng = Rng::new(seed);
    let (logits, targets) = (bf16_bits(&rng.uniform(n * v, 8.0)), rng.below(n, v as u32));
    for grad_scale in [None, Some(1.0 / 4096.0)] {
        let (mut want_losses, mut want) = (vec![f32::NAN; n], bf16_values(&logits));
        forward_backward(&mut want_losses, &mut want, &targets, grad_scale);
        let mut first_fill: Option<(Vec<f32>, Vec<u16>)> = None;
        for &fill in fills {
            let what = |x: &str| {
                format!("bf16 {x} (V = {v} padded to {vp}, gradient {grad_scale:?}, padding {fill})")
            };
            let fill = bf16_bits(&[fill])[0];
            let mut run = Run::new(seed);
            let (l, t, losses) = (
                run.buffer(&pad(&logits, v, vp, fill)),
                run.buffer(&targets),
                run.buffer(&vec![f32::NAN; n]),
            );
            let (write, scale) = (grad_scale.is_some() as i32, grad_scale.unwrap_or(0.0));
            run.launch(
                "fused_classifier_bf16",
                per_row_block(n),
                &[
                    losses.into(),
                    l.into(),
                    t.into(),
                    (v as i32).into(),
                    (vp as i32).into(),
                    write.into(),
                    scale.into(),
                ],
            );
            for buf in [losses, l] {
                run.read(buf);
            }
            let got = family.run(run)?;
            let got_losses = got.get::<f32>(losses);
            let (vocab, padding) = split(&got.get::<u16>(l), v, vp);
            close(&what("losses"), &got_losses, &want_losses, 1e-5, 0.0)?;
            match grad_scale {
                Some(_) => {
                    rounds_from(&what("dlogits"), &vocab, &want, 1e-5, 0.0)?;
                    bitwise(
                        &what("the padding's dlogits"),
                        &bf16_values(&padding),
                        &vec![0.0; n * (vp - v)],
                    )?;
                }
                None => {
                    bitwise(&what("logits after a forward"), &bf16_values(&vocab), &bf16_values(&logits))?;
                    let filled = bf16_values(&vec![fill; n * (vp - v)]);
                    bitwise(&what("padding after a forward"), &bf16_values(&padding), &filled)?;
                }
            }
            match &first_fill {
                Some((losses, vocab_first)) => {
                    bitwise(&what("losses against the first filling's"), &got_losses, losses)?;
                    bitwise(
                        &what("logits row against the first filling's"),
                        &bf16_values(&vocab),
                        &bf16_values(vocab_first),
                    )?;
                }
                None => first_fill = Some((got_losses, vocab)),
            }
        }
    }
    Ok(())
}

#[test]
fn fused_classifier_matches_the_cpu_at_gpt2_size() {
    let Some(family) = Family::of("fused_classifier_matches_the_cpu_at_gpt2_size", "classifier.cu") else {
        return;
    };
    assert_eq!(padded_vocab(V), 50304);
    // All of GPT-2's 50257 logits in rows of 50304, in 64 of a step's 4096 rows (each row is
    // one block, so more rows repeat the same work).
    classifier(&family, 64, V, &FILLS[..1], 7).unwrap();
}

#[test]
fn fused_classifier_matches_the_cpu_at_odd_sizes() {
    let Some(family) = Family::of("fused_classifier_matches_the_cpu_at_odd_sizes", "classifier.cu") else {
        return;
    };
    // A vocabulary below one block (most threads see no column; 37 padded to 128), one with
    // no padding at all, and one whose rows take 6 columns per thread and end in 72 padding
    // columns; each with both fillings of the padding.
    for (n, v, seed) in [(5, 37, 8), (3, 256, 9), (9, 3000, 10)] {
        classifier(&family, n, v, &FILLS, seed).unwrap();
    }
}

#[test]
fn fused_classifier_bf16_matches_the_cpu_at_gpt2_size() {
    let Some(family) = Family::of("fused_classifier_bf16_matches_the_cpu_at_gpt2_size", "classifier.cu")
    else {
        return;
    };
    // As the f32 test: all 50257 logits of 64 rows of 50304.
    classifier_bf16(&family, 64, V, &FILLS[..1], 7).unwrap();
}

#[test]
fn fused_classifier_bf16_matches_the_cpu_at_odd_sizes() {
    let Some(family) = Family::of("fused_classifier_bf16_matches_the_cpu_at_odd_sizes", "classifier.cu")
    else {
        return;
    };
    // The f32 test's odd vocabularies, with both fillings of the padding.
    for (n, v, seed) in [(5, 37, 8), (3, 256, 9), (9, 3000, 10)] {
        classifier_bf16(&family, n, v, &FILLS, seed).unwrap();
    }
}
