//! (input, target) windows of `seq_len + 1` consecutive tokens, from the sources of a data
//! path. A window never crosses from one file into the next, as in llm.c and Megatron.
//!
//! Training: row `row` of microbatch `microbatch` at step `step` takes one Philox4x32-10 draw
//! (the generator dropout uses) keyed by the seed, with counter (row, microbatch, step,
//! DATA_STREAM). Of its four words, the last two pick the source by the normalised blend
//! weights (with one source they go unused); the first two pick the start uniformly among
//! every start of every file of that source, a file thus drawn in proportion to its windows.
//! A window is a pure function of (seed, step, microbatch, row): a resumed run draws exactly
//! the windows the uninterrupted run would have, and the trainer's "data position" is just
//! its step count. With one file this is the draw of a single llm.c file, bit for bit.
//!
//! Evaluation reads each source's files in order with non-overlapping windows (window k of a
//! file has inputs `k*T .. k*T+T-1` and targets `k*T+1 .. k*T+T`). A blend's evaluation rows
//! take their sources in Megatron's blending order (`build_blending_indices`: row i goes to
//! the source furthest below its weight's share), each source's rows in its own order.

use kernels::philox::{key_words, philox4x32_10};

use super::{TokenData, TokenFile};
use crate::error::user_error;

/// Counter word that separates data draws from dropout masks, whose last counter word is
/// `layer * 4 + site` and never reaches this.
const DATA_STREAM: u32 = u32::MAX;

/// `batch_size` windows of `seq_len` tokens, row-major `[batch_size * seq_len]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
}

impl TokenFile {
    /// Errors unless the file holds at least one window (`seq_len + 1` tokens).
    pub fn check_seq_len(&self, seq_len: usize) -> anyhow::Result<()> {
        if seq_len == 0 || self.len() <= seq_len {
            return Err(user_error(format!(
                "{}: {} tokens, too few for one window of seq_length {seq_len} (needs {})",
                self.path().display(),
                self.len(),
                seq_len + 1
            )));
        }
        Ok(())
    }
}

/// Multiply-shift: maps `r` onto `0..n` with bias below n / 2^64.
fn scale(r: u64, n: u64) -> u64 {
    ((r as u128 * n as u128) >> 64) as u64
}

/// The `k`-th of the counts `per` laid end to end: (which, offset within it); `k < sum`.
fn locate(per: impl Iterator<Item = u64>, mut k: u64) -> (usize, u64) {
    for (i, n) in per.enumerate() {
        if k < n {
            return (i, k);
        }
        k -= n;
    }
    unreachable!("k is below the sum of the counts")
}

impl TokenData {
    /// Errors unless every file holds a window (`seq_len + 1` tokens).
    pub fn check_seq_len(&self, seq_len: usize) -> anyhow::Result<()> {
        self.sources.iter().flat_map(|s| &s.files).try_for_each(|f| f.check_seq_len(seq_len))
    }

    /// Sources' names, normalised weights, in order.
    pub fn describe(&self) -> Vec<(String, f64)> {
        self.sources.iter().map(|s| (s.name.clone(), s.weight)).collect()
    }

    /// The draw of one training row.
    fn draw(seed: u64, step: u32, microbatch: u32, row: u32) -> [u32; 4] {
        philox4x32_10([row, microbatch, step, DATA_STREAM], key_words(seed))
    }

    /// The source a draw picks: the first whose cumulative weight passes the draw's last two
    /// words read as a fraction of 2^64.
    fn source_of(&self, w: [u32; 4]) -> usize {
        if self.sources.len() == 1 {
            return 0;
        }
        let u = ((w[2] as u64) << 32 | w[3] as u64) as u128;
        let mut cumulative = 0.0f64;
        for (i, s) in self.sources[..self.sources.len() - 1].iter().enumerate() {
            cumulative += s.weight;
            if u < (cumulative * 18446744073709551616.0) as u128 {
                return i;
            }
        }
        self.sources.len() - 1
    }

