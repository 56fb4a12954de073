//! Running remem for months (issue 14): `remem node --config FILE` with the command line winning
//! over the file, the example config of contrib/ and the systemd units that run it, shell
//! completions, man pages that groff renders without a warning, and the host-memory guardrails
//! of `remem node` and `remem up` (refused with the host's numbers, started with --force).

use crate::common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use clap::Args;

const BINARY: &str = env!("CARGO_BIN_EXE_remem");

fn remem() -> Command {
    Command::new(BINARY)
}

fn repository_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

fn fresh_dir(name: &str) -> common::ScratchDir {
    common::ScratchDir::new(&format!("operations-{name}"))
}

/// A secret file of mode 0600 in `dir`, as a node accepts it.
fn secret_file(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("secret");
    std::fs::write(&path, "00112233445566778899aabbccddeeff").expect("secret");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod 0600");
    path
}

/// Success and stderr plus stdout of a remem command that is expected to end by itself.
fn run(args: &[&str]) -> (bool, String) {
    let output = remem().args(args).stdin(Stdio::null()).output().expect("remem runs");
    let text =
        String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
    (output.status.success(), text)
}

/// A started `remem node`: its address, and its log (stderr) file.
struct RunningNode {
    child: Child,
    address: std::net::SocketAddr,
    log: PathBuf,
}

impl RunningNode {
    /// Starts `remem node ARGS` and waits for its `listening ADDRESS` line.
    fn start(args: &[&std::ffi::OsStr], log: PathBuf) -> RunningNode {
        let mut command = remem();
        command.arg("node").args(args).env_remove("REMEM_SECRET");
        let (child, line) = common::spawn_with_first_line(command, &log);
        let Some(address) = line.trim().strip_prefix("listening ") else {
            let log_text = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("the node did not start: first line {line:?}, log:\n{log_text}");
        };
        let address = address.parse().expect("an address after `listening`");
        RunningNode { child, address, log }
    }

    /// The metrics page of a node started with `--metrics` (its address is in the log).
    fn metrics(&self) -> String {
        let log = std::fs::read_to_string(&self.log).expect("node log");
        let address = log
            .lines()
            .find_map(|line| line.strip_prefix("metrics at http://")?.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("no metrics address in the log:\n{log}"));
        let mut stream = std::net::TcpStream::connect(address).expect("metrics endpoint");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("request");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("response");
        response
    }

    /// SIGTERM, then asserts a clean exit.
    fn stop(mut self) {
        // SAFETY: kill with the PID of a child this test spawned and has not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let status = self.child.wait().expect("node reaped");
        assert!(status.success(), "the node did not stop cleanly: {status}");
    }
}

impl Drop for RunningNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{page}"))
}

