//! Token embedding, plus the learned position embedding where the model has one (GPT-2;
//! a RoPE model has none).

use super::disjoint::DisjointMut;
use crate::op_args::OTHER_SHARD;
use rayon::prelude::*;

/// Embedding rows per parallel task in forward.
const ROWS: usize = 16;
/// Channels per parallel task in backward: each task owns these columns of every row of
/// dwte and dwpe, so tokens that repeat never race and are summed in position order.
const COLS: usize = 64;

/// out [N,C] (N = B*T, t = n % T) = wte [V,C] [tokens[n]] (+ wpe [maxT,C] [t]); a token
/// of another shard ([`OTHER_SHARD`]) looks up a zero row.
pub fn forward(out: &mut [f32], tokens: &[u32], wte: &[f32], wpe: Option<&[f32]>, t: usize, c: usize) {
    out.par_chunks_mut(c).with_min_len(ROWS).zip(tokens).enumerate().for_each(|(n, (row, &tok))| {
        let pos_row = wpe.map(|wpe| &wpe[(n % t) * c..][..c]);
        match (tok == OTHER_SHARD, pos_row) {
            (false, Some(pos_row)) => {
                let tok_row = &wte[tok as usize * c..][..c];
                for ((o, &a), &b) in row.iter_mut().zip(tok_row).zip(pos_row) {
                    *o = a + b;
                }
            }
            (false, None) => row.copy_from_slice(&wte[tok as usize * c..][..c]),
            (true, Some(pos_row)) => row.copy_from_slice(pos_row),
            (true, None) => row.fill(0.0),
        }
    });
}

/// dwte [V,C] += scatter of dout [N,C] by token; dwpe [maxT,C] (if any) += dout summed over
/// batch.
pub fn backward(
    dwte: &mut [f32],
    dwpe: Option<&mut [f32]>,
    dout: &[f32],
    tokens: &[u32],
    t: usize,
    c: usize,
) {
    let dwte = DisjointMut::new(dwte);
    let dwpe = dwpe.map(DisjointMut::new);
    (0..c.div_ceil(COLS)).into_par_iter().for_each(|chunk| {
        let c0 = chunk * COLS;
        let width = COLS.min(c - c0);
        for (n, &tok) in tokens.iter().enumerate() {
            let d = &dout[n * c + c0..][..width];
            // SAFETY: this task alone touches columns c0..c0+width of every row, and the two
            // slices lie in different buffers.
            if tok != OTHER_SHARD {
                add(unsafe { dwte.slice(tok as usize * c + c0, width) }, d);
            }
            if let Some(dwpe) = dwpe {
                // SAFETY: as above.
                add(unsafe { dwpe.slice((n % t) * c + c0, width) }, d);
            }
        }
    });
}