    /// Where training row `row` of `microbatch` at `step` starts: (source, file, position).
    fn train_window(
        &self,
        seed: u64,
        step: u32,
        microbatch: u32,
        row: u32,
        seq_len: usize,
    ) -> (usize, usize, usize) {
        let w = Self::draw(seed, step, microbatch, row);
        let source = self.source_of(w);
        let files = &self.sources[source].files;
        let starts = |f: &TokenFile| (f.len() - seq_len) as u64;
        let k = scale((w[0] as u64) << 32 | w[1] as u64, files.iter().map(starts).sum());
        let (file, start) = locate(files.iter().map(starts), k);
        (source, file, start as usize)
    }

    /// The training microbatch `microbatch` of optimizer step `step`.
    pub fn train_batch(
        &self,
        seed: u64,
        step: u32,
        microbatch: u32,
        batch_size: usize,
        seq_len: usize,
    ) -> anyhow::Result<Batch> {
        self.check_seq_len(seq_len)?;
        let windows = (0..batch_size as u32).map(|row| {
            let (source, file, start) = self.train_window(seed, step, microbatch, row, seq_len);
            (&self.sources[source].files[file], start)
        });
        Ok(gather(windows, batch_size, seq_len))
    }

    /// Tokens (inputs, `seq_len` a row) each source serves over `steps`, every step of
    /// `microbatches` microbatches (all replicas') of `batch_size` rows.
    pub fn served(
        &self,
        seed: u64,
        steps: std::ops::RangeInclusive<usize>,
        microbatches: usize,
        batch_size: usize,
        seq_len: usize,
    ) -> Vec<u64> {
        if self.sources.len() == 1 {
            // No source to pick: every row is the one source's (a resume replays nothing).
            return vec![(steps.count() * microbatches * batch_size * seq_len) as u64];
        }
        let mut tokens = vec![0u64; self.sources.len()];
        for step in steps {
            for mb in 0..microbatches as u32 {
                for row in 0..batch_size as u32 {
                    tokens[self.source_of(Self::draw(seed, step as u32, mb, row))] += seq_len as u64;
                }
            }
        }
        tokens
    }

    /// Non-overlapping evaluation windows of each source.
    fn source_eval_windows(&self, seq_len: usize) -> Vec<u64> {
        let per_file = |f: &TokenFile| (f.len().saturating_sub(1) / seq_len.max(1)) as u64;
        self.sources.iter().map(|s| s.files.iter().map(per_file).sum()).collect()
    }

    /// Number of non-overlapping evaluation windows, all sources together.
    pub fn eval_windows(&self, seq_len: usize) -> usize {
        self.source_eval_windows(seq_len).iter().sum::<u64>() as usize
    }

    /// Evaluation batch `index`: row r is evaluation row `index * batch_size + r`, which is
    /// window `n % windows` of its source, the source's n-th row; asking for more windows
    /// than a source holds wraps around to its start.
    pub fn eval_batch(&self, index: usize, batch_size: usize, seq_len: usize) -> anyhow::Result<Batch> {
        self.check_seq_len(seq_len)?;
        let windows = self.source_eval_windows(seq_len);
        let rows = blending_order(
            &self.describe().iter().map(|d| d.1).collect::<Vec<_>>(),
            (index + 1) * batch_size,
        );
        let picked = rows[index * batch_size..].iter().map(|&(source, n)| {
            let files = &self.sources[source].files;
            let per_file = |f: &TokenFile| (f.len() - 1) as u64 / seq_len as u64;
            let (file, k) = locate(files.iter().map(per_file), n % windows[source]);
            (&files[file], k as usize * seq_len)
        });
        Ok(gather(picked, batch_size, seq_len))
    }
}

/// Megatron's blending order of the first `count` rows: (source, the source's row index).
/// Row i goes to the source whose weight times max(i, 1) most exceeds the rows it already
/// has (ties to the first), so every prefix follows the weights as closely as whole rows can.
fn blending_order(weights: &[f64], count: usize) -> Vec<(usize, u64)> {
    let mut taken = vec![0u64; weights.len()];
    (0..count)
        .map(|i| {
            let at = (i as f64).max(1.0);
            let error = |d: usize| weights[d] * at - taken[d] as f64;
            let d = (1..weights.len()).fold(0, |best, d| if error(d) > error(best) { d } else { best });
            taken[d] += 1;
            (d, taken[d] - 1)
        })
        .collect()
}

