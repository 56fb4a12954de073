//! The crate's layering, checked from its source: the module graph built from every file's
//! `crate::` paths is acyclic, and the engine names nothing of the protocol layer above it
//! (docs/ARCHITECTURE.md, crates/kv). `super::` paths stay inside a module and its children,
//! which count as one node.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The engine and the modules it is built on: none of them may name [`ABOVE_THE_ENGINE`].
const ENGINE: &[&str] = &["cache", "index", "space", "chunks", "pageio", "page_client", "budget", "backup"];
const ABOVE_THE_ENGINE: &[&str] = &[
    "dispatch", "text", "meta", "commands", "reply", "report", "server", "standby", "cli", "auth", "sockets",
    "writers",
];
/// Items `lib.rs` re-exports, by the module that defines them.
const REEXPORTS: &[(&str, &str)] = &[
    ("Cache", "cache"),
    ("CacheConfig", "cache"),
    ("build_cache", "cache"),
    ("cache_over_regions", "cache"),
    ("MAIN_COPIES_LABEL", "cache"),
    ("now_unix", "clock"),
    ("PAGE_OPS_IN_FLIGHT", "pageio"),
    ("PageClient", "page_client"),
    ("VERSION", "report"),
    ("EcShape", "scheme"),
    ("Policy", "scheme"),
    ("Scheme", "scheme"),
    ("region_shape", "scheme"),
    ("schemes_needed", "scheme"),
    ("Server", "server"),
    ("ServerConfig", "server"),
];

/// The text of a file without comments and without its `#[cfg(test)]` tail.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines().map(|line| line.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The names right after each `crate::` (both `crate::a::b` and `crate::{a, b::c}`).
fn named(code: &str) -> BTreeSet<String> {
    let identifier = |text: &str| -> String {
        text.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
    };
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(inner) => {
                names.extend(inner[..inner.find('}').unwrap_or(inner.len())].split(',').map(identifier))
            }
            None => {
                names.insert(identifier(rest));
            }
        }
    }
    names.retain(|name| !name.is_empty());
    names
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![source.clone()];
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(
                std::fs::read_dir(&path)
                    .expect("src is readable")
                    .map(|entry| entry.expect("an entry").path()),
            );
            continue;
        }
        if path.extension().is_none_or(|extension| extension != "rs") {
            continue;
        }
        let relative = path.strip_prefix(&source).expect("under src");
        let first = relative.components().next().expect("a file").as_os_str().to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" || relative.file_name().is_some_and(|name| name == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a source file is readable");
        let targets = edges.entry(module.clone()).or_default();
        for name in named(&code(&text)) {
            let target =
                REEXPORTS.iter().find(|(item, _)| *item == name).map_or(name.as_str(), |(_, module)| module);
            if target != module {
                targets.insert(target.to_string());
            }
        }
    }
    edges
}

#[test]
fn lib_rs_holds_no_items_only_modules_and_reexports() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).expect("lib.rs");
    for line in code(&text).lines().map(str::trim) {
        let allowed = line.is_empty()
            || line.starts_with("pub mod ")
            || line.starts_with("mod ")
            || line.starts_with("pub use ")
            || line.starts_with("#[cfg(test)]");
        assert!(allowed, "lib.rs holds an item: {line}");
    }
}

#[test]
fn the_module_graph_is_acyclic_and_the_engine_never_names_the_protocol_layer() {
    let edges = graph();
    for module in ENGINE {
        let names = edges.get(*module).unwrap_or_else(|| panic!("no module {module}"));
        let above: Vec<&String> =
            names.iter().filter(|name| ABOVE_THE_ENGINE.contains(&name.as_str())).collect();
        assert!(above.is_empty(), "the engine's {module} names {above:?}");
    }
    // Depth-first, with the path so far: an edge back into it is a cycle.
    fn visit<'a>(
        module: &'a str,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if done.contains(module) {
            return;
        }
        assert!(!path.contains(&module), "import cycle: {} -> {module}", path.join(" -> "));
        path.push(module);
        for next in edges.get(module).into_iter().flatten() {
            if edges.contains_key(next) {
                visit(next, edges, path, done);
            }
        }
        path.pop();
        done.insert(module);
    }
    let mut done = BTreeSet::new();
    for module in edges.keys() {
        visit(module, &edges, &mut Vec::new(), &mut done);
    }
}
