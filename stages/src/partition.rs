//! Splitting the model's blocks over the virtual stages (p stages x v chunks): balanced by
//! cost by default — the first virtual stage also runs the embedding, the last the final
//! norm, LM head and loss — or given explicitly.

use crate::flops::{block_flops, head_flops};
use crate::model::ModelShape;
use crate::params::ChunkLayout;

/// Blocks per virtual stage minimising the most expensive virtual stage's FLOPs.
/// Every virtual stage gets at least one block, except that the last may hold only the head.
pub fn balanced(s: &ModelShape, virtual_stages: usize) -> Result<Vec<usize>, String> {
    let l = s.num_layers;
    if virtual_stages == 0 || virtual_stages > l + 1 || (virtual_stages == l + 1 && l == 0) {
        return Err(format!("cannot split {l} layers over {virtual_stages} pipeline stages (chunks)"));
    }
    let block = block_flops(s).total();
    let head = head_flops(s).total();
    // best[k][n]: the smallest achievable max cost of n blocks over the first k stages
    // (k < V: every stage >= 1 block); choice[k][n]: blocks of stage k-1 in that optimum.
    let v = virtual_stages;
    let inf = f64::INFINITY;
    let mut best = vec![vec![inf; l + 1]; v + 1];
    let mut choice = vec![vec![0usize; l + 1]; v + 1];
    best[0][0] = 0.0;
    for k in 1..=v {
        let last = k == v;
        for n in 0..=l {
            let min_blocks = if last { 0 } else { 1 };
            for take in min_blocks..=n {
                let prev = best[k - 1][n - take];
                if prev == inf {
                    continue;
                }
                let cost = take as f64 * block + if last { head } else { 0.0 };
                let candidate = prev.max(cost);
                // Ties go to the split that gives earlier stages more blocks (fewer later,
                // where the head already sits).
                if candidate < best[k][n] {
                    best[k][n] = candidate;
                    choice[k][n] = take;
                }
            }
        }
    }
    if best[v][l] == inf {
        return Err(format!("cannot split {l} layers over {v} pipeline stages (chunks)"));
    }
    let mut counts = vec![0; v];
    let mut n = l;
    for k in (1..=v).rev() {
        counts[k - 1] = choice[k][n];
        n -= counts[k - 1];
    }
    Ok(counts)
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