fn gather<'a>(
    windows: impl Iterator<Item = (&'a TokenFile, usize)>,
    batch_size: usize,
    seq_len: usize,
) -> Batch {
    let mut inputs = Vec::with_capacity(batch_size * seq_len);
    let mut targets = Vec::with_capacity(batch_size * seq_len);
    for (f, s) in windows {
        inputs.extend((s..s + seq_len).map(|i| f.token(i)));
        targets.extend((s + 1..s + seq_len + 1).map(|i| f.token(i)));
    }
    Batch { inputs, targets }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DataPath;
    use crate::data::test_dir;
    use crate::data::token_file::{u32_file_bytes, write_tokens};

    /// A token file whose token i is i, so windows show their own positions.
    fn counting_file(name: &str, n: u16) -> TokenData {
        let path = test_dir(name).join("count.bin");
        let mut bytes = Vec::new();
        write_tokens(&mut bytes, &(0..n).collect::<Vec<_>>()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        TokenData::open_file(&path, 1, 1 << 16).unwrap()
    }

    /// uint32 files in `dir` whose token i of file `f` is `(f + 1) * 100_000 + i`, so a
    /// window shows its file and start; `files` gives (name, token count).
    fn tagged_files(dir: &std::path::Path, files: &[(&str, u32)]) {
        for (f, (name, n)) in files.iter().enumerate() {
            let tokens: Vec<u32> = (0..*n).map(|i| (f as u32 + 1) * 100_000 + i).collect();
            std::fs::write(dir.join(name), u32_file_bytes(7, &tokens)).unwrap();
        }
    }

    /// (file tag, start) of each row of a batch of tagged windows.
    fn tags(b: &Batch, seq_len: usize) -> Vec<(u32, u32)> {
        b.inputs.chunks(seq_len).map(|w| (w[0] / 100_000, w[0] % 100_000)).collect()
    }

    fn open(path: DataPath) -> TokenData {
        TokenData::open(&path, 1, 1_000_000).unwrap()
    }

    #[test]
    fn eval_windows_are_sequential_and_shifted() {
        let f = counting_file("ld_eval", 10);
        assert_eq!(f.eval_windows(3), 3);
        let b = f.eval_batch(0, 2, 3).unwrap();
        assert_eq!(b.inputs, [0, 1, 2, 3, 4, 5]);
        assert_eq!(b.targets, [1, 2, 3, 4, 5, 6]);
        let b = f.eval_batch(1, 2, 3).unwrap();
        assert_eq!(b.inputs, [6, 7, 8, 0, 1, 2], "window 3 wraps to window 0");
        assert_eq!(b.targets, [7, 8, 9, 1, 2, 3]);
    }

    #[test]
    fn train_windows_are_reproducible_and_vary() {
        let f = counting_file("ld_train", 5000);
        let a = f.train_batch(42, 7, 1, 4, 16).unwrap();
        assert_eq!(a, f.train_batch(42, 7, 1, 4, 16).unwrap());
        for row in 0..4 {
            let s = a.inputs[row * 16] as usize;
            assert_eq!((0, 0, s), f.train_window(42, 7, 1, row as u32, 16));
            assert_eq!(a.inputs[row * 16..row * 16 + 16], (s as u32..s as u32 + 16).collect::<Vec<_>>()[..]);
            assert_eq!(
                a.targets[row * 16..row * 16 + 16],
                (s as u32 + 1..s as u32 + 17).collect::<Vec<_>>()[..]
            );
        }
        assert_eq!(f.served(42, 2..=4, 2, 4, 16), [3 * 2 * 4 * 16]);
        assert_ne!(a, f.train_batch(42, 8, 1, 4, 16).unwrap(), "next step");
        assert_ne!(a, f.train_batch(42, 7, 2, 4, 16).unwrap(), "next microbatch");
        assert_ne!(a, f.train_batch(43, 7, 1, 4, 16).unwrap(), "other seed");
        // Pinned (checked against an independent Python Philox): a change to the draw would
        // make resumed runs read other windows than the runs they resume.
        let starts: Vec<usize> = (0..4).map(|r| f.train_window(42, 7, 1, r, 16).2).collect();
        assert_eq!(starts, [2929, 1986, 4447, 1422]);
    }

    #[test]
    fn train_windows_cover_the_whole_file() {
        // seq_len 3 in a 6-token file: starts 0, 1, 2 are the only ones with a target.
        let f = counting_file("ld_cover", 6);
        let mut seen = [0usize; 3];
        for step in 0..300 {
            seen[f.train_window(1, step, 0, 0, 3).2] += 1;
        }
        assert!(seen.iter().all(|&c| c > 60), "{seen:?}");
    }

    #[test]
    fn too_short_file_is_a_clear_error() {
        let f = counting_file("ld_short", 8);
        f.check_seq_len(7).unwrap();
        let path = &f.sources[0].files[0].path().display().to_string();
        let msg = format!("{path}: 8 tokens, too few for one window of seq_length 8 (needs 9)");
        assert_eq!(f.train_batch(0, 0, 0, 1, 8).unwrap_err().to_string(), msg);
        assert_eq!(f.eval_batch(0, 1, 8).unwrap_err().to_string(), msg);
    }

    /// Shards are one pool of starts, laid end to end: the draw that starts at k in one file
    /// of 72 starts starts at k in the shards' 46 + 26, and never spans two files.
    #[test]
    fn shards_draw_from_every_start_of_every_file_in_order() {
        let dir = test_dir("ld_shards");
        tagged_files(&dir, &[("s_000.bin", 50), ("s_001.bin", 30)]);
        std::fs::write(dir.join("one.bin"), u32_file_bytes(7, &(0..76).collect::<Vec<_>>())).unwrap();
        let glob = open(DataPath::One(format!("{}/s_*.bin", dir.display())));
        let list = open(DataPath::Shards(vec![
            dir.join("s_000.bin").display().to_string(),
            dir.join("s_001.bin").display().to_string(),
        ]));
        let one = open(DataPath::One(dir.join("one.bin").display().to_string()));
        let mut pinned = Vec::new();
        for step in 1..=40 {
            let b = glob.train_batch(5, step, 0, 2, 4).unwrap();
            assert_eq!(b, list.train_batch(5, step, 0, 2, 4).unwrap());
            for (row, (tag, start)) in tags(&b, 4).into_iter().enumerate() {
                let k = one.train_window(5, step, 0, row as u32, 4).2 as u32;
                assert_eq!((tag, start), if k < 46 { (1, k) } else { (2, k - 46) }, "step {step} row {row}");
                let w = &b.inputs[row * 4..row * 4 + 4];
                assert!(w.iter().zip(w[1..].iter()).all(|(a, b)| b - a == 1), "{w:?} spans files");
                if step <= 4 {
                    pinned.push((tag, start));
                }
            }
        }
        // Pinned, checked against an independent Python Philox (steps 1 to 4).
        assert_eq!(pinned, [(2, 19), (2, 20), (1, 39), (1, 13), (1, 39), (1, 31), (1, 38), (1, 41)]);
        // Evaluation walks file 0's 12 windows, then file 1's 7, then wraps.
        let b = glob.eval_batch(0, 20, 4).unwrap();
        let want: Vec<(u32, u32)> =
            (0..12).map(|k| (1, 4 * k)).chain((0..7).map(|k| (2, 4 * k))).chain([(1, 0)]).collect();
        assert_eq!(tags(&b, 4), want);
    }

    /// A blend picks each row's source by the normalised weights from the draw's last two
    /// words, and the window within that source from its first two, as that source alone
    /// would: the choice of source moves no window.
    #[test]
    fn a_blend_draws_sources_by_weight_and_windows_as_each_alone() {
        let dir = test_dir("ld_blend");
        tagged_files(&dir, &[("x.bin", 200), ("y.bin", 90)]);
        let (x, y) = (dir.join("x.bin").display().to_string(), dir.join("y.bin").display().to_string());
        let blend = open(DataPath::Blend(vec![(3.0, x.clone()), (1.0, y.clone())]));
        assert_eq!(blend.describe(), [(x.clone(), 0.75), (y.clone(), 0.25)]);
        let alone = [open(DataPath::One(x)), open(DataPath::One(y))];
        let mut from = [0u64; 2];
        let mut pinned = Vec::new();
        for step in 1..=500u32 {
            for mb in 0..2 {
                let b = blend.train_batch(9, step, mb, 4, 8).unwrap();
                for (row, (tag, start)) in tags(&b, 8).into_iter().enumerate() {
                    let source = tag as usize - 1;
                    from[source] += 8;
                    let own = alone[source].train_window(9, step, mb, row as u32, 8);
                    assert_eq!(own, (0, 0, start as usize));
                    if (4..=5).contains(&step) && mb == 0 {
                        pinned.push((tag, start));
                    }
                }
            }
        }
        // Pinned, checked against an independent Python Philox (steps 4 and 5, microbatch 0).
        assert_eq!(pinned, [(1, 110), (1, 13), (2, 44), (1, 184), (2, 35), (1, 139), (2, 39), (2, 55)]);
        assert_eq!(blend.served(9, 1..=500, 2, 4, 8), from);
        let share = from[0] as f64 / (from[0] + from[1]) as f64;
        assert!((share - 0.75).abs() < 0.03, "{share}");
    }

    /// A Megatron dataset is one stream of its documents' tokens: windows cross documents
    /// (the fixture's 150 + 1 + 249) but not the file, drawn as from an llm.c file.
    #[test]
    fn a_megatron_dataset_draws_windows_over_its_document_stream() {
        let data = open(DataPath::One("tests/fixtures/megatron/tiny_text_document".into()));
        let token = |i: u32| (i * 7919 + 65521) % 70000;
        let b = data.train_batch(3, 1, 0, 4, 8).unwrap();
        let starts: Vec<u32> =
            b.inputs.chunks(8).map(|w| (0..400).find(|&i| token(i) == w[0]).unwrap()).collect();
        // Pinned, checked against an independent Python Philox: starts among 400 - 8.
        assert_eq!(starts, [178, 53, 385, 20]);
        for (row, s) in starts.iter().enumerate() {
            assert_eq!(b.inputs[row * 8..row * 8 + 8], (*s..s + 8).map(token).collect::<Vec<_>>()[..]);
            assert_eq!(b.targets[row * 8..row * 8 + 8], (s + 1..s + 9).map(token).collect::<Vec<_>>()[..]);
        }
        assert_eq!(data.eval_windows(8), 49);
        assert_eq!(data.eval_batch(48, 1, 8).unwrap().inputs, (384..392).map(token).collect::<Vec<_>>());
    }

    #[test]
    fn a_blend_evaluates_in_megatrons_blending_order() {
        assert_eq!(
            blending_order(&[0.75, 0.25], 8),
            [(0, 0), (1, 0), (0, 1), (0, 2), (0, 3), (1, 1), (0, 4), (0, 5)]
        );
        assert_eq!(blending_order(&[1.0], 3), [(0, 0), (0, 1), (0, 2)]);
        let dir = test_dir("ld_blend_eval");
        tagged_files(&dir, &[("x.bin", 21), ("y.bin", 9)]);
        let (x, y) = (dir.join("x.bin").display().to_string(), dir.join("y.bin").display().to_string());
        let blend = open(DataPath::Blend(vec![(0.75, x), (0.25, y)]));
        // x holds 5 windows of 4, y 2; rows 4..8 are x's 3rd, y's 2nd, x's 5th and 6th
        // (wrapped to its 1st).
        let b = blend.eval_batch(1, 4, 4).unwrap();
        assert_eq!(tags(&b, 4), [(1, 12), (2, 4), (1, 16), (1, 0)]);
    }
}
