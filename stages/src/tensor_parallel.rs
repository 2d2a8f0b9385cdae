//! How Megatron-LM splits one transformer layer over t tensor-parallel ranks (Shoeybi et
//! al. 2019), optionally with sequence parallelism (Korthikanti et al. 2022): the facts the
//! simulator needs to turn a whole layer's FLOPs, bytes and parameters into one rank's.
//!
//! * The attention (q, k, v by heads) and the MLP interior (c_fc by columns, c_proj by rows)
//!   are split: their matmuls, the attention core and the tensors between them divide by t.
//! * The rest of the layer (LayerNorms, residual dropouts, the layer's input and output)
//!   is replicated on every rank, or, with sequence parallelism, split along the sequence.
//! * Which stored tensor is which is declared per tensor in `saved.rs`
//!   ([`crate::saved::BlockTensor::split`]), which parameter is split in `params.rs`.
//!
//! The simulator models any t from these; the trainer runs one [`Shard`] per rank.

use crate::model::ModelShape;

use kernels::{QkNormSpan, OTHER_SHARD};
use std::borrow::Cow;
use std::ops::Range;

/// The tensor-parallel layout of every layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorParallel {
    /// t, ranks that share each layer.
    pub size: usize,
    /// Sequence parallelism: the replicated part of the layer splits along the sequence.
    pub sequence: bool,
    /// Megatron's `distribute_saved_activations`: the input a full recompute keeps is split
    /// over the t ranks, each keeping 1/t of it, gathered before the recompute.
    pub distribute_saved: bool,
}

/// How a stored tensor or a parameter is laid out over the t ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Inside the attention or the MLP (or the vocab-parallel embedding): 1/t per rank.
    Interior,
    /// Outside them: whole on every rank, or 1/t of the sequence with sequence parallelism.
    Sequence,
    /// Whole on every rank whatever the layout (LayerNorm parameters, row-parallel biases,
    /// the position embedding).
    Replicated,
}

/// A collective among the t ranks of a layer, on a [B,T,C] activation or its gradient.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
}

impl Collective {
    /// Bytes each rank sends in a ring over `ranks` for a `bytes`-sized whole tensor:
    /// 2(t-1)/t of it for an all-reduce, (t-1)/t for the others.
    pub fn ring_bytes(self, bytes: f64, ranks: usize) -> f64 {
        let t = ranks as f64;
        let share = (t - 1.0) / t;
        match self {
            Collective::AllReduce => 2.0 * share * bytes,
            Collective::AllGather | Collective::ReduceScatter => share * bytes,
        }
    }
}

/// The collectives of one layer's pass on each rank: on [B,T,C]-sized tensors, and on
/// per-token statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerCollectives {
    pub all_reduce: usize,
    pub all_gather: usize,
    pub reduce_scatter: usize,
    /// All-reduces of per-token statistics: QK-norm's [B,T,2] where the ranks split the
    /// projections it normalises. A latency each; their bytes are nothing beside the rest.
    pub statistics: usize,
}

impl LayerCollectives {
    /// Every collective of the pass, each a latency.
    pub fn count(&self) -> usize {
        self.all_reduce + self.all_gather + self.reduce_scatter + self.statistics
    }

    /// Bytes one rank sends for them, each [B,T,C] collective on a `bytes`-sized whole
    /// tensor (the statistics' left out).
    pub fn ring_bytes(&self, bytes: f64, ranks: usize) -> f64 {
        self.all_reduce as f64 * Collective::AllReduce.ring_bytes(bytes, ranks)
            + self.all_gather as f64 * Collective::AllGather.ring_bytes(bytes, ranks)
            + self.reduce_scatter as f64 * Collective::ReduceScatter.ring_bytes(bytes, ranks)
    }
}

impl TensorParallel {
    /// One rank holds the whole layer: the trainer's layout.
    pub const NONE: TensorParallel = TensorParallel { size: 1, sequence: false, distribute_saved: false };

    /// Elements one rank holds of a tensor of `elements` laid out as `split` (the largest
    /// share where t does not divide it, as a vocabulary that Megatron would pad).
    pub fn per_rank(&self, elements: usize, split: Split) -> usize {
        match split {
            Split::Interior => elements.div_ceil(self.size),
            Split::Sequence if self.sequence => elements.div_ceil(self.size),
            Split::Sequence | Split::Replicated => elements,
        }
    }

