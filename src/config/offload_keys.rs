//! The activation offload keys: each alone and with the recompute settings, so that every
//! offload the config asks for moves something.

use super::{Config, RecomputeGranularity, RecomputeMethod, RecomputeModule};
use stages::OffloadModule;

impl Config {
    pub(super) fn validate_offload(&self) -> Result<(), (&'static str, String)> {
        let switch = "fine_grained_activation_offloading";
        let modules = self.offload_modules.as_deref().unwrap_or(&[]);
        let full = self.granularity() == RecomputeGranularity::Full;
        match (self.fine_grained_activation_offloading, modules.is_empty()) {
            (false, false) => {
                let names: Vec<&str> = modules.iter().map(|m| m.name()).collect();
                return Err(("offload_modules", format!("[{}] needs {switch}: true", names.join(", "))));
            }
            (true, true) => {
                let names: Vec<&str> = OffloadModule::ALL.iter().map(|m| m.name()).collect();
                return Err((
                    "offload_modules",
                    format!("{switch} needs one or more of {}", names.join(", ")),
                ));
            }
            (true, false) if full && self.recompute_method == Some(RecomputeMethod::Uniform) => {
                return Err((
                    switch,
                    "offloads nothing under recompute_method: uniform, which keeps only each group's input \
                     (offload it with cpu_offloading_activations)"
                        .into(),
                ));
            }
            _ => {}
        }
        for &m in modules {
            if !m.keeps_anything(self.norm_placement) {
                return Err((
                    "offload_modules",
                    format!(
                        "`{}` has nothing to offload under norm_placement: {}: its projection reads the \
                         residual stream, which attn_norm and mlp_norm offload",
                        m.name(),
                        self.norm_placement.name()
                    ),
                ));
            }
            if let Some(recomputed) = self.drops_all_of(m) {
                return Err((
                    "offload_modules",
                    format!(
                        "`{}` has nothing to offload: selective recompute of {recomputed} drops what it keeps",
                        m.name()
                    ),
                ));
            }
        }
        if self.cpu_offloading_activations && !full {
            return Err((
                "cpu_offloading_activations",
                "true needs recompute_granularity: full: it offloads the inputs full recompute keeps".into(),
            ));
        }
        if let Some(per_stage) = &self.offload_num_layers_per_stage {
            if !self.fine_grained_activation_offloading && !self.cpu_offloading_activations {
                return Err((
                    "offload_num_layers_per_stage",
                    format!("needs {switch} or cpu_offloading_activations"),
                ));
            }
            self.one_per_stage("offload_num_layers_per_stage", per_stage)?;
        }
        Ok(())
    }

    /// The selective recompute module that drops every tensor offload module `m` would move.
    fn drops_all_of(&self, m: OffloadModule) -> Option<&'static str> {
        let recomputes = |r| {
            self.granularity() == RecomputeGranularity::Selective
                && self.recompute_modules.as_deref().is_some_and(|ms| ms.contains(&r))
        };
        match m {
            OffloadModule::QkvLinear | OffloadModule::MlpFc1 if recomputes(RecomputeModule::Layernorm) => {
                Some("layernorm")
            }
            OffloadModule::MlpFc2 if recomputes(RecomputeModule::Mlp) => Some("mlp"),
            _ => None,
        }
    }
}
