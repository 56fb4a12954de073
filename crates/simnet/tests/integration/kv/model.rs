//! The model of the cache: what each key may hold, and whether a reply can be explained.
//!
//! The cache applies commands to its index in the order they arrive (one thread), and a write in
//! flight may be seen as old or new only until its reply (docs/KV.md "Semantics"). So the model
//! keeps, per key, a set of items it may hold once every answered op is folded in (`base`), and
//! the ops not folded yet, in arrival order, each with its reply once it came. An op is folded
//! when every op before it on the key is: the base becomes what the op makes of each item the
//! base may be, keeping only the outcomes its reply shows. A read may return any item of the
//! base after a prefix of the ops still in flight before it (an op arrived but not answered may
//! or may not be seen).
//!
//! A reply no item of the model can produce is a failure: a wrong value, a wrong `NOT_FOUND`, a
//! lost acknowledged write. A store answered `SERVER_ERROR` may have left the key as it was or,
//! if a later op saw its value in flight, holding it; and a failure (a write's, or a lost
//! value's) removes the key (docs/KV.md "Semantics") at some time before its reply is taken, so
//! ops that arrived until then may have seen the key there or gone (`removed_before`). An
//! eviction the harness sees (the key gone from the index) makes the key possibly absent.

use std::collections::BTreeSet;

/// What a key holds: `None` for no item, else its flags and value.
pub type Item = Option<(u32, Vec<u8>)>;

/// A command of the workload on one key.
#[derive(Clone, PartialEq, Eq)]
pub enum Command {
    Set {
        flags: u32,
        data: Vec<u8>,
    },
    Add {
        flags: u32,
        data: Vec<u8>,
    },
    Replace {
        flags: u32,
        data: Vec<u8>,
    },
    Append {
        data: Vec<u8>,
    },
    Prepend {
        data: Vec<u8>,
    },
    /// A cas with a unique the model does not follow: stored or `EXISTS` when the key is there.
    Cas {
        flags: u32,
        data: Vec<u8>,
        unique: u64,
    },
    Incr {
        delta: u64,
    },
    Decr {
        delta: u64,
    },
    Delete,
    Touch,
    Get,
    Gets,
    /// `mg <key> v f`: the value and its flags.
    MetaGet,
    /// `ms <key> <bytes> F<flags>`: a set.
    MetaSet {
        flags: u32,
        data: Vec<u8>,
    },
    /// `md <key>`: a delete.
    MetaDelete,
}

/// A command as its request line (a value as its length and first bytes).
impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let request = self.request("key");
        let line = request.split(|byte| *byte == b'\r').next().unwrap_or(&[]);
        write!(f, "{:?}", String::from_utf8_lossy(line))?;
        match self {
            Command::Set { data, .. }
            | Command::Add { data, .. }
            | Command::Replace { data, .. }
            | Command::Append { data }
            | Command::Prepend { data }
            | Command::Cas { data, .. }
            | Command::MetaSet { data, .. } => {
                write!(f, " {:?}", String::from_utf8_lossy(&data[..data.len().min(16)]))
            }
            _ => Ok(()),
        }
    }
}

impl Command {
    pub fn is_read(&self) -> bool {
        matches!(self, Command::Get | Command::Gets | Command::MetaGet)
    }

    /// The text command a meta command does what of (the model's outcomes are the same).
    fn plain(&self) -> Command {
        match self {
            Command::MetaGet => Command::Get,
            Command::MetaSet { flags, data } => Command::Set { flags: *flags, data: data.clone() },
            Command::MetaDelete => Command::Delete,
            other => other.clone(),
        }
    }

