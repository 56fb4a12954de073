//! Config files for long-running commands (`remem node --config FILE`): a TOML table whose keys
//! are the command's long flag names, with `-` or `_` (`slab_size = "64MiB"`, `no_monitor =
//! true`).
//!
//! The file is turned into `--key=value` arguments placed before the real command line, and the
//! command is parsed again with `args_override_self`, so a flag given on the command line wins
//! over the file, and the file over the defaults. Every value goes through the flag's own parser:
//! there is one validation, not two. Nothing here lists the flags: they come from the clap
//! `Command`, so a flag added to the command is a key of its file at once.
//!
//! Fault model: the file is written by an operator and may be wrong in every way: not TOML,
//! unknown keys, a key twice (`slab_size` and `slab-size`), wrong types, bad values. Each is an
//! error naming the file and the key, never a panic. The file may name the secret's file
//! (`secret_file`) but never hold a secret: a `secret` key is refused, so that a config file can
//! stay world-readable.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, Result};
use clap::ArgAction;

/// Keys that are flags of every command but make no sense in a file.
const NOT_IN_A_FILE: [&str; 3] = ["config", "help", "version"];

/// The arguments that `path` stands for, for `command` (the subcommand's own `Command`, whose
/// long flags are the keys), each checked by its flag's parser.
///
/// Errors: the file cannot be read or is not TOML; a key is unknown, given twice, `secret`, or
/// has a value of the wrong type or that its flag's parser refuses. Each message starts with the
/// file's path and names the key.
pub fn arguments_from_file(path: &Path, command: &clap::Command) -> Result<Vec<OsString>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
    let table: toml::Table = text.parse().map_err(|error: toml::de::Error| {
        anyhow::anyhow!("{}: not a valid TOML file: {}", path.display(), error.to_string().trim_end())
    })?;
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut arguments = Vec::new();
    for (key, value) in &table {
        let flag = key.replace('_', "-");
        let fail = |message: String| anyhow::anyhow!("{}: key `{key}`: {message}", path.display());
        if flag == "config" {
            return Err(fail("config files do not nest: name one file with --config".into()));
        }
        if flag == "secret" {
            return Err(fail(
                "a config file never holds the cluster secret: put the secret in a file only the \
                 node's user can read (mode 0600) and name that file with `secret_file`"
                    .into(),
            ));
        }
        let argument = command
            .get_arguments()
            .find(|argument| argument.get_long() == Some(flag.as_str()))
            .filter(|_| !NOT_IN_A_FILE.contains(&flag.as_str()));
        let Some(argument) = argument else {
            return Err(fail(format!("unknown key; the keys are {}", known_keys(command).join(", "))));
        };
        if let Some(earlier) = seen.insert(flag.clone(), key.clone()) {
            return Err(fail(format!("the same setting as `{earlier}`, given twice")));
        }
        let key_arguments = flag_arguments(&flag, argument.get_action(), value).map_err(fail)?;
        // The flag's own parser, alone: its error then names this key only.
        let mut alone = vec![OsString::from(command.get_name())];
        alone.extend(key_arguments.iter().cloned());
        if let Err(error) = command.clone().try_get_matches_from(alone) {
            return Err(fail(clap_message(&error)));
        }
        arguments.extend(key_arguments);
    }
    Ok(arguments)
}

/// `argv` with `inserted` placed right after the first `subcommand` word (before the flags the
/// user typed, so that those win under `args_override_self`).
pub fn insert_after_subcommand(
    argv: Vec<OsString>,
    subcommand: &str,
    inserted: Vec<OsString>,
) -> Vec<OsString> {
    let position =
        argv.iter().skip(1).position(|word| word == subcommand).map_or(argv.len(), |index| index + 2);
    let mut result = argv;
    result.splice(position..position, inserted);
    result
}

/// The arguments one key stands for: `--flag` or nothing for a boolean, `--flag=VALUE` (once per
/// element of an array, for flags that repeat) otherwise.
fn flag_arguments(flag: &str, action: &ArgAction, value: &toml::Value) -> Result<Vec<OsString>, String> {
    let type_name = with_article(value.type_str());
    match action {
        ArgAction::SetTrue | ArgAction::SetFalse => match value {
            toml::Value::Boolean(set) => {
                let passes_flag = *set == matches!(action, ArgAction::SetTrue);
                Ok(passes_flag.then(|| OsString::from(format!("--{flag}"))).into_iter().collect())
            }
            _ => Err(format!("expected true or false, found {type_name}")),
        },
        ArgAction::Count => match value {
            toml::Value::Integer(times @ 0..=255) => {
                Ok((0..*times).map(|_| OsString::from(format!("--{flag}"))).collect())
            }
            _ => Err(format!("expected a small whole number, found {type_name}")),
        },
        ArgAction::Set | ArgAction::Append => {
            let values: Vec<&toml::Value> = match value {
                toml::Value::Array(items) if matches!(action, ArgAction::Append) => items.iter().collect(),
                toml::Value::Array(_) => return Err("expected one value, found an array".into()),
                single => vec![single],
            };
            values
                .into_iter()
                .map(|value| scalar_text(value).map(|text| OsString::from(format!("--{flag}={text}"))))
                .collect()
        }
        _ => Err("not a setting".into()),
    }
}

