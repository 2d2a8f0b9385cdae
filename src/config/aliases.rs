//! Other spellings of the recompute settings, as launch scripts and write-ups still use them:
//! Megatron-LM's earlier names and the flag of minimal GPT trainers. Each alias means a set
//! of canonical settings; it is resolved here, before anything else reads the config, so
//! that the rest of pipetrain knows only the canonical keys.

use super::{show, Entry, Origin};
use crate::error::user_error;
use serde::Serialize;
use serde_norway::Value;

/// (alias, its value, what that means), for `--help`.
pub const ALIASES: [(&str, &str, &str); 4] = [
    ("checkpoint_num_layers", "N", "recompute_num_layers: N (Megatron's earlier name)"),
    (
        "checkpoint_activations",
        "true",
        "recompute_granularity: full, recompute_method: uniform, recompute_num_layers from \
         checkpoint_num_layers, default 1 (Megatron's earlier flag)",
    ),
    ("recompute_activations", "true", "recompute_granularity: selective (Megatron's shorthand)"),
    (
        "use_activation_checkpoint",
        "true",
        "recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1 \
         (minimal GPT trainers)",
    ),
];

/// Aliases that are switches: on the command line they may be given without a value.
const SWITCHES: [&str; 3] = ["checkpoint_activations", "recompute_activations", "use_activation_checkpoint"];

pub fn is_alias(key: &str) -> bool {
    ALIASES.iter().any(|(alias, _, _)| *alias == key)
}

pub fn is_switch(key: &str) -> bool {
    SWITCHES.contains(&key)
}

/// An alias the config used and the canonical settings it became, for config.yaml, the
/// run report and `simulate`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AliasUse {
    /// As written, e.g. `checkpoint_activations: true`.
    pub given: String,
    /// The canonical settings it resolved to, e.g. `recompute_granularity: full, ...`.
    pub means: String,
}

impl AliasUse {
    /// `recompute_granularity: selective (given as recompute_activations: true)`
    pub fn describe(&self) -> String {
        format!("{} (given as {})", self.means, self.given)
    }
}

/// One canonical setting an alias implies.
pub struct Implied {
    pub key: &'static str,
    pub value: Value,
    /// A default (checkpoint_activations' N = 1): it yields to any other value of the key
    /// instead of disagreeing with it.
    pub default_only: bool,
}

/// What `alias: value` means. Err is the reason the value is wrong, for the caller to place.
pub fn expand(alias: &str, value: &Value) -> Result<Vec<Implied>, String> {
    let set = |key, v: &str| Implied { key, value: Value::String(v.into()), default_only: false };
    let layers =
        |n: u64, default_only| Implied { key: "recompute_num_layers", value: n.into(), default_only };
    if alias == "checkpoint_num_layers" {
        return match value.as_u64() {
            Some(n) => Ok(vec![layers(n, false)]),
            None => Err("expected a number of layers".into()),
        };
    }
    let on = value.as_bool().ok_or_else(|| "expected true or false".to_string())?;
    if !on {
        return Ok(vec![]);
    }
    Ok(match alias {
        "checkpoint_activations" => {
            vec![set("recompute_granularity", "full"), set("recompute_method", "uniform"), layers(1, true)]
        }
        "recompute_activations" => vec![set("recompute_granularity", "selective")],
        "use_activation_checkpoint" => {
            vec![set("recompute_granularity", "full"), set("recompute_method", "uniform"), layers(1, false)]
        }
        other => unreachable!("`{other}` is not an alias"),
    })
}

/// Replaces every alias entry by the canonical entries it means, and returns them with the
/// aliases that took effect. The command line beats the file key by key, an alias counting
/// as the keys it means; two spellings of one key that disagree are an error naming both.
pub(super) fn resolve(entries: Vec<Entry>) -> anyhow::Result<(Vec<Entry>, Vec<AliasUse>)> {
    let mut expanded = Vec::new();
    for e in entries {
        if !is_alias(&e.key) {
            expanded.push(e);
            continue;
        }
        let implied = expand(&e.key, &e.value).map_err(|why| {
            user_error(format!("{}: bad value {}: {why}", e.origin.describe(&e.key), show(&e.value)))
        })?;
        for i in implied {
            expanded.push(Entry {
                key: i.key.into(),
                value: i.value,
                default_only: i.default_only,
                ..e.clone()
            });
        }
    }
    let is_flag = |e: &Entry| matches!(e.origin, Origin::Flag(_));
    let on_command_line: Vec<String> =
        expanded.iter().filter(|e| is_flag(e) && !e.default_only).map(|e| e.key.clone()).collect();
    expanded.retain(|e| is_flag(e) || !on_command_line.contains(&e.key));
    let given: Vec<String> = expanded.iter().filter(|e| !e.default_only).map(|e| e.key.clone()).collect();
    expanded.retain(|e| !(e.default_only && given.contains(&e.key)));

    let mut used: Vec<AliasUse> = Vec::new();
    for e in expanded.iter().filter(|e| e.is_alias_setting()) {
        let given = format!("{}: {}", e.written, show(&e.written_value));
        let setting = format!("{}: {}", e.key, show(&e.value));
        match used.iter_mut().find(|u| u.given == given) {
            Some(u) => u.means = format!("{}, {setting}", u.means),
            None => used.push(AliasUse { given, means: setting }),
        }
    }
    let mut kept: Vec<Entry> = Vec::new();
    for e in expanded {
        match kept.iter().find(|k| k.key == e.key) {
            Some(k) if k.value != e.value => {
                return Err(user_error(format!(
                    "{} and {} disagree on {}: {} vs {}",
                    k.said(),
                    e.said(),
                    e.key,
                    show(&k.value),
                    show(&e.value)
                )))
            }
            Some(_) => {}
            None => kept.push(e),
        }
    }
    Ok((kept, used))
}

/// `--help` text: the aliases and what each means.
pub fn help() -> String {
    let mut text =
        String::from("Recompute aliases (in YAML, or as --kebab-case flags; a switch needs no value):\n");
    for (alias, value, means) in ALIASES {
        text.push_str(&format!("  {alias}: {value}  means  {means}\n"));
    }
    text
}
