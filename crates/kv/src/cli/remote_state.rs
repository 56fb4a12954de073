//! Reading the state region back (`remem kv --etcd` on any host, docs/KV.md "Host loss"): the
//! rewrites log and the backup region's pages in use, copied from remote memory into the local
//! working copies of a state directory, which the ordinary reopen then scans
//! (`crate::backup::Backup::open`, `crate::cache::rewrites::RewriteLog::open`).
//!
//! Every byte read is input: the header's magic, version, chunk count and CRC are checked here
//! before they size anything (and again by `Backup::open`, with every slot's CRC), the chunk
//! count is bounded by the region's size, and a page that cannot be read stops the start with
//! what happened to it (torn or lost beyond r, `describe_read_error`): a record lost with its
//! page is never replaced by zeros.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{bail, Context, Result};
use remem_client::{Client, PageOp};

use crate::backup::{self, CHUNK_BYTES, HEADER_FIXED_BYTES, MAGIC, MAX_CHUNKS, VERSION};
use crate::cache::mirror::{describe_read_error, StateRegion};
use crate::cache::rewrites::LOG_BYTES;

const PAGE: usize = 4096;
/// Pages read per batch (the buffer is this many pages).
const BATCH_PAGES: usize = 64;

/// What was found in the state region.
#[derive(Debug)]
pub enum Found {
    /// Nothing was ever written there (its first range never mapped: the last process stopped
    /// before its first copy-out, so it acknowledged nothing).
    Empty,
    /// The working copies were written: backup pages in use, chunks assigned.
    Copied { pages: u64, chunks: u32 },
}

/// Copies the state region's rewrites log and backup pages in use to `rewrites_path` and
/// `backup_path` (replacing them). Blocking; before the cache serves.
///
/// Errors: a page unreadable (torn, or lost with more than r nodes); a header that is not a
/// backup region's or does not fit the region; local I/O.
pub fn read_state_region(
    client: &mut Client,
    region: &StateRegion,
    rewrites_path: &Path,
    backup_path: &Path,
) -> Result<Found> {
    if !client.engine().range_mapped(region.first_range) {
        return Ok(Found::Empty);
    }
    let mut buffer = vec![0u8; BATCH_PAGES * PAGE];
    read_pages(client, region, 0, 1, &mut buffer)?;
    write_file(rewrites_path, &buffer[..LOG_BYTES])?;
    read_pages(client, region, 1, 1, &mut buffer)?;
    let chunk_count = check_header(&buffer[..PAGE], region)?;
    let header_pages = (backup::header_bytes(chunk_count) / PAGE) as u64;
    let file_bytes = backup::header_bytes(chunk_count) as u64 + u64::from(chunk_count) * CHUNK_BYTES as u64;
    let _ = std::fs::remove_file(backup_path);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(backup_path)
        .with_context(|| format!("creating {}", backup_path.display()))?;
    file.set_len(file_bytes).with_context(|| format!("sizing {}", backup_path.display()))?;
    // The header (at most 17 pages) whole: its class bytes say which chunks are assigned.
    let mut header = vec![0u8; header_pages as usize * PAGE];
    for (index, part) in header.chunks_mut(BATCH_PAGES * PAGE).enumerate() {
        let first = 1 + (index * BATCH_PAGES) as u64;
        read_pages(client, region, first, (part.len() / PAGE) as u64, &mut buffer)?;
        part.copy_from_slice(&buffer[..part.len()]);
    }
    file.write_all_at(&header, 0).context("writing the backup's header")?;
    // Chunks are assigned in order: the first class byte 0 ends the assigned ones.
    let classes = &header[HEADER_FIXED_BYTES..HEADER_FIXED_BYTES + chunk_count as usize];
    let chunks = classes.iter().position(|&class| class == 0).unwrap_or(classes.len()) as u32;
    let pages = u64::from(chunks) * (CHUNK_BYTES / PAGE) as u64;
    let mut done = 0;
    while done < pages {
        let count = (pages - done).min(BATCH_PAGES as u64);
        read_pages(client, region, 1 + header_pages + done, count, &mut buffer)?;
        let at = (header_pages + done) * PAGE as u64;
        file.write_all_at(&buffer[..count as usize * PAGE], at).context("writing the backup's chunks")?;
        done += count;
    }
    Ok(Found::Copied { pages: header_pages + pages, chunks })
}