    /// The collectives of one block's forward. Without sequence parallelism the attention's
    /// and the MLP's row-parallel outputs are all-reduced (Megatron's `g`); with it, each of
    /// the two is entered by an all-gather of the sequence shards and left by a
    /// reduce-scatter. QK-norm over whole projections, which the ranks split by heads, adds
    /// the all-reduce of each token's sums of squares. A full recompute runs the forward
    /// again, collectives included.
    pub fn block_forward(&self, s: &ModelShape) -> LayerCollectives {
        let statistics = usize::from(self.splits_qk_norm_rows(s));
        match (self.size, self.sequence) {
            (1, _) => LayerCollectives::default(),
            (_, false) => LayerCollectives { all_reduce: 2, statistics, ..Default::default() },
            (_, true) => {
                LayerCollectives { all_gather: 2, reduce_scatter: 2, statistics, ..Default::default() }
            }
        }
    }

    /// Whether each rank holds only part of QK-norm's rows: the norm spans whole
    /// projections, and the ranks split the heads.
    fn splits_qk_norm_rows(&self, s: &ModelShape) -> bool {
        self.size > 1 && s.arch.qk_norm && s.arch.qk_norm_span == QkNormSpan::Projection
    }

    /// The vocab-parallel embedding's forward: each rank looks up its vocabulary rows and the
    /// partial outputs are summed (all-reduce, or reduce-scatter into sequence shards).
    pub fn embedding_forward(&self) -> LayerCollectives {
        match (self.size, self.sequence) {
            (1, _) => LayerCollectives::default(),
            (_, false) => LayerCollectives { all_reduce: 1, ..Default::default() },
            (_, true) => LayerCollectives { reduce_scatter: 1, ..Default::default() },
        }
    }

    /// The head's forward, which runs its backward too: the vocab-parallel LM head's input
    /// gradient is all-reduced (with sequence parallelism its input is all-gathered and the
    /// gradient reduce-scattered). The cross-entropy's gather of each row's statistics is
    /// left out: one latency a microbatch.
    pub fn head_forward(&self) -> LayerCollectives {
        match (self.size, self.sequence) {
            (1, _) => LayerCollectives::default(),
            (_, false) => LayerCollectives { all_reduce: 1, ..Default::default() },
            (_, true) => LayerCollectives { all_gather: 1, reduce_scatter: 1, ..Default::default() },
        }
    }

    /// The collectives of one block's input-gradient pass: each forward collective's
    /// transpose (Megatron's `f`: all-reduce; all-gather <-> reduce-scatter), and split
    /// QK-norm's all-reduce of each token's sums of dnorm x norm.
    pub fn block_backward_input(&self, s: &ModelShape) -> LayerCollectives {
        let f = self.block_forward(s);
        LayerCollectives {
            all_reduce: f.all_reduce,
            all_gather: f.reduce_scatter,
            reduce_scatter: f.all_gather,
            statistics: f.statistics,
        }
    }

    /// The collectives of one block's weight-gradient pass: with sequence parallelism the
    /// column-parallel matmuls (c_attn, c_fc) kept only their input's sequence shard, so
    /// Megatron all-gathers it again for each weight gradient.
    pub fn block_backward_weight(&self) -> LayerCollectives {
        match (self.size, self.sequence) {
            (1, _) | (_, false) => LayerCollectives::default(),
            (_, true) => LayerCollectives { all_gather: 2, ..Default::default() },
        }
    }
}

/// One rank's part of every tensor-parallel layer: shard `rank` of `size`. Its heads and
/// key/value groups, its columns of the MLP and its rows of the vocabulary are the
/// `rank`-th 1/size of each, as Megatron cuts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub size: usize,
    pub rank: usize,
    /// Sequence parallelism: the norms, dropout and residual run on this shard's 1/size of
    /// the tokens (contiguous rows of the microbatch's [B*T, C]).
    pub sequence: bool,
}

impl Shard {
    /// The whole layer on one rank (t = 1).
    pub const WHOLE: Shard = Shard { size: 1, rank: 0, sequence: false };

