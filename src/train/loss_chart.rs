//! `RUN/loss.svg`: train loss, its moving average and val loss against step, tokens/s on a
//! panel below. Drawn from `metrics.jsonl`, the whole run's record, so a resumed run
//! continues the same chart.

use crate::checkpoint::write_atomic;
use crate::svg::{hsl, Svg};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Steps in the trailing mean of the train loss.
const MOVING_AVERAGE: usize = 20;

const WIDTH: f64 = 900.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const LOSS_HEIGHT: f64 = 300.0;
const PANEL_GAP: f64 = 50.0;
const RATE_HEIGHT: f64 = 140.0;
const AXIS: f64 = 40.0;

/// One line of metrics.jsonl, as far as the chart reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Point {
    step: f64,
    loss: f64,
    val_loss: Option<f64>,
    tokens_per_s: f64,
}

pub fn path(run_dir: &Path) -> PathBuf {
    run_dir.join("loss.svg")
}

/// Redraws `RUN/loss.svg` from `RUN/metrics.jsonl`.
pub fn write(run_dir: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(run_dir.join("metrics.jsonl"))?;
    let points: Vec<Point> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| {
            Some(Point {
                step: v["step"].as_f64()?,
                loss: v["loss"].as_f64()?,
                val_loss: v["val_loss"].as_f64(),
                tokens_per_s: v["tokens_per_s"].as_f64()?,
            })
        })
        .collect();
    write_atomic(&path(run_dir), &render(&points))
}

/// The trailing mean over up to [`MOVING_AVERAGE`] losses, per point.
fn moving_average(losses: &[f64]) -> Vec<f64> {
    (0..losses.len())
        .map(|i| {
            let window = &losses[(i + 1).saturating_sub(MOVING_AVERAGE)..=i];
            window.iter().sum::<f64>() / window.len() as f64
        })
        .collect()
}

/// lo..hi over the finite values, a little apart when they are equal.
fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    match (lo.is_finite(), hi > lo) {
        (false, _) => (0.0, 1.0),
        (true, true) => (lo, hi),
        (true, false) => (lo - 0.5, hi + 0.5),
    }
}

/// A panel's frame: `(lo, hi)` on its y axis maps to its bottom..top.
struct Panel {
    top: f64,
    height: f64,
    steps: (f64, f64),
    values: (f64, f64),
}

impl Panel {
    fn at(&self, step: f64, value: f64) -> (f64, f64) {
        let (s0, s1) = self.steps;
        let (v0, v1) = self.values;
        let x = LEFT + (step - s0) / (s1 - s0).max(f64::MIN_POSITIVE) * (WIDTH - LEFT - RIGHT);
        let y = self.top + self.height - (value - v0) / (v1 - v0) * self.height;
        (x, y)
    }

    fn frame(&self, svg: &mut Svg, title: &str, label: impl Fn(f64) -> String) {
        let bottom = self.top + self.height;
        svg.y_axis(LEFT, (bottom, self.top), self.values, WIDTH - RIGHT, label);
        let step_label = |s: f64| format!("{s}");
        svg.x_axis(bottom, (LEFT, WIDTH - RIGHT), self.steps, 1.0, step_label, "step");
        svg.text((LEFT, self.top - 8.0), r#" font-weight="bold""#, title);
    }

    fn series(&self, svg: &mut Svg, points: impl Iterator<Item = (f64, f64)>, stroke: &str, width: f64) {
        let xy: Vec<(f64, f64)> = points.filter(|(_, v)| v.is_finite()).map(|(s, v)| self.at(s, v)).collect();
        svg.polyline(&xy, stroke, width);
    }
}

fn render(points: &[Point]) -> String {
    let height = TOP + LOSS_HEIGHT + PANEL_GAP + RATE_HEIGHT + AXIS;
    let mut svg = Svg::new(WIDTH, height);
    let steps = match (points.first(), points.last()) {
        (Some(a), Some(b)) if b.step > a.step => (a.step, b.step),
        (Some(a), _) => (a.step - 1.0, a.step),
        _ => (0.0, 1.0),
    };
    let losses: Vec<f64> = points.iter().map(|p| p.loss).collect();
    let average = moving_average(&losses);
    let vals: Vec<(f64, f64)> = points.iter().filter_map(|p| Some((p.step, p.val_loss?))).collect();
    let loss = Panel {
        top: TOP,
        height: LOSS_HEIGHT,
        steps,
        values: range(losses.iter().copied().chain(vals.iter().map(|v| v.1))),
    };
    let (train, mean, val) = (hsl(210.0, 0.6, 0.8), hsl(210.0, 0.8, 0.35), hsl(25.0, 0.9, 0.5));
    loss.frame(&mut svg, "loss", |v| format!("{v:.2}"));
    loss.series(&mut svg, points.iter().map(|p| (p.step, p.loss)), &train, 1.0);
    loss.series(&mut svg, points.iter().zip(&average).map(|(p, a)| (p.step, *a)), &mean, 2.0);
    loss.series(&mut svg, vals.iter().copied(), &val, 2.0);
    for &(s, v) in &vals {
        svg.circle(loss.at(s, v), 3.0, &val);
    }
    let legend = [
        (train.as_str(), "train loss".to_string()),
        (mean.as_str(), format!("mean of the last {MOVING_AVERAGE} steps")),
        (val.as_str(), "val loss".to_string()),
    ];
    let mut x = LEFT + 60.0;
    for (colour, name) in legend {
        svg.rect((x, TOP - 13.5), (20.0, 3.0), colour, "");
        svg.text((x + 26.0, TOP - 8.0), "", &name);
        x += 26.0 + 7.0 * name.len() as f64 + 24.0;
    }

    let rates = Panel {
        top: TOP + LOSS_HEIGHT + PANEL_GAP,
        height: RATE_HEIGHT,
        steps,
        values: range(points.iter().map(|p| p.tokens_per_s).chain([0.0])),
    };
    rates.frame(&mut svg, "tokens/s", |v| format!("{v:.0}"));
    rates.series(&mut svg, points.iter().map(|p| (p.step, p.tokens_per_s)), &hsl(140.0, 0.6, 0.35), 1.5);
    svg.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_moving_average_trails_over_its_window() {
        let losses: Vec<f64> = (0..25).map(f64::from).collect();
        let avg = moving_average(&losses);
        assert_eq!(avg[0], 0.0);
        assert_eq!(avg[3], 1.5);
        // Steps 5..=24 once the window is full.
        assert_eq!(avg[24], 14.5);
    }

    #[test]
    fn the_chart_has_both_panels_and_every_series() {
        let points: Vec<Point> = (1..=10)
            .map(|s| Point {
                step: s as f64,
                loss: 10.0 - s as f64 * 0.5,
                val_loss: (s % 5 == 0).then_some(9.0 - s as f64 * 0.4),
                tokens_per_s: 1000.0 + s as f64,
            })
            .collect();
        let svg = render(&points);
        assert_eq!(svg.matches("<polyline").count(), 4, "train, mean, val, tokens/s");
        assert_eq!(svg.matches("<circle").count(), 2, "a marker per eval");
        for label in
            [">loss</text>", ">tokens/s</text>", ">val loss</text>", ">train loss</text>", ">step</text>"]
        {
            assert!(svg.contains(label), "no {label}");
        }
        // The first train point sits at the left edge, the highest loss at the top.
        assert!(svg.contains(&format!("{LEFT:.2},{TOP:.2}")), "{svg}");
    }
}
