//! The memory levers the sweep and the planner weigh against each other on a shape:
//! recompute (selective, full, or full block per stage) and activation offload (every
//! module of the first N blocks of each chunk, N per stage), each as the config keys that
//! ask for it.

use crate::config::{Config, Named, RecomputeGranularity, RecomputeMethod, RecomputeModule};
use stages::OffloadModule;

#[derive(Clone, Debug, PartialEq)]
pub enum Lever {
    None,
    Selective(Vec<RecomputeModule>),
    Full {
        method: RecomputeMethod,
        num_layers: usize,
    },
    /// Full block recompute with N per stage (0: none).
    BlockPerStage(Vec<usize>),
    /// No recompute; every tensor of each chunk's first N blocks waits in host memory, N per
    /// stage (0: none).
    OffloadPerStage(Vec<usize>),
}

impl Lever {
    /// Sets `cfg`'s recompute and offload keys to this lever alone.
    pub fn apply(&self, cfg: &mut Config) {
        cfg.recompute_granularity = None;
        cfg.recompute_method = None;
        cfg.recompute_num_layers = None;
        cfg.recompute_modules = None;
        cfg.recompute_num_layers_per_stage = None;
        cfg.fine_grained_activation_offloading = false;
        cfg.offload_modules = None;
        cfg.cpu_offloading_activations = false;
        cfg.offload_num_layers_per_stage = None;
        match self {
            Lever::None => {}
            Lever::Selective(modules) => {
                cfg.recompute_granularity = Some(RecomputeGranularity::Selective);
                cfg.recompute_modules = Some(modules.clone());
            }
            Lever::Full { method, num_layers } => {
                cfg.recompute_granularity = Some(RecomputeGranularity::Full);
                cfg.recompute_method = Some(*method);
                cfg.recompute_num_layers = Some(*num_layers);
            }
            Lever::BlockPerStage(ns) => {
                cfg.recompute_granularity = Some(RecomputeGranularity::Full);
                cfg.recompute_method = Some(RecomputeMethod::Block);
                cfg.recompute_num_layers_per_stage = Some(ns.clone());
            }
            Lever::OffloadPerStage(ns) => {
                cfg.fine_grained_activation_offloading = true;
                cfg.offload_modules = Some(OffloadModule::ALL.to_vec());
                cfg.offload_num_layers_per_stage = Some(ns.clone());
            }
        }
    }

    /// The N of stage `stage` where this lever is a per-stage count of `family`'s (a uniform
    /// run counting as one): full block N for [`Lever::BlockPerStage`], offloaded layers for
    /// [`Lever::OffloadPerStage`]; 0 for no lever.
    pub fn stage_n(&self, family: &Lever, stage: usize) -> Option<usize> {
        match (self, family) {
            (Lever::None, _) => Some(0),
            (Lever::Full { method: RecomputeMethod::Block, num_layers }, Lever::BlockPerStage(_)) => {
                Some(*num_layers)
            }
            (Lever::BlockPerStage(ns), Lever::BlockPerStage(_))
            | (Lever::OffloadPerStage(ns), Lever::OffloadPerStage(_)) => ns.get(stage).copied(),
            _ => None,
        }
    }

    pub fn describe(&self) -> String {
        let list = |ns: &[usize]| ns.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",");
        match self {
            Lever::None => "none".into(),
            Lever::Selective(m) => {
                format!("selective {}", m.iter().map(|m| m.name()).collect::<Vec<_>>().join("+"))
            }
            Lever::Full { method, num_layers } => format!("full/{method} N={num_layers}"),
            Lever::BlockPerStage(ns) => format!("full/block N per stage {}", list(ns)),
            Lever::OffloadPerStage(ns) if ns.iter().all(|&n| n == ns[0]) => format!("offload N={}", ns[0]),
            Lever::OffloadPerStage(ns) => format!("offload N per stage {}", list(ns)),
        }
    }
}