    /// The token rows this shard's norms, dropout and residual run on: its 1/t of the
    /// microbatch's with sequence parallelism, all of them without.
    pub fn rows(&self, s: &ModelShape) -> Range<usize> {
        match self.sequence {
            true => self.part(s.tokens(), 0),
            false => 0..s.tokens(),
        }
    }

    /// Query heads of this shard.
    pub fn heads(&self, s: &ModelShape) -> usize {
        s.heads / self.size
    }

    /// Key/value heads of this shard: its query heads' groups.
    pub fn kv_heads(&self, s: &ModelShape) -> usize {
        s.kv_heads / self.size
    }

    /// Columns of the MLP's inner width.
    pub fn ffn(&self, s: &ModelShape) -> usize {
        s.ffn / self.size
    }

    /// Columns of the fused q, k, v projection: this shard's query heads, then its key and
    /// value heads.
    pub fn qkv_width(&self, s: &ModelShape) -> usize {
        (self.heads(s) + 2 * self.kv_heads(s)) * s.head_size()
    }

    /// Columns of the MLP's first projection (gate and up halves under SwiGLU).
    pub fn fc1_width(&self, s: &ModelShape) -> usize {
        s.arch.activation.fc1_width(self.ffn(s))
    }

    /// Columns of the attention's output before its projection: this shard's heads.
    pub fn attention_width(&self, s: &ModelShape) -> usize {
        s.attention_width() / self.size
    }

    /// The vocabulary rows of the embedding and the output layer this shard holds.
    pub fn vocab(&self, s: &ModelShape) -> Range<usize> {
        let rows = s.vocab / self.size;
        self.rank * rows..(self.rank + 1) * rows
    }

    /// `tokens` as this shard numbers its vocabulary rows, another shard's as
    /// [`OTHER_SHARD`]: what the embedding and the loss take.
    pub fn vocab_ids<'t>(&self, s: &ModelShape, tokens: &'t [u32]) -> Cow<'t, [u32]> {
        if self.size == 1 {
            return Cow::Borrowed(tokens);
        }
        let rows = self.vocab(s);
        let local = |tok: u32| match rows.contains(&(tok as usize)) {
            true => tok - rows.start as u32,
            false => OTHER_SHARD,
        };
        Cow::Owned(tokens.iter().map(|&tok| local(tok)).collect())
    }

    /// The `rank`-th of `size` equal parts of `0..n`, shifted by `offset`.
    fn part(&self, n: usize, offset: usize) -> Range<usize> {
        let len = n / self.size;
        offset + self.rank * len..offset + (self.rank + 1) * len
    }

    /// The ranges of the fused q, k, v width this shard holds: its query heads', its key
    /// heads', its value heads'.
    pub fn qkv_ranges(&self, s: &ModelShape) -> Vec<Range<usize>> {
        let hs = s.head_size();
        let (q, kv) = (s.heads * hs, s.kv_heads * hs);
        vec![self.part(q, 0), self.part(kv, q), self.part(kv, q + kv)]
    }

    /// The ranges of the MLP's first projection this shard holds: its columns of each half.
    pub fn fc1_ranges(&self, s: &ModelShape) -> Vec<Range<usize>> {
        let f = s.ffn;
        (0..s.arch.activation.fc1_width(1)).map(|half| self.part(f, half * f)).collect()
    }

    /// This shard's part of an `n`-wide dimension cut in one piece (attention heads' columns,
    /// the MLP's inner width, the vocabulary).
    pub fn even(&self, n: usize) -> Vec<Range<usize>> {
        vec![self.part(n, 0)]
    }
}

/// Where a tensor of a tensor-parallel layer is cut: the ranges of one axis of a row-major
/// tensor that a shard holds, concatenated in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    /// 0: ranges of rows; 1: ranges of columns (of a 2-D tensor).
    pub axis: usize,
    pub ranges: Vec<Range<usize>>,
}

impl Cut {
    /// The shard's shape of a whole tensor of `shape`.
    pub fn shape(&self, shape: &[usize]) -> Vec<usize> {
        let mut local = shape.to_vec();
        local[self.axis] = self.ranges.iter().map(|r| r.len()).sum();
        local
    }

