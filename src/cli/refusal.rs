//! clap's refusals of a command line, each as the one line every other mistake gets
//! (`command line: ...`, exit 2), where clap's own run to several lines and a usage block.

use std::num::{IntErrorKind, ParseFloatError, ParseIntError};

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::CommandFactory;

use super::Cli;
use crate::error::user_error;

/// The line for clap's refusal `e` of `args` (the command line less the program's name).
pub fn refusal(args: &[String], e: &clap::Error) -> anyhow::Error {
    let cli = Cli::command();
    let command = args.first().map(String::as_str).filter(|c| cli.find_subcommand(c).is_some());
    let one = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => s.clone(),
        _ => String::new(),
    };
    let many = |kind| match e.get(kind) {
        Some(ContextValue::Strings(v)) => v.clone(),
        Some(ContextValue::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    };
    // clap names a flag with its value's placeholder: `--windows <WINDOWS>`.
    let flag = || one(ContextKind::InvalidArg).split(' ').next().unwrap_or_default().to_string();
    let line = match (e.kind(), command) {
        (ErrorKind::UnknownArgument, Some(command)) => {
            return unknown_argument(&cli, command, &one(ContextKind::InvalidArg));
        }
        (ErrorKind::InvalidSubcommand, _) => {
            let commands: Vec<String> = cli.get_subcommands().map(|c| c.get_name().to_string()).collect();
            let hint = many(ContextKind::SuggestedSubcommand)
                .first()
                .map(|s| format!(" (did you mean `{s}`?)"))
                .unwrap_or_default();
            let sub = one(ContextKind::InvalidSubcommand);
            format!("{sub}: not a command; pipetrain's are {}{hint}", joined(&commands, "or"))
        }
        (ErrorKind::MissingRequiredArgument, Some(command)) => {
            format!("`{command}` needs {}", joined(&many(ContextKind::InvalidArg), "and"))
        }
        (ErrorKind::InvalidValue, _) if one(ContextKind::InvalidValue).is_empty() => {
            format!("{}: needs a value", flag())
        }
        (ErrorKind::InvalidValue, _) => {
            let valid = many(ContextKind::ValidValue);
            format!("{} {}: expected {}", flag(), one(ContextKind::InvalidValue), joined(&valid, "or"))
        }
        (ErrorKind::ValueValidation, _) => {
            let value = one(ContextKind::InvalidValue);
            let why = std::error::Error::source(e).map(|why| not_a_number(&value, why)).unwrap_or_default();
            format!("{} {value}: {why}", flag())
        }
        _ => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or_default();
            first.strip_prefix("error: ").unwrap_or(first).to_string()
        }
    };
    user_error(format!("command line: {line}"))
}

/// An argument `command` has no place for, with the nearest of its names as the hint to
/// a flag, as an unknown key in the file gets. Train, simulate and bench take every config
/// key as a flag too, which clap does not know.
fn unknown_argument(cli: &clap::Command, command: &str, arg: &str) -> anyhow::Error {
    let mut names: Vec<String> = cli
        .find_subcommand(command)
        .map(|c| c.get_arguments().filter_map(|a| a.get_long()).map(|l| format!("--{l}")).collect())
        .unwrap_or_default();
    let takes_keys = matches!(command, "train" | "simulate" | "bench");
    let what = if takes_keys {
        names.extend(crate::config::key_flags());
        format!("neither a config key nor a flag of `{command}`")
    } else if arg.starts_with('-') {
        format!("not an argument of `{command}`")
    } else {
        format!("`{command}` takes no more arguments")
    };
    let hint = arg
        .starts_with("--")
        .then(|| crate::config::closest(arg, &names))
        .flatten()
        .map(|f| format!(" (did you mean `{f}`?)"))
        .unwrap_or_default();
    user_error(format!("command line: {arg}: {what}{hint}"))
}

/// Why `value` is not a number the flag takes, in words; another parser's own reason. A
/// negative number reaches an unsigned flag's parser as an invalid digit.
fn not_a_number(value: &str, e: &(dyn std::error::Error + 'static)) -> String {
    if let Some(int) = e.downcast_ref::<ParseIntError>() {
        let negative = value.strip_prefix('-').is_some_and(|v| v.parse::<f64>().is_ok());
        return match int.kind() {
            IntErrorKind::PosOverflow => "too large".into(),
            _ if negative => "must be 0 or more".into(),
            _ => "not a whole number".into(),
        };
    }
    match e.downcast_ref::<ParseFloatError>() {
        Some(_) => "not a number".into(),
        None => e.to_string(),
    }
}

/// `a`, `a or b`, `a, b or c`.
fn joined(items: &[String], word: &str) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} {word} {last}", rest.join(", ")),
    }
}
