//! QK-norm's geometry: the rows of the fused qkv [N,(NH+2*KV)*hs] it normalises, each head
//! (Qwen3's, Megatron's `qk_layernorm`) or each token's whole query and whole key projection
//! (OLMo 2's). Under grouped-query attention the two projections differ in width, so a
//! query row and a key row need not be as wide. Under tensor parallelism a whole projection
//! is cut across the ranks, so its norm runs in two halves with the group's sum between
//! them (`Device::qk_norm_sum_squares` and the `_summed` ops).

/// What one QK-norm normalises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNormSpan {
    /// Each query and key head, one weight [hs] for the query heads and one for the key
    /// heads (Qwen3's, Megatron's `qk_layernorm`).
    Head,
    /// The whole query projection and the whole key projection of each token, one weight
    /// [NH hs] and one [KV hs] (OLMo 2's and OLMo 3's).
    Projection,
}

impl QkNormSpan {
    pub const ALL: [QkNormSpan; 2] = [QkNormSpan::Head, QkNormSpan::Projection];

    /// The config's spelling.
    pub fn name(self) -> &'static str {
        match self {
            QkNormSpan::Head => "head",
            QkNormSpan::Projection => "projection",
        }
    }

    /// The rows this span normalises in a token of qkv with `nh` query heads and `kv`
    /// key/value heads of `hs`.
    pub fn rows(self, nh: usize, kv: usize, hs: usize) -> QkNormRows {
        match self {
            QkNormSpan::Head => QkNormRows { q_rows: nh, q_width: hs, k_rows: kv, k_width: hs },
            QkNormSpan::Projection => QkNormRows { q_rows: 1, q_width: nh * hs, k_rows: 1, k_width: kv * hs },
        }
    }
}

/// QK-norm on a rank's qkv [B,T,(NH+2*KV)*hs]: its NH query and KV key/value heads and the
/// rows `span` names over them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QkNormHeads {
    pub heads: usize,
    pub kv_heads: usize,
    pub span: QkNormSpan,
}

/// The rows QK-norm normalises in each token of qkv: `q_rows` rows of `q_width` from the
/// token's start (its query side), then `k_rows` of `k_width` (its key side); the value
/// heads, as wide as the key side, follow untouched. Each row is one RMSNorm row with the
/// query weight [q_width] or the key weight [k_width].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QkNormRows {
    pub q_rows: usize,
    pub q_width: usize,
    pub k_rows: usize,
    pub k_width: usize,
}

impl QkNormRows {
    /// A token's width in qkv: the query side, the key side and the value side.
    pub fn token_width(&self) -> usize {
        self.q_rows * self.q_width + 2 * self.k_rows * self.k_width
    }

    /// Normalised rows per token: its query rows, then its key rows.
    pub fn rows(&self) -> usize {
        self.q_rows + self.k_rows
    }

    /// Row `r` of a token: where it starts in the token, its width and its weight (0 the
    /// query weight, 1 the key weight).
    pub fn row(&self, r: usize) -> (usize, usize, usize) {
        match r.checked_sub(self.q_rows) {
            None => (r * self.q_width, self.q_width, 0),
            Some(k) => (self.q_rows * self.q_width + k * self.k_width, self.k_width, 1),
        }
    }

    /// The widths of the two weights, [q, k].
    pub fn weight_widths(&self) -> [usize; 2] {
        [self.q_width, self.k_width]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rows_tile_the_query_and_key_sides_and_leave_the_values() {
        for span in QkNormSpan::ALL {
            let r = span.rows(8, 2, 6);
            assert_eq!(r.token_width(), (8 + 2 * 2) * 6);
            let mut next = 0;
            for i in 0..r.rows() {
                let (at, width, weight) = r.row(i);
                assert_eq!((at, width), (next, r.weight_widths()[weight]), "{span:?} row {i}");
                assert_eq!(weight, usize::from(i >= r.q_rows));
                next = at + width;
            }
            assert_eq!(next, (8 + 2) * 6, "{span:?}: the rows end where the values start");
        }
        assert_eq!(QkNormSpan::Projection.rows(8, 2, 6).weight_widths(), [48, 12]);
        assert_eq!(QkNormSpan::Head.rows(8, 2, 6).weight_widths(), [6, 6]);
    }
}