    /// The request's bytes for `key`.
    pub fn request(&self, key: &str) -> Vec<u8> {
        let store = |verb: &str, flags: u32, data: &[u8], cas: Option<u64>| {
            let cas = cas.map(|unique| format!(" {unique}")).unwrap_or_default();
            let mut bytes = format!("{verb} {key} {flags} 0 {}{cas}\r\n", data.len()).into_bytes();
            bytes.extend_from_slice(data);
            bytes.extend_from_slice(b"\r\n");
            bytes
        };
        match self {
            Command::Set { flags, data } => store("set", *flags, data, None),
            Command::Add { flags, data } => store("add", *flags, data, None),
            Command::Replace { flags, data } => store("replace", *flags, data, None),
            Command::Append { data } => store("append", 0, data, None),
            Command::Prepend { data } => store("prepend", 0, data, None),
            Command::Cas { flags, data, unique } => store("cas", *flags, data, Some(*unique)),
            Command::Incr { delta } => format!("incr {key} {delta}\r\n").into_bytes(),
            Command::Decr { delta } => format!("decr {key} {delta}\r\n").into_bytes(),
            Command::Delete => format!("delete {key}\r\n").into_bytes(),
            Command::Touch => format!("touch {key} 0\r\n").into_bytes(),
            Command::Get => format!("get {key}\r\n").into_bytes(),
            Command::Gets => format!("gets {key}\r\n").into_bytes(),
            Command::MetaGet => format!("mg {key} v f\r\n").into_bytes(),
            Command::MetaSet { flags, data } => {
                let mut bytes = format!("ms {key} {} F{flags}\r\n", data.len()).into_bytes();
                bytes.extend_from_slice(data);
                bytes.extend_from_slice(b"\r\n");
                bytes
            }
            Command::MetaDelete => format!("md {key}\r\n").into_bytes(),
        }
    }
}

/// A reply, parsed. Anything else is malformed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Stored,
    NotStored,
    Exists,
    NotFound,
    Deleted,
    Touched,
    Number(u64),
    /// A get's answer: the item found, with its cas for `gets`.
    Value {
        item: Item,
        cas: Option<u64>,
    },
    ServerError(String),
    ClientError(String),
}

/// Parses the whole reply to `command` for `key`; `Err` says why it is malformed.
pub fn parse_reply(command: &Command, key: &str, bytes: &[u8]) -> Result<Reply, String> {
    let line_end = bytes.windows(2).position(|pair| pair == b"\r\n").ok_or("no line end")?;
    let line = std::str::from_utf8(&bytes[..line_end]).map_err(|_| "a line that is not UTF-8")?;
    let rest = &bytes[line_end + 2..];
    let whole = |reply: Reply| {
        if rest.is_empty() {
            Ok(reply)
        } else {
            Err(format!("{} bytes after {line:?}", rest.len()))
        }
    };
    if let Some(message) = line.strip_prefix("SERVER_ERROR ") {
        return whole(Reply::ServerError(message.to_owned()));
    }
    if let Some(message) = line.strip_prefix("CLIENT_ERROR ") {
        return whole(Reply::ClientError(message.to_owned()));
    }
    match command {
        Command::MetaGet => return parse_meta_value(line, rest),
        Command::MetaSet { .. } | Command::MetaDelete => {
            let reply = match (command, line) {
                (Command::MetaSet { .. }, "HD") => Reply::Stored,
                (Command::MetaSet { .. }, "NS") => Reply::NotStored,
                (Command::MetaDelete, "HD") => Reply::Deleted,
                (Command::MetaDelete, "NF") => Reply::NotFound,
                (_, other) => return Err(format!("{other:?} is no reply to {command:?}")),
            };
            return whole(reply);
        }
        _ => {}
    }
    if command.is_read() {
        return parse_value(command, key, line, rest);
    }
    let reply = match (command, line) {
        (_, "STORED") => Reply::Stored,
        (_, "NOT_STORED") => Reply::NotStored,
        (_, "EXISTS") => Reply::Exists,
        (_, "NOT_FOUND") => Reply::NotFound,
        (Command::Delete, "DELETED") => Reply::Deleted,
        (Command::Touch, "TOUCHED") => Reply::Touched,
        (Command::Incr { .. } | Command::Decr { .. }, number) => {
            Reply::Number(number.parse().map_err(|_| format!("{number:?} is no number"))?)
        }
        (_, other) => return Err(format!("{other:?} is no reply to {command:?}")),
    };
    whole(reply)
}

