//! `remem completions SHELL`: the shell's completion script for the whole command line, printed
//! on stdout (clap_complete, from the same clap definitions as the parser, so it never lags a
//! flag).

use std::io::Write;

use anyhow::{Context, Result};

/// The shells `remem completions` knows.
pub use clap_complete::Shell;

#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell. Bash: `source <(remem completions bash)`, or save
    /// it as /usr/share/bash-completion/completions/remem.
    pub shell: Shell,
}

/// Writes the completion script of `command` (the `remem` command with all its subcommands)
/// for `shell` to `out`.
///
/// Errors: only those of writing to `out`.
pub fn write(shell: Shell, command: clap::Command, out: &mut dyn Write) -> Result<()> {
    let mut command = with_value_lists(command);
    let name = command.get_name().to_owned();
    clap_complete::generate(shell, &mut command, name, out);
    out.flush().context("writing the completion script")
}

/// `command` with the values of free-string arguments listed, for completion scripts and man
/// pages: `remem kv --scheme <TAB>` offers auto and the scheme names instead of file names.
/// (kv parses these strings itself, against its -k/-r shape; listing them here leaves its
/// parsing as it is.)
pub fn with_value_lists(command: clap::Command) -> clap::Command {
    let schemes: Vec<&'static str> =
        remem_kv::scheme::Scheme::ALL.iter().map(|scheme| scheme.stat_name()).collect();
    let listed = |values: Vec<&'static str>| {
        move |arg: clap::Arg| arg.value_parser(clap::builder::PossibleValuesParser::new(values.clone()))
    };
    let with_auto: Vec<&'static str> = std::iter::once("auto").chain(schemes.iter().copied()).collect();
    command.mut_subcommand("kv", |kv| {
        kv.mut_arg("scheme", listed(with_auto))
            .mut_arg("small_scheme", listed(schemes.clone()))
            .mut_arg("large_scheme", listed(schemes.clone()))
    })
}
