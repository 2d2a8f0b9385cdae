//! The transient operand copies of the trainer's bf16 matmuls on CUDA: each matmul casts
//! its two fp32 operands into bf16 scratch and frees it when it returns, so a pass holds at
//! once the copies of its largest matmul. Zero wherever the setup models no such copies
//! ([`Setup::matmul_copy_bytes_per_element`]).
//!
//! A matmul reads its input and weight forward, its output gradient and weight for the
//! input gradient, its output gradient and input for the weight gradient.

use super::setup::Setup;
use stages::tensor_parallel::Split;

/// One matmul's operands and output, in elements on one tensor-parallel rank.
struct Matmul {
    input: usize,
    weight: usize,
    output: usize,
}

impl Matmul {
    fn forward(&self) -> usize {
        self.input + self.weight
    }

    fn backward_input(&self) -> usize {
        self.output + self.weight
    }

    fn backward_weight(&self) -> usize {
        self.output + self.input
    }
}

/// A block's four matmuls: qkv, the attention's projection, fc, the MLP's projection. The
/// column-parallel ones read the whole [B,T,C] (gathered under sequence parallelism); their
/// outputs and the row-parallel ones' inputs are split.
fn block_matmuls(setup: &Setup) -> [Matmul; 4] {
    let (s, tp) = (&setup.shape, setup.tp);
    let (n, c, f) = (s.tokens(), s.hidden, s.ffn);
    let split = |elements| tp.per_rank(elements, Split::Interior);
    [
        Matmul { input: n * c, weight: split(3 * c * c), output: split(n * 3 * c) },
        Matmul { input: split(n * c), weight: split(c * c), output: n * c },
        Matmul { input: n * c, weight: split(f * c), output: split(n * f) },
        Matmul { input: split(n * f), weight: split(c * f), output: n * c },
    ]
}

/// The LM head: ln_f's output times the tied embedding, cast as a zero-padded copy of one
/// row per logits column, into the logits rows.
fn head_matmul(setup: &Setup) -> Matmul {
    let (s, tp) = (&setup.shape, setup.tp);
    let (n, columns) = (s.tokens(), setup.logits_columns());
    let split = |elements| tp.per_rank(elements, Split::Interior);
    Matmul { input: n * s.hidden, weight: split(columns * s.hidden), output: split(n * columns) }
}

fn bytes(setup: &Setup, elements: impl Iterator<Item = usize>) -> u64 {
    (elements.max().unwrap_or(0) * setup.matmul_copy_bytes_per_element()) as u64
}

/// A block's forward (or its recompute): the largest forward matmul's copies.
pub fn block_forward_bytes(setup: &Setup) -> u64 {
    bytes(setup, block_matmuls(setup).iter().map(Matmul::forward))
}

/// A block's backward-input: its largest backward matmul's copies, the weight gradients'
/// included (an unsplit backward runs them in the same pass).
pub fn block_backward_input_bytes(setup: &Setup) -> u64 {
    let matmuls = block_matmuls(setup);
    bytes(setup, matmuls.iter().flat_map(|m| [m.backward_input(), m.backward_weight()]))
}

/// A block's backward-weight: its largest weight-gradient matmul's copies.
pub fn block_backward_weight_bytes(setup: &Setup) -> u64 {
    bytes(setup, block_matmuls(setup).iter().map(Matmul::backward_weight))
}

/// The head's forward and backward, which run together in the forward pass: its largest
/// matmul's copies (for GPT-2, dlogits [B*T, Vp] beside the embedding's [Vp, C] copy).
pub fn head_bytes(setup: &Setup) -> u64 {
    let head = head_matmul(setup);
    bytes(setup, [head.forward(), head.backward_input(), head.backward_weight()].into_iter())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::simulate::memory::{chunk_memory, stage_parameters, stage_static_bytes};
    use crate::simulate::predicted_stage_peaks;
    use crate::simulate::setup::tests::gpt2_small;
    use crate::simulate::setup::Storage;
    use std::path::Path;

    /// GPT-2 small at seq 1024 on one CUDA stage, micro batch 4 (configs/gpt2-124m.yaml).
    fn on_one_gpu(precision: &str) -> Config {
        Config {
            device: "cuda".into(),
            precision: precision.into(),
            micro_batch_size: 4,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
            ..gpt2_small(1, "1f1b", 1, 8)
        }
    }

    /// The trainer keeps fp32 activations and no weight copy under bf16: its peak is fp32's
    /// plus the head's operand copies, dlogits [4096, 50304] and the padded embedding
    /// [50304, 768] at 2 bytes each, which outweigh every block matmul's.
    #[test]
    fn the_trainers_bf16_peak_is_fp32s_plus_the_heads_operand_copies() {
        let path = Path::new("c.yaml");
        let fp32 = predicted_stage_peaks(&on_one_gpu("fp32"), path).unwrap();
        let bf16 = predicted_stage_peaks(&on_one_gpu("bf16"), path).unwrap();
        let (n, vp, c, f) = (4 * 1024u64, 50304u64, 768u64, 3072u64);
        let head = 2 * (n * vp + vp * c);
        assert_eq!(bf16, [fp32[0] + head]);

        let sixteen_bit = Setup::new(&on_one_gpu("bf16"), path).unwrap();
        let trainer = sixteen_bit.as_the_trainer_stores_it();
        assert_eq!(head_bytes(&trainer), head);
        // The MLP's: fc's output gradient [4096, 3072] beside its input [4096, 768].
        assert_eq!(block_backward_weight_bytes(&trainer), 2 * (n * f + n * c));
        assert_eq!(head_bytes(&sixteen_bit), 0);

        // `simulate` still models 16 bits: half the trainer's activation bytes and a 2-byte
        // copy of every parameter, Megatron's.
        assert_eq!(sixteen_bit.storage, Storage::SixteenBit);
        let (kept, stored) = (chunk_memory(&sixteen_bit, 0, 0), chunk_memory(&trainer, 0, 0));
        assert_eq!(2 * kept.activation_bytes, stored.activation_bytes);
        let params = stage_parameters(&sixteen_bit, 0) as u64;
        assert_eq!(stage_static_bytes(&sixteen_bit, 0) - stage_static_bytes(&trainer, 0), 2 * params);
    }
}