/// The chunk count of a backup header read from remote memory, checked before it sizes
/// anything: magic, version, CRC, bounds, and the region's room for it.
fn check_header(page: &[u8], region: &StateRegion) -> Result<u32> {
    let word = |at: usize| u32::from_le_bytes(page[at..at + 4].try_into().expect("4 bytes"));
    if &page[..8] != MAGIC {
        bail!("the state region holds no backup region (bad magic)");
    }
    if word(16) != crc32c::crc32c(&page[..16]) {
        bail!("the state region's backup header fails its checksum");
    }
    if word(8) != VERSION {
        bail!("the state region's backup is format version {}, this remem reads {VERSION}", word(8));
    }
    let chunk_count = word(12);
    let pages = (backup::header_bytes(chunk_count.min(MAX_CHUNKS)) / PAGE) as u64
        + u64::from(chunk_count) * (CHUNK_BYTES / PAGE) as u64;
    if chunk_count == 0 || chunk_count > MAX_CHUNKS || 1 + pages > region.page_count {
        bail!(
            "the state region's backup header names {chunk_count} chunks, which its {} pages cannot hold",
            region.page_count
        );
    }
    Ok(chunk_count)
}

/// Reads state pages `first..first + count` into `buffer` (blocking), each error named by what
/// it means. A page in a range never mapped reads as zeros: nothing was ever written there,
/// since a range is in the saved map before any page of it is written.
fn read_pages(
    client: &mut Client,
    region: &StateRegion,
    first: u64,
    count: u64,
    buffer: &mut [u8],
) -> Result<()> {
    assert!(count as usize * PAGE <= buffer.len());
    let mut pages = Vec::with_capacity(count as usize);
    let mut ops: Vec<PageOp> = Vec::with_capacity(count as usize);
    for (index, buf) in buffer[..count as usize * PAGE].chunks_exact_mut(PAGE).enumerate() {
        let page = first + index as u64;
        let range = region.first_range + (page / region.pages_per_range) as usize;
        if client.engine().range_mapped(range) {
            pages.push(page);
            ops.push(PageOp::Read { page: region.first_page + page, buf });
        } else {
            buf.fill(0);
        }
    }
    let mut failure = None;
    client.execute(&mut ops, |done| {
        if let (Err(error), None) = (&done.result, &failure) {
            failure = Some(describe_read_error(pages[done.index], error));
        }
    });
    match failure {
        Some(failure) => bail!(
            "the kv's state cannot be read back: {failure}; refusing to start rather than lose acknowledged \
             items (--fresh starts empty)"
        ),
        None => Ok(()),
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let _ = std::fs::remove_file(path);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all_at(bytes, 0).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(page_count: u64) -> StateRegion {
        StateRegion { first_page: 0, page_count, first_range: 0, pages_per_range: 256 }
    }

    fn header(chunk_count: u32) -> Vec<u8> {
        let mut page = vec![0u8; PAGE];
        page[..8].copy_from_slice(MAGIC);
        page[8..12].copy_from_slice(&VERSION.to_le_bytes());
        page[12..16].copy_from_slice(&chunk_count.to_le_bytes());
        let crc = crc32c::crc32c(&page[..16]);
        page[16..20].copy_from_slice(&crc.to_le_bytes());
        page
    }

    #[test]
    fn a_hostile_header_read_back_is_refused_before_it_sizes_anything() {
        // 1 (rewrites) + 1 (header) + 4 chunks of 256 pages.
        let room = region(2 + 4 * 256);
        assert_eq!(check_header(&header(4), &room).unwrap(), 4);
        assert!(check_header(&header(5), &room).is_err(), "more chunks than the region holds");
        assert!(check_header(&header(0), &room).is_err());
        assert!(check_header(&header(u32::MAX), &region(u64::MAX)).is_err(), "beyond MAX_CHUNKS");
        let mut flipped = header(4);
        flipped[12] ^= 1;
        assert!(check_header(&flipped, &room).unwrap_err().to_string().contains("checksum"));
        let mut magic = header(4);
        magic[0] = b'X';
        assert!(check_header(&magic, &room).unwrap_err().to_string().contains("magic"));
        assert!(check_header(&[0u8; PAGE], &room).is_err(), "a page never written");
    }

    #[test]
    fn a_torn_page_and_a_page_lost_beyond_r_are_told_apart() {
        let node: std::net::SocketAddr = "10.0.0.1:7100".parse().unwrap();
        let lost = |failed_nodes| remem_client::PageError::Lost {
            page: 7,
            range: 0,
            valid_splits: 0,
            needed_splits: 1,
            failed_nodes,
        };
        assert!(describe_read_error(3, &lost(Vec::new())).contains("state page 3 is torn"));
        let beyond = describe_read_error(3, &lost(vec![node]));
        assert!(beyond.contains("is lost with nodes") && beyond.contains("10.0.0.1:7100"), "{beyond}");
    }
}
