//! The metadata snapshot: every inode, directory, extent map and the unwritten pages, with the
//! sequence number of the last journal record it includes.
//!
//! File: `magic (8) | payload_len: u64 | crc: u32 | payload`, `crc = crc32c(payload_len bytes
//! ++ payload)`. Encoding is canonical (inodes by number, entries by name, runs in order), so
//! two equal metadata states give equal bytes; the tests compare a live file system with its
//! replay that way. The page allocator's free list is not stored: it is what no file maps.
//!
//! Decoding trusts nothing: the checksum must hold and the payload length must be the file's,
//! then every count is checked against the bytes left, every inode number against the inode
//! table, every page run against the address space and against every other run, and the tree
//! is checked whole (each directory named once by its parent, link counts, every directory
//! reachable from the root, names valid). A snapshot that fails any of it is an error.

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use super::codec::{DecodeError, Decoder, Encoder};
use super::record::{decode_kind, encode_kind};
use crate::extents::{Allocator, ExtentMap, RunSet};
use crate::filesystem::MAX_FILE_BYTES;
use crate::namespace::{
    check_name, Attributes, Content, Directory, FileKind, Inode, Namespace, MAX_NAME_BYTES,
    MAX_SYMLINK_BYTES, ROOT_INODE,
};

/// Version 2: inodes may be special files (kinds 4-7, their content a `u32` device number).
/// Version 1 (no special files) is the same encoding otherwise, so it still loads.
pub const MAGIC: &[u8; 8] = b"REMEMFS\x02";
const MAGIC_VERSION_1: &[u8; 8] = b"REMEMFS\x01";
const HEADER_BYTES: usize = 8 + 8 + 4;

