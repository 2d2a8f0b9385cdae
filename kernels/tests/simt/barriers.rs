//! Removing any one `__syncthreads` that a kernel needs makes the harness fail. Each
//! barrier of kernels/cuda is cut out of the source text in turn, and every kernel that
//! needs it is run against the CPU again, under three seeds, and must now fail; the same
//! runs pass with the barrier in place, and a kernel that runs a barrier it does not need
//! (the first of a block reduction that is its only one) passes without it.

use crate::attention::Dims;
use crate::classifier::{classifier, vocab_shard, FILLS};
use crate::fused_attention::{fused_attention, Fused, FP32, GROUPED, ODD, SPEC, TWO_TILES};
use crate::fused_attention_mma::{BF16, BF16_HS128};
use crate::harness::{Family, Storage};
use crate::rowwise::{bias_kernels, loss_mean, sum_of_squares};
use kernels::cuda::launch::SUM_SQUARES_CHUNK;
use kernels::cuda::sources::{HEADERS, SOURCES};
use kernels::CausalMask;

const BARRIER: &str = "__syncthreads();";

/// The text of `file` without its `k`-th barrier.
fn without_barrier(file: &str, k: usize) -> String {
    let text =
        SOURCES.iter().map(|s| (s.name, s.source)).chain(HEADERS.iter().copied()).find(|(f, _)| *f == file);
    let text = text.unwrap_or_else(|| panic!("no file {file} in kernels/cuda")).1;
    let at = text.match_indices(BARRIER).nth(k).unwrap_or_else(|| panic!("{file} has no barrier {k}")).0;
    format!("{}/* barrier removed */{}", &text[..at], &text[at + BARRIER.len()..])
}

/// A kernel run against the CPU by a family, whole or with an edit.
type Check = fn(intact: &Family, edited: &Family, seed: u64) -> Result<(), String>;

/// 16 rows of a 3000-token vocabulary (padded to 3072), with and without the gradient: six
/// columns per thread, so every warp reduces real values.
fn classifier_kernel(_: &Family, edited: &Family, seed: u64) -> Result<(), String> {
    classifier(edited, Storage::F32, 16, 3000, &FILLS[..1], seed)
}

/// The same rows through the bf16-storage twin, which shares the kernel's body and so its
/// barriers.
fn classifier_bf16_kernel(_: &Family, edited: &Family, seed: u64) -> Result<(), String> {
    classifier(edited, Storage::Bf16, 16, 3000, &FILLS[..1], seed)
}

/// The same rows as a shard's (3000 columns, unpadded), through the statistics, which
/// reduce as the classifier does, then the dlogits.
fn vocab_shard_kernel(_: &Family, edited: &Family, seed: u64) -> Result<(), String> {
    vocab_shard(edited, Storage::F32, 16, 3000, seed)
}

/// Stage one over four blocks of one tensor and one of another. Stage two over sixteen
/// tensors of 40 partial sums each (chunks of 1024), so that every warp of each of its
/// blocks reduces real values.
const SQUARES: [usize; 2] = [3 * 65536 + 5, 1001];
const SQUARES_STAGE_TWO: ([usize; 16], usize) = ([40 * 1024 - 3; 16], 1024);

fn sum_squares_chunks_kernel(intact: &Family, edited: &Family, seed: u64) -> Result<(), String> {
    sum_of_squares(edited, intact, &SQUARES, 0, SUM_SQUARES_CHUNK, seed)
}

fn sum_squares_totals_kernel(intact: &Family, edited: &Family, seed: u64) -> Result<(), String> {
    let (lens, chunk) = SQUARES_STAGE_TWO;
    sum_of_squares(intact, edited, &lens, 0, chunk, seed)
}

/// Twelve chunks of rows over four blocks of columns (the last a partial one): the first
/// twelve warps of each block sum a chunk each, and the first warp adds their sums.
fn add_partials_kernel(_: &Family, edited: &Family, seed: u64) -> Result<(), String> {
    bias_kernels(edited, Storage::F32, 11 * 64 + 5, 101, seed)
}

/// Three chunks of losses and a part: thread 0 adds each chunk while the others staged it.
fn loss_mean_kernel(_: &Family, edited: &Family, seed: u64) -> Result<(), String> {
    loss_mean(edited, 3 * 2048 + 100, seed)
}

