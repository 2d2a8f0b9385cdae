//! The fused classifier (kernels/cuda/classifier.cu) over logits rows padded as the CUDA
//! device pads them (`padded_vocab`), launched as `Device::classifier` launches it, against
//! the CPU's cross-entropy over the unpadded rows: the losses and dlogits, the padding's
//! dlogits exactly zero, and the padding never read (fillings that would change or poison
//! the losses if it were give the same bits). The bf16-storage twin the same way, its rows
//! bf16 and the CPU given the logits rounded to bf16, its dlogits the rounding of the CPU's
//! within the same tolerance. The vocab_shard kernels, a tensor-parallel rank's halves of
//! the same loss, against the CPU's shard ops the same way, targets of other shards included.

use crate::harness::{bitwise, close, Family, Rng, Run, Storage, Tolerance};
use kernels::cpu::cross_entropy::{forward_backward, shard_combine, shard_dlogits, shard_stats};
use kernels::cuda::launch::{per_item, per_row_block};
use kernels::{padded_vocab, OTHER_SHARD};

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

/// The kernel over n rows of v logits padded to `padded_vocab(v)`, the rows in `storage`
/// (the losses f32), with and without the gradient, once per padding filling; Err on the
/// first difference.
pub fn classifier(
    family: &Family,
    storage: Storage,
    n: usize,
    v: usize,
    fills: &[f32],
    seed: u64,
) -> Result<(), String> {
    let vp = padded_vocab(v);
    let mut rng = Rng::new(seed);
    let (logits, mut targets) = (storage.round(rng.uniform(n * v, 8.0)), rng.below(n, v as u32));
    // The last column (in the vocabulary's last pack, taken element by element where V is
    // not a multiple of the pack) and the first, besides random ones.
    targets[0] = v as u32 - 1;
    targets[n - 1] = 0;
    for grad_scale in [None, Some(1.0 / 4096.0)] {
        let (mut want_losses, mut want) = (vec![f32::NAN; n], logits.clone());
        forward_backward(&mut want_losses, &mut want, &targets, grad_scale);
        let mut first_fill: Option<(Vec<f32>, Vec<f32>)> = None;
        for &fill in fills {
            let what = |part: &str| {
                format!(
                    "{part} in {storage} (V = {v} padded to {vp}, gradient {grad_scale:?}, padding {fill})"
                )
            };
            // The filling as the rows hold it: 1e4 is 9984 in bf16.
            let fill = storage.round(vec![fill])[0];
            let mut run = Run::new(seed);
            let (l, t, losses) = (
                storage.buffer(&mut run, &pad(&logits, v, vp, fill)),
                run.buffer(&targets),
                run.buffer(&vec![f32::NAN; n]),
            );
            let (write, scale) = (grad_scale.is_some() as i32, grad_scale.unwrap_or(0.0));
            run.launch(
                storage.kernel("fused_classifier"),
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
            let (vocab, padding) = split(&storage.read(&got, l), v, vp);
            close(&what("losses"), &got_losses, &want_losses, 1e-5, 0.0)?;
            match grad_scale {
                Some(_) => {
                    let dlogits = Tolerance::Close { rtol: 1e-5, floor: 0.0 };
                    storage.check(&what("dlogits"), &vocab, &want, dlogits)?;
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

#[test]
fn fused_classifier_matches_the_cpu_at_gpt2_size_in_f32_and_bf16() {
    let test = "fused_classifier_matches_the_cpu_at_gpt2_size_in_f32_and_bf16";
    let Some(family) = Family::of(test, "classifier.cu") else { return };
    assert_eq!(padded_vocab(V), 50304);
    // All of GPT-2's 50257 logits in rows of 50304, in 64 of a step's 4096 rows (each row is
    // one block, so more rows repeat the same work).
    for storage in Storage::BOTH {
        classifier(&family, storage, 64, V, &FILLS[..1], 7).unwrap();
    }
}

#[test]
fn fused_classifier_matches_the_cpu_at_odd_sizes_in_f32_and_bf16() {
    let test = "fused_classifier_matches_the_cpu_at_odd_sizes_in_f32_and_bf16";
    let Some(family) = Family::of(test, "classifier.cu") else { return };
    // A vocabulary below one block (most threads see no column; 37 padded to 128), one with
    // no padding at all, and one whose rows take 6 columns per thread and end in 72 padding
    // columns; each with both fillings of the padding.
    for storage in Storage::BOTH {
        for (n, v, seed) in [(5, 37, 8), (3, 256, 9), (9, 3000, 10)] {
            classifier(&family, storage, n, v, &FILLS, seed).unwrap();
        }
    }
}

/// A shard's kernels over n rows of v logits in `storage`, against the CPU's: the statistics
/// (the max and the target's logit exact, the sum within f32 rounding), then the dlogits
/// from whole rows whose max lies in another shard for the even rows and in this one for the
/// odd. Targets: the last column, the first, another shard's, and random ones.
pub fn vocab_shard(family: &Family, storage: Storage, n: usize, v: usize, seed: u64) -> Result<(), String> {
    let what = |part: &str| format!("{part} in {storage} (a shard of {v} columns, {n} rows)");
    let mut rng = Rng::new(seed);
    let (logits, mut targets) = (storage.round(rng.uniform(n * v, 8.0)), rng.below(n, v as u32));
    targets[0] = v as u32 - 1;
    targets[1] = 0;
    targets.iter_mut().skip(2).step_by(2).for_each(|t| *t = OTHER_SHARD);
    let mut want_stats = vec![f32::NAN; 3 * n];
    shard_stats(&mut want_stats, &logits, &targets);
    let whole: Vec<f32> = want_stats
        .chunks(3)
        .enumerate()
        .flat_map(|(i, s)| match i % 2 {
            0 => [s[0] + 0.75, s[1] * (-0.75f32).exp() + 2.5],
            _ => [s[0], s[1] + 1.25],
        })
        .collect();
    let mut want = logits.clone();
    let scale = 1.0 / 4096.0;
    shard_dlogits(&mut want, &whole, &targets, scale);

    let mut run = Run::new(seed);
    let (l, t, stats, rows) = (
        storage.buffer(&mut run, &logits),
        run.buffer(&targets),
        run.buffer(&vec![f32::NAN; 3 * n]),
        run.buffer(&whole),
    );
    let v_i = v as i32;
    run.launch(
        storage.kernel("vocab_shard_stats"),
        per_row_block(n),
        &[stats.into(), l.into(), t.into(), v_i.into()],
    );
    run.read(stats);
    run.launch(
        storage.kernel("vocab_shard_dlogits"),
        per_row_block(n),
        &[l.into(), rows.into(), t.into(), v_i.into(), scale.into()],
    );
    run.read(l);
    let got = family.run(run)?;
    let got_stats = got.get::<f32>(stats);
    let column = |xs: &[f32], k: usize| xs.chunks(3).map(|s| s[k]).collect::<Vec<f32>>();
    bitwise(&what("row maxima"), &column(&got_stats, 0), &column(&want_stats, 0))?;
    close(&what("sums of exponentials"), &column(&got_stats, 1), &column(&want_stats, 1), 1e-5, 0.0)?;
    bitwise(&what("target logits"), &column(&got_stats, 2), &column(&want_stats, 2))?;
    let dlogits = Tolerance::Close { rtol: 1e-5, floor: 0.0 };
    storage.check(&what("dlogits"), &storage.read(&got, l), &want, dlogits)
}

#[test]
fn vocab_shard_kernels_match_the_cpu_in_f32_and_bf16() {
    let test = "vocab_shard_kernels_match_the_cpu_in_f32_and_bf16";
    let Some(family) = Family::of(test, "classifier.cu") else { return };
    // A shard below one block, one whose rows start unaligned (3001 columns), GPT-2's
    // vocabulary of 50304 at t = 2 and Llama 3's of 128256 at t = 8.
    for storage in Storage::BOTH {
        for (n, v, seed) in [(5, 37, 11), (4, 3001, 12), (4, 25152, 13), (3, 16032, 14)] {
            vocab_shard(&family, storage, n, v, seed).unwrap();
        }
    }
}

/// The group's statistics combined: `members` ranks' rows of [`shard_stats`] for n rows of
/// logits of each rank's 700 columns, one rank holding each row's target, through the kernel
/// and the CPU: the maxima exact, the sums and losses within f32 rounding (the GPU's expf
/// is not the host's libm).
fn vocab_shard_combine(family: &Family, members: usize, n: usize, seed: u64) -> Result<(), String> {
    let what = |part: &str| format!("{part} ({members} ranks, {n} rows)");
    let mut rng = Rng::new(seed);
    let v = 700;
    let targets = rng.below(n, (members * v) as u32);
    let stats: Vec<f32> = (0..members)
        .flat_map(|k| {
            let logits = rng.uniform(n * v, 6.0 + k as f32);
            let mine: Vec<u32> = targets
                .iter()
                .map(|&t| if t as usize / v == k { t % v as u32 } else { OTHER_SHARD })
                .collect();
            let mut stats = vec![f32::NAN; 3 * n];
            shard_stats(&mut stats, &logits, &mine);
            stats
        })
        .collect();
    let (mut want_losses, mut want_rows) = (vec![f32::NAN; n], vec![f32::NAN; 2 * n]);
    shard_combine(&mut want_losses, &mut want_rows, &stats);
    let mut run = Run::new(seed);
    let (losses, rows, s) =
        (run.buffer(&vec![f32::NAN; n]), run.buffer(&vec![f32::NAN; 2 * n]), run.buffer(&stats));
    let args = [losses.into(), rows.into(), s.into(), (n as i32).into(), (members as i32).into()];
    run.launch("vocab_shard_combine", per_item(n), &args);
    run.read(losses);
    run.read(rows);
    let got = family.run(run)?;
    let (got_rows, got_losses) = (got.get::<f32>(rows), got.get::<f32>(losses));
    let column = |xs: &[f32], k: usize| xs.chunks(2).map(|r| r[k]).collect::<Vec<f32>>();
    bitwise(&what("row maxima"), &column(&got_rows, 0), &column(&want_rows, 0))?;
    close(&what("sums of exponentials"), &column(&got_rows, 1), &column(&want_rows, 1), 1e-6, 0.0)?;
    close(&what("losses"), &got_losses, &want_losses, 1e-6, 0.0)
}

#[test]
fn vocab_shard_combine_matches_the_cpu() {
    let test = "vocab_shard_combine_matches_the_cpu";
    let Some(family) = Family::of(test, "classifier.cu") else { return };
    // Two ranks over a block and a part of one; eight over a few rows.
    for (members, n, seed) in [(2, 300, 15), (8, 5, 16)] {
        vocab_shard_combine(&family, members, n, seed).unwrap();
    }
}