/// The metadata a snapshot restores.
pub struct Restored {
    pub namespace: Namespace,
    pub allocator: Allocator,
    pub unwritten: RunSet,
    /// The last journal record the snapshot includes.
    pub last_seq: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a remem-fs snapshot (bad magic)")]
    Magic,
    #[error("snapshot checksum mismatch: the file is damaged")]
    Checksum,
    #[error("snapshot length {stated} does not match the file ({actual} bytes of payload)")]
    Length { stated: u64, actual: u64 },
    #[error("snapshot does not decode: {0}")]
    Decode(#[from] DecodeError),
    #[error("snapshot is inconsistent: {0}")]
    Invalid(String),
}

fn invalid(message: impl Into<String>) -> SnapshotError {
    SnapshotError::Invalid(message.into())
}

/// Encodes the whole metadata state; `last_seq` is the last journal record it includes.
pub fn encode(
    last_seq: u64,
    page_bytes: usize,
    namespace: &Namespace,
    allocator: &Allocator,
    unwritten: &RunSet,
) -> Vec<u8> {
    let mut encoder = Encoder::default();
    encoder.u64(last_seq);
    encoder.u32(page_bytes as u32);
    encoder.u64(allocator.total_pages());
    encoder.u64(namespace.next_inode());
    let mut inodes: Vec<(u64, &Inode)> = namespace.iter().collect();
    inodes.sort_by_key(|&(number, _)| number);
    encoder.u64(inodes.len() as u64);
    for (number, inode) in inodes {
        let attributes = &inode.attributes;
        encoder.u64(number);
        encoder.u8(encode_kind(attributes.kind));
        encoder.u16(attributes.mode);
        encoder.u32(attributes.uid);
        encoder.u32(attributes.gid);
        encoder.u32(attributes.nlink);
        encoder.u64(attributes.size_bytes);
        for time in [attributes.atime, attributes.mtime, attributes.ctime, attributes.crtime] {
            encoder.time(time);
        }
        match &inode.content {
            Content::File(extents) => {
                encoder.u64(extents.runs().count() as u64);
                for (first, remote, len) in extents.runs() {
                    encoder.u64(first);
                    encoder.u64(remote);
                    encoder.u64(len);
                }
            }
            Content::Directory(directory) => {
                encoder.u64(directory.parent);
                encoder.u64(directory.len() as u64);
                for (name, entry) in directory.entries() {
                    encoder.name(name);
                    encoder.u64(entry);
                }
            }
            Content::Symlink(target) => encoder.name(target),
            Content::Special { rdev, .. } => encoder.u32(*rdev),
        }
    }
    encoder.u64(unwritten.runs().count() as u64);
    for (start, len) in unwritten.runs() {
        encoder.u64(start);
        encoder.u64(len);
    }
    let payload = encoder.bytes;
    let len = (payload.len() as u64).to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len), &payload);
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&len);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Decodes and checks a snapshot for an address space of `total_pages` pages of `page_bytes`.
pub fn decode(bytes: &[u8], page_bytes: usize, total_pages: u64) -> Result<Restored, SnapshotError> {
    if bytes.len() < HEADER_BYTES || (&bytes[..8] != MAGIC && &bytes[..8] != MAGIC_VERSION_1) {
        return Err(SnapshotError::Magic);
    }
    let len_bytes: [u8; 8] = bytes[8..16].try_into().expect("8 bytes");
    let stated = u64::from_le_bytes(len_bytes);
    let crc = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    let payload = &bytes[HEADER_BYTES..];
    if stated != payload.len() as u64 {
        return Err(SnapshotError::Length { stated, actual: payload.len() as u64 });
    }
    if crc32c::crc32c_append(crc32c::crc32c(&len_bytes), payload) != crc {
        return Err(SnapshotError::Checksum);
    }
    let mut decoder = Decoder::new(payload);
    let last_seq = decoder.u64()?;
    let stored_page_bytes = decoder.u32()?;
    let stored_total_pages = decoder.u64()?;
    if stored_page_bytes as usize != page_bytes || stored_total_pages != total_pages {
        return Err(invalid(format!(
            "it describes {stored_total_pages} pages of {stored_page_bytes} bytes, the slab map {total_pages} of {page_bytes}"
        )));
    }
    let next_inode = decoder.u64()?;
    let page_bytes_u64 = page_bytes as u64;
    let max_file_pages = MAX_FILE_BYTES / page_bytes_u64;
    let mut allocator = Allocator::new(total_pages);
    let mut inodes: HashMap<u64, Inode> = HashMap::new();
    // Minimum bytes of one inode: fixed fields (8+1+2+4+4+4+8+4*12) and the smallest content
    // (a one-byte symlink target, 3).
    let count = decoder.count("inodes", 82)?;
    for _ in 0..count {
        let number = decoder.u64()?;
        if number == 0 || number >= next_inode || inodes.contains_key(&number) {
            return Err(invalid(format!("inode number {number} (next is {next_inode}, or listed twice)")));
        }
        let kind = decode_kind(decoder.u8()?)?;
        let mode = decoder.u16()?;
        if mode > 0o7777 {
            return Err(invalid(format!("inode {number} has mode {mode:o}")));
        }
        let uid = decoder.u32()?;
        let gid = decoder.u32()?;
        let nlink = decoder.u32()?;
        let size_bytes = decoder.u64()?;
        if size_bytes > MAX_FILE_BYTES {
            return Err(invalid(format!("inode {number} is {size_bytes} bytes")));
        }
        let mut times = [SystemTime::UNIX_EPOCH; 4];
        for time in &mut times {
            *time = decoder.time()?;
        }
        let [atime, mtime, ctime, crtime] = times;
        let content =
            decode_content(&mut decoder, (number, kind, size_bytes), max_file_pages, &mut allocator)?;
        let (mapped_pages, rdev) = match &content {
            Content::File(extents) => (extents.mapped_pages(), 0),
            Content::Special { rdev, .. } => (0, *rdev),
            _ => (0, 0),
        };
        let attributes = Attributes {
            inode: number,
            kind,
            size_bytes,
            mapped_pages,
            mode,
            uid,
            gid,
            nlink,
            rdev,
            atime,
            mtime,
            ctime,
            crtime,
        };
        inodes.insert(number, Inode { attributes, content, open_handles: 0, lookups: 0 });
    }
    let mut unwritten = RunSet::default();
    for _ in 0..decoder.count("unwritten runs", 16)? {
        let (start, len) = (decoder.u64()?, decoder.u64()?);
        let end = start.checked_add(len).filter(|&end| len > 0 && end <= total_pages);
        match end {
            Some(end) if !allocator.intersects_free(start, end) && !unwritten.intersects(start, end) => {
                unwritten.insert(start, len)
            }
            _ => {
                return Err(invalid(format!(
                    "unwritten run of {len} pages at {start} is not mapped to a file"
                )))
            }
        }
    }
    decoder.finish("the snapshot")?;
    check_tree(&inodes)?;
    Ok(Restored { namespace: Namespace::from_parts(inodes, next_inode), allocator, unwritten, last_seq })
}