/// Every head of two odd sequences (T = 37: one tile of 64 rows, streamed by the backward
/// kernels in two tiles of keys and three of queries), then both heads of T = 100 (two
/// tiles, so the forward streams two key tiles), with dropout, through all three fused
/// kernels.
fn fused_attention_kernels(_: &Family, edited: &Family, seed: u64) -> Result<(), String> {
    let heads: Vec<usize> = (0..ODD.heads()).collect();
    fused_attention(edited, &FP32, ODD, &heads, Some(SPEC), seed)?;
    fused_attention(edited, &FP32, TWO_TILES, &[0, 1], Some(SPEC), seed)
}

/// The same through the tensor-core kernels, their tensors in bf16: every head of two
/// sequences of T = 77 with dropout, 4 query heads a key/value head, so that the key side
/// streams the query tiles of four heads in turn; and every head of a sequence held in one
/// streamed query tile, 2 query heads a key/value head (T = 37 at head size 64, 20 at
/// 128). There a head's one query tile is both its first and its last, and dq's sum for it
/// is key tile 0's alone: the block waits for no turn and hands on none, so no barrier of
/// turns.cuh follows its dq product, and the next head's queries are staged into the
/// buffer whose dS^T other warps may still be reading.
fn fused_attention_bf16(kernels: &Fused, one_tile: usize, edited: &Family, seed: u64) -> Result<(), String> {
    let heads: Vec<usize> = (0..GROUPED.heads()).collect();
    fused_attention(edited, kernels, GROUPED, &heads, Some(SPEC), seed)?;
    let one_tile = Dims { b: 1, t: one_tile, c: 64, nh: 4, kv: 2, mask: CausalMask::Full };
    let heads: Vec<usize> = (0..one_tile.heads()).collect();
    fused_attention(edited, kernels, one_tile, &heads, Some(SPEC), seed)
}

fn fused_attention_mma_kernels(_: &Family, edited: &Family, seed: u64) -> Result<(), String> {
    fused_attention_bf16(&BF16, 37, edited, seed)
}

fn fused_attention_hs128_kernels(_: &Family, edited: &Family, seed: u64) -> Result<(), String> {
    fused_attention_bf16(&BF16_HS128, 20, edited, seed)
}

/// A barrier of kernels/cuda: the `index`-th in `file`, what it orders, the kernels that
/// need it, and those that run it without needing it (the only reduction they make).
struct Barrier {
    file: &'static str,
    index: usize,
    orders: &'static str,
    needed_by: &'static [Needs],
    spare_in: &'static [Needs],
}

/// A kernel, its family, and how to check it.
struct Needs(&'static str, &'static str, Check);

const CLASSIFIER: Needs = Needs("fused_classifier", "classifier.cu", classifier_kernel);
const CLASSIFIER_BF16: Needs = Needs("fused_classifier_bf16", "classifier.cu", classifier_bf16_kernel);
const SHARD_STATS: Needs = Needs("vocab_shard_stats", "classifier.cu", vocab_shard_kernel);
const FORWARD: Needs = Needs("fused_attention_forward", "fused_attention.cu", fused_attention_kernels);
const QUERY: Needs = Needs("fused_attention_backward_query", "fused_attention.cu", fused_attention_kernels);
const SQUARES_PARTIAL: Needs = Needs("sum_squares_chunks", "sum_squares.cu", sum_squares_chunks_kernel);
const SQUARES_TOTAL: Needs = Needs("sum_squares_totals", "sum_squares.cu", sum_squares_totals_kernel);
const LOSS_MEAN: Needs = Needs("loss_mean", "loss_mean.cu", loss_mean_kernel);
const ADD_PARTIALS: Needs = Needs("add_partials", "bias.cu", add_partials_kernel);
const KEY_VALUE: Needs =
    Needs("fused_attention_backward_key_value", "fused_attention.cu", fused_attention_kernels);

const FORWARD_BF16: Needs =
    Needs("fused_attention_forward_bf16", "fused_attention_mma.cu", fused_attention_mma_kernels);
const FORWARD_HS128: Needs =
    Needs("fused_attention_forward_bf16_hs128", "fused_attention_mma.cu", fused_attention_hs128_kernels);
const CHAINED: Needs =
    Needs("fused_attention_backward_bf16", "fused_attention_mma.cu", fused_attention_mma_kernels);
const CHAINED_HS128: Needs =
    Needs("fused_attention_backward_bf16_hs128", "fused_attention_mma.cu", fused_attention_hs128_kernels);

