//! clap's refusals of a command line, each as the one line every other mistake gets
//! (`command line: ...`, exit 2), where clap's own run to several lines and a usage block.

use std::num::{IntErrorKind, ParseFloatError, ParseIntError};

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::CommandFactory;

use super::Cli;
use crate::error::user_error;

/// The line for clap's refusal `e` of `args` (the command line less the program's name).
pub fn refusal(args: &[String], e: &clap::Error) -> anyhow::Error {
    let command = args.first().map(String::as_str).filter(|c| Cli::command().find_subcommand(c).is_some());
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
            return unknown_argument(command, &one(ContextKind::InvalidArg));
        }
        (ErrorKind::InvalidSubcommand, _) => {
            let commands: Vec<String> =
                Cli::command().get_subcommands().map(|c| c.get_name().to_string()).collect();
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

/// An argument `command` has no place for. Under train, simulate and bench a flag may be a
/// config key too, which clap does not know: the nearest of either is the hint, as an
/// unknown key in the file gets.
fn unknown_argument(command: &str, arg: &str) -> anyhow::Error {
    let own: Vec<String> = Cli::command()
        .find_subcommand(command)
        .map(|c| c.get_arguments().filter_map(|a| a.get_long()).map(|l| format!("--{l}")).collect())
        .unwrap_or_default();
    if matches!(command, "train" | "simulate" | "bench") {
        return crate::config::unknown_argument(command, arg, &own);
    }
    if !arg.starts_with('-') {
        return user_error(format!("command line: {arg}: `{command}` takes no more arguments"));
    }
    let hint = arg
        .starts_with("--")
        .then(|| crate::config::closest(arg, &own))
        .flatten()
        .map(|f| format!(" (did you mean `{f}`?)"))
        .unwrap_or_default();
    user_error(format!("command line: {arg}: not an argument of `{command}`{hint}"))
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
