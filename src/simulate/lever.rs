//! The memory levers the sweep and the planner weigh against each other on a shape:
//! recompute (selective, full, or full block per stage), activation offload (a set of
//! modules of the first N blocks of each chunk, N per stage, alone or beside selective
//! recompute of the attention core), and per stage one or the other of full block recompute
//! and offload, each as the config keys that ask for it.

use crate::config::{Config, Named, RecomputeGranularity, RecomputeMethod, RecomputeModule};
use stages::{NormPlacement, OffloadModule};

/// The modules the planner offloads, and the recompute each set goes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffloadSet {
    /// Every module: the most a block can move.
    Every,
    /// The attention core's saves alone (q, k, v and the core's probabilities or
    /// log-sum-exp): the largest share of a block under the unfused core, one copy per
    /// block to hide.
    CoreAttn,
    /// Selective recompute of the attention core, every other module offloaded: what is
    /// cheap to rebuild is rebuilt, the rest crosses PCIe (Megatron-LM's pairing).
    BesideSelectiveCore,
}

impl OffloadSet {
    pub const ALL: [OffloadSet; 3] =
        [OffloadSet::Every, OffloadSet::CoreAttn, OffloadSet::BesideSelectiveCore];

    /// Its modules in a block whose norms sit at `placement`, those that keep something.
    fn modules(self, placement: NormPlacement) -> Vec<OffloadModule> {
        let all = OffloadModule::ALL.into_iter().filter(|m| m.keeps_anything(placement));
        match self {
            OffloadSet::Every => all.collect(),
            OffloadSet::CoreAttn => vec![OffloadModule::CoreAttn],
            OffloadSet::BesideSelectiveCore => all.filter(|&m| m != OffloadModule::CoreAttn).collect(),
        }
    }

    fn recompute(self) -> Option<Vec<RecomputeModule>> {
        (self == OffloadSet::BesideSelectiveCore).then(|| vec![RecomputeModule::CoreAttn])
    }

