//! `pipetrain eval`: the mean loss of a checkpoint over the first N consecutive
//! non-overlapping windows of a token file (window k reads tokens k*T .. k*T+T-1 and
//! predicts k*T+1 .. k*T+T).

use crate::checkpoint;
use crate::cli::EvalArgs;
use crate::data::TokenData;
use crate::error::user_error;
use crate::plan;
use kernels::cpu::math::mean_in_order;
use kernels::cpu::CpuDevice;
use kernels::Device;
use stages::{ChunkLayout, Microbatch, OptimizerShard, RecomputePolicy, Shard, TensorGroup};

pub fn run(args: &EvalArgs) -> anyhow::Result<()> {
    let ck = checkpoint::load_checkpoint(&args.checkpoint)?;
    let seq_length = args.seq_length.unwrap_or(ck.config.max_positions());
    if seq_length == 0 || seq_length > ck.config.max_positions() {
        return Err(user_error(format!(
            "command line: --seq-length {seq_length}: must be between 1 and the model's {} positions \
             (max_position_embeddings)",
            ck.config.max_positions()
        )));
    }
    let data = TokenData::open_file(&args.data, seq_length, ck.config.vocab_size())?;
    let available = data.eval_windows(seq_length);
    if args.windows == 0 || args.windows > available {
        return Err(user_error(format!(
            "command line: --windows {}: {} holds {available} windows of {seq_length} tokens; give 1 to {available}",
            args.windows,
            args.data.display()
        )));
    }
    let cfg = ck.config.run_config(seq_length, 1);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let dev = CpuDevice::new(threads);
    let layout = ChunkLayout { blocks: 0..cfg.num_layers, embedding: true, head: true };
    let mut chunk = plan::build_chunk(
        &dev,
        &cfg,
        layout,
        (Shard::WHOLE, OptimizerShard::WHOLE),
        RecomputePolicy::None,
        Some(&ck.model),
    )?;
    let mut total = 0.0;
    for k in 0..args.windows {
        let batch = data.eval_batch(k, 1, seq_length)?;
        let mb = Microbatch {
            step: 0,
            index: 0,
            tokens: &batch.inputs,
            targets: &batch.targets,
            mode: stages::Mode::Eval,
        };
        let losses = chunk
            .forward(&dev, &mb, None, &mut TensorGroup::whole())
            .losses
            .expect("the whole model holds the head");
        total += mean_in_order(&dev.to_host(&losses));
    }
    println!("{:.6}", total / args.windows as f64);
    Ok(())
}
