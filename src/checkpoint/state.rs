//! Trainer state: everything besides the weights that a resumed run needs to continue exactly
//! where the saved one stopped. The AdamW moments go to `trainer_state.safetensors` as
//! `exp_avg.<param>` and `exp_avg_sq.<param>`; the rest to `trainer_state.json`.

use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize};

use super::NamedTensor;
use crate::data::TokenizerSpec;
use crate::error::user_error;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer steps completed. It is also the position in the learning-rate schedule,
    /// which is a function of the step alone, and AdamW's bias-correction count.
    pub step: u64,
    pub seed: u64,
    /// Training windows are a pure function of (seed, step, microbatch, row) (see
    /// `data::loader`), so the data position is the step count; stored so that the file says so.
    pub data_position: u64,
    /// Learning rate of the last completed step (informational: the schedule recomputes it).
    pub lr: f64,
    /// The run's full pipetrain config as YAML, so a resumed run can compare against it.
    pub config_yaml: String,
    /// The tokenizer that made the training data, where its `tokenize` records say: the one
    /// `generate` then reads and writes the model's text with. None for data without a
    /// record (and in a checkpoint from before it was kept).
    #[serde(default)]
    pub tokenizer: Option<TokenizerSpec>,
    /// (step, training loss) of completed steps.
    #[serde(default, deserialize_with = "null_as_nan")]
    pub train_losses: Vec<(u64, f32)>,
    /// (step, validation loss) of evaluations.
    #[serde(default, deserialize_with = "null_as_nan")]
    pub val_losses: Vec<(u64, f32)>,
}

/// JSON has no NaN: serde_json writes a diverged (NaN or infinite) loss as null, and this
/// reads it back as NaN so that such a run can still be resumed and inspected.
fn null_as_nan<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(u64, f32)>, D::Error> {
    let losses: Vec<(u64, Option<f32>)> = Deserialize::deserialize(d)?;
    Ok(losses.into_iter().map(|(step, loss)| (step, loss.unwrap_or(f32::NAN))).collect())
}

pub fn exp_avg_name(param: &str) -> String {
    format!("exp_avg.{param}")
}

pub fn exp_avg_sq_name(param: &str) -> String {
    format!("exp_avg_sq.{param}")
}

/// Errors, naming `file`, unless `optimizer` holds exactly one first and one second moment
/// with the shape of each of `model`'s parameters.
pub fn check_optimizer(file: &Path, model: &[NamedTensor], optimizer: &[NamedTensor]) -> anyhow::Result<()> {
    let bad = |what: String| Err(user_error(format!("{}: {what}", file.display())));
    for p in model {
        for name in [exp_avg_name(&p.name), exp_avg_sq_name(&p.name)] {
            match optimizer.iter().find(|t| t.name == name) {
                None => return bad(format!("missing {name}")),
                Some(t) if t.shape != p.shape => {
                    return bad(format!("{name} has shape {:?}, its parameter has {:?}", t.shape, p.shape))
                }
                Some(_) => {}
            }
        }
    }
    if optimizer.len() != 2 * model.len() {
        let extra = optimizer.iter().find(|t| {
            !model.iter().any(|p| t.name == exp_avg_name(&p.name) || t.name == exp_avg_sq_name(&p.name))
        });
        let name = extra.map_or("a duplicate tensor", |t| t.name.as_str());
        return bad(format!("unexpected {name}, which matches no model parameter"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, shape: &[usize]) -> NamedTensor {
        NamedTensor { name: name.into(), shape: shape.to_vec(), data: vec![0.0; shape.iter().product()] }
    }

    #[test]
    fn a_diverged_loss_reads_back_as_nan() {
        let state = TrainerState {
            step: 2,
            seed: 1,
            data_position: 2,
            lr: 1e-3,
            config_yaml: String::new(),
            tokenizer: None,
            train_losses: vec![(1, 2.5), (2, f32::NAN)],
            val_losses: vec![],
        };
        let text = serde_json::to_string(&state).unwrap();
        assert!(text.contains("[[1,2.5],[2,null]]"), "{text}");
        let back: TrainerState = serde_json::from_str(&text).unwrap();
        assert_eq!(back.train_losses[0], (1, 2.5));
        assert!(back.train_losses[1].0 == 2 && back.train_losses[1].1.is_nan());
    }

    #[test]
    fn optimizer_must_match_the_model() {
        let f = Path::new("r/trainer_state.safetensors");
        let model = [t("wte.weight", &[4, 2]), t("ln_f.bias", &[2])];
        let good = vec![
            t("exp_avg.wte.weight", &[4, 2]),
            t("exp_avg_sq.wte.weight", &[4, 2]),
            t("exp_avg.ln_f.bias", &[2]),
        ];
        let err = |opt: &[NamedTensor]| check_optimizer(f, &model, opt).unwrap_err().to_string();
        assert_eq!(err(&good), "r/trainer_state.safetensors: missing exp_avg_sq.ln_f.bias");
        let mut full = good.clone();
        full.push(t("exp_avg_sq.ln_f.bias", &[2]));
        check_optimizer(f, &model, &full).unwrap();
        let mut wrong = full.clone();
        wrong[1].shape = vec![8];
        assert_eq!(
            err(&wrong),
            "r/trainer_state.safetensors: exp_avg_sq.wte.weight has shape [8], its parameter has [4, 2]"
        );
        full.push(t("exp_avg.h.0.ln_1.bias", &[2]));
        assert_eq!(
            err(&full),
            "r/trainer_state.safetensors: unexpected exp_avg.h.0.ln_1.bias, which matches no model parameter"
        );
    }
}
