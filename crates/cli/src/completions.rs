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
pub fn write(shell: Shell, mut command: clap::Command, out: &mut dyn Write) -> Result<()> {
    let name = command.get_name().to_owned();
    clap_complete::generate(shell, &mut command, name, out);
    out.flush().context("writing the completion script")
}
