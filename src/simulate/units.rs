//! Byte sizes as people write them (`80GiB`, `40 GB`, `512MiB`) and as the reports print them.

use crate::error::user_error;

const UNITS: [(&str, f64); 9] = [
    ("B", 1.0),
    ("KB", 1e3),
    ("KiB", 1024.0),
    ("MB", 1e6),
    ("MiB", 1048576.0),
    ("GB", 1e9),
    ("GiB", 1073741824.0),
    ("TB", 1e12),
    ("TiB", 1099511627776.0),
];

/// A size with a unit: decimal (KB, MB, GB, TB: powers of 1000) or binary (KiB, MiB, GiB,
/// TiB: powers of 1024), unit names case-insensitive. `flag` names the option in errors.
pub fn parse_bytes(flag: &str, text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (number, unit) = (t[..split].trim(), t[split..].trim());
    let names = UNITS.map(|(n, _)| n).join(", ");
    let scale =
        UNITS.iter().find(|(name, _)| name.eq_ignore_ascii_case(unit)).map(|(_, s)| *s).ok_or_else(|| {
            user_error(format!("command line: {flag} {text}: give a size with a unit ({names}), e.g. 80GiB"))
        })?;
    match number.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok((x * scale).round() as u64),
        _ => {
            Err(user_error(format!("command line: {flag} {text}: the size must be a number > 0, e.g. 80GiB")))
        }
    }
}

/// `1.50 GiB`-style, binary units.
pub fn format_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    match UNITS.iter().rev().step_by(2).find(|(_, s)| b >= *s) {
        Some((name, scale)) if *scale > 1.0 => format!("{:.2} {name}", b / scale),
        _ => format!("{bytes} B"),
    }
}

/// A rate with an SI prefix and three significant digits: `95.8 GFLOP/s`, `3.35 TB/s`.
pub fn format_rate(per_second: f64, unit: &str) -> String {
    let prefixes = ["", "k", "M", "G", "T", "P", "E"];
    let mut v = per_second;
    let mut i = 0;
    while v >= 999.5 && i + 1 < prefixes.len() {
        v /= 1000.0;
        i += 1;
    }
    let digits = if v >= 99.95 {
        0
    } else if v >= 9.995 {
        1
    } else {
        2
    };
    format!("{v:.digits$} {}{unit}/s", prefixes[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_decimal_and_binary_units() {
        assert_eq!(parse_bytes("--memory-limit", "80GiB").unwrap(), 80 << 30);
        assert_eq!(parse_bytes("--memory-limit", "80 GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_bytes("--memory-limit", "1.5mib").unwrap(), 1_572_864);
        assert_eq!(parse_bytes("--memory-limit", "512MB").unwrap(), 512_000_000);
        assert_eq!(
            parse_bytes("--memory-limit", "80").unwrap_err().to_string(),
            "command line: --memory-limit 80: give a size with a unit (B, KB, KiB, MB, MiB, GB, GiB, TB, TiB), e.g. 80GiB"
        );
        assert_eq!(
            parse_bytes("--memory-limit", "-3GB").unwrap_err().to_string(),
            "command line: --memory-limit -3GB: the size must be a number > 0, e.g. 80GiB"
        );
    }

    #[test]
    fn formats_with_binary_units() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
        assert_eq!(format_bytes(100_679_680), "96.02 MiB");
        assert_eq!(format_rate(989e12, "FLOP"), "989 TFLOP/s");
        assert_eq!(format_rate(95.8e9, "FLOP"), "95.8 GFLOP/s");
        assert_eq!(format_rate(3.35e12, "B"), "3.35 TB/s");
        assert_eq!(format_rate(999.7e9, "B"), "1.00 TB/s");
    }
}