    /// The set offloading `layers` (e.g. "N=3"), as the plan's lines name it.
    fn describe(self, layers: &str) -> String {
        match self {
            OffloadSet::Every => format!("offload {layers}"),
            OffloadSet::CoreAttn => format!("offload core_attn {layers}"),
            OffloadSet::BesideSelectiveCore => format!("selective core_attn + offload of the rest {layers}"),
        }
    }
}

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
    /// The tensors of `set`'s modules of each chunk's first N blocks wait in host memory, N
    /// per stage (0: none), beside the recompute `set` goes with.
    Offload {
        set: OffloadSet,
        layers: Vec<usize>,
    },
    /// Per stage, full block recompute of N blocks or offload of every module of N blocks
    /// (at most one of the two nonzero): recompute where offload cannot fit (its host memory,
    /// or the microbatches an early stage holds), offload elsewhere.
    BlockOrOffload {
        block: Vec<usize>,
        offload: Vec<usize>,
    },
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
            Lever::BlockOrOffload { block, offload } => {
                Lever::BlockPerStage(block.clone()).apply(cfg);
                cfg.fine_grained_activation_offloading = true;
                cfg.offload_modules = Some(OffloadSet::Every.modules(cfg.norm_placement));
                cfg.offload_num_layers_per_stage = Some(offload.clone());
            }
            Lever::Offload { set, layers } => {
                if let Some(modules) = set.recompute() {
                    cfg.recompute_granularity = Some(RecomputeGranularity::Selective);
                    cfg.recompute_modules = Some(modules);
                }
                cfg.fine_grained_activation_offloading = true;
                cfg.offload_modules = Some(set.modules(cfg.norm_placement));
                cfg.offload_num_layers_per_stage = Some(layers.clone());
            }
        }
    }

    /// The N of stage `stage` where this lever is a per-stage count of `family`'s (a uniform
    /// run counting as one): full block N for [`Lever::BlockPerStage`], offloaded layers of
    /// the same set for [`Lever::Offload`]; 0 for no lever (for an offload set that
    /// recomputes, for that recompute alone).
    pub fn stage_n(&self, family: &Lever, stage: usize) -> Option<usize> {
        match (self, family) {
            // Offload of no layer beside a recompute is that recompute alone.
            (Lever::Selective(modules), Lever::Offload { set, .. }) => {
                (set.recompute().as_ref() == Some(modules)).then_some(0)
            }
            (Lever::None, Lever::Offload { set, .. }) if set.recompute().is_some() => None,
            (Lever::None, _) => Some(0),
            (Lever::Full { method: RecomputeMethod::Block, num_layers }, Lever::BlockPerStage(_)) => {
                Some(*num_layers)
            }
            (Lever::BlockPerStage(ns), Lever::BlockPerStage(_)) => ns.get(stage).copied(),
            (Lever::Offload { set, layers }, Lever::Offload { set: family, .. }) if set == family => {
                layers.get(stage).copied()
            }
            _ => None,
        }
    }

    /// `self`'s per-stage family with counts `ns`.
    pub fn with_counts(&self, ns: Vec<usize>) -> Lever {
        match self {
            Lever::Offload { set, .. } => Lever::Offload { set: *set, layers: ns },
            _ => Lever::BlockPerStage(ns),
        }
    }

    /// What this lever does on stage `stage`, for the plan's per-stage comment.
    pub fn describe_stage(&self, stage: usize) -> String {
        match self {
            Lever::BlockPerStage(ns) if ns[stage] > 0 => format!("full block N={}", ns[stage]),
            Lever::Offload { set, layers } if layers[stage] > 0 => {
                set.describe(&format!("N={}", layers[stage]))
            }
            Lever::Offload { set, .. } => match set.recompute() {
                Some(modules) => Lever::Selective(modules).describe(),
                None => "none".into(),
            },
            Lever::BlockOrOffload { block, .. } if block[stage] > 0 => {
                format!("full block N={}", block[stage])
            }
            Lever::BlockOrOffload { offload, .. } if offload[stage] > 0 => {
                format!("offload N={}", offload[stage])
            }
            Lever::BlockPerStage(_) | Lever::BlockOrOffload { .. } | Lever::None => "none".into(),
            other => other.describe(),
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
            Lever::Offload { set, layers } if layers.iter().all(|&n| n == layers[0]) => {
                set.describe(&format!("N={}", layers[0]))
            }
            Lever::Offload { set, layers } => set.describe(&format!("N per stage {}", list(layers))),
            Lever::BlockOrOffload { block, offload } => {
                format!("full/block N per stage {} or offload N per stage {}", list(block), list(offload))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::setup::tests::gpt2_small;

    /// Each offload set writes the keys that ask for it, which validate; beside selective
    /// recompute of the core, the other seven modules offload.
    #[test]
    fn each_offload_set_applies_as_its_keys() {
        for set in OffloadSet::ALL {
            let mut cfg = gpt2_small(4, "1f1b", 1, 8);
            Lever::Offload { set, layers: vec![2, 1, 0, 0] }.apply(&mut cfg);
            cfg.validate().unwrap_or_else(|e| panic!("{set:?}: {e:?}"));
            assert!(cfg.fine_grained_activation_offloading);
            assert_eq!(cfg.offload_num_layers_per_stage, Some(vec![2, 1, 0, 0]));
            let modules = cfg.offload_modules.clone().unwrap();
            let recomputed = cfg.recompute_modules.clone();
            match set {
                OffloadSet::Every => assert_eq!((modules.len(), recomputed), (8, None)),
                OffloadSet::CoreAttn => {
                    assert_eq!((modules, recomputed), (vec![OffloadModule::CoreAttn], None))
                }
                OffloadSet::BesideSelectiveCore => {
                    assert_eq!(cfg.recompute_granularity, Some(RecomputeGranularity::Selective));
                    assert_eq!(recomputed, Some(vec![RecomputeModule::CoreAttn]));
                    assert_eq!(modules.len(), 7);
                    assert!(!modules.contains(&OffloadModule::CoreAttn));
                }
            }
        }
    }

    /// With the norms on the branches' outputs, the projections that read no norm's output
    /// keep nothing: every set leaves them out, and the keys validate.
    #[test]
    fn offload_sets_leave_out_what_the_norms_on_the_outputs_leave_empty() {
        let empty = [OffloadModule::QkvLinear, OffloadModule::MlpFc1];
        let levers = OffloadSet::ALL.map(|set| Lever::Offload { set, layers: vec![2, 1, 0, 0] });
        let mix = Lever::BlockOrOffload { block: vec![2, 0, 0, 0], offload: vec![0, 1, 1, 0] };
        for lever in levers.iter().chain([&mix]) {
            let mut cfg = gpt2_small(4, "1f1b", 1, 8);
            cfg.norm_placement = NormPlacement::Output;
            lever.apply(&mut cfg);
            cfg.validate().unwrap_or_else(|e| panic!("{lever:?}: {e:?}"));
            let modules = cfg.offload_modules.unwrap();
            assert!(modules.iter().all(|m| !empty.contains(m)), "{lever:?}: {modules:?}");
            assert_eq!(
                modules.len(),
                if *lever == levers[1] {
                    1
                } else if *lever == levers[2] {
                    5
                } else {
                    6
                }
            );
        }
    }

    /// Per stage full block recompute or offload: both per-stage keys, which validate, and each
    /// stage described by its own lever.
    #[test]
    fn block_or_offload_applies_as_both_per_stage_keys() {
        let mut cfg = gpt2_small(4, "1f1b", 1, 8);
        let mix = Lever::BlockOrOffload { block: vec![2, 0, 0, 0], offload: vec![0, 1, 1, 0] };
        mix.apply(&mut cfg);
        cfg.validate().unwrap();
        assert_eq!(cfg.recompute_num_layers_per_stage, Some(vec![2, 0, 0, 0]));
        assert_eq!(cfg.offload_num_layers_per_stage, Some(vec![0, 1, 1, 0]));
        assert_eq!(cfg.offload_modules.map(|m| m.len()), Some(8));
        assert_eq!(
            (0..4).map(|r| mix.describe_stage(r)).collect::<Vec<_>>(),
            ["full block N=2", "offload N=1", "offload N=1", "none"]
        );
        assert_eq!(mix.describe(), "full/block N per stage 2,0,0,0 or offload N per stage 0,1,1,0");
    }

    /// A set's per-stage count: its own runs' N, 0 for the run without a lever, or for a set
    /// that recomputes, for that recompute alone; another set's runs count for nothing.
    #[test]
    fn a_stage_n_counts_only_the_runs_of_its_own_set() {
        let offload = |set, layers: Vec<usize>| Lever::Offload { set, layers };
        let beside = offload(OffloadSet::BesideSelectiveCore, Vec::new());
        let every = offload(OffloadSet::Every, Vec::new());
        assert_eq!(offload(OffloadSet::BesideSelectiveCore, vec![3, 1]).stage_n(&beside, 1), Some(1));
        assert_eq!(offload(OffloadSet::CoreAttn, vec![3, 1]).stage_n(&beside, 1), None);
        assert_eq!(Lever::Selective(vec![RecomputeModule::CoreAttn]).stage_n(&beside, 0), Some(0));
        assert_eq!(Lever::None.stage_n(&beside, 0), None);
        assert_eq!(Lever::None.stage_n(&every, 0), Some(0));
        assert_eq!(Lever::Selective(vec![RecomputeModule::CoreAttn]).stage_n(&every, 0), None);
        let mix = offload(OffloadSet::BesideSelectiveCore, vec![2, 0]);
        assert_eq!(mix.describe(), "selective core_attn + offload of the rest N per stage 2,0");
        assert_eq!(
            [mix.describe_stage(0), mix.describe_stage(1)],
            ["selective core_attn + offload of the rest N=2", "selective core_attn"]
        );
        assert_eq!(offload(OffloadSet::CoreAttn, vec![1, 1]).describe(), "offload core_attn N=1");
    }
}