fn parse_value(command: &Command, key: &str, line: &str, rest: &[u8]) -> Result<Reply, String> {
    if line == "END" {
        return if rest.is_empty() {
            Ok(Reply::Value { item: None, cas: None })
        } else {
            Err("bytes after END".into())
        };
    }
    let words: Vec<&str> = line.split(' ').collect();
    let with_cas = *command == Command::Gets;
    let expected_words = if with_cas { 5 } else { 4 };
    if words.len() != expected_words || words[0] != "VALUE" || words[1] != key {
        return Err(format!("{line:?} is no VALUE line of key {key}"));
    }
    let flags: u32 = words[2].parse().map_err(|_| format!("bad flags in {line:?}"))?;
    let length: usize = words[3].parse().map_err(|_| format!("bad length in {line:?}"))?;
    let cas =
        if with_cas { Some(words[4].parse().map_err(|_| format!("bad cas in {line:?}"))?) } else { None };
    if rest.len() != length + 2 + 5 || &rest[length..] != b"\r\nEND\r\n" {
        return Err(format!("a data block of {} bytes and END do not follow {line:?}", rest.len()));
    }
    Ok(Reply::Value { item: Some((flags, rest[..length].to_vec())), cas })
}

/// `EN`, or `VA <bytes> f<flags>`, the data block and its `\r\n`.
fn parse_meta_value(line: &str, rest: &[u8]) -> Result<Reply, String> {
    if line == "EN" {
        return if rest.is_empty() {
            Ok(Reply::Value { item: None, cas: None })
        } else {
            Err("bytes after EN".into())
        };
    }
    let words: Vec<&str> = line.split(' ').collect();
    let ["VA", length, flags] = words.as_slice() else {
        return Err(format!("{line:?} is no VA line with the flags asked"));
    };
    let flags = flags.strip_prefix('f').ok_or_else(|| format!("no flags in {line:?}"))?;
    let length: usize = length.parse().map_err(|_| format!("bad length in {line:?}"))?;
    let flags: u32 = flags.parse().map_err(|_| format!("bad flags in {line:?}"))?;
    if rest.len() != length + 2 || &rest[length..] != b"\r\n" {
        return Err(format!("a data block of {} bytes does not follow {line:?}", rest.len()));
    }
    Ok(Reply::Value { item: Some((flags, rest[..length].to_vec())), cas: None })
}