#[test]
fn the_example_config_starts_a_node_with_command_line_overrides() {
    let dir = fresh_dir("example");
    let secret = secret_file(&dir);
    let example = repository_file("contrib/node.toml");
    // The example names /etc paths and fixed ports: the command line moves them here.
    let node = RunningNode::start(
        &[
            "--config".as_ref(),
            example.as_os_str(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--metrics".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--secret-file".as_ref(),
            secret.as_os_str(),
        ],
        dir.join("node.log"),
    );
    assert!(node.address.ip().is_loopback() && node.address.port() != 7100, "{}", node.address);
    let page = node.metrics();
    assert_eq!(metric(&page, "remem_node_slab_size_bytes"), (64u64 << 20) as f64, "slab_size of the file");
    node.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_flag_on_the_command_line_wins_over_the_file_and_the_file_over_the_default() {
    let dir = fresh_dir("precedence");
    let secret = secret_file(&dir);
    let config = dir.join("node.toml");
    let text = format!(
        "listen = \"127.0.0.1:0\"\ncapacity = \"24MiB\"\nslab-size = \"1MiB\"\nno_monitor = true\n\
         metrics = \"127.0.0.1:0\"\nfailure_domain = \"-from-the-file\"\nsecret_file = {:?}\n",
        secret.to_str().expect("utf-8 path")
    );
    std::fs::write(&config, text).expect("config file");
    let node = RunningNode::start(
        &["--capacity".as_ref(), "16MiB".as_ref(), "--config".as_ref(), config.as_os_str()],
        dir.join("node.log"),
    );
    let page = node.metrics();
    assert_eq!(metric(&page, "remem_node_capacity_bytes"), (16u64 << 20) as f64, "the command line wins");
    assert_eq!(
        metric(&page, "remem_node_slab_size_bytes"),
        (1u64 << 20) as f64,
        "the file beats the default"
    );
    let log = std::fs::read_to_string(&node.log).expect("log");
    assert!(log.contains("resource monitor off") && log.contains("failure_domain=-from-the-file"), "{log}");
    node.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_config_file_is_refused_naming_the_file_and_the_key() {
    let dir = fresh_dir("bad-config");
    let cases = [
        ("capacty = \"4GiB\"", "key `capacty`: unknown key"),
        ("capacity = \"4 parsecs\"", "key `capacity`: invalid value '4 parsecs' for '--capacity"),
        ("no_monitor = 1", "key `no_monitor`: expected true or false, found an integer"),
        ("secret = \"00112233445566778899aabbccddeeff\"", "never holds the cluster secret"),
        ("listen = [", "not a valid TOML file"),
    ];
    for (index, (text, expected)) in cases.iter().enumerate() {
        let config = dir.join(format!("bad-{index}.toml"));
        std::fs::write(&config, text).expect("config file");
        let (success, output) = run(&["node", "--config", config.to_str().expect("utf-8")]);
        assert!(!success, "{text:?} was accepted");
        assert!(!output.contains("panicked"), "{text:?} panicked: {output}");
        let named = format!("{}: ", config.display());
        assert!(output.contains(&named) && output.contains(expected), "{text:?}: {output}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every key of the example, the commented-out ones too, is a setting the node accepts.
#[test]
fn every_key_of_the_example_config_is_a_node_setting() {
    let example = std::fs::read_to_string(repository_file("contrib/node.toml")).expect("contrib/node.toml");
    let uncommented: String = example
        .lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest)
                if rest
                    .split_once(" = ")
                    .is_some_and(|(key, _)| key.chars().all(|c| c.is_ascii_lowercase() || c == '_')) =>
            {
                rest
            }
            _ => line,
        })
        .map(|line| format!("{line}\n"))
        .collect();
    let keys = uncommented.lines().filter(|line| line.contains(" = ") && !line.starts_with('#')).count();
    assert!(keys >= 14, "only {keys} keys in the example:\n{uncommented}");
    let path = std::env::temp_dir().join(format!("remem-operations-uncommented-{}.toml", std::process::id()));
    std::fs::write(&path, &uncommented).expect("write");
    let node = remem::node::NodeArgs::augment_args(clap::Command::new("node"));
    let arguments = remem::config_file::arguments_from_file(&path, &node);
    let _ = std::fs::remove_file(&path);
    let arguments = arguments.unwrap_or_else(|error| panic!("{error:#}"));
    assert!(arguments.iter().any(|argument| argument == "--unix=/run/remem/node.sock"), "{arguments:?}");
}

#[test]
fn the_systemd_units_run_flags_that_exist_with_memfd_friendly_hardening() {
    let (success, help) = run(&["node", "--help"]);
    assert!(success, "{help}");
    for (unit, config) in
        [("remem-node.service", "/etc/remem/node.toml"), ("remem-node@.service", "/etc/remem/node-%i.toml")]
    {
        let path = repository_file(&format!("contrib/systemd/{unit}"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        let exec_start = text
            .lines()
            .find_map(|line| line.strip_prefix("ExecStart="))
            .unwrap_or_else(|| panic!("{unit} has no ExecStart"));
        let words: Vec<&str> = exec_start.split_whitespace().collect();
        assert!(words[0].ends_with("/remem") && words[1] == "node", "{unit}: {exec_start}");
        assert!(exec_start.contains(&format!("--config {config}")), "{unit}: {exec_start}");
        for flag in words.iter().filter(|word| word.starts_with("--")) {
            assert!(help.contains(&format!("{flag} ")), "{unit}: `remem node` has no {flag}");
        }
        for setting in [
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "ProtectHome=yes",
            "PrivateTmp=yes",
            "LimitMEMLOCK=infinity",
            "Restart=on-failure",
            "MemoryDenyWriteExecute=yes",
            "SystemCallFilter=@system-service",
        ] {
            assert!(text.lines().any(|line| line == setting), "{unit}: no {setting}");
        }
        // Where systemd's own checker is installed, it must accept the unit (with a binary that
        // exists at the ExecStart path).
        if Command::new("systemd-analyze")
            .arg("--version")
            .output()
            .is_ok_and(|output| output.status.success())
        {
            let dir = fresh_dir(&format!("unit-{}", unit.replace('@', "-at")));
            let instance = unit.replace("@.", "@test.");
            let copy = dir.join(&instance);
            std::fs::write(&copy, text.replace(words[0], BINARY)).expect("unit copy");
            let output = Command::new("systemd-analyze")
                .args(["verify", "--man=no"])
                .arg(&copy)
                .output()
                .expect("systemd-analyze runs");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(output.status.success() && stderr.trim().is_empty(), "{unit}: {stderr}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[test]
fn bash_completion_registers_remem_and_every_shell_gets_a_script() {
    let script = format!("source <('{BINARY}' completions bash) && complete -p remem");
    let registered = common::run_ok(30, "bash", &["-c", &script]);
    assert!(registered.contains("complete") && registered.trim_end().ends_with(" remem"), "{registered}");
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (success, text) = run(&["completions", shell]);
        assert!(success && text.contains("remem") && text.contains("node"), "{shell}: {text}");
    }
    let (success, text) = run(&["completions", "tcsh"]);
    assert!(!success && text.contains("invalid value 'tcsh'"), "{text}");
    // Values that are names complete as names, not file names (issue 29: `--scheme <TAB>`).
    // As bash calls it: the words so far and an empty one being completed, then the function
    // with the command, that empty word and the word before it.
    let complete = |words: &str| {
        let previous = words.rsplit(' ').next().expect("a word");
        let script = format!(
            "source <('{BINARY}' completions bash) && COMP_WORDS=({words} '') && \
             COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)) && _remem remem '' {previous} && echo \"${{COMPREPLY[@]}}\""
        );
        common::run_ok(30, "bash", &["-c", &script])
    };
    assert_eq!(complete("remem kv --scheme").trim(), "auto none rep2 rep3 ec eor");
    assert_eq!(complete("remem kv --large-scheme").trim(), "none rep2 rep3 ec eor");
    let placements = complete("remem nbd --placement");
    assert!(placements.contains("codingsets-p2c") && placements.contains("least-loaded"), "{placements}");
}

#[test]
fn man_pages_exist_for_every_subcommand_and_groff_renders_them_without_warnings() {
    let dir = fresh_dir("man");
    let (success, text) = run(&["man", "--dir", dir.to_str().expect("utf-8")]);
    assert!(success, "{text}");
    for page in
        ["remem.1", "remem-node.1", "remem-up.1", "remem-status.1", "remem-bench-pages.1", "remem-man.1"]
    {
        assert!(dir.join(page).is_file(), "no {page}: {text}");
    }
    assert!(!dir.join("remem-torture-writer.1").exists(), "a hidden helper got a page");
    let node_page = std::fs::read_to_string(dir.join("remem-node.1")).expect("remem-node.1");
    assert!(node_page.contains("config") && node_page.contains("force"), "{node_page}");
    // The sections clap does not write, with what each command does: remem status's exit
    // statuses say how healthy the cluster is, remem up's signals what happens to its nodes.
    let status_page = std::fs::read_to_string(dir.join("remem-status.1")).expect("remem-status.1");
    assert!(status_page.contains("Some nodes are down"), "{status_page}");
    let up_page = std::fs::read_to_string(dir.join("remem-up.1")).expect("remem-up.1");
    assert!(up_page.contains("remove 3") && up_page.contains("DIR/lock"), "{up_page}");
    let pages: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("man directory")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "1"))
        .collect();
    assert!(pages.len() >= 15, "only {} pages", pages.len());
    for page in pages {
        let roff = std::fs::read_to_string(&page).expect("a page");
        for section in ["EXAMPLES", "FILES", "SIGNALS", "EXIT STATUS", "SEE ALSO"] {
            assert!(roff.contains(&format!(".SH \"{section}\"")), "{} has no {section}", page.display());
        }
        let output = common::run(60, "groff", &["-man", "-Tutf8", "-ww", page.to_str().expect("utf-8")]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success() && stderr.trim().is_empty(), "{}: {stderr}", page.display());
        assert!(output.stdout.len() > 200, "{} renders to almost nothing", page.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_node_larger_than_the_host_is_refused_naming_its_memory_and_starts_with_force() {
    let host = remem::host_memory::HostMemory::read().expect("this test needs /proc/meminfo");
    let (success, text) = run(&["node", "--listen", "127.0.0.1:0", "--capacity", "100TiB"]);
    assert!(!success, "a 100 TiB node started: {text}");
    let host_memory = remem::units::format_bytes(host.limit_bytes);
    assert!(text.contains(&format!("its memory is {host_memory}")), "{text}");
    assert!(text.contains("100.00 TiB") && text.contains("pass --force to start anyway"), "{text}");

    // Without a resource monitor, 80% of what is available is the most.
    let too_much_unmonitored = (host.available_bytes / 100 * 90).min(host.limit_bytes).to_string();
    let (success, text) =
        run(&["node", "--listen", "127.0.0.1:0", "--no-monitor", "--capacity", &too_much_unmonitored]);
    assert!(!success && text.contains("80% of the") && text.contains("--no-monitor"), "{text}");

    let dir = fresh_dir("force");
    let secret = secret_file(&dir);
    let node = RunningNode::start(
        &[
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--capacity".as_ref(),
            "100TiB".as_ref(),
            "--slab-size".as_ref(),
            "1MiB".as_ref(),
            "--no-monitor".as_ref(),
            "--force".as_ref(),
            "--secret-file".as_ref(),
            secret.as_os_str(),
        ],
        dir.join("node.log"),
    );
    let log = std::fs::read_to_string(&node.log).expect("log");
    assert!(log.contains("starting as told by --force"), "{log}");
    node.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn remem_up_refuses_nodes_that_add_up_to_more_than_the_host() {
    let dir = fresh_dir("up");
    let dir_text = dir.to_str().expect("utf-8");
    let (success, text) = run(&["up", "--nodes", "3", "--capacity", "100TiB", "--dir", dir_text]);
    assert!(!success, "{text}");
    assert!(
        text.contains("--nodes 3 x --capacity 100.00 TiB = 300.00 TiB")
            && text.contains("pass --force to start anyway"),
        "{text}"
    );
    // Without --capacity, the default shrinks to fit; when not one slab a node fits, it says so.
    let (success, text) = run(&["up", "--nodes", "100000", "--slab-size", "1TiB", "--dir", dir_text]);
    assert!(!success && text.contains("do not fit") && text.contains("--force"), "{text}");
    assert!(!dir.join("cluster.json").exists(), "a refused cluster started");
    let _ = std::fs::remove_dir_all(&dir);
}
