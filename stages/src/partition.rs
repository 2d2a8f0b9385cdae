//! Splitting the model's blocks over the virtual stages (p stages x v chunks): balanced by
//! cost by default — the first virtual stage also runs the embedding, the last the final
//! norm, LM head and loss — or given explicitly.

use crate::flops::{head_flops, typical_block_flops};
use crate::model::ModelShape;
use crate::params::ChunkLayout;

/// Blocks per virtual stage minimising the most expensive virtual stage's FLOPs.
/// Every virtual stage gets at least one block, except that the last may hold only the head.
/// Of the splits that tie, the one that gives earlier stages more blocks (fewer later, where
/// the head already sits).
///
/// Stage by stage from the last: each takes the fewest blocks that minimise the larger of
/// its own cost and the cheapest most-expensive stage of the blocks left over the stages
/// before it, which is ceil(left / stages) blocks (every stage but the last costs its
/// blocks alone). So a split is O(V log L) where a dynamic program over every (stage,
/// blocks) took O(V L^2) time and O(V L) memory: a minute at 100,000 layers.
pub fn balanced(s: &ModelShape, virtual_stages: usize) -> Result<Vec<usize>, String> {
    let (l, v) = (s.num_layers, virtual_stages);
    if v == 0 || v > l + 1 || (v == l + 1 && l == 0) {
        return Err(format!("cannot split {l} layers over {v} pipeline stages (chunks)"));
    }
    let block = typical_block_flops(s).total();
    let head = head_flops(s).total();
    // The cheapest most-expensive stage of n blocks over k stages before the last, each
    // holding at least one (n >= k >= 1).
    let spread = |k: usize, n: usize| n.div_ceil(k) as f64 * block;
    let mut counts = vec![0; v];
    let mut left = l;
    for k in (2..=v).rev() {
        let own = |take: usize| take as f64 * block + if k == v { head } else { 0.0 };
        // From none (the last stage may hold only the head) or one, to what leaves the
        // k - 1 stages before a block each.
        let fewest = if k == v { 0 } else { 1 };
        counts[k - 1] = fewest_minimising(fewest, left - (k - 1), |take| spread(k - 1, left - take), own);
        left -= counts[k - 1];
    }
    counts[0] = left;
    Ok(counts)
}

/// The least `take` in [lo, hi] that minimises max(before(take), own(take)), with `before`
/// not increasing and `own` increasing in `take`: below the first take whose own cost
/// exceeds `before`, the larger is `before`, from it on `own`; so the minimum is at one of
/// those two, and where `before` holds a value over several takes, at the first of them.
fn fewest_minimising(
    lo: usize,
    hi: usize,
    before: impl Fn(usize) -> f64,
    own: impl Fn(usize) -> f64,
) -> usize {
    let crossing = lo + first_true(hi + 1 - lo, |i| own(lo + i) > before(lo + i));
    let below = if crossing > lo { before(crossing - 1) } else { f64::INFINITY };
    if crossing <= hi && own(crossing) < below {
        return crossing;
    }
    lo + first_true(crossing - lo, |i| before(lo + i) <= below)
}