fn add(acc: &mut [f32], x: &[f32]) {
    for (a, &x) in acc.iter_mut().zip(x) {
        *a += x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::{assert_close, finite_diff, random, to_f64, weighted_sum};

    const B: usize = 2;
    const T: usize = 5;
    const C: usize = 70; // more than COLS, not a multiple of it
    const V: usize = 6;
    const MAX_T: usize = 7;
    const TOKENS: [u32; B * T] = [3, 1, 3, 0, 5, 5, 2, 3, 4, 1];

    fn reference(wte: &[f64], wpe: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; B * T * C];
        for n in 0..B * T {
            for ch in 0..C {
                out[n * C + ch] = wte[TOKENS[n] as usize * C + ch] + wpe[(n % T) * C + ch];
            }
        }
        out
    }

    #[test]
    fn forward_adds_token_and_position_rows_exactly() {
        let (wte, wpe) = (random(1, V * C, 1.0), random(2, MAX_T * C, 1.0));
        let mut out = vec![0.0; B * T * C];
        forward(&mut out, &TOKENS, &wte, Some(&wpe), T, C);
        // One f32 add rounds the exact sum once, so the f64 reference rounds to the same bits.
        let want = reference(&to_f64(&wte), &to_f64(&wpe));
        assert!(out.iter().zip(&want).all(|(&o, &w)| o == w as f32));
        // Without positions, the token rows themselves.
        forward(&mut out, &TOKENS, &wte, None, T, C);
        assert!(out.chunks_exact(C).zip(TOKENS).all(|(row, tok)| row == &wte[tok as usize * C..][..C]));
    }

    /// Megatron's vocab-parallel embedding: two shards of the table, each looking up its own
    /// tokens (the other's as [`OTHER_SHARD`]), the position added by one of them. Their
    /// sum is the whole lookup bit for bit (adding a zero is exact), and their table
    /// gradients are the whole one's rows.
    #[test]
    fn two_vocabulary_shards_sum_to_the_whole_lookup() {
        let (wte, wpe) = (random(1, V * C, 1.0), random(2, MAX_T * C, 1.0));
        let mut whole = vec![0.0; B * T * C];
        forward(&mut whole, &TOKENS, &wte, Some(&wpe), T, C);
        let half = V / 2;
        let local = |first: u32| -> Vec<u32> {
            let own = first..first + half as u32;
            TOKENS.iter().map(|&tok| if own.contains(&tok) { tok - first } else { OTHER_SHARD }).collect()
        };
        let (mut a, mut b) = (vec![1.0; B * T * C], vec![1.0; B * T * C]);
        forward(&mut a, &local(0), &wte[..half * C], Some(&wpe), T, C);
        forward(&mut b, &local(half as u32), &wte[half * C..], None, T, C);
        let summed: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(summed, whole);
        let dout = random(3, B * T * C, 1.0);
        let mut dwte = vec![0.0; V * C];
        backward(&mut dwte, None, &dout, &TOKENS, T, C);
        let (mut da, mut db) = (vec![0.0; half * C], vec![0.0; half * C]);
        backward(&mut da, None, &dout, &local(0), T, C);
        backward(&mut db, None, &dout, &local(half as u32), T, C);
        assert_eq!([da, db].concat(), dwte);
    }

    #[test]
    fn backward_matches_finite_differences_and_accumulates() {
        let (wte, wpe) = (random(1, V * C, 1.0), random(2, MAX_T * C, 1.0));
        let w = random(3, B * T * C, 1.0);
        let wpe64 = to_f64(&wpe);
        let wte64 = to_f64(&wte);
        let fd_wte = finite_diff(&wte, |x| weighted_sum(&reference(x, &wpe64), &w));
        let fd_wpe = finite_diff(&wpe, |x| weighted_sum(&reference(&wte64, x), &w));
        let (mut dwte, mut dwpe) = (vec![0.0; V * C], vec![0.0; MAX_T * C]);
        backward(&mut dwte, Some(&mut dwpe), &w, &TOKENS, T, C);
        // Tolerance: 1e-6 of the largest gradient (sums of at most 3 terms in f32).
        assert_close(&dwte, &fd_wte, 1e-6, "dwte");
        assert_close(&dwpe, &fd_wpe, 1e-6, "dwpe");
        let (once_wte, once_wpe) = (dwte.clone(), dwpe.clone());
        backward(&mut dwte, Some(&mut dwpe), &w, &TOKENS, T, C);
        let doubled =
            |twice: &[f32], once: &[f32]| twice.iter().zip(once).all(|(&a, &b)| (a - 2.0 * b).abs() <= 1e-6);
        assert!(doubled(&dwte, &once_wte) && doubled(&dwpe, &once_wpe), "a second call must add again");
        // Without positions, the token gradient alone, bitwise as with them.
        let mut dwte_alone = vec![0.0; V * C];
        backward(&mut dwte_alone, None, &w, &TOKENS, T, C);
        let mut dwte_with = vec![0.0; V * C];
        backward(&mut dwte_with, Some(&mut vec![0.0; MAX_T * C]), &w, &TOKENS, T, C);
        assert!(dwte_alone == dwte_with, "dwte must not depend on whether there are positions");
    }
}
