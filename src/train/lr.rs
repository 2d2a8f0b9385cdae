//! The learning-rate schedule, as Megatron-LM's: linear warm-up from 0 over lr_warmup_iters,
//! then decay to min_lr over the remaining lr_decay_iters (cosine, linear or constant).

use crate::config::{Config, LrDecayStyle};

/// The learning rate of 1-based optimizer step `step`.
pub fn learning_rate(c: &Config, step: usize) -> f32 {
    let (max, min) = (c.lr as f64, c.min_lr as f64);
    let warmup = c.lr_warmup_iters;
    if warmup > 0 && step <= warmup {
        return (max * step as f64 / warmup as f64) as f32;
    }
    let decay_iters = c.lr_decay_iters.unwrap_or(c.train_iters);
    if c.lr_decay_style == LrDecayStyle::Constant || decay_iters <= warmup {
        return max as f32;
    }
    if step > decay_iters {
        return min as f32;
    }
    let ratio = (step - warmup) as f64 / (decay_iters - warmup) as f64;
    let coeff = match c.lr_decay_style {
        LrDecayStyle::Linear => 1.0 - ratio,
        LrDecayStyle::Cosine | LrDecayStyle::Constant => 0.5 * ((std::f64::consts::PI * ratio).cos() + 1.0),
    };
    (min + coeff * (max - min)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_min() {
        let c = Config { lr: 1e-3, min_lr: 1e-4, lr_warmup_iters: 10, train_iters: 110, ..Config::default() };
        // The schedule computes in f64 from the f32 config values.
        let (max, min) = (1e-3f32 as f64, 1e-4f32 as f64);
        assert_eq!(learning_rate(&c, 1), (max / 10.0) as f32);
        assert_eq!(learning_rate(&c, 10), 1e-3);
        assert_eq!(learning_rate(&c, 60), (min + 0.5 * (max - min)) as f32);
        assert_eq!(learning_rate(&c, 110), 1e-4);
        assert_eq!(learning_rate(&c, 500), 1e-4);
        let linear = Config { lr_decay_style: LrDecayStyle::Linear, ..c.clone() };
        assert_eq!(learning_rate(&linear, 35), (min + 0.75 * (max - min)) as f32);
    }
}
