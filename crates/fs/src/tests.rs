//! The file system against a `HashMap` page store: a byte-vector model of one file under random
//! writes, truncates, punches and reads; batches of reads and writes over two files against the
//! same requests one at a time; sparse and TiB-sized files; EIO, never bytes, when the store
//! fails, for exactly the requests whose pages failed.

use std::ffi::OsStr;

use proptest::prelude::*;

use crate::batch::{DataAnswer, DataRequest};
use crate::error::FsError;
use crate::filesystem::FileSystem;
use crate::namespace::{Creator, ROOT_INODE};
use crate::store::MemoryStore;

const ME: Creator = Creator { uid: 0, gid: 0, mode: 0o644 };

fn file_system(pages: u64) -> (FileSystem<MemoryStore>, u64) {
    let store = MemoryStore::new(4096, pages);
    let mut fs = FileSystem::new(store, ME);
    let inode = fs.create_file(ROOT_INODE, OsStr::new("f"), ME).expect("create").inode;
    (fs, inode)
}

#[derive(Clone, Debug)]
enum Op {
    Write { offset: u64, len: usize, byte: u8 },
    Truncate { size: u64 },
    Punch { offset: u64, len: u64 },
    Read { offset: u64, len: usize },
}

fn op() -> impl Strategy<Value = Op> {
    const SPAN: u64 = 12 * 4096;
    prop_oneof![
        4 => (0..SPAN, 1usize..10_000, any::<u8>()).prop_map(|(offset, len, byte)| Op::Write { offset, len, byte }),
        1 => (0..SPAN).prop_map(|size| Op::Truncate { size }),
        1 => (0..SPAN, 1..3 * 4096u64).prop_map(|(offset, len)| Op::Punch { offset, len }),
        3 => (0..SPAN, 1usize..20_000).prop_map(|(offset, len)| Op::Read { offset, len }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Every read returns exactly what a plain byte vector holds after the same operations, and
    /// the pages the file holds are only those some byte of it needed.
    #[test]
    fn a_file_reads_like_a_byte_vector(ops in prop::collection::vec(op(), 1..40)) {
        let (mut fs, inode) = file_system(64);
        let mut model: Vec<u8> = Vec::new();
        for op in ops {
            match op {
                Op::Write { offset, len, byte } => {
                    let data: Vec<u8> = (0..len).map(|index| byte.wrapping_add(index as u8) | 1).collect();
                    prop_assert_eq!(fs.write(inode, offset, &data).expect("write"), len as u32);
                    let end = offset as usize + len;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[offset as usize..end].copy_from_slice(&data);
                }
                Op::Truncate { size } => {
                    fs.truncate(inode, size).expect("truncate");
                    model.resize(size as usize, 0);
                }
                Op::Punch { offset, len } => {
                    fs.fallocate(inode, offset, len, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                        .expect("punch");
                    let end = ((offset + len) as usize).min(model.len());
                    if (offset as usize) < end {
                        model[offset as usize..end].fill(0);
                    }
                }
                Op::Read { offset, len } => {
                    let got = fs.read(inode, offset, len).expect("read").to_vec();
                    let start = (offset as usize).min(model.len());
                    let end = (offset as usize + len).min(model.len());
                    prop_assert_eq!(&got[..], &model[start..end]);
                }
            }
            prop_assert_eq!(fs.getattr(inode).expect("attributes").size_bytes, model.len() as u64);
        }
        // Freed pages read as zeros in the store (discarded), so a later owner sees no old byte.
        let mapped = fs.getattr(inode).expect("attributes").mapped_pages;
        prop_assert_eq!(fs.store.pages.len() as u64 <= mapped, true);
    }
}

#[test]
fn a_sparse_file_of_a_tebibyte_holds_only_its_written_pages() {
    let (mut fs, inode) = file_system(16);
    let tebibyte = 1u64 << 40;
    fs.truncate(inode, tebibyte).expect("truncate up");
    assert_eq!(fs.write(inode, tebibyte - 10, b"tail bytes").expect("write"), 10);
    assert_eq!(fs.write(inode, 3 * 4096 + 5, b"x").expect("write"), 1);
    let attributes = fs.getattr(inode).expect("attributes");
    assert_eq!(attributes.size_bytes, tebibyte);
    assert_eq!(attributes.mapped_pages, 2);
    let ops_before = fs.store.ops_executed;
    assert!(fs.read(inode, 1 << 30, 1 << 20).expect("hole").iter().all(|&byte| byte == 0));
    assert_eq!(fs.store.ops_executed, ops_before, "a hole costs no page I/O");
    assert_eq!(fs.read(inode, tebibyte - 10, 100).expect("tail"), b"tail bytes");
    assert!(matches!(fs.write(inode, crate::MAX_FILE_BYTES - 1, b"ab"), Err(FsError::TooLarge { .. })));
}

#[test]
fn fallocate_reserves_pages_and_runs_out_with_enospc() {
    let (mut fs, inode) = file_system(8);
    fs.fallocate(inode, 0, 5 * 4096, 0).expect("allocate");
    assert_eq!(fs.getattr(inode).expect("attributes").size_bytes, 5 * 4096);
    assert_eq!(fs.usage().free_pages, 3);
    fs.fallocate(inode, 5 * 4096, 3 * 4096, libc::FALLOC_FL_KEEP_SIZE).expect("keep size");
    assert_eq!(fs.getattr(inode).expect("attributes").size_bytes, 5 * 4096);
    assert!(fs.read(inode, 0, 5 * 4096).expect("read").iter().all(|&byte| byte == 0));
    let other = fs.create_file(ROOT_INODE, OsStr::new("g"), ME).expect("g").inode;
    let error = fs.write(other, 0, &[1; 4096]).expect_err("full");
    assert_eq!(error.errno(), libc::ENOSPC);
    fs.unlink(ROOT_INODE, OsStr::new("f")).expect("unlink");
    assert_eq!(fs.usage().free_pages, 8);
    fs.write(other, 0, &[1; 4096]).expect("space again");
}

#[test]
fn a_failing_store_gives_eio_never_bytes() {
    let (mut fs, inode) = file_system(8);
    fs.write(inode, 0, &[7; 8192]).expect("write");
    fs.store.failing = true;
    assert_eq!(fs.read(inode, 0, 8192).expect_err("read fails").errno(), libc::EIO);
    assert_eq!(fs.write(inode, 100, b"abc").expect_err("write fails").errno(), libc::EIO);
    fs.store.failing = false;
    assert_eq!(fs.read(inode, 0, 8192).expect("read"), &[7; 8192][..]);
}

#[derive(Clone, Debug)]
enum BatchOp {
    Write { file: usize, offset: u64, len: usize, byte: u8 },
    Read { file: usize, offset: u64, len: usize },
}

fn batch_op() -> impl Strategy<Value = BatchOp> {
    const SPAN: u64 = 8 * 4096;
    prop_oneof![
        (0..2usize, 0..SPAN, 1usize..10_000, any::<u8>())
            .prop_map(|(file, offset, len, byte)| BatchOp::Write { file, offset, len, byte }),
        (0..2usize, 0..SPAN, 1usize..12_000).prop_map(|(file, offset, len)| BatchOp::Read {
            file,
            offset,
            len
        }),
    ]
}

/// What a request got: bytes read, bytes written, or an errno.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Got {
    Read(Vec<u8>),
    Written(u32),
    Errno(i32),
}

/// Runs `requests` as one call of the batch path; what each got.
fn run_batch(fs: &mut FileSystem<MemoryStore>, requests: &[DataRequest<'_>]) -> Vec<Got> {
    let mut got = vec![None; requests.len()];
    fs.run_data_requests(requests, &mut |index, result| {
        assert!(got[index].is_none(), "request {index} answered twice");
        got[index] = Some(match result {
            Ok(DataAnswer::Read(bytes)) => Got::Read(bytes.to_vec()),
            Ok(DataAnswer::Written(written)) => Got::Written(written),
            Err(error) => Got::Errno(error.errno()),
        });
    });
    got.into_iter().map(|got| got.expect("every request is answered")).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Reads and writes of two files run as batches (overlapping, partial pages, growing the
    /// files) give each request exactly what it gets when the requests run one at a time in
    /// arrival order.
    #[test]
    fn a_batch_answers_like_its_requests_one_at_a_time(
        batches in prop::collection::vec(prop::collection::vec(batch_op(), 1..16), 1..6)
    ) {
        let (mut fs, first) = file_system(64);
        let second = fs.create_file(ROOT_INODE, OsStr::new("g"), ME).expect("create").inode;
        let inodes = [first, second];
        let mut model: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
        for batch in batches {
            let data: Vec<Vec<u8>> = batch
                .iter()
                .map(|op| match *op {
                    BatchOp::Write { len, byte, .. } => (0..len).map(|index| byte.wrapping_add(index as u8) | 1).collect(),
                    BatchOp::Read { .. } => Vec::new(),
                })
                .collect();
            let requests: Vec<DataRequest<'_>> = batch
                .iter()
                .zip(&data)
                .map(|(op, data)| match *op {
                    BatchOp::Write { file, offset, .. } => DataRequest::Write { inode: inodes[file], offset, data },
                    BatchOp::Read { file, offset, len } => DataRequest::Read { inode: inodes[file], offset, size: len },
                })
                .collect();
            let got = run_batch(&mut fs, &requests);
            for ((op, data), got) in batch.iter().zip(&data).zip(got) {
                match *op {
                    BatchOp::Write { file, offset, len, .. } => {
                        prop_assert_eq!(got, Got::Written(len as u32));
                        let end = offset as usize + len;
                        if model[file].len() < end {
                            model[file].resize(end, 0);
                        }
                        model[file][offset as usize..end].copy_from_slice(data);
                    }
                    BatchOp::Read { file, offset, len } => {
                        let start = (offset as usize).min(model[file].len());
                        let end = (offset as usize + len).min(model[file].len());
                        prop_assert_eq!(got, Got::Read(model[file][start..end].to_vec()));
                    }
                }
            }
        }
        for (inode, model) in inodes.iter().zip(&model) {
            prop_assert_eq!(fs.getattr(*inode).expect("attributes").size_bytes, model.len() as u64);
            prop_assert_eq!(fs.read(*inode, 0, 1 << 20).expect("read"), &model[..]);
        }
    }
}

/// The remem page of `inode`'s file page `page`.
fn remote_page(fs: &FileSystem<MemoryStore>, inode: u64, page: u64) -> u64 {
    match &fs.namespace.get(inode).expect("inode").content {
        crate::namespace::Content::File(extents) => extents.lookup(page).expect("mapped"),
        _ => panic!("not a file"),
    }
}

#[test]
fn a_failed_page_fails_only_the_requests_that_touch_it_and_the_rest_share_two_batches() {
    let (mut fs, first) = file_system(16);
    let second = fs.create_file(ROOT_INODE, OsStr::new("g"), ME).expect("create").inode;
    fs.write(first, 0, &[1; 8192]).expect("write");
    fs.write(second, 0, &[2; 8192]).expect("write");
    let bad = remote_page(&fs, first, 1);
    fs.store.lost.insert(bad);
    let batches_before = fs.store.batches_executed;
    let requests = [
        DataRequest::Read { inode: first, offset: 0, size: 4096 },
        DataRequest::Read { inode: first, offset: 4000, size: 200 },
        DataRequest::Read { inode: second, offset: 0, size: 8192 },
        DataRequest::Write { inode: second, offset: 100, data: b"abc" },
        DataRequest::Write { inode: first, offset: 4096 + 10, data: b"x" },
        DataRequest::Write { inode: first, offset: 0, data: &[3; 4096] },
    ];
    let got = run_batch(&mut fs, &requests);
    assert_eq!(got[0], Got::Read(vec![1; 4096]));
    assert_eq!(got[1], Got::Errno(libc::EIO), "a read touching the failed page");
    assert_eq!(got[2], Got::Read(vec![2; 8192]));
    assert_eq!(got[3], Got::Written(3));
    assert_eq!(got[4], Got::Errno(libc::EIO), "its read-modify-write read failed");
    assert_eq!(got[5], Got::Written(4096));
    assert_eq!(fs.store.batches_executed - batches_before, 2, "one batch of page reads, one of page writes");
    fs.store.lost.clear();
    let mut expected = vec![2; 8192];
    expected[100..103].copy_from_slice(b"abc");
    assert_eq!(fs.read(second, 0, 8192).expect("read"), &expected[..]);
    let mut expected = vec![3; 4096];
    expected.extend_from_slice(&[1; 4096]);
    assert_eq!(fs.read(first, 0, 8192).expect("read"), &expected[..], "the failed write wrote nothing");
}

#[test]
fn overlapping_partial_writes_in_one_batch_apply_in_arrival_order() {
    let (mut fs, inode) = file_system(8);
    fs.write(inode, 0, &[b'.'; 4096]).expect("write");
    let requests = [
        DataRequest::Write { inode, offset: 0, data: b"aaaa" },
        DataRequest::Write { inode, offset: 2, data: b"bb" },
        DataRequest::Read { inode, offset: 0, size: 6 },
        DataRequest::Write { inode, offset: 3, data: b"c" },
    ];
    let got = run_batch(&mut fs, &requests);
    assert_eq!(got[2], Got::Read(b"aabb..".to_vec()));
    assert_eq!(fs.read(inode, 0, 6).expect("read"), b"aabc..");
}
