//! `remem man --dir DIR`: manual pages in roff (clap_mangen), from the same clap definitions as
//! the parser: remem.1 and one page per visible subcommand (remem-node.1, remem-bench-pages.1),
//! each with EXAMPLES, FILES, SIGNALS, EXIT STATUS and SEE ALSO sections written here (clap
//! knows none of them).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Directory to write the pages into (created if missing), e.g. /usr/local/share/man/man1.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
}

/// Writes the pages of `command` and its visible subcommands into `dir`; returns their paths,
/// sorted. Each page is clap_mangen's, with EXAMPLES, FILES, SIGNALS and EXIT STATUS added
/// before its VERSION section (from [`sections`]).
///
/// Errors: the directory cannot be created or a page cannot be written.
pub fn write_all(command: clap::Command, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut command = command.disable_help_subcommand(true);
    command.build();
    let mut pages = Vec::new();
    write_tree(command, dir, &mut pages)?;
    pages.sort();
    Ok(pages)
}

/// Writes the page of `command`, then those of its visible subcommands.
fn write_tree(command: clap::Command, dir: &Path, pages: &mut Vec<PathBuf>) -> Result<()> {
    for subcommand in command.get_subcommands().filter(|subcommand| !subcommand.is_hide_set()) {
        write_tree(subcommand.clone(), dir, pages)?;
    }
    let man = clap_mangen::Man::new(command);
    let path = dir.join(man.get_filename());
    let name = man.get_filename().trim_end_matches(".1").to_owned();
    let mut page = Vec::new();
    man.render(&mut page).with_context(|| format!("rendering {}", path.display()))?;
    let page = String::from_utf8(page).context("clap_mangen wrote a page that is not UTF-8")?;
    let extra: String =
        sections(&name).iter().map(|(title, body)| format!(".SH \"{title}\"\n{body}")).collect();
    let page = match page.find(".SH VERSION") {
        Some(at) => format!("{}{extra}{}", &page[..at], &page[at..]),
        None => page + &extra,
    };
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    pages.push(path);
    Ok(())
}

/// Text for a roff body: backslashes escaped, and no line that starts as a request.
fn roff_text(text: &str) -> String {
    let escaped = text.replace('\\', "\\e");
    if escaped.starts_with(['.', '\'']) {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

/// Command lines, one a line, as they are typed (no filling).
fn roff_examples(lines: &[&str]) -> String {
    let lines: Vec<String> = lines.iter().map(|line| roff_text(line)).collect();
    format!(".PP\n.nf\n.RS 4\n{}\n.RE\n.fi\n", lines.join("\n"))
}

/// Tagged paragraphs: `(tag, text)`.
fn roff_list(items: &[(&str, &str)]) -> String {
    items.iter().map(|(tag, text)| format!(".TP\n{}\n{}\n", roff_text(tag), roff_text(text))).collect()
}

/// Where `remem up` and every command that reads a cluster file look first.
const DEFAULT_DIR: &str = "$XDG_RUNTIME_DIR/remem, or /tmp/remem-UID without XDG_RUNTIME_DIR";

/// The cluster files every client command reads.
const CLUSTER_FILES: &[(&str, &str)] = &[
    (
        "DIR/cluster.json",
        "The nodes of the cluster and where its secret is (--cluster; DIR is the remem up directory).",
    ),
    ("DIR/secret", "The cluster secret (mode 0600), named by the cluster file."),
    ("DIR/clients/FRONTEND-PID.json", "The region report a running front end writes for remem status."),
];

/// The added sections of page `name` (`remem`, `remem-node`, `remem-bench-pages`...).
fn sections(name: &str) -> Vec<(&'static str, String)> {
    let command = name.strip_prefix("remem-").unwrap_or("");
    let (examples, files, signals) = page_facts(command);
    let default_dir = format!("DIR defaults to {DEFAULT_DIR}.");
    let mut sections = vec![("EXAMPLES", roff_examples(examples))];
    if files.is_empty() {
        sections.push(("FILES", format!(".PP\nNone of its own; {}\n", roff_text(&default_dir))));
    } else {
        sections.push(("FILES", format!("{}.PP\n{}\n", roff_list(files), roff_text(&default_dir))));
    }
    sections.push(("SIGNALS", format!(".PP\n{}\n", roff_text(signals))));
    sections.push(("EXIT STATUS", roff_list(exit_statuses(command))));
    sections.push((
        "SEE ALSO",
        format!(
            ".PP\n{}\n",
            roff_text(
                "remem docs NAME prints the document docs/NAME.md that this page names (remem docs lists \
                 them); the documents are built into the binary, so an installed remem has them too."
            )
        ),
    ));
    sections
}

/// Exit statuses of `remem COMMAND`.
fn exit_statuses(command: &str) -> &'static [(&'static str, &'static str)] {
    match command {
        "status" => &[
            ("0", "Every node is up."),
            ("1", "The command failed: no cluster file, a bad flag."),
            ("2", "The command line did not parse."),
            ("3", "Some nodes are down: the cluster is degraded."),
            ("4", "Every node is down, or the cluster file lists none."),
        ],
        "run" => &[
            ("N", "The exit status of COMMAND (128 + the signal's number when a signal killed it)."),
            ("1", "remem run itself failed (no cgroup, swap could not be turned on); nothing stays set up."),
            ("2", "The command line did not parse."),
        ],
        "node" => &[
            ("0", "Stopped by SIGTERM or SIGINT."),
            ("1", "It could not start (address in use, no secret, capacity beyond the host) or failed."),
            ("2", "The command line or the --config file did not parse."),
        ],
        _ => &[
            ("0", "Success (a server: it was stopped by SIGTERM or SIGINT)."),
            ("1", "An error, printed on one line on stderr with its causes."),
            ("2", "The command line did not parse."),
        ],
    }
}

/// What one page adds: (examples, files, what signals do).
type PageFacts = (&'static [&'static str], &'static [(&'static str, &'static str)], &'static str);

