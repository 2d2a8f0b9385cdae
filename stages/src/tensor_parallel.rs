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
//! The trainer runs t = 1 ([`TensorParallel::NONE`]); the simulator models t > 1.

/// The tensor-parallel layout of every layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorParallel {
    /// t, ranks that share each layer.
    pub size: usize,
    /// Sequence parallelism: the replicated part of the layer splits along the sequence.
    pub sequence: bool,
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

/// The collectives of one layer's pass on each rank, all on [B,T,C]-sized tensors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerCollectives {
    pub all_reduce: usize,
    pub all_gather: usize,
    pub reduce_scatter: usize,
}

impl LayerCollectives {
    /// Bytes one rank sends for them, each on a `bytes`-sized whole tensor.
    pub fn ring_bytes(&self, bytes: f64, ranks: usize) -> f64 {
        self.all_reduce as f64 * Collective::AllReduce.ring_bytes(bytes, ranks)
            + self.all_gather as f64 * Collective::AllGather.ring_bytes(bytes, ranks)
            + self.reduce_scatter as f64 * Collective::ReduceScatter.ring_bytes(bytes, ranks)
    }
}

impl TensorParallel {
    /// One rank holds the whole layer: the trainer's layout.
    pub const NONE: TensorParallel = TensorParallel { size: 1, sequence: false };

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
    /// reduce-scatter. A full recompute runs the forward again, collectives included.
    pub fn block_forward(&self) -> LayerCollectives {
        match (self.size, self.sequence) {
            (1, _) => LayerCollectives::default(),
            (_, false) => LayerCollectives { all_reduce: 2, ..Default::default() },
            (_, true) => LayerCollectives { all_gather: 2, reduce_scatter: 2, ..Default::default() },
        }
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
    /// gradient reduce-scattered). The cross-entropy's [B,T] all-reduces are left out.
    pub fn head_forward(&self) -> LayerCollectives {
        match (self.size, self.sequence) {
            (1, _) => LayerCollectives::default(),
            (_, false) => LayerCollectives { all_reduce: 1, ..Default::default() },
            (_, true) => LayerCollectives { all_gather: 1, reduce_scatter: 1, ..Default::default() },
        }
    }

    /// The collectives of one block's input-gradient pass: each forward collective's
    /// transpose (Megatron's `f`: all-reduce; all-gather <-> reduce-scatter).
    pub fn block_backward_input(&self) -> LayerCollectives {
        let f = self.block_forward();
        LayerCollectives {
            all_reduce: f.all_reduce,
            all_gather: f.reduce_scatter,
            reduce_scatter: f.all_gather,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_bytes_are_megatrons() {
        // An all-reduce moves 2(t-1)/t of the tensor per rank; an all-gather half that.
        assert_eq!(Collective::AllReduce.ring_bytes(800.0, 8), 1400.0);
        assert_eq!(Collective::AllGather.ring_bytes(800.0, 8), 700.0);
        assert_eq!(Collective::ReduceScatter.ring_bytes(800.0, 1), 0.0);
        // Sequence parallelism moves the same bytes as the all-reduces it replaces.
        let (tp, sp) =
            (TensorParallel { size: 8, sequence: false }, TensorParallel { size: 8, sequence: true });
        assert_eq!(tp.block_forward().ring_bytes(800.0, 8), sp.block_forward().ring_bytes(800.0, 8));
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
        };
        let tp = TensorParallel { size: 8, sequence: false };
        let sp = TensorParallel { sequence: true, ..tp };
        let passes =
            |t: TensorParallel| [t.block_forward(), t.block_backward_input(), t.block_backward_weight()];
        assert_eq!(passes(tp), [c(2, 0, 0), c(2, 0, 0), c(0, 0, 0)]);
        assert_eq!(passes(sp), [c(0, 2, 2), c(0, 2, 2), c(0, 2, 0)]);
        assert_eq!(passes(TensorParallel::NONE), [c(0, 0, 0); 3]);
        assert_eq!(passes(TensorParallel { size: 1, sequence: true }), [c(0, 0, 0); 3]);
        assert_eq!([tp.embedding_forward(), tp.head_forward()], [c(1, 0, 0), c(1, 0, 0)]);
        assert_eq!([sp.embedding_forward(), sp.head_forward()], [c(0, 0, 1), c(0, 1, 1)]);
    }

    #[test]
    fn per_rank_splits_follow_the_layout() {
        let tp = TensorParallel { size: 4, sequence: false };
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
}