const BARRIERS: &[Barrier] = &[
    // block_sum's first barrier guards a previous reduction's reads of the scratch; the sums
    // of squares make one reduction each, so none needs it yet.
    Barrier {
        file: "common.cuh",
        index: 0,
        orders: "block_sum: a previous block reduction has read the scratch it overwrites",
        needed_by: &[],
        spare_in: &[SQUARES_PARTIAL, SQUARES_TOTAL],
    },
    Barrier {
        file: "common.cuh",
        index: 1,
        orders: "block_sum: every warp's sum is in scratch before any is read",
        needed_by: &[SQUARES_PARTIAL, SQUARES_TOTAL],
        spare_in: &[],
    },
    Barrier {
        file: "classifier.cu",
        index: 0,
        orders: "block_merge: every warp's maximum and sum are in scratch before any is read",
        needed_by: &[CLASSIFIER, CLASSIFIER_BF16, SHARD_STATS],
        spare_in: &[],
    },
    Barrier {
        file: "classifier.cu",
        index: 1,
        orders: "every thread has read the target's logit before the row is overwritten",
        needed_by: &[CLASSIFIER, CLASSIFIER_BF16],
        spare_in: &[],
    },
    Barrier {
        file: "bias.cu",
        index: 0,
        orders: "add_partials: every warp's sum of its run of chunks is staged before the first warp adds them",
        needed_by: &[ADD_PARTIALS],
        spare_in: &[],
    },
    Barrier {
        file: "loss_mean.cu",
        index: 0,
        orders: "a chunk of losses is staged before thread 0 adds it",
        needed_by: &[LOSS_MEAN],
        spare_in: &[],
    },
    Barrier {
        file: "loss_mean.cu",
        index: 1,
        orders: "thread 0 has added a chunk before the next overwrites it",
        needed_by: &[LOSS_MEAN],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention.cu",
        index: 0,
        orders: "forward: every thread is done with a tile's P and V before the next overwrites them",
        needed_by: &[FORWARD],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention.cu",
        index: 1,
        orders: "forward: the query, key and value tiles are loaded before they are read",
        needed_by: &[FORWARD],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention.cu",
        index: 2,
        orders: "forward: every thread has read the key tile before P overwrites it",
        needed_by: &[FORWARD],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention.cu",
        index: 3,
        orders: "forward: P is written before it is read",
        needed_by: &[FORWARD],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention.cu",
        index: 4,
        orders: "backward, query side: dout's tile is loaded before delta is taken from it",
        needed_by: &[QUERY],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention.cu",
        index: 5,
        orders: "backward, query side: every thread is done with a key tile and its dS before the next",
        needed_by: &[QUERY],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention.cu",
        index: 6,
        orders: "backward, query side: the key and value tiles are loaded before they are read",
        needed_by: &[QUERY],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention.cu",
        index: 7,
        orders: "backward, query side: every thread has read the value tile before dS overwrites it",
        needed_by: &[QUERY],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention.cu",
        index: 8,
        orders: "backward, query side: dS is written before it is read",
        needed_by: &[QUERY],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention.cu",
        index: 9,
        orders: "backward, key side: every thread is done with a query tile, P' and dS before the next",
        needed_by: &[KEY_VALUE],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention.cu",
        index: 10,
        orders: "backward, key side: the query tile (and the key tile) are loaded before they are read",
        needed_by: &[KEY_VALUE],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention.cu",
        index: 11,
        orders: "backward, key side: P' and dS are written before they are read",
        needed_by: &[KEY_VALUE],
        spare_in: &[],
    },
    // The tensor-core kernels stage the streamed side double-buffered: one barrier a tile,
    // at its top, both publishes the tile staged during the previous one and retires the
    // buffer that the next tile's staging overwrites.
    Barrier {
        file: "fused_attention_mma.cu",
        index: 0,
        orders: "bf16 forward: a key tile is staged before it is read, and read before its buffer is restaged",
        needed_by: &[FORWARD_BF16, FORWARD_HS128],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention_mma.cu",
        index: 1,
        orders: "bf16 backward: every warp is done with a query head's last tile, its dS^T among them, before the next head's first is staged",
        needed_by: &[CHAINED, CHAINED_HS128],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention_mma.cu",
        index: 2,
        orders: "bf16 backward: a query tile, lse and delta are staged before read, read before restaging",
        needed_by: &[CHAINED, CHAINED_HS128],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention_mma.cu",
        index: 3,
        orders: "bf16 backward: every warp is done with a tile's queries and output gradients before dS^T and the next output gradients overwrite them",
        needed_by: &[CHAINED, CHAINED_HS128],
        spare_in: &[],
    },
    Barrier {
        file: "fused_attention_mma.cu",
        index: 4,
        orders: "bf16 backward: dS^T is staged whole before any warp reads its columns",
        needed_by: &[CHAINED, CHAINED_HS128],
        spare_in: &[],
    },
    Barrier {
        file: "turns.cuh",
        index: 0,
        orders: "take_ticket: thread 0's ticket is in shared memory before the block reads it",
        needed_by: &[CHAINED, CHAINED_HS128],
        spare_in: &[],
    },
    // The turns' other two barriers order memory between blocks: the previous holder's
    // stores before this block's reads, this block's stores before the next holder's. The
    // emulator runs one block at a time, so every store is seen in any case and no run
    // here can show them needed; they are needed on a GPU (turns.cuh).
    Barrier {
        file: "turns.cuh",
        index: 1,
        orders: "wait_turn: thread 0's acquire of the turn comes before any thread's read of the sum (between blocks)",
        needed_by: &[],
        spare_in: &[],
    },
    Barrier {
        file: "turns.cuh",
        index: 2,
        orders: "pass_turn: every thread's store to the sum comes before thread 0's release of the turn (between blocks)",
        needed_by: &[],
        spare_in: &[],
    },
];

