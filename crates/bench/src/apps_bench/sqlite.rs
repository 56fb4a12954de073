//! The transactional database: sqlite (python3's sqlite3 module) with an in-memory database, so
//! its pages are the process's anonymous memory and page to swap. TPC-B-like small transactions:
//! move an amount between two accounts picked uniformly, log it in a history table, and every
//! tenth transaction also read a range of 100 balances. Each transaction's latency is measured
//! in the script (p50/p99); throughput is transactions per second of that phase. At the end,
//! `PRAGMA integrity_check` must say ok, the balances must still sum to the initial total, the
//! history must hold one row per transaction with the sum of the amounts moved: a deterministic
//! result line that every run must print as the baseline did.

use std::path::Path;

use anyhow::Result;

use super::failure::Failure;
use super::pagerank::run_batch_job;
use super::Measurement;

const SQLITE_SCRIPT: &str = r#"import random, sqlite3, sys, time
rows, transactions, seed = map(int, sys.argv[1:4])
rng = random.Random(seed)
db = sqlite3.connect(":memory:", isolation_level=None)
db.execute("create table account(id integer primary key, branch integer not null, balance integer not null, payload text not null)")
db.execute("create table history(id integer primary key, source integer, target integer, amount integer, note text)")
db.execute("begin")
for start in range(0, rows, 10000):
    db.executemany("insert into account values (?, ?, 1000, ?)",
        [(i, i % 100, "%08x" % rng.getrandbits(32) * 25) for i in range(start, min(rows, start + 10000))])
db.execute("commit")
latencies = []
moved = 0
began = time.perf_counter()
for t in range(transactions):
    a, b, amount = rng.randrange(rows), rng.randrange(rows), rng.randrange(1, 100)
    t0 = time.perf_counter_ns()
    db.execute("begin")
    balance = db.execute("select balance from account where id = ?", (a,)).fetchone()[0]
    db.execute("update account set balance = balance - ? where id = ?", (amount, a))
    db.execute("update account set balance = balance + ? where id = ?", (amount, b))
    db.execute("insert into history(source, target, amount, note) values (?, ?, ?, ?)", (a, b, amount, "%016x" % rng.getrandbits(64) * 4))
    if t % 10 == 0:
        start = rng.randrange(rows)
        db.execute("select sum(balance) from account where id between ? and ?", (start, start + 99)).fetchone()
    db.execute("commit")
    latencies.append(time.perf_counter_ns() - t0)
    moved += amount
elapsed = time.perf_counter() - began
integrity = db.execute("pragma integrity_check").fetchone()[0]
total = db.execute("select sum(balance) from account").fetchone()[0]
count, history_sum = db.execute("select count(*), coalesce(sum(amount), 0) from history").fetchone()
checksum = db.execute("select sum((id * 7919 + balance) % 1000003) from account").fetchone()[0]
ok = integrity == "ok" and total == rows * 1000 and count == transactions and history_sum == moved
print("rows %d transactions %d integrity %s balance_sum %d history %d moved %d checksum %d %s" % (
    rows, transactions, integrity, total, count, history_sum, checksum, "consistent" if ok else "INCONSISTENT"))
latencies.sort()
if latencies:
    p50 = latencies[max(0, (len(latencies) * 50 + 99) // 100 - 1)] / 1000
    p99 = latencies[max(0, (len(latencies) * 99 + 99) // 100 - 1)] / 1000
    print("latency p50_us %.1f p99_us %.1f ops_per_second %.1f" % (p50, p99, transactions / max(elapsed, 1e-9)))
sys.exit(0 if ok else 1)
"#;

pub struct Sqlite {
    pub rows: usize,
    pub transactions: usize,
}

impl Sqlite {
    pub fn describe(&self) -> String {
        format!(
            "sqlite (python3 sqlite3, in-memory database of {} accounts, {} TPC-B-like transactions)",
            self.rows, self.transactions
        )
    }

    pub fn run(
        &self,
        limit: Option<&super::Limit>,
        work_dir: &Path,
        failure: Option<Failure>,
    ) -> Result<Measurement> {
        let script = work_dir.join("sqlite_oltp.py");
        std::fs::write(&script, SQLITE_SCRIPT)?;
        let command: Vec<String> = vec![
            super::pagerank::python3(),
            script.to_string_lossy().into_owned(),
            self.rows.to_string(),
            self.transactions.to_string(),
            "42".to_owned(),
        ];
        run_batch_job(&command, limit, work_dir, failure)
    }
}