    /// The shard's elements of `whole` [shape], row-major in its own shape.
    pub fn slice(&self, shape: &[usize], whole: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.shape(shape).iter().product());
        self.walk(shape, |local, len| out.extend_from_slice(&whole[local..local + len]));
        out
    }

    /// Writes the shard's elements `part` into their places in `whole` [shape].
    pub fn place(&self, shape: &[usize], part: &[f32], whole: &mut [f32]) {
        let mut at = 0;
        self.walk(shape, |local, len| {
            whole[local..local + len].copy_from_slice(&part[at..at + len]);
            at += len;
        });
    }

    /// Calls `run(start, len)` for each contiguous run of the shard's elements in a whole
    /// row-major tensor of `shape`, in the shard's order.
    fn walk(&self, shape: &[usize], mut run: impl FnMut(usize, usize)) {
        let row: usize = shape[1..].iter().product();
        match self.axis {
            0 => self.ranges.iter().for_each(|r| run(r.start * row, r.len() * row)),
            _ => {
                for i in 0..shape[0] {
                    self.ranges.iter().for_each(|r| run(i * row + r.start, r.len()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Architecture;

    #[test]
    fn ring_bytes_are_megatrons() {
        // An all-reduce moves 2(t-1)/t of the tensor per rank; an all-gather half that.
        assert_eq!(Collective::AllReduce.ring_bytes(800.0, 8), 1400.0);
        assert_eq!(Collective::AllGather.ring_bytes(800.0, 8), 700.0);
        assert_eq!(Collective::ReduceScatter.ring_bytes(800.0, 1), 0.0);
        // Sequence parallelism moves the same bytes as the all-reduces it replaces.
        let (tp, sp) = (
            TensorParallel { size: 8, sequence: false, distribute_saved: false },
            TensorParallel { size: 8, sequence: true, distribute_saved: false },
        );
        let s = ModelShape::GPT2_SMALL;
        assert_eq!(tp.block_forward(&s).ring_bytes(800.0, 8), sp.block_forward(&s).ring_bytes(800.0, 8));
    }

    /// Megatron's collectives per transformer layer (Korthikanti et al. 2022, section 4.2.2):
    /// two all-reduces in forward and two in backward; with sequence parallelism two
    /// all-gathers and two reduce-scatters each way, plus the all-gathers that the
    /// column-parallel weight gradients repeat.
    #[test]
    fn collectives_per_layer() {
        let c = |all_reduce, all_gather, reduce_scatter| LayerCollectives {
            all_reduce,
            all_gather,
            reduce_scatter,
            statistics: 0,
        };
        let tp = TensorParallel { size: 8, sequence: false, distribute_saved: false };
        let sp = TensorParallel { sequence: true, ..tp };
        let s = ModelShape::GPT2_SMALL;
        let passes =
            |t: TensorParallel| [t.block_forward(&s), t.block_backward_input(&s), t.block_backward_weight()];
        assert_eq!(passes(tp), [c(2, 0, 0), c(2, 0, 0), c(0, 0, 0)]);
        assert_eq!(passes(sp), [c(0, 2, 2), c(0, 2, 2), c(0, 2, 0)]);
        assert_eq!(passes(TensorParallel::NONE), [c(0, 0, 0); 3]);
        assert_eq!(
            passes(TensorParallel { size: 1, sequence: true, distribute_saved: false }),
            [c(0, 0, 0); 3]
        );
        assert_eq!([tp.embedding_forward(), tp.head_forward()], [c(1, 0, 0), c(1, 0, 0)]);
        assert_eq!([sp.embedding_forward(), sp.head_forward()], [c(0, 0, 1), c(0, 1, 1)]);
    }

    /// QK-norm over whole projections (OLMo 2's) adds one all-reduce of each token's
    /// statistics to a block's forward and one to its input-gradient pass, where the ranks
    /// split the heads; QK-norm over each head (Qwen3's) is whole on every rank.
    #[test]
    fn split_qk_norm_adds_an_all_reduce_of_statistics_each_way() {
        let arch =
            |span| Architecture { qk_norm: true, qk_norm_span: span, ..Architecture::llama(10000.0, 1e-6) };
        let olmo2 = ModelShape { arch: arch(QkNormSpan::Projection), ..ModelShape::GPT2_SMALL };
        let qwen3 = ModelShape { arch: arch(QkNormSpan::Head), ..ModelShape::GPT2_SMALL };
        let tp = TensorParallel { size: 2, sequence: false, distribute_saved: false };
        let sp = TensorParallel { sequence: true, ..tp };
        let statistics = |t: TensorParallel, s: &ModelShape| {
            [t.block_forward(s), t.block_backward_input(s), t.block_backward_weight()].map(|c| c.statistics)
        };
        assert_eq!(statistics(tp, &olmo2), [1, 1, 0]);
        assert_eq!(statistics(sp, &olmo2), [1, 1, 0]);
        assert_eq!(statistics(tp, &qwen3), [0, 0, 0]);
        assert_eq!(statistics(TensorParallel::NONE, &olmo2), [0, 0, 0]);
        let (with, without) = (tp.block_forward(&olmo2), tp.block_forward(&qwen3));
        assert_eq!((with.count(), without.count()), (3, 2));
        assert_eq!(with.ring_bytes(800.0, 2), without.ring_bytes(800.0, 2), "a latency, no bandwidth");
    }

    #[test]
    fn per_rank_splits_follow_the_layout() {
        let tp = TensorParallel { size: 4, sequence: false, distribute_saved: false };
        let sp = TensorParallel { sequence: true, ..tp };
        assert_eq!(
            [Split::Interior, Split::Sequence, Split::Replicated].map(|s| tp.per_rank(64, s)),
            [16, 64, 64]
        );
        assert_eq!(
            [Split::Interior, Split::Sequence, Split::Replicated].map(|s| sp.per_rank(64, s)),
            [16, 16, 64]
        );
        assert_eq!(TensorParallel::NONE.per_rank(64, Split::Interior), 64);
    }

    #[test]
    fn a_cut_slices_and_places_rows_and_columns() {
        // [3, 4]: 0..12 row-major.
        let whole: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let cols = Cut { axis: 1, ranges: vec![0..1, 2..4] };
        assert_eq!(cols.shape(&[3, 4]), [3, 3]);
        assert_eq!(cols.slice(&[3, 4], &whole), [0., 2., 3., 4., 6., 7., 8., 10., 11.]);
        let middle = |n| Shard { size: n, rank: 1, ..Shard::WHOLE }.even(n); // [1..2]
        let rows = Cut { axis: 0, ranges: middle(3) };
        assert_eq!(rows.slice(&[3, 4], &whole), [4., 5., 6., 7.]);
        let mut back = vec![0.0; 12];
        cols.place(&[3, 4], &cols.slice(&[3, 4], &whole), &mut back);
        Cut { axis: 1, ranges: middle(4) }.place(&[3, 4], &[1., 5., 9.], &mut back);
        assert_eq!(back, whole);
    }

    /// Llama-3-8B's q, k, v and gate/up on shard 1 of 4: 8 query heads and 2 groups each.
    #[test]
    fn a_shard_holds_its_heads_groups_and_columns() {
        let s = ModelShape {
            arch: crate::model::Architecture::llama(5e5, 1e-5),
            hidden: 4096,
            heads: 32,
            kv_heads: 8,
            ffn: 14336,
            vocab: 128256,
            ..ModelShape::GPT2_SMALL
        };
        let shard = Shard { size: 4, rank: 1, sequence: false };
        assert_eq!((shard.heads(&s), shard.kv_heads(&s), shard.ffn(&s)), (8, 2, 3584));
        assert_eq!(shard.qkv_ranges(&s), [1024..2048, 4096 + 256..4096 + 512, 5120 + 256..5120 + 512]);
        assert_eq!(shard.qkv_width(&s), 1536);
        assert_eq!(shard.fc1_ranges(&s), [3584..7168, 14336 + 3584..14336 + 7168]);
        assert_eq!(shard.fc1_width(&s), 7168);
        assert_eq!(shard.vocab(&s), 32064..64128);
        assert_eq!(Shard::WHOLE.qkv_ranges(&s), [0..4096, 4096..5120, 5120..6144]);
    }
}
