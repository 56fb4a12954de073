//! `remem fs --writeback` (the kernel's writeback cache) on real node processes and a real
//! mount: what docs/FS.md SEMANTICS promises of the mode. fio's crc32c verify through the page
//! cache, sqlite3 in WAL mode with `integrity_check`, and after a SIGKILL of `remem fs` a file
//! written in unaligned pieces and closed, and one fsynced and still open, read back byte for
//! byte on the next mount (close and fsync mean "on the nodes"). Every mount is unmounted by
//! its guard, also on panic.

use crate::common;
use crate::fs_support::{detach, FsMount};

use common::run_ok;

use std::io::Write;

use remem::launcher::UnixSockets;

fn pattern(offset: u64, len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64).map(|index| ((offset + index).wrapping_mul(0x9e37_79b9) ^ seed) as u8).collect()
}

#[test]
fn writeback_mode_keeps_closed_files_across_a_sigkill() {
    let dir = common::ScratchDir::new("fs-writeback");
    let cluster = common::start_cluster("fs", "writeback", 10, UnixSockets::None);
    let mount = FsMount::start_with(&cluster, &dir, "96MiB", &["--writeback"]);
    let directory = mount.mountpoint.to_str().expect("utf-8 path").to_owned();
    let output = run_ok(
        120,
        "fio",
        &[
            "--name=writeback",
            &format!("--directory={directory}"),
            "--rw=randwrite",
            "--bsrange=1k-64k",
            "--size=16m",
            "--ioengine=psync",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            "--randrepeat=1",
            // No verify state file left in the working directory.
            "--verify_state_save=0",
        ],
    );
    assert!(output.contains("err= 0"), "fio through the writeback cache: {output}");

    let database = mount.path("wal.sqlite");
    let script = "pragma journal_mode=wal;
         create table t(id integer primary key, body text);
         begin; insert into t(body) select hex(randomblob(300)) from generate_series(1, 4000); commit;
         delete from t where id % 5 = 0;
         pragma integrity_check;
         select count(*) from t;";
    let output = run_ok(60, "sqlite3", &[database.to_str().expect("utf-8"), script]);
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines[lines.len() - 2..], ["ok", "3200"], "sqlite3 said: {output}");

    // Unaligned pieces that share pages, then close: the close waits for the write-back.
    const CLOSED_BYTES: usize = 3 << 20;
    let closed = pattern(0, CLOSED_BYTES, 1);
    let mut file = std::fs::File::create(mount.path("closed")).expect("create closed");
    for piece in closed.chunks(1000) {
        file.write_all(piece).expect("write a piece");
    }
    drop(file);
    // Written, fsynced, and still open when remem fs dies.
    let synced = pattern(0, 1 << 20, 2);
    let mut open_file = std::fs::File::create(mount.path("synced")).expect("create synced");
    open_file.write_all(&synced).expect("write synced");
    open_file.sync_all().expect("fsync");

    mount.sigkill();
    drop(open_file);
    detach(&dir.join("mnt"));
    let mount = FsMount::start(&cluster, &dir, "96MiB");
    let read_closed = std::fs::read(mount.path("closed")).expect("read closed after the restart");
    assert!(
        read_closed == closed,
        "the closed file differs after a SIGKILL ({} bytes read)",
        read_closed.len()
    );
    let read_synced = std::fs::read(mount.path("synced")).expect("read synced after the restart");
    assert!(
        read_synced == synced,
        "the fsynced file differs after a SIGKILL ({} bytes read)",
        read_synced.len()
    );
    let output = run_ok(
        60,
        "sqlite3",
        &[mount.path("wal.sqlite").to_str().expect("utf-8"), "pragma integrity_check;"],
    );
    assert_eq!(output.trim(), "ok", "the database after the restart: {output}");
}