/// The first i in [0, n) where `holds` (false, then true) is true, else n.
fn first_true(n: usize, holds: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if holds(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// Checks an explicit split: one count per virtual stage, summing to the model's layers.
pub fn explicit(num_layers: usize, counts: &[usize], virtual_stages: usize) -> Result<Vec<usize>, String> {
    if counts.len() != virtual_stages {
        return Err(format!(
            "{counts:?} has {} entries, the pipeline has {virtual_stages} (chunks of) stages",
            counts.len()
        ));
    }
    let total: usize = counts.iter().sum();
    if total != num_layers {
        return Err(format!("{counts:?} sums to {total}, num_layers is {num_layers}"));
    }
    if let Some(i) = counts[..virtual_stages - 1].iter().position(|&c| c == 0) {
        return Err(format!("{counts:?}: stage {i} would hold no layer"));
    }
    Ok(counts.to_vec())
}

/// The chunk layout of every virtual stage, from blocks per virtual stage.
pub fn layouts(counts: &[usize]) -> Vec<ChunkLayout> {
    let mut start = 0;
    let last = counts.len() - 1;
    counts
        .iter()
        .enumerate()
        .map(|(vs, &n)| {
            let layout = ChunkLayout { blocks: start..start + n, embedding: vs == 0, head: vs == last };
            start += n;
            layout
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt2(layers: usize) -> ModelShape {
        ModelShape { num_layers: layers, ..ModelShape::GPT2_SMALL }
    }

    #[test]
    fn balanced_splits_give_the_head_stage_fewer_blocks() {
        // GPT-2 small at T=1024: the LM head costs about 4.5 blocks, so the last stage gets fewer.
        assert_eq!(balanced(&gpt2(12), 2).unwrap(), vec![8, 4]);
        assert_eq!(balanced(&gpt2(12), 4).unwrap(), vec![4, 4, 4, 0]);
        assert_eq!(balanced(&gpt2(12), 1).unwrap(), vec![12]);
        let tiny = ModelShape { hidden: 64, ffn: 256, seq_len: 32, heads: 4, max_positions: 32, ..gpt2(3) };
        assert_eq!(balanced(&tiny, 4).unwrap(), vec![1, 1, 1, 0]);
        assert_eq!(balanced(&tiny, 5).unwrap_err(), "cannot split 3 layers over 5 pipeline stages (chunks)");
    }

    /// The dynamic program `balanced` replaced, over every (stages, blocks): the smallest
    /// most-expensive stage, the ties going to the fewest blocks of a stage counted from the
    /// last.
    fn by_dynamic_program(s: &ModelShape, v: usize) -> Vec<usize> {
        let (l, block, head) = (s.num_layers, typical_block_flops(s).total(), head_flops(s).total());
        let mut best = vec![vec![f64::INFINITY; l + 1]; v + 1];
        let mut choice = vec![vec![0usize; l + 1]; v + 1];
        best[0][0] = 0.0;
        for k in 1..=v {
            let last = k == v;
            for n in 0..=l {
                for take in usize::from(!last)..=n {
                    let prev = best[k - 1][n - take];
                    let candidate = prev.max(take as f64 * block + if last { head } else { 0.0 });
                    if prev < f64::INFINITY && candidate < best[k][n] {
                        best[k][n] = candidate;
                        choice[k][n] = take;
                    }
                }
            }
        }
        let mut counts = vec![0; v];
        let mut n = l;
        for k in (1..=v).rev() {
            counts[k - 1] = choice[k][n];
            n -= counts[k - 1];
        }
        counts
    }

    /// The split is the dynamic program's, tie for tie, at every stage count up to one past
    /// the layers, for heads from a fraction of a block to many (a vocabulary of 96 to
    /// GPT-2's and Llama 3's), up to 40 layers.
    #[test]
    fn balanced_is_the_dynamic_programs_split() {
        let shapes = [
            ModelShape {
                hidden: 64,
                ffn: 256,
                seq_len: 32,
                heads: 4,
                max_positions: 32,
                vocab: 96,
                ..gpt2(1)
            },
            ModelShape { hidden: 64, ffn: 256, seq_len: 32, heads: 4, max_positions: 32, ..gpt2(1) },
            gpt2(1),
            ModelShape { vocab: 128_256, ..gpt2(1) },
        ];
        for shape in shapes {
            for l in 0..=40 {
                let s = ModelShape { num_layers: l, ..shape };
                for v in 1..=l + 1 {
                    if v == l + 1 && l == 0 {
                        continue;
                    }
                    assert_eq!(balanced(&s, v).unwrap(), by_dynamic_program(&s, v), "{l} layers over {v}");
                }
            }
        }
        // 100,000 layers, which the program took a minute over at 4 stages.
        let deep = balanced(&gpt2(100_000), 4).unwrap();
        assert_eq!(deep.iter().sum::<usize>(), 100_000);
        assert_eq!(deep[..3], [deep[0]; 3]);
    }

    #[test]
    fn explicit_splits_are_checked() {
        assert_eq!(explicit(5, &[3, 2], 2).unwrap(), vec![3, 2]);
        assert_eq!(explicit(5, &[3, 1], 2).unwrap_err(), "[3, 1] sums to 4, num_layers is 5");
        assert_eq!(
            explicit(5, &[5], 2).unwrap_err(),
            "[5] has 1 entries, the pipeline has 2 (chunks of) stages"
        );
        assert_eq!(explicit(2, &[0, 2], 2).unwrap_err(), "[0, 2]: stage 0 would hold no layer");
        let l = layouts(&[2, 1]);
        assert_eq!(l[0], ChunkLayout { blocks: 0..2, embedding: true, head: false });
        assert_eq!(l[1], ChunkLayout { blocks: 2..3, embedding: false, head: true });
    }
}