/// What `command` can do to `item`: each (outcome, item after) it may give, a failure
/// (`SERVER_ERROR`) included for writes.
fn outcomes(command: &Command, item: &Item) -> Vec<(Reply, Item)> {
    let command = &command.plain();
    let failed = |new: Item| -> Vec<(Reply, Item)> {
        let error = Reply::ServerError(String::new());
        vec![(error.clone(), item.clone()), (error.clone(), None), (error, new)]
    };
    let mut list = match (command, item) {
        (Command::Set { flags, data }, _) => vec![(Reply::Stored, Some((*flags, data.clone())))],
        (Command::Add { flags, data }, None) => vec![(Reply::Stored, Some((*flags, data.clone())))],
        (Command::Replace { flags, data } | Command::Cas { flags, data, .. }, Some(_)) => {
            let mut list = vec![(Reply::Stored, Some((*flags, data.clone())))];
            if matches!(command, Command::Cas { .. }) {
                list.push((Reply::Exists, item.clone()));
            }
            list
        }
        (Command::Add { .. }, Some(_)) | (Command::Replace { .. }, None) => {
            vec![(Reply::NotStored, item.clone())]
        }
        (Command::Append { .. } | Command::Prepend { .. }, None) => vec![(Reply::NotStored, None)],
        (Command::Append { data }, Some((flags, value))) => {
            vec![(Reply::Stored, Some((*flags, [value.as_slice(), data].concat())))]
        }
        (Command::Prepend { data }, Some((flags, value))) => {
            vec![(Reply::Stored, Some((*flags, [data.as_slice(), value].concat())))]
        }
        (Command::Cas { .. } | Command::Incr { .. } | Command::Decr { .. } | Command::Touch, None) => {
            vec![(Reply::NotFound, None)]
        }
        (Command::Delete, None) => vec![(Reply::NotFound, None)],
        (Command::Delete, Some(_)) => vec![(Reply::Deleted, None)],
        (Command::Touch, Some(_)) => vec![(Reply::Touched, item.clone())],
        (Command::Incr { delta } | Command::Decr { delta }, Some((flags, value))) => {
            match std::str::from_utf8(value).ok().and_then(|text| text.parse::<u64>().ok()) {
                Some(number) => {
                    let result = match command {
                        Command::Incr { .. } => number.wrapping_add(*delta),
                        _ => number.saturating_sub(*delta),
                    };
                    vec![(Reply::Number(result), Some((*flags, result.to_string().into_bytes())))]
                }
                None => vec![(Reply::ClientError(String::new()), item.clone())],
            }
        }
        (Command::Get | Command::Gets, _) => {
            vec![(Reply::Value { item: item.clone(), cas: None }, item.clone())]
        }
        (Command::MetaGet | Command::MetaSet { .. } | Command::MetaDelete, _) => {
            unreachable!("meta commands are modelled as their text commands")
        }
    };
    if !command.is_read() && !matches!(command, Command::Delete | Command::Touch) {
        let new = list
            .iter()
            .find(|(reply, _)| matches!(reply, Reply::Stored | Reply::Number(_)))
            .and_then(|(_, new)| new.clone());
        list.extend(failed(new));
    }
    list
}

/// Whether `actual` is the kind of reply `modelled` is (errors match errors of any text, a
/// get's value matches without its cas).
fn same_outcome(modelled: &Reply, actual: &Reply) -> bool {
    match (modelled, actual) {
        (Reply::ServerError(_), Reply::ServerError(_)) | (Reply::ClientError(_), Reply::ClientError(_)) => {
            true
        }
        (Reply::Value { item: a, .. }, Reply::Value { item: b, .. }) => a == b,
        (a, b) => a == b,
    }
}

/// One op on a key not folded into its base yet.
#[derive(Clone, Debug)]
struct InFlight {
    id: u64,
    command: Command,
    reply: Option<Reply>,
    /// A read: what it may return, fixed at its arrival.
    may_read: BTreeSet<Item>,
}

/// One key of the model.
#[derive(Clone, Debug)]
pub struct KeyModel {
    base: BTreeSet<Item>,
    in_flight: Vec<InFlight>,
    /// A failure removed the key at some time before its reply was taken, when every op with
    /// an id below this one had arrived: those ops may have seen it there or gone.
    removed_before: u64,
}

impl Default for KeyModel {
    fn default() -> KeyModel {
        KeyModel { base: BTreeSet::from([None]), in_flight: Vec::new(), removed_before: 0 }
    }
}

impl KeyModel {
    /// Ops of the key that arrived and are not folded in yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Every item the key may hold once the ops in flight are done (the base and any prefix).
    pub fn may_hold(&self) -> BTreeSet<Item> {
        let mut reachable = self.base.clone();
        let mut current = self.base.clone();
        for op in self.in_flight.iter().filter(|op| !op.command.is_read()) {
            let mut next = BTreeSet::new();
            for item in &current {
                for (reply, after) in outcomes(&op.command, item) {
                    if op.reply.as_ref().is_none_or(|actual| same_outcome(&reply, actual)) {
                        next.insert(after);
                    }
                }
            }
            reachable.extend(next.iter().cloned());
            current = next;
        }
        reachable
    }

