//! The whole-stage peak that `simulate` predicts is what the trainer's ledger measures, at
//! GPT-2 small's width, heads and vocabulary, where the stages holding the tied embedding
//! are dominated by [B,T,V] logits and the [V,C] tied-gradient exchange (tiny's vocabulary
//! hides both): within 2% on every stage; and the same for a Llama of that width (RMSNorm,
//! rotary positions, SwiGLU, 3 key/value groups, no biases, an untied output layer). The
//! schedules are the two the issue was found with (gpipe and interleaved-1f1b agree as
//! closely at the real 124M shape), and 1F1B over tensor-parallel ranks (t = 2, each rank
//! against its stage's per-rank prediction), with sequence parallelism, and without it but
//! with full recompute's inputs distributed over the group.

use super::rank::Rank;
use crate::config::{Config, PositionEmbeddingType, RecomputeGranularity, RecomputeMethod};
use crate::data::TokenData;
use std::path::Path;

#[test]
fn whole_stage_peaks_are_predicted_within_two_percent_at_gpt2_small_width() {
    let llama = Config {
        normalization: stages::Norm::RmsNorm,
        position_embedding_type: PositionEmbeddingType::Rope,
        swiglu: true,
        ffn_hidden_size: Some(2048),
        group_query_attention: true,
        num_query_groups: Some(3),
        untie_embeddings_and_output_weights: true,
        disable_bias_linear: true,
        ..Config::default()
    };
    for family in [Config::default(), llama] {
        peaks_are_predicted(&family);
    }
}

fn peaks_are_predicted(family: &Config) {
    let data = TokenData::open_file(Path::new("data/corpus/train.bin"), 1, 50257).unwrap();
    // (schedule, p, t, sequence parallelism, distributed saves)
    let cases = [
        ("1f1b", 2, 1, false, false),
        ("zb-h1", 3, 1, false, false),
        ("1f1b", 2, 2, true, false),
        ("1f1b", 2, 2, false, true),
    ];
    for (schedule, p, t, sequence, distributed) in cases {
        // Three of GPT-2 small's twelve layers keep the test quick; dropout on, as GPT-2 trains.
        // t must divide the vocabulary (GPT-2's padded 50304) and the key/value groups (4
        // instead of 3).
        let tp = t > 1;
        let cfg = Config {
            num_layers: 3,
            seq_length: 32,
            micro_batch_size: 2,
            global_batch_size: 8,
            pipeline_model_parallel_size: p,
            tensor_model_parallel_size: t,
            pipeline_schedule: schedule.parse().unwrap(),
            vocab_size: if tp { 50304 } else { family.vocab_size },
            num_query_groups: family.num_query_groups.map(|g| if tp { 4 } else { g }),
            recompute_granularity: distributed.then_some(RecomputeGranularity::Full),
            recompute_method: distributed.then_some(RecomputeMethod::Uniform),
            recompute_num_layers: distributed.then_some(1),
            sequence_parallel: sequence,
            distribute_saved_activations: distributed,
            ..family.clone()
        };
        let mut ranks = Rank::all_in_threads(&cfg);
        std::thread::scope(|s| {
            for r in &mut ranks {
                let (cfg, data) = (&cfg, &data);
                s.spawn(move || r.train_step(cfg, data, 1, 1e-4, None).unwrap());
            }
        });
        let predicted = crate::simulate::predicted_stage_peaks(&cfg).unwrap();
        for (r, rank) in ranks.iter().enumerate() {
            let measured = rank.stage.device.ledger().snapshot().peak_bytes as f64;
            let stage = rank.stage_index();
            let error = predicted[stage] as f64 / measured - 1.0;
            assert!(
                error.abs() <= 0.02,
                "{:?} {schedule} p={p} t={t} sequence {sequence} distributed {distributed} rank {r}: predicted {} bytes, measured {measured} ({:+.1}%)",
                cfg.normalization,
                predicted[stage],
                100.0 * error
            );
        }
    }
}
