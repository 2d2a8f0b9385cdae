//! The drawing primitives every chart shares (the simulated pipeline chart, the training
//! loss chart): an SVG document built element by element, colours, and axes with round
//! ticks.

use std::fmt::Write as _;

/// An SVG document being drawn, white background, sans-serif 11 px text.
pub struct Svg {
    out: String,
}

impl Svg {
    pub fn new(width: f64, height: f64) -> Svg {
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
        );
        let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
        Svg { out }
    }

    /// Markup with no primitive of its own (pattern definitions).
    pub fn raw(&mut self, markup: &str) {
        let _ = writeln!(self.out, "{markup}");
    }

    /// A box; `fill` is a colour or `url(#pattern)`; `extra` more attributes, or "".
    pub fn rect(&mut self, (x, y): (f64, f64), (w, h): (f64, f64), fill: &str, extra: &str) {
        let _ = writeln!(
            self.out,
            r#"<rect x="{x:.2}" y="{y:.2}" width="{w:.2}" height="{h:.2}" fill="{fill}"{extra}/>"#
        );
    }

    /// Text at (x, y); `attrs` more attributes (anchor, size, colour), or "".
    pub fn text(&mut self, (x, y): (f64, f64), attrs: &str, content: &str) {
        let content = content.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        let _ = writeln!(self.out, r#"<text x="{x:.2}" y="{y:.2}"{attrs}>{content}</text>"#);
    }

    pub fn line(&mut self, (x1, y1): (f64, f64), (x2, y2): (f64, f64), stroke: &str) {
        let _ = writeln!(
            self.out,
            r#"<line x1="{x1:.2}" y1="{y1:.2}" x2="{x2:.2}" y2="{y2:.2}" stroke="{stroke}"/>"#
        );
    }

    /// A line through `points`, in order.
    pub fn polyline(&mut self, points: &[(f64, f64)], stroke: &str, width: f64) {
        let mut coords = String::new();
        for (x, y) in points {
            let _ = write!(coords, "{x:.2},{y:.2} ");
        }
        let _ = writeln!(
            self.out,
            r#"<polyline points="{}" fill="none" stroke="{stroke}" stroke-width="{width}"/>"#,
            coords.trim_end()
        );
    }

    pub fn circle(&mut self, (x, y): (f64, f64), r: f64, fill: &str) {
        let _ = writeln!(self.out, r#"<circle cx="{x:.2}" cy="{y:.2}" r="{r}" fill="{fill}"/>"#);
    }

    /// A horizontal axis at height `y` from x0 to x1 for values lo..hi: a rule, round ticks
    /// at least `min_step` apart labelled by `label`, and `name` at the right end below.
    pub fn x_axis(
        &mut self,
        y: f64,
        (x0, x1): (f64, f64),
        (lo, hi): (f64, f64),
        min_step: f64,
        label: impl Fn(f64) -> String,
        name: &str,
    ) {
        self.line((x0, y), (x1, y), "black");
        let scale = (x1 - x0) / (hi - lo).max(f64::MIN_POSITIVE);
        for t in ticks(lo, hi, min_step) {
            let x = x0 + (t - lo) * scale;
            self.line((x, y), (x, y + 5.0), "black");
            self.text((x, y + 18.0), r#" text-anchor="middle""#, &label(t));
        }
        self.text((x1, y + 34.0), r#" text-anchor="end""#, name);
    }

    /// A vertical axis at `x` from y0 (bottom, value lo) up to y1 (top, value hi), with
    /// light grid lines across to `grid_to`.
    pub fn y_axis(
        &mut self,
        x: f64,
        (y0, y1): (f64, f64),
        (lo, hi): (f64, f64),
        grid_to: f64,
        label: impl Fn(f64) -> String,
    ) {
        self.line((x, y0), (x, y1), "black");
        let scale = (y0 - y1) / (hi - lo).max(f64::MIN_POSITIVE);
        for t in ticks(lo, hi, 0.0) {
            let y = y0 - (t - lo) * scale;
            self.line((x - 5.0, y), (x, y), "black");
            self.line((x, y), (grid_to, y), "#e6e6e6");
            self.text((x - 8.0, y + 4.0), r#" text-anchor="end""#, &label(t));
        }
    }

    pub fn finish(mut self) -> String {
        self.out.push_str("</svg>\n");
        self.out
    }
}

/// #rrggbb of hue (degrees), saturation and lightness (0..1).
pub fn hsl(h: f64, s: f64, l: f64) -> String {
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

/// A round tick step giving about 10 ticks over `span`.
pub fn tick_step(span: f64) -> f64 {
    let raw = span / 10.0;
    let pow = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|k| k * pow).find(|s| *s >= raw).unwrap_or(10.0 * pow)
}

/// The multiples of the tick step (at least `min_step`: whole training steps) within lo..=hi.
pub fn ticks(lo: f64, hi: f64, min_step: f64) -> Vec<f64> {
    let span = hi - lo;
    if span.is_nan() || span <= 0.0 {
        return vec![lo];
    }
    let step = tick_step(span).max(min_step);
    let first = (lo / step).ceil() as i64;
    (first..).map(|i| i as f64 * step).take_while(|t| *t <= hi + span * 1e-9).collect()
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
        assert_eq!(ticks(0.0, 13.0, 0.0), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
        assert_eq!(ticks(3.5, 10.8, 0.0), [4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        assert_eq!(ticks(1.0, 2.0, 1.0), [1.0, 2.0]);
        assert_eq!(ticks(5.0, 5.0, 0.0), [5.0]);
    }

    #[test]
    fn text_is_escaped_and_the_document_closed() {
        let mut svg = Svg::new(10.0, 20.0);
        svg.text((1.0, 2.0), "", "a<b & c");
        let doc = svg.finish();
        assert!(doc.starts_with(r#"<svg xmlns="http://www.w3.org/2000/svg" width="10" height="20""#));
        assert!(doc.contains(r#"<text x="1.00" y="2.00">a&lt;b &amp; c</text>"#), "{doc}");
        assert!(doc.ends_with("</svg>\n"));
    }
}