/// SIGTERM and SIGINT of a command that runs to its end.
const RUNS_TO_ITS_END: &str =
    "SIGINT and SIGTERM end it at once (the default action); it starts nothing that outlives it.";

/// The added facts of `remem COMMAND` (`""` for remem itself; `bench-pages` for a nested one):
/// those of one-shot commands here, the servers' in [`server_page_facts`].
fn page_facts(command: &str) -> PageFacts {
    match command {
        "swap" | "swap-on" => (
            &["remem swap on --size 8GiB --priority 10", "remem swap on --size 2GiB -k 4 -r 2 --transport shm"],
            &[
                ("RUNTIME_DIR/state.json", "Every step taken, for remem swap off (--runtime-dir, default DIR/swap)."),
                ("RUNTIME_DIR/mnt, RUNTIME_DIR/fs.log", "The remem fs mount that holds the swap file, and its daemon's log."),
            ],
            "SIGINT and SIGTERM during remem swap on are taken between its steps: it undoes what it set up and fails. The file system daemon runs in its own process group and is not stopped by them.",
        ),
        "swap-off" => (
            &["remem swap off", "remem swap off --runtime-dir /run/remem-swap"],
            &[("RUNTIME_DIR/state.json", "What remem swap on set up; also found from /proc and /sys when it is missing.")],
            RUNS_TO_ITS_END,
        ),
        "run" => (
            &["remem run --memory-limit 50% -- python3 train.py", "remem run --memory-limit 2GiB --swap-size 4GiB -- sqlite3 big.db 'select count(*) from t'"],
            &[("/sys/fs/cgroup/remem-run-PID", "The run's memory cgroup, removed after it."), ("/run/remem/run-swap-PID/", "The swap of --swap-size (root; $XDG_RUNTIME_DIR/remem/ when set), turned off and removed after the run.")],
            "SIGINT and SIGTERM during the --swap-size set-up undo it and fail; afterwards they reach COMMAND as usual, and the cgroup and swap are cleaned up after it ends.",
        ),
        "status" => (
            &["remem status", "remem status --json | jq .nodes_up", "remem status --watch 2"],
            CLUSTER_FILES,
            RUNS_TO_ITS_END,
        ),
        "completions" => (
            &["source <(remem completions bash)", "remem completions zsh > ~/.zfunc/_remem"],
            &[],
            RUNS_TO_ITS_END,
        ),
        "man" => (&["remem man --dir /usr/local/share/man/man1 && man remem-up"], &[], RUNS_TO_ITS_END),
        "sim" => (&["remem sim", "remem sim --nodes 1000 --json > sim.json"], &[], RUNS_TO_ITS_END),
        "sim-durability" => (&["remem sim durability", "remem sim durability --nodes 1000 -k 8 -r 2"], &[], RUNS_TO_ITS_END),
        "bench" => (&["remem bench pages", "remem bench codec"], &[], BENCH_SIGNALS),
        "bench-pages" => (&["remem bench pages", "remem bench pages --cluster DIR/cluster.json --json --plot cdf.png"], CLUSTER_FILES, BENCH_SIGNALS),
        "bench-codec" => (&["remem bench codec", "remem bench codec -k 4 -r 2 --json"], &[], RUNS_TO_ITS_END),
        "bench-regen" => (&["remem bench regen --slab-size 8MiB"], &[], BENCH_SIGNALS),
        "bench-kv" => (&["remem bench kv"], &[], BENCH_SIGNALS),
        "bench-kv-ha" => (&["remem bench kv-ha"], &[], BENCH_SIGNALS),
        "bench-apps" => (&["remem bench apps --quick"], &[], BENCH_SIGNALS),
        _ => server_page_facts(command),
    }
}

