//! The activation recompute policy of one model chunk, with Megatron-LM's semantics:
//!
//! - `full` + `uniform`, N: the chunk's blocks are cut into groups of N (the last may be
//!   shorter); only each group's input is kept; in backward the group runs forward again,
//!   then backward.
//! - `full` + `block`, N: the first N blocks of the chunk keep only their inputs and are
//!   recomputed one by one; the others keep everything. N >= blocks recomputes all.
//! - `selective`: every block drops the tensors of the chosen modules (attention core by
//!   default) and recomputes them just before its backward.

/// Which modules selective recompute drops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SelectiveModules {
    /// The attention core: keeps only q, k, v; softmax probabilities recomputed.
    pub core_attn: bool,
    /// The MLP activation: GELU output recomputed from the c_fc output.
    pub mlp: bool,
    /// LayerNorm outputs, recomputed from their inputs and saved statistics.
    pub layernorm: bool,
}

impl SelectiveModules {
    pub const NONE: SelectiveModules = SelectiveModules { core_attn: false, mlp: false, layernorm: false };

    pub fn names(&self) -> Vec<&'static str> {
        [(self.core_attn, "core_attn"), (self.mlp, "mlp"), (self.layernorm, "layernorm")]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect()
    }
}

/// How a block keeps its activations for one microbatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKeep {
    /// Keeps every tensor except those the selective modules drop.
    Stored(SelectiveModules),
    /// Full recompute: keeps only its input, and only if it is the first block of its
    /// recompute group (the others' inputs are recomputed too).
    InputOnly { group_start: bool },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FullMethod {
    Uniform,
    Block,
}

/// One chunk's recompute policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecomputePolicy {
    None,
    Full { method: FullMethod, num_layers: usize },
    Selective(SelectiveModules),
}

/// A run of consecutive blocks of a chunk that are stored or recomputed together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Block offsets within the chunk, `start..end`.
    pub start: usize,
    pub end: usize,
    /// Full recompute: only the segment's input is kept.
    pub recompute: bool,
}

impl RecomputePolicy {
    /// Cuts a chunk of `blocks` blocks into segments.
    pub fn segments(&self, blocks: usize) -> Vec<Segment> {
        let stored = |start, end| Segment { start, end, recompute: false };
        match *self {
            RecomputePolicy::None | RecomputePolicy::Selective(_) => {
                if blocks == 0 {
                    vec![]
                } else {
                    vec![stored(0, blocks)]
                }
            }
            RecomputePolicy::Full { method: FullMethod::Uniform, num_layers } => (0..blocks)
                .step_by(num_layers.max(1))
                .map(|s| Segment { start: s, end: (s + num_layers).min(blocks), recompute: true })
                .collect(),
            RecomputePolicy::Full { method: FullMethod::Block, num_layers } => {
                let n = num_layers.min(blocks);
                let mut segs: Vec<Segment> =
                    (0..n).map(|s| Segment { start: s, end: s + 1, recompute: true }).collect();
                if n < blocks {
                    segs.push(stored(n, blocks));
                }
                segs
            }
        }
    }

    /// What block `offset` of a chunk of `blocks` blocks keeps in forward.
    pub fn block_keep(&self, blocks: usize, offset: usize) -> BlockKeep {
        let modules = match self {
            RecomputePolicy::Selective(m) => *m,
            _ => SelectiveModules::NONE,
        };
        self.segments(blocks)
            .into_iter()
            .find(|s| (s.start..s.end).contains(&offset))
            .map(|s| {
                if s.recompute {
                    BlockKeep::InputOnly { group_start: s.start == offset }
                } else {
                    BlockKeep::Stored(modules)
                }
            })
            .unwrap_or(BlockKeep::Stored(modules))
    }

    /// One line for reports, e.g. "full/uniform N=2" or "selective (core_attn, mlp)".
    pub fn describe(&self) -> String {
        match self {
            RecomputePolicy::None => "none".into(),
            RecomputePolicy::Full { method, num_layers } => {
                let m = if *method == FullMethod::Uniform { "uniform" } else { "block" };
                format!("full/{m} N={num_layers}")
            }
            RecomputePolicy::Selective(m) => format!("selective ({})", m.names().join(", ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(p: RecomputePolicy, blocks: usize) -> Vec<(usize, usize, bool)> {
        p.segments(blocks).iter().map(|s| (s.start, s.end, s.recompute)).collect()
    }

    #[test]
    fn megatron_segments() {
        let uniform = |n| RecomputePolicy::Full { method: FullMethod::Uniform, num_layers: n };
        let block = |n| RecomputePolicy::Full { method: FullMethod::Block, num_layers: n };
        assert_eq!(spans(uniform(2), 5), vec![(0, 2, true), (2, 4, true), (4, 5, true)]);
        assert_eq!(spans(uniform(8), 3), vec![(0, 3, true)]);
        assert_eq!(spans(block(2), 4), vec![(0, 1, true), (1, 2, true), (2, 4, false)]);
        assert_eq!(spans(block(9), 2), vec![(0, 1, true), (1, 2, true)]);
        assert_eq!(spans(RecomputePolicy::None, 3), vec![(0, 3, false)]);
        assert_eq!(uniform(2).block_keep(5, 3), BlockKeep::InputOnly { group_start: false });
        assert_eq!(uniform(2).block_keep(5, 4), BlockKeep::InputOnly { group_start: true });
        assert_eq!(block(1).block_keep(3, 2), BlockKeep::Stored(SelectiveModules::NONE));
    }

    #[test]
    fn selective_names() {
        let m = SelectiveModules { mlp: true, layernorm: true, ..SelectiveModules::NONE };
        assert_eq!(m.names(), vec!["mlp", "layernorm"]);
        assert_eq!(RecomputePolicy::Selective(m).describe(), "selective (mlp, layernorm)");
    }
}