/// The content of inode `number`: a file's runs (each taken from `allocator`), a directory's
/// entries, a symlink's target.
fn decode_content(
    decoder: &mut Decoder<'_>,
    (number, kind, size_bytes): (u64, FileKind, u64),
    max_file_pages: u64,
    allocator: &mut Allocator,
) -> Result<Content, SnapshotError> {
    Ok(match kind {
        FileKind::File => {
            let mut extents = ExtentMap::default();
            for _ in 0..decoder.count("runs", 24)? {
                let (first, remote, len) = (decoder.u64()?, decoder.u64()?, decoder.u64()?);
                let in_file = first.checked_add(len).is_some_and(|end| end <= max_file_pages);
                if !in_file || !extents.insert_mapping(first, remote, len) || !allocator.take(remote, len) {
                    return Err(invalid(format!(
                        "inode {number}: run of {len} pages at file page {first} -> remem page {remote} \
                         overlaps another run or lies outside the address space"
                    )));
                }
            }
            Content::File(extents)
        }
        FileKind::Directory => {
            let mut directory = Directory::new(decoder.u64()?);
            for _ in 0..decoder.count("entries", 10)? {
                let name = decoder.name("name", MAX_NAME_BYTES)?;
                let entry = decoder.u64()?;
                check_name(&name).map_err(|_| invalid(format!("directory {number}: bad name {name:?}")))?;
                if directory.get(&name).is_some() {
                    return Err(invalid(format!("directory {number}: {name:?} listed twice")));
                }
                directory.insert(&name, entry);
            }
            Content::Directory(directory)
        }
        FileKind::Symlink => {
            let target = decoder.name("symlink target", MAX_SYMLINK_BYTES)?;
            if target.is_empty() || size_bytes != target.len() as u64 {
                return Err(invalid(format!(
                    "symlink {number}: target of {} bytes, size {size_bytes}",
                    target.len()
                )));
            }
            Content::Symlink(target)
        }
        kind => {
            let rdev = decoder.u32()?;
            if size_bytes != 0 {
                return Err(invalid(format!("special file {number} has size {size_bytes}")));
            }
            Content::Special { kind, rdev }
        }
    })
}

/// The namespace invariants (see `crate::namespace`), checked whole.
fn check_tree(inodes: &HashMap<u64, Inode>) -> Result<(), SnapshotError> {
    let root = inodes.get(&ROOT_INODE).ok_or_else(|| invalid("no root directory"))?;
    match &root.content {
        Content::Directory(directory) if directory.parent == ROOT_INODE => {}
        _ => return Err(invalid("the root is not a directory that is its own parent")),
    }
    let mut names: HashMap<u64, u32> = HashMap::new();
    let mut subdirectories: HashMap<u64, u32> = HashMap::new();
    for (&number, inode) in inodes {
        let Content::Directory(directory) = &inode.content else { continue };
        for (name, entry) in directory.entries() {
            let target = inodes.get(&entry).ok_or_else(|| {
                invalid(format!("directory {number}: {name:?} names missing inode {entry}"))
            })?;
            *names.entry(entry).or_default() += 1;
            if let Content::Directory(child) = &target.content {
                if child.parent != number || entry == ROOT_INODE {
                    return Err(invalid(format!(
                        "directory {entry} is listed in {number}, its parent is {}",
                        child.parent
                    )));
                }
                *subdirectories.entry(number).or_default() += 1;
            }
        }
    }
    let mut orphan_directories = 0;
    for (&number, inode) in inodes {
        let named = names.get(&number).copied().unwrap_or(0);
        let expected_nlink = match &inode.content {
            // A removed directory the kernel still held when the snapshot was taken (freed
            // after loading): empty, without a name or links.
            Content::Directory(directory)
                if number != ROOT_INODE && named == 0 && inode.attributes.nlink == 0 =>
            {
                if !directory.is_empty() {
                    return Err(invalid(format!("removed directory {number} has entries")));
                }
                orphan_directories += 1;
                0
            }
            Content::Directory(_) => {
                if number != ROOT_INODE && named != 1 {
                    return Err(invalid(format!("directory {number} has {named} names")));
                }
                2 + subdirectories.get(&number).copied().unwrap_or(0)
            }
            // A node with no name was held (open, or known to the kernel) when the snapshot was
            // taken (freed after loading).
            _ => named,
        };
        if inode.attributes.nlink != expected_nlink {
            return Err(invalid(format!(
                "inode {number} has link count {}, {expected_nlink} expected",
                inode.attributes.nlink
            )));
        }
    }
    // Every directory reachable from the root (no cycles among the others).
    let mut reached = HashSet::from([ROOT_INODE]);
    let mut queue = vec![ROOT_INODE];
    while let Some(number) = queue.pop() {
        if let Some(Inode { content: Content::Directory(directory), .. }) = inodes.get(&number) {
            for (_, entry) in directory.entries() {
                if inodes.get(&entry).is_some_and(|inode| inode.attributes.kind == FileKind::Directory)
                    && reached.insert(entry)
                {
                    queue.push(entry);
                }
            }
        }
    }
    let directories = inodes.values().filter(|inode| inode.attributes.kind == FileKind::Directory).count();
    if reached.len() + orphan_directories != directories {
        return Err(invalid(format!(
            "{} of {directories} directories are not reachable from the root",
            directories - reached.len() - orphan_directories
        )));
    }
    Ok(())
}
