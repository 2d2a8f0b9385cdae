//! pipetrain: pipeline-parallel pretraining of GPT-2 and Llama-family models with
//! Megatron-style activation recompute, and a simulator of schedules and recompute plans.

mod bench;
mod checkpoint;
mod cli;
mod config;
mod data;
mod error;
mod eval;
mod export;
mod generate;
mod plan;
#[cfg(test)]
mod reader_fuzz;
mod simulate;
mod svg;
mod trace;
mod train;

use clap::error::ErrorKind;
use std::process::ExitCode;

fn main() -> ExitCode {
    quiet_out_of_memory_panics();
    let args: Vec<String> = std::env::args().collect();
    // Only the commands that read a config take config keys as flags.
    let takes_config = matches!(args.get(1).map(String::as_str), Some("train" | "simulate" | "bench"));
    let (overrides, rest) = if takes_config {
        match config::split_overrides(&args[1..]) {
            Ok(split) => split,
            Err(e) => return report(e),
        }
    } else {
        (Vec::new(), args[1..].to_vec())
    };
    let cli = match cli::parse(std::iter::once(args[0].clone()).chain(rest)) {
        Ok(cli) => cli,
        // Help and the version are printed as clap writes them; a bare `pipetrain` gets the help.
        Err(e) if !e.use_stderr() || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
        Err(e) => return report(cli::refusal(&args[1..], &e)),
    };
    if !matches!(cli.command, cli::Command::Train(_)) {
        end_quietly_when_the_reader_stops();
    }
    let result = match cli.command {
        cli::Command::Train(a) => train::run(&a, &overrides),
        cli::Command::Simulate(a) => simulate::run(&a, &overrides),
        cli::Command::Tokenize(a) => data::tokenize(&a).map(|summary| println!("{summary}")),
        cli::Command::Export(a) => export::run(&a),
        cli::Command::Eval(a) => eval::run(&a),
        cli::Command::Generate(a) => generate::run(&a),
        cli::Command::Bench(a) => bench::run(&a, &overrides),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report(e),
    }
}

/// A device out of memory panics with a [`kernels::OutOfMemory`] (ops are infallible); the
/// rank that catches it reports it in one line, so the panic itself prints nothing.
fn quiet_out_of_memory_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<kernels::OutOfMemory>().is_none() {
            default(info);
        }
    }));
}

/// Reports are read through pipes (`simulate --sweep | head`). Rust ignores SIGPIPE, so a
/// reader that stops early made the next print panic; a read-only command now ends as `cat`
/// does. Training keeps the default: a closed terminal is an error it handles, not a signal
/// that kills it before its checkpoint.
fn end_quietly_when_the_reader_stops() {
    // SAFETY: sets the disposition of one signal before any thread starts; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// One line for a user mistake (exit 2), missing hardware (exit 3) or an interruption
/// (exit 130); the full chain for anything else (exit 1).
fn report(e: anyhow::Error) -> ExitCode {
    if let Some(error::Quiet(code)) = e.downcast_ref::<error::Quiet>() {
        ExitCode::from(*code)
    } else if e.is::<error::NoDevice>() {
        error::print_line(&e.to_string());
        ExitCode::from(3)
    } else if e.is::<error::Interrupted>() {
        error::print_line(&e.to_string());
        ExitCode::from(130)
    } else if error::is_user_error(&e) {
        error::print_line(&format!("error: {e}"));
        ExitCode::from(2)
    } else {
        error::print_line(&format!("error: {e:#}"));
        ExitCode::from(1)
    }
}