/// The text a scalar TOML value stands for on the command line (`"4GiB"` -> `4GiB`, `8` -> `8`).
fn scalar_text(value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(text) => Ok(text.clone()),
        toml::Value::Integer(number) => Ok(number.to_string()),
        toml::Value::Float(number) => Ok(number.to_string()),
        toml::Value::Boolean(set) => Ok(set.to_string()),
        toml::Value::Datetime(datetime) => Ok(datetime.to_string()),
        other => Err(format!("expected a single value, found {}", with_article(other.type_str()))),
    }
}

/// `an integer`, `a string`.
fn with_article(type_name: &str) -> String {
    let article = if type_name.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" };
    format!("{article} {type_name}")
}

/// The keys a file for `command` may have, as they are spelled in a file (`slab_size`).
fn known_keys(command: &clap::Command) -> Vec<String> {
    command
        .get_arguments()
        .filter_map(clap::Arg::get_long)
        .filter(|long| !NOT_IN_A_FILE.contains(long))
        .map(|long| long.replace('-', "_"))
        .collect()
}

/// Clap's error on one line, without its `error: ` prefix and its usage hint.
fn clap_message(error: &clap::Error) -> String {
    let text = error.to_string();
    let first = text.lines().next().unwrap_or("invalid value");
    first.strip_prefix("error: ").unwrap_or(first).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Args;

    fn node_command() -> clap::Command {
        crate::node::NodeArgs::augment_args(clap::Command::new("node"))
    }

    fn arguments_of(name: &str, text: &str) -> Result<Vec<OsString>> {
        let path = std::env::temp_dir().join(format!("remem-config-{name}-{}.toml", std::process::id()));
        std::fs::write(&path, text).expect("write the config file");
        let result = arguments_from_file(&path, &node_command());
        let _ = std::fs::remove_file(&path);
        result.map_err(|error| error.context(path.display().to_string()))
    }

    fn error_of(name: &str, text: &str) -> String {
        format!("{:#}", arguments_of(name, text).expect_err("the file is refused"))
    }

    #[test]
    fn keys_with_dashes_or_underscores_become_flags() {
        let arguments = arguments_of(
            "good",
            "listen = \"127.0.0.1:0\"\ncapacity = \"4GiB\"\nslab-size = \"64MiB\"\nmax_connections = 8\n\
             no_monitor = true\nfault_injection = false\nfailure_domain = \"-rack1\"\n",
        )
        .expect("accepted");
        let arguments: Vec<_> = arguments.iter().map(|argument| argument.to_str().expect("utf-8")).collect();
        for expected in [
            "--listen=127.0.0.1:0",
            "--capacity=4GiB",
            "--slab-size=64MiB",
            "--max-connections=8",
            "--no-monitor",
            "--failure-domain=-rack1",
        ] {
            assert!(arguments.contains(&expected), "{expected} missing from {arguments:?}");
        }
        assert!(!arguments.iter().any(|argument| argument.contains("fault-injection")), "{arguments:?}");
    }

    #[test]
    fn unknown_keys_wrong_types_and_bad_values_name_the_file_and_the_key() {
        let cases = [
            ("unknown", "capacty = \"4GiB\"", "key `capacty`: unknown key; the keys are listen, capacity"),
            ("type-bool", "no_monitor = \"yes\"", "key `no_monitor`: expected true or false, found a string"),
            ("type-table", "capacity = { a = 1 }", "key `capacity`: expected a single value, found a table"),
            ("bad-size", "capacity = \"lots\"", "key `capacity`: invalid value 'lots' for '--capacity"),
            ("zero", "max_connections = 0", "key `max_connections`: invalid value '0'"),
            ("bad-address", "listen = 7100", "key `listen`: invalid value '7100'"),
            ("twice", "slab_size = \"1MiB\"\nslab-size = \"2MiB\"", "given twice"),
            (
                "secret",
                "secret = \"0123456789abcdef\"",
                "key `secret`: a config file never holds the cluster secret",
            ),
            ("nested", "config = \"/etc/other.toml\"", "key `config`: config files do not nest"),
            ("not-toml", "capacity = ", "not a valid TOML file"),
        ];
        for (name, text, expected) in cases {
            let error = error_of(name, text);
            assert!(error.contains(expected), "{name}: expected {expected:?} in {error:?}");
            assert!(
                error.contains(&format!("remem-config-{name}-")),
                "{name}: the file is not named: {error}"
            );
        }
        let missing = arguments_from_file(Path::new("/nonexistent/node.toml"), &node_command()).unwrap_err();
        assert!(format!("{missing:#}").contains("reading config file /nonexistent/node.toml"), "{missing:#}");
    }

    #[test]
    fn file_arguments_go_before_the_command_line_ones() {
        let argv: Vec<OsString> = ["remem", "node", "--capacity", "1GiB"].map(OsString::from).to_vec();
        let inserted = vec![OsString::from("--capacity=4GiB")];
        assert_eq!(
            insert_after_subcommand(argv, "node", inserted),
            ["remem", "node", "--capacity=4GiB", "--capacity", "1GiB"].map(OsString::from).to_vec()
        );
    }
}
