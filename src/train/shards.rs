//! Checkpoints across ranks. The format holds the whole model whatever the layout, so rank
//! 0 reads it and hands each rank the tensors of its own chunks (scatter), and at a save
//! the first replica's stages send theirs back to rank 0, which writes them (gather). A
//! run can so resume with another stage count, data-parallel size or launcher.

use super::rank::{Held, Rank};
use crate::checkpoint::{exp_avg_name, exp_avg_sq_name, NamedTensor};
use crate::config::Config;
use crate::plan;
use stages::dist::{decode_tensors, encode_tensors, DistError, Reader, Topology, Writer};
use stages::params::chunk_param_specs;

/// What rank 0 hands a rank at the start.
pub struct RankStart {
    /// The step to continue from (0 for a new run).
    pub step: usize,
    /// The weights of this rank's chunks; None initialises them from the seed.
    pub weights: Option<Vec<NamedTensor>>,
    /// The AdamW moments of this rank's chunks, when resuming.
    pub optimizer: Option<Vec<NamedTensor>>,
}

/// Rank 0's parts, one per rank: each rank's share of `weights` and `optimizer`.
pub fn start_parts(
    cfg: &Config,
    topology: Topology,
    step: usize,
    weights: Option<&[NamedTensor]>,
    optimizer: Option<&[NamedTensor]>,
) -> anyhow::Result<Vec<Vec<u8>>> {
    let shape = plan::shape(cfg);
    let mut per_stage = Vec::with_capacity(topology.pipeline);
    for stage in 0..topology.pipeline {
        let names: Vec<String> = plan::stage_layouts(cfg, stage)?
            .iter()
            .flat_map(|l| chunk_param_specs(&shape, l))
            .flat_map(|spec| spec.hf.into_iter().map(|part| part.name))
            .collect();
        let pick = |all: &[NamedTensor], names: &[String]| -> Vec<NamedTensor> {
            all.iter().filter(|t| names.contains(&t.name)).cloned().collect()
        };
        let moment_names: Vec<String> =
            names.iter().flat_map(|n| [exp_avg_name(n), exp_avg_sq_name(n)]).collect();
        let mut w = Writer::default();
        w.u64(step as u64);
        for part in [weights.map(|all| pick(all, &names)), optimizer.map(|all| pick(all, &moment_names))] {
            w.u64(part.is_some() as u64);
            w.bytes(&encode_tensors(&part.unwrap_or_default()));
        }
        per_stage.push(w.0);
    }
    Ok((0..topology.world()).map(|r| per_stage[topology.stage_of(r)].clone()).collect())
}

pub fn decode_start(bytes: &[u8]) -> Result<RankStart, DistError> {
    let mut r = Reader(bytes);
    let step = r.usize()?;
    let mut part = || -> Result<Option<Vec<NamedTensor>>, DistError> {
        let present = r.u64()? != 0;
        let tensors = decode_tensors(&r.bytes()?)?;
        Ok(present.then_some(tensors))
    };
    let (weights, optimizer) = (part()?, part()?);
    Ok(RankStart { step, weights, optimizer })
}

/// This rank's contribution to a checkpoint: its parameters and moments (tagged with their
/// place in the model's order, gathered whole from its tensor-parallel group, and under the
/// distributed optimizer the moments, and the fp32 masters it shards, from every replica) from tensor rank 0 of the first
/// replica; nothing from the others, which hold the same. The format so does not depend on
/// the sharding: a run resumes with or without it, and at another data-parallel size.
pub fn encode_stage(rank: &mut Rank) -> anyhow::Result<Vec<u8>> {
    let parts_are_cut = rank.stage.optimizer().distributed;
    if rank.replica() != 0 && !parts_are_cut {
        return Ok(Vec::new());
    }
    let lists = [rank.named(Held::Values)?, rank.named(Held::ExpAvg)?, rank.named(Held::ExpAvgSq)?];
    if rank.replica() != 0 || rank.tensor_rank() != 0 {
        return Ok(Vec::new());
    }
    let mut w = Writer::default();
    for tagged in lists {
        w.u64(tagged.len() as u64);
        for ((index, part), _) in &tagged {
            w.u64(*index as u64);
            w.u64(*part as u64);
        }
        let tensors: Vec<NamedTensor> = tagged.into_iter().map(|(_, t)| t).collect();
        w.bytes(&encode_tensors(&tensors));
    }
    Ok(w.0)
}

/// The whole model and its optimizer moments in global parameter order, from every rank's
/// [`encode_stage`]: (model, exp_avg.* then exp_avg_sq.*).
pub fn assemble(parts: &[Vec<u8>]) -> Result<(Vec<NamedTensor>, Vec<NamedTensor>), DistError> {
    let mut lists: [Vec<((usize, usize), NamedTensor)>; 3] = Default::default();
    for part in parts.iter().filter(|p| !p.is_empty()) {
        let mut r = Reader(part);
        for list in &mut lists {
            let indices =
                (0..r.usize()?).map(|_| Ok((r.usize()?, r.usize()?))).collect::<Result<Vec<_>, _>>()?;
            list.extend(indices.into_iter().zip(decode_tensors(&r.bytes()?)?));
        }
    }
    let [values, exp_avg, exp_avg_sq] = lists.map(plan::in_global_order);
    let rename = |tensors: Vec<NamedTensor>, name: fn(&str) -> String| {
        tensors.into_iter().map(move |t| NamedTensor { name: name(&t.name), ..t })
    };
    let optimizer = rename(exp_avg, exp_avg_name).chain(rename(exp_avg_sq, exp_avg_sq_name)).collect();
    Ok((values, optimizer))
}
