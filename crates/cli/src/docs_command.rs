//! `remem docs [NAME]`: the documents of docs/ built into the binary, so that the names the
//! help texts and manual pages give (`docs/KV.md`) can be read wherever remem is installed, with
//! no source tree beside it.

use anyhow::{bail, Result};

#[derive(clap::Args, Debug)]
pub struct DocsArgs {
    /// The document to print, as the help texts name it: KV, docs/KV.md, kv (case does not
    /// matter). Without it, the list of documents.
    pub name: Option<String>,
}

/// Every document of docs/, by name (the file name without `.md`).
pub const DOCUMENTS: &[(&str, &str)] = &[
    ("APPS", include_str!("../../../docs/APPS.md")),
    ("ARCHITECTURE", include_str!("../../../docs/ARCHITECTURE.md")),
    ("BENCHMARKS", include_str!("../../../docs/BENCHMARKS.md")),
    ("CODEC", include_str!("../../../docs/CODEC.md")),
    ("ETCD", include_str!("../../../docs/ETCD.md")),
    ("FAILURES", include_str!("../../../docs/FAILURES.md")),
    ("FS", include_str!("../../../docs/FS.md")),
    ("KV", include_str!("../../../docs/KV.md")),
    ("MULTIHOST", include_str!("../../../docs/MULTIHOST.md")),
    ("NBD", include_str!("../../../docs/NBD.md")),
    ("OPERATIONS", include_str!("../../../docs/OPERATIONS.md")),
    ("PAGING", include_str!("../../../docs/PAGING.md")),
    ("PLACEMENT", include_str!("../../../docs/PLACEMENT.md")),
    ("PROTOCOL", include_str!("../../../docs/PROTOCOL.md")),
    ("RDMA", include_str!("../../../docs/RDMA.md")),
    ("RESOURCE_MONITOR", include_str!("../../../docs/RESOURCE_MONITOR.md")),
    ("SECURITY", include_str!("../../../docs/SECURITY.md")),
    ("SHM", include_str!("../../../docs/SHM.md")),
    ("SIMULATOR", include_str!("../../../docs/SIMULATOR.md")),
];

/// The document `name` names (`KV`, `kv`, `docs/KV.md`, `KV.md`).
pub fn find(name: &str) -> Option<&'static str> {
    let bare = name.trim().trim_start_matches("docs/").trim_end_matches(".md");
    DOCUMENTS.iter().find(|(document, _)| document.eq_ignore_ascii_case(bare)).map(|(_, text)| *text)
}

/// Prints the document, or the list; an unknown name is an error that lists the names.
pub fn run(args: DocsArgs, out: &mut impl std::io::Write) -> Result<()> {
    let names: Vec<&str> = DOCUMENTS.iter().map(|(name, _)| *name).collect();
    match args.name {
        None => {
            for (name, text) in DOCUMENTS {
                let title = text.lines().next().unwrap_or("").trim_start_matches('#').trim();
                writeln!(out, "{name:<18} {title}")?;
            }
            writeln!(out, "\nremem docs NAME prints one (docs/NAME.md of the source tree).")?;
        }
        Some(name) => match find(&name) {
            Some(text) => out.write_all(text.as_bytes())?,
            None => bail!("no document {name:?}: the documents are {}", names.join(", ")),
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_document_of_docs_is_built_in_and_found_by_the_names_help_gives() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("docs/")
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.strip_suffix(".md").map(str::to_owned))
            .collect();
        on_disk.sort();
        let built_in: Vec<String> = DOCUMENTS.iter().map(|(name, _)| name.to_string()).collect();
        assert_eq!(built_in, on_disk, "a document of docs/ is missing from DOCUMENTS (or one is gone)");
        for name in ["KV", "kv", "docs/KV.md", "KV.md"] {
            assert!(find(name).is_some_and(|text| text.contains("remem kv")), "{name}");
        }
        assert!(find("nothing").is_none());
        let mut listed = Vec::new();
        run(DocsArgs { name: None }, &mut listed).expect("the list");
        assert!(String::from_utf8(listed).expect("text").contains("PAGING"));
        let error = run(DocsArgs { name: Some("KVV".to_owned()) }, &mut Vec::new()).expect_err("unknown");
        assert!(error.to_string().contains("the documents are APPS"), "{error}");
    }
}
