//! The pipeline chart: one row per stage, time across, every compute pass a box coloured by
//! its microbatch (hue) and shaded by its pass — forward light, backward dark, weight
//! gradient mid-tone and hatched, recompute pale and dotted; each stage's optimizer step
//! after its list is grey.

use super::report::seconds;
use super::setup::Setup;
use crate::error::user_error;
use schedules::{EventKind, SimReport};
use std::fmt::Write as _;
use std::path::Path;

const WIDTH: f64 = 1600.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 62.0;
const ROW: f64 = 22.0;
const GAP: f64 = 4.0;
const AXIS: f64 = 40.0;

/// #rrggbb of hue (degrees), saturation and lightness (0..1).
fn hsl(h: f64, s: f64, l: f64) -> String {
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let x = c * (1.0 - ((h / 60.0) % 2.0 - 1.0).abs());
    let (r, g, b) = match (h / 60.0) as u32 % 6 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let byte = |v: f64| ((v + m) * 255.0).round() as u8;
    format!("#{:02x}{:02x}{:02x}", byte(r), byte(g), byte(b))
}

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

/// A round tick step giving about 10 ticks over `span` seconds.
fn tick_step(span: f64) -> f64 {
    let raw = span / 10.0;
    let pow = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|k| k * pow).find(|s| *s >= raw).unwrap_or(10.0 * pow)
}

pub fn render(setup: &Setup, sim: &SimReport) -> String {
    let p = setup.p;
    let height = TOP + p as f64 * (ROW + GAP) + AXIS;
    let span = sim.iteration_time.max(f64::MIN_POSITIVE);
    let scale = (WIDTH - LEFT - RIGHT) / span;
    let mut svg = String::new();
    let w = &mut svg;
    let _ = writeln!(
        w,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        w,
        concat!(
            r#"<defs><pattern id="hatch" width="5" height="5" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">"#,
            r#"<line x1="0" y1="0" x2="0" y2="5" stroke="white" stroke-width="2" stroke-opacity="0.8"/></pattern>"#,
            r#"<pattern id="dots" width="4" height="4" patternUnits="userSpaceOnUse">"#,
            r#"<circle cx="2" cy="2" r="0.9" fill="black" fill-opacity="0.45"/></pattern></defs>"#
        )
    );
    let _ = writeln!(w, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        w,
        r#"<text x="{LEFT}" y="18" font-size="14" font-weight="bold">{}, p={}, v={}, m={}: iteration {}, bubble {:.1}%</text>"#,
        setup.kind,
        p,
        setup.v,
        setup.m,
        seconds(sim.iteration_time),
        100.0 * sim.bubble_rate
    );
    legend(w);

    for r in 0..p {
        let y = TOP + r as f64 * (ROW + GAP);
        let _ = writeln!(
            w,
            r##"<rect x="{LEFT}" y="{y}" width="{}" height="{ROW}" fill="#f2f2f2"/>"##,
            WIDTH - LEFT - RIGHT
        );
        let _ = writeln!(
            w,
            r#"<text x="{}" y="{}" text-anchor="end">stage {r}</text>"#,
            LEFT - 8.0,
            y + ROW / 2.0 + 4.0
        );
    }
    for e in sim.timeline.iter().filter(|e| !matches!(e.kind, EventKind::Transfer { .. })) {
        let (fill, overlay, white_text) = style(e.kind, hue(e.microbatch));
        let x = LEFT + e.start * scale;
        let bw = ((e.end - e.start) * scale).max(0.5);
        let y = TOP + e.stage as f64 * (ROW + GAP);
        let edge = if bw > 3.0 { r#" stroke="white" stroke-width="0.5""# } else { "" };
        let _ =
            writeln!(w, r#"<rect x="{x:.2}" y="{y}" width="{bw:.2}" height="{ROW}" fill="{fill}"{edge}/>"#);
        if let Some(id) = overlay {
            let _ =
                writeln!(w, r#"<rect x="{x:.2}" y="{y}" width="{bw:.2}" height="{ROW}" fill="url(#{id})"/>"#);
        }
        let label = match e.kind {
            EventKind::Optimizer => "optimizer".to_string(),
            _ if setup.v > 1 => format!("{}.{}", e.microbatch, e.chunk),
            _ => e.microbatch.to_string(),
        };
        if bw > 7.0 * label.len() as f64 + 4.0 {
            let colour = if white_text { "white" } else { "black" };
            let _ = writeln!(
                w,
                r#"<text x="{:.2}" y="{}" text-anchor="middle" font-size="10" fill="{colour}">{label}</text>"#,
                x + bw / 2.0,
                y + ROW / 2.0 + 3.5
            );
        }
    }
    axis(w, span, scale, TOP + p as f64 * (ROW + GAP));
    let _ = writeln!(w, "</svg>");
    svg
}

fn legend(w: &mut String) {
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
        let _ = writeln!(w, r#"<rect x="{x}" y="32" width="22" height="14" fill="{fill}"/>"#);
        if let Some(id) = overlay {
            let _ = writeln!(w, r#"<rect x="{x}" y="32" width="22" height="14" fill="url(#{id})"/>"#);
        }
        let _ = writeln!(w, r#"<text x="{}" y="43">{name}</text>"#, x + 28.0);
        x += 28.0 + 7.0 * name.len() as f64 + 24.0;
    }
    let _ = writeln!(
        w,
        r##"<text x="{x}" y="43" fill="#555">colour: microbatch (label: microbatch[.chunk])</text>"##
    );
}

fn axis(w: &mut String, span: f64, scale: f64, y: f64) {
    let _ = writeln!(w, r#"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="black"/>"#, WIDTH - RIGHT);
    let step = tick_step(span);
    let mut i = 0;
    loop {
        let t = i as f64 * step;
        if t > span * (1.0 + 1e-9) {
            break;
        }
        let x = LEFT + t * scale;
        let _ = writeln!(w, r#"<line x1="{x:.2}" y1="{y}" x2="{x:.2}" y2="{}" stroke="black"/>"#, y + 5.0);
        let label = if i == 0 { "0".to_string() } else { seconds(t) };
        let _ = writeln!(w, r#"<text x="{x:.2}" y="{}" text-anchor="middle">{label}</text>"#, y + 18.0);
        i += 1;
    }
    let _ = writeln!(w, r#"<text x="{}" y="{}" text-anchor="end">time</text>"#, WIDTH - RIGHT, y + 34.0);
}

pub fn write(path: &Path, setup: &Setup, sim: &SimReport) -> anyhow::Result<()> {
    std::fs::write(path, render(setup, sim))
        .map_err(|e| user_error(format!("--svg {}: cannot write the chart: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_and_ticks() {
        assert_eq!(hsl(0.0, 1.0, 0.5), "#ff0000");
        assert_eq!(hsl(240.0, 1.0, 0.5), "#0000ff");
        assert_eq!(hsl(120.0, 0.0, 1.0), "#ffffff");
        assert_eq!(tick_step(1.0), 0.1);
        assert_eq!(tick_step(0.7), 0.1);
        assert_eq!(tick_step(13.0), 2.0);
    }
}
