//! `remem man --dir DIR`: manual pages in roff (clap_mangen), from the same clap definitions as
//! the parser: remem.1 and one page per visible subcommand (remem-node.1, remem-bench-pages.1).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Directory to write the pages into (created if missing), e.g. /usr/local/share/man/man1.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
}

/// Writes the pages of `command` and its visible subcommands into `dir`; returns their paths,
/// sorted.
///
/// Errors: the directory cannot be created or a page cannot be written.
pub fn write_all(command: clap::Command, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    clap_mangen::generate_to(command, dir)
        .with_context(|| format!("writing man pages into {}", dir.display()))?;
    let mut pages: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|extension| extension == "1"))
        .collect();
    pages.sort();
    Ok(pages)
}
