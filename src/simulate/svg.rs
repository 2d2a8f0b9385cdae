//! The pipeline chart: one row per stage, time across, every compute pass a box coloured by
//! its microbatch (hue) and shaded by its pass — forward light, backward dark, weight
//! gradient mid-tone and hatched, recompute pale and dotted; each stage's optimizer step
//! after its list is grey.

use super::report::seconds;
use super::setup::Setup;
use crate::error::user_error;
use crate::svg::{hsl, Svg};
use schedules::{EventKind, SimReport};
use std::path::Path;

const WIDTH: f64 = 1600.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 62.0;
const ROW: f64 = 22.0;
const GAP: f64 = 4.0;
const AXIS: f64 = 40.0;

/// The overlay patterns the passes use: white hatching, dark dots.
const PATTERNS: &str = concat!(
    r#"<defs><pattern id="hatch" width="5" height="5" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">"#,
    r#"<line x1="0" y1="0" x2="0" y2="5" stroke="white" stroke-width="2" stroke-opacity="0.8"/></pattern>"#,
    r#"<pattern id="dots" width="4" height="4" patternUnits="userSpaceOnUse">"#,
    r#"<circle cx="2" cy="2" r="0.9" fill="black" fill-opacity="0.45"/></pattern></defs>"#
);

/// Neighbouring microbatches get far-apart hues (golden angle).
fn hue(microbatch: usize) -> f64 {
    (microbatch as f64 * 137.508) % 360.0
}

/// Fill, overlay pattern and whether labels should be white, per pass.
fn style(kind: EventKind, hue: f64) -> (String, Option<&'static str>, bool) {
    match kind {
        EventKind::Forward => (hsl(hue, 0.7, 0.78), None, false),
        EventKind::Backward | EventKind::BackwardInput => (hsl(hue, 0.7, 0.38), None, true),
        EventKind::BackwardWeight => (hsl(hue, 0.7, 0.58), Some("hatch"), false),
        EventKind::Recompute => (hsl(hue, 0.25, 0.85), Some("dots"), false),
        EventKind::Optimizer => ("#9e9e9e".to_string(), None, true),
        EventKind::Transfer { .. } => unreachable!("transfers are not drawn"),
    }
}

/// A pass's box, with its overlay pattern if it has one.
fn pass_box(svg: &mut Svg, at: (f64, f64), size: (f64, f64), fill: &str, overlay: Option<&str>, edge: &str) {
    svg.rect(at, size, fill, edge);
    if let Some(id) = overlay {
        svg.rect(at, size, &format!("url(#{id})"), "");
    }
}

pub fn render(setup: &Setup, sim: &SimReport) -> String {
    let p = setup.p;
    let height = TOP + p as f64 * (ROW + GAP) + AXIS;
    let span = sim.iteration_time.max(f64::MIN_POSITIVE);
    let scale = (WIDTH - LEFT - RIGHT) / span;
    let mut svg = Svg::new(WIDTH, height);
    svg.raw(PATTERNS);
    let title = format!(
        "{}, p={}, v={}, m={}: iteration {}, bubble {:.1}%",
        setup.kind,
        p,
        setup.v,
        setup.m,
        seconds(sim.iteration_time),
        100.0 * sim.bubble_rate
    );
    svg.text((LEFT, 18.0), r#" font-size="14" font-weight="bold""#, &title);
    legend(&mut svg);

    for r in 0..p {
        let y = TOP + r as f64 * (ROW + GAP);
        svg.rect((LEFT, y), (WIDTH - LEFT - RIGHT, ROW), "#f2f2f2", "");
        svg.text((LEFT - 8.0, y + ROW / 2.0 + 4.0), r#" text-anchor="end""#, &format!("stage {r}"));
    }
    for e in sim.timeline.iter().filter(|e| !matches!(e.kind, EventKind::Transfer { .. })) {
        let (fill, overlay, white_text) = style(e.kind, hue(e.microbatch));
        let x = LEFT + e.start * scale;
        let bw = ((e.end - e.start) * scale).max(0.5);
        let y = TOP + e.stage as f64 * (ROW + GAP);
        let edge = if bw > 3.0 { r#" stroke="white" stroke-width="0.5""# } else { "" };
        pass_box(&mut svg, (x, y), (bw, ROW), &fill, overlay, edge);
        let label = match e.kind {
            EventKind::Optimizer => "optimizer".to_string(),
            _ if setup.v > 1 => format!("{}.{}", e.microbatch, e.chunk),
            _ => e.microbatch.to_string(),
        };
        if bw > 7.0 * label.len() as f64 + 4.0 {
            let colour = if white_text { "white" } else { "black" };
            let attrs = format!(r#" text-anchor="middle" font-size="10" fill="{colour}""#);
            svg.text((x + bw / 2.0, y + ROW / 2.0 + 3.5), &attrs, &label);
        }
    }
    let label = |t: f64| if t == 0.0 { "0".to_string() } else { seconds(t) };
    svg.x_axis(TOP + p as f64 * (ROW + GAP), (LEFT, WIDTH - RIGHT), (0.0, span), 0.0, label, "time");
    svg.finish()
}

fn legend(svg: &mut Svg) {
    let hue = 210.0;
    let items = [
        (EventKind::Forward, "forward"),
        (EventKind::Backward, "backward / backward-input"),
        (EventKind::BackwardWeight, "backward-weight"),
        (EventKind::Recompute, "recompute"),
        (EventKind::Optimizer, "optimizer"),
    ];
    let mut x = LEFT;
    for (kind, name) in items {
        let (fill, overlay, _) = style(kind, hue);
        pass_box(svg, (x, 32.0), (22.0, 14.0), &fill, overlay, "");
        svg.text((x + 28.0, 43.0), "", name);
        x += 28.0 + 7.0 * name.len() as f64 + 24.0;
    }
    svg.text((x, 43.0), r##" fill="#555""##, "colour: microbatch (label: microbatch[.chunk])");
}

pub fn write(path: &Path, setup: &Setup, sim: &SimReport) -> anyhow::Result<()> {
    std::fs::write(path, render(setup, sim)).map_err(|e| {
        user_error(format!("command line: --svg {}: cannot write the chart: {e}", path.display()))
    })
}