/// [`page_facts`] of remem itself and of the commands that serve until they are stopped.
fn server_page_facts(command: &str) -> PageFacts {
    match command {
        "" => (
            &["remem demo", "remem up --nodes 10 &", "remem status", "remem nbd --size 8GiB --export scratch"],
            CLUSTER_FILES,
            "Each command says on its own page; servers (node, up, nbd, kv, fs) stop cleanly on SIGTERM or SIGINT.",
        ),
        "node" => (
            &[
                "REMEM_SECRET=$(cat /etc/remem/secret) remem node --listen 10.0.0.5:7100 --capacity 32GiB --failure-domain rack1",
                "remem node --config /etc/remem/node.toml --metrics 127.0.0.1:9187",
            ],
            &[
                ("--config FILE", "Settings in TOML (contrib/node.toml); flags on the command line win."),
                ("--secret-file FILE", "The cluster secret (mode 0600), or the REMEM_SECRET environment variable."),
            ],
            "SIGTERM and SIGINT stop it cleanly: it stops accepting, closes its connections and exits 0. Its slabs are gone with it (clients rebuild them elsewhere).",
        ),
        "up" => (
            &["remem up --nodes 10", "remem up --nodes 12 --nodes-per-domain 3 --metrics 9187 --dir /tmp/cluster", "   (then type into it: add, stop 3, restart 3, remove 3, help)"],
            &[
                ("DIR/cluster.json", "The nodes, written when they listen, rewritten on add, restart and remove, removed on a clean stop."),
                ("DIR/secret", "A new cluster secret each start (mode 0600)."),
                ("DIR/node-N.log, DIR/node-N.sock", "Node N's log and its Unix socket for same-host shared memory."),
                ("DIR/lock", "Held while the cluster runs: a second remem up on DIR is refused."),
            ],
            "SIGTERM and SIGINT stop every node (SIGTERM, SIGKILL after 5 s) and remove the cluster file. A SIGKILLed remem up takes its nodes along (they get SIGTERM); its cluster file stays, is refused by the commands that read it, and is replaced by the next remem up.",
        ),
        "demo" => (
            &["remem demo", "remem demo --size 256MiB -k 4 -r 2 --dir /tmp/demo"],
            &[("--dir DIR", "The demo cluster's files and node logs (default: a temporary directory, removed after a run that succeeds).")],
            "SIGINT and SIGTERM end it; its nodes get SIGTERM with it.",
        ),
        "nbd" => (
            &[
                "remem nbd --size 8GiB --export scratch &",
                "nbd-client -unix $XDG_RUNTIME_DIR/remem/nbd-scratch.sock -N scratch /dev/nbd1 -b 4096",
                "remem nbd --size 64GiB --listen 127.0.0.1:10809 --metrics 127.0.0.1:9102",
            ],
            &[
                ("DIR/nbd-EXPORT.sock", "The export's Unix socket (owner only), when it does not --listen on TCP."),
                ("DIR/nbd-EXPORT.slabmap", "Where its slabs are (--state): a restarted export reopens them."),
                ("DIR/cluster.json, DIR/secret", "The cluster (--cluster)."),
            ],
            "SIGTERM and SIGINT stop it cleanly: in-flight requests finish, its slab map is saved, and its slabs stay on the nodes for a restart within their lease grace.",
        ),
        "kv" => (
            &[
                "remem kv --memory-limit 256MiB &",
                "exec 3<>/dev/tcp/127.0.0.1/11211; printf 'set k 0 0 5\\r\\nhello\\r\\nget k\\r\\n' >&3; timeout 1 cat <&3",
                "remem kv -m 1GiB --scheme auto --metrics 127.0.0.1:9188 --name sessions",
            ],
            &[
                ("DIR/kv-NAME/", "Its state directory (--name, --state): the slab map and the backup region's place, for a restart."),
                ("DIR/cluster.json, DIR/secret", "The cluster (--cluster)."),
                ("--auth-file FILE", "memcached-style user:password lines (-Y)."),
            ],
            "SIGTERM and SIGINT stop it cleanly: it stops accepting, answers what it read, saves its state and exits; a restart serves every item it acknowledged.",
        ),
        "fs" => (
            &["mkdir -p /mnt/remem && remem fs /mnt/remem --size 16GiB &", "remem fs /mnt/remem --size 1TiB --transport shm --metrics 127.0.0.1:9103"],
            &[
                ("DIR/fs-NAME/", "Its state directory (--state): slab map, metadata snapshot and journal."),
                ("/dev/fuse", "Needed; the mount point must exist."),
            ],
            "SIGTERM and SIGINT unmount (lazily) and stop it; a SIGKILLed one leaves a dead mount that the next remem fs on the mount point detaches first.",
        ),
        _ => (&[], &[], RUNS_TO_ITS_END),
    }
}

/// SIGTERM and SIGINT of a benchmark that starts its own nodes and servers.
const BENCH_SIGNALS: &str =
    "SIGINT and SIGTERM end it; the nodes and servers it started get SIGTERM with it (PR_SET_PDEATHSIG).";