const SEEDS: [u64; 3] = [21, 22, 23];

#[test]
fn every_barrier_is_listed() {
    let files = SOURCES.iter().map(|s| (s.name, s.source)).chain(HEADERS.iter().copied());
    for (file, text) in files {
        let listed = BARRIERS.iter().filter(|b| b.file == file).count();
        assert_eq!(listed, text.matches(BARRIER).count(), "{file}: barriers in the text vs listed here");
    }
}

#[test]
fn removing_a_needed_barrier_fails_the_harness() {
    let test = "removing_a_needed_barrier_fails_the_harness";
    let pairs: Vec<(&Barrier, &Needs)> =
        BARRIERS.iter().flat_map(|b| b.needed_by.iter().map(move |needs| (b, needs))).collect();
    assert_eq!(pairs.len(), 34, "barrier and kernel pairs checked");
    // Every kernel passes with all its barriers, on every seed, before an edit is judged.
    let mut kernels: Vec<&Needs> = pairs.iter().map(|(_, needs)| *needs).collect();
    kernels.sort_by_key(|needs| needs.0);
    kernels.dedup_by_key(|needs| needs.0);
    for &Needs(kernel, family, check) in kernels {
        let Some(intact) = Family::of(test, family) else { return };
        for seed in SEEDS {
            check(&intact, &intact, seed)
                .unwrap_or_else(|e| panic!("{kernel} fails with every barrier: {e}"));
        }
    }
    // Two edits at a time: most of this test is the C++ compiler's, building each edited
    // family.
    std::thread::scope(|scope| {
        for half in pairs.chunks(pairs.len().div_ceil(2)) {
            scope.spawn(move || {
                for (barrier, &Needs(kernel, family, check)) in half {
                    let (file, k, what) = (barrier.file, barrier.index, barrier.orders);
                    let intact = Family::of(test, family).expect("built above");
                    let edited = Family::edited(test, family, &[(file, without_barrier(file, k))])
                        .expect("a compiler");
                    for seed in SEEDS {
                        match check(&intact, &edited, seed) {
                            Err(e) => {
                                eprintln!("{kernel} without {file} barrier {k} ({what}), seed {seed}: {e}")
                            }
                            Ok(()) => {
                                panic!("{kernel} passes without {file} barrier {k} ({what}), seed {seed}")
                            }
                        }
                    }
                }
            });
        }
    });
}

#[test]
fn removing_a_spare_barrier_changes_nothing() {
    let test = "removing_a_spare_barrier_changes_nothing";
    for barrier in BARRIERS {
        let (file, k) = (barrier.file, barrier.index);
        for &Needs(kernel, family, check) in barrier.spare_in {
            let Some(intact) = Family::of(test, family) else { return };
            let edited =
                Family::edited(test, family, &[(file, without_barrier(file, k))]).expect("a compiler");
            for seed in SEEDS {
                check(&intact, &edited, seed)
                    .unwrap_or_else(|e| panic!("{kernel} without {file} barrier {k}, seed {seed}: {e}"));
            }
        }
    }
}