    /// The cache evicted the key (its LRU made room) when every op with an id below
    /// `arrived_before` had arrived: it may be absent from then on, whatever those ops did.
    pub fn evicted(&mut self, arrived_before: u64) -> Result<(), String> {
        self.removed_before = self.removed_before.max(arrived_before);
        self.fold()
    }

    /// An op arrives (is executed by the cache) with id `id`.
    pub fn arrive(&mut self, id: u64, command: Command) {
        let may_read = if command.is_read() { self.may_hold() } else { BTreeSet::new() };
        self.in_flight.push(InFlight { id, command, reply: None, may_read });
    }

    /// The reply of op `id` came. `Err` when no item the model allows gives that reply.
    /// `beyond_r`: a get may miss, or answer `SERVER_ERROR` (a lost value), whatever the model
    /// says.
    /// `arrived_before`: the id the next op to arrive will get (a failure's removal happened
    /// before it).
    pub fn answer(
        &mut self,
        id: u64,
        reply: Reply,
        beyond_r: bool,
        arrived_before: u64,
    ) -> Result<(), String> {
        let index = self.in_flight.iter().position(|op| op.id == id).expect("a reply names an op in flight");
        if matches!(reply, Reply::ServerError(_)) {
            self.removed_before = self.removed_before.max(arrived_before);
        }
        if !self.in_flight[index].command.is_read() {
            self.in_flight[index].reply = Some(reply);
            return self.fold();
        }
        let op = self.in_flight.remove(index);
        let explained = match &reply {
            Reply::Value { item: None, .. } => beyond_r || op.may_read.contains(&None),
            Reply::Value { item, .. } => op.may_read.contains(item),
            // A lost value: the item is removed (`removed_before`).
            Reply::ServerError(_) => beyond_r,
            _ => false,
        };
        if !explained {
            return Err(format!(
                "{:?} answered {} but the key may hold only {}",
                op.command,
                describe_reply(&reply),
                describe(&op.may_read)
            ));
        }
        self.fold()
    }

    /// Folds answered writes at the front into the base.
    fn fold(&mut self) -> Result<(), String> {
        while self.in_flight.first().is_some_and(|op| op.reply.is_some()) {
            let op = self.in_flight.remove(0);
            let actual = op.reply.expect("checked");
            let mut next = BTreeSet::new();
            let mut base = self.base.clone();
            if op.id < self.removed_before {
                base.insert(None);
            }
            for item in &base {
                for (reply, after) in outcomes(&op.command, item) {
                    if same_outcome(&reply, &actual) {
                        next.insert(after);
                    }
                }
            }
            if next.is_empty() {
                return Err(format!(
                    "{:?} answered {} but no item the key may hold ({}) gives that",
                    op.command,
                    describe_reply(&actual),
                    describe(&self.base)
                ));
            }
            self.base = next;
        }
        if self.removed_before > 0 && self.in_flight.iter().all(|op| op.id >= self.removed_before) {
            self.base.insert(None);
            self.removed_before = 0;
        }
        Ok(())
    }
}

/// Items for a failure message: each as its flags, length and first bytes.
pub fn describe(items: &BTreeSet<Item>) -> String {
    let parts: Vec<String> = items.iter().map(describe_item).collect();
    format!("{{{}}}", parts.join(", "))
}

fn describe_item(item: &Item) -> String {
    match item {
        None => "absent".into(),
        Some((flags, value)) => {
            let head = String::from_utf8_lossy(&value[..value.len().min(24)]).into_owned();
            format!("{flags}:{}B:{head:?}", value.len())
        }
    }
}

fn describe_reply(reply: &Reply) -> String {
    match reply {
        Reply::Value { item, .. } => format!("the value {}", describe_item(item)),
        other => format!("{other:?}"),
    }
}
