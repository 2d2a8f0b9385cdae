//! docs/config.md is the config reference; this test keeps it from drifting from the parser.
//! A key is documented by a table row whose first cell is that key in backticks. Every key
//! the parser accepts (the `Config` fields and the recompute aliases) must have a row, and
//! every row must name a key the parser accepts.

use super::{aliases::ALIASES, known_keys};
use std::collections::BTreeSet;

/// The keys of `doc`'s table rows whose first cell starts with a backtick; Err names a row
/// whose first cell is not exactly one key.
fn documented_keys(doc: &str) -> Result<Vec<String>, String> {
    let mut keys = Vec::new();
    for line in doc.lines() {
        let Some(cell) = line.strip_prefix('|').and_then(|rest| rest.split('|').next()) else {
            continue;
        };
        let cell = cell.trim();
        if !cell.starts_with('`') {
            continue;
        }
        let key = cell.strip_prefix('`').and_then(|c| c.strip_suffix('`'));
        match key {
            Some(k)
                if !k.is_empty()
                    && k.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') =>
            {
                keys.push(k.to_string())
            }
            _ => {
                return Err(format!(
                    "docs/config.md: row `{line}`: the first cell must be one key in backticks"
                ))
            }
        }
    }
    Ok(keys)
}

/// What is wrong between the documented keys and the accepted ones, one line each.
fn drift(documented: &[String], accepted: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for key in documented {
        if !seen.insert(key.as_str()) {
            problems.push(format!("`{key}` has more than one row in docs/config.md"));
        }
    }
    for key in accepted {
        if !seen.contains(key.as_str()) {
            problems.push(format!("`{key}` is a config key but docs/config.md has no row for it"));
        }
    }
    for key in &seen {
        if !accepted.contains(*key) {
            problems.push(format!("`{key}` is in docs/config.md but the config parser does not accept it"));
        }
    }
    problems
}

fn accepted_keys() -> BTreeSet<String> {
    known_keys().into_iter().chain(ALIASES.iter().map(|(alias, _, _)| alias.to_string())).collect()
}

#[test]
fn docs_config_md_lists_exactly_the_accepted_keys() {
    let documented = documented_keys(include_str!("../../docs/config.md")).unwrap();
    let problems = drift(&documented, &accepted_keys());
    assert!(problems.is_empty(), "docs/config.md and the config parser disagree:\n{}", problems.join("\n"));
}

#[test]
fn drift_names_the_missing_and_the_extra_key() {
    let accepted: BTreeSet<String> = ["lr", "seed"].map(String::from).into();
    let doc = "| key | default | meaning |\n|---|---|---|\n| `lr` | 6e-4 | peak |\n| `sed` | 1 | typo |\n";
    let documented = documented_keys(doc).unwrap();
    assert_eq!(documented, ["lr", "sed"]);
    assert_eq!(
        drift(&documented, &accepted),
        [
            "`seed` is a config key but docs/config.md has no row for it",
            "`sed` is in docs/config.md but the config parser does not accept it",
        ]
    );
    assert_eq!(
        drift(&["lr".into(), "lr".into()], &["lr".to_string()].into()),
        ["`lr` has more than one row in docs/config.md"]
    );
}

#[test]
fn a_row_of_two_keys_is_refused() {
    assert_eq!(
        documented_keys("| `lr`, `min_lr` | 6e-4, 6e-5 | |\n").unwrap_err(),
        "docs/config.md: row `| `lr`, `min_lr` | 6e-4, 6e-5 | |`: the first cell must be one key in backticks"
    );
}
