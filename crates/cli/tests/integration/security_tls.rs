//! NBD over TLS (NBD_OPT_STARTTLS, x509): libnbd's nbdcopy and nbdinfo against `remem nbd`
//! with a throwaway CA and certificates made here with `openssl`. A TLS client reads and writes
//! the export; with `--tls-required` a plain client is refused; with `--tls-ca` a client
//! without a certificate is refused. `remem kv --enable-ssl` (memcached's -Z) against a TLS
//! memcache client.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use remem::launcher::{ClusterOptions, LocalCluster, UnixSockets};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

fn run(command: &mut Command) -> Output {
    let output = command.output().expect("command runs");
    assert!(output.status.success(), "{command:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    output
}

fn openssl(dir: &Path, args: &[&str]) {
    run(Command::new("openssl").current_dir(dir).args(args));
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, in libnbd's layout
/// (`ca-cert.pem`, `client-cert.pem`, `client-key.pem`) under `dir/client`, and the server's
/// files under `dir`.
fn make_certificates(dir: &Path) {
    let client = dir.join("client");
    std::fs::create_dir_all(&client).unwrap();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    let mut ca = vec!["req", "-x509", "-days", "1", "-subj", "/CN=remem test CA"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca-key.pem", "-out", "ca-cert.pem"]);
    openssl(dir, &ca);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for (name, extensions) in [("server", "server.ext"), ("client/client", "client.ext")] {
        let key = format!("{name}-key.pem");
        let request = format!("{name}.csr");
        let certificate = format!("{name}-cert.pem");
        let mut new_request = vec!["req", "-subj", "/CN=localhost", "-keyout", &key, "-out", &request];
        new_request.extend(ec);
        openssl(dir, &new_request);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-days",
                "1",
                "-in",
                &request,
                "-CA",
                "ca-cert.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-extfile",
                extensions,
                "-out",
                &certificate,
            ],
        );
    }
    std::fs::copy(dir.join("ca-cert.pem"), client.join("ca-cert.pem")).unwrap();
}

struct Server {
    child: Child,
    address: String,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(cluster: &LocalCluster, dir: &Path, extra: &[&str]) -> Server {
    let log = dir.join(format!("nbd-{}.log", extra.len()));
    let mut child = Command::new(binary())
        .args(["nbd", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .args(["--size", "4MiB", "--export", "test", "-k", "2", "-r", "1", "--delta", "0"])
        .args(["--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(dir.join("server-cert.pem"))
        .arg("--tls-key")
        .arg(dir.join("server-key.pem"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .expect("remem nbd starts");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let address = line.trim().strip_prefix("listening ").unwrap_or_default().to_owned();
    let server = Server { child, address, log };
    assert!(
        !server.address.is_empty(),
        "no listening line: {}",
        std::fs::read_to_string(&server.log).unwrap()
    );
    server
}

fn timed(program: &str, args: &[&str]) -> Output {
    Command::new("timeout").arg("30").arg(program).args(args).output().expect("runs")
}

#[test]
fn nbd_over_tls_serves_tls_clients_and_refuses_plain_ones_when_required() {
    let dir = std::env::temp_dir().join(format!("remem-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    make_certificates(&dir);
    let options = ClusterOptions {
        lease_grace: None,
        nodes: 3,
        capacity_bytes: 64 << 20,
        slab_size_bytes: 1 << 20,
        nodes_per_domain: 1,
        dir: dir.join("cluster"),
        fault_injection: false,
        monitor_args: None,
        unix_sockets: UnixSockets::None,
        encrypt: false,
    };
    let cluster = LocalCluster::start(binary(), &options).expect("cluster starts");
    let certificates = dir.join("client");
    let certificates = certificates.to_str().unwrap();
    let data = dir.join("data.bin");
    let pattern: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(&data, &pattern).unwrap();
    let back = dir.join("back.bin");

    let server = start_server(&cluster, &dir, &["--tls-required"]);
    let tls_uri = format!("nbds://{}/test?tls-certificates={certificates}", server.address);
    let plain_uri = format!("nbd://{}/test", server.address);
    // A TLS client writes the export and reads it back.
    let copied = timed("nbdcopy", &[data.to_str().unwrap(), &tls_uri]);
    assert!(copied.status.success(), "nbdcopy over TLS: {}", String::from_utf8_lossy(&copied.stderr));
    let read_back = timed("nbdcopy", &[&tls_uri, back.to_str().unwrap()]);
    assert!(read_back.status.success(), "nbdcopy back: {}", String::from_utf8_lossy(&read_back.stderr));
    assert!(std::fs::read(&back).unwrap() == pattern, "bytes read over TLS differ from those written");
    // A plain client is refused (NBD_REP_ERR_TLS_REQD to its options).
    let plain = timed("nbdinfo", &["--size", &plain_uri]);
    assert!(!plain.status.success(), "a plain client was served although TLS is required");
    let message = String::from_utf8_lossy(&plain.stderr);
    assert!(message.contains("TLS") || message.contains("tls"), "unexpected refusal: {message}");
    drop(server);

    // Client certificates: one signed by the CA is served, none is refused.
    let ca = dir.join("ca-cert.pem");
    let server = start_server(&cluster, &dir, &["--tls-required", "--tls-ca", ca.to_str().unwrap()]);
    let with_certificate = format!("nbds://{}/test?tls-certificates={certificates}", server.address);
    let served = timed("nbdinfo", &["--size", &with_certificate]);
    assert!(
        served.status.success(),
        "client certificate refused: {}",
        String::from_utf8_lossy(&served.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&served.stdout).trim(), "4194304");
    let only_ca = dir.join("only-ca");
    std::fs::create_dir_all(&only_ca).unwrap();
    std::fs::copy(&ca, only_ca.join("ca-cert.pem")).unwrap();
    let without = format!("nbds://{}/test?tls-certificates={}", server.address, only_ca.display());
    let refused = timed("nbdinfo", &["--size", &without]);
    assert!(!refused.status.success(), "a client without a certificate was served");
    drop(server);

    // --tls-ca alone asks for client certificates, so TLS is required: a plain client, which
    // has none, is refused too (before, it was served in the clear).
    let server = start_server(&cluster, &dir, &["--tls-ca", ca.to_str().unwrap()]);
    let plain = timed("nbdinfo", &["--size", &format!("nbd://{}/test", server.address)]);
    assert!(!plain.status.success(), "a plain client was served although --tls-ca asks for certificates");
    drop(server);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A memcache text client over TLS (Python's `ssl`, checking the server's certificate against
/// the CA), run against `address`: a 300 KiB value set and read back byte for byte (its reply
/// is many TLS records, some written when the socket has room again), 200 pipelined sets
/// answered in order, and `stats settings` saying `ssl_enabled yes`. With `client` (a
/// certificate and key), it presents that certificate. Prints `ok`, or fails.
const TLS_MEMCACHE_CLIENT: &str = r#"
import socket, ssl, sys
host, port = sys.argv[1].rsplit(":", 1)
context = ssl.create_default_context(cafile=sys.argv[2])
if len(sys.argv) > 3:
    context.load_cert_chain(sys.argv[3], sys.argv[4])
conn = context.wrap_socket(socket.create_connection((host, int(port)), timeout=20), server_hostname="localhost")
def call(data, end):
    conn.sendall(data)
    got = b""
    while not got.endswith(end):
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise SystemExit("closed after %r" % got[-200:])
        got += chunk
    return got
value = bytes(range(256)) * 1200
assert call(b"set big 5 0 %d\r\n" % len(value) + value + b"\r\n", b"\r\n") == b"STORED\r\n"
assert call(b"get big\r\n", b"END\r\n") == b"VALUE big 5 %d\r\n" % len(value) + value + b"\r\nEND\r\n"
sets = b"".join(b"set k%d 0 0 %d\r\n%d\r\n" % (i, len(b"%d" % i), i) for i in range(200))
assert call(sets, b"STORED\r\n" * 200) == b"STORED\r\n" * 200
keys = b" ".join(b"k%d" % i for i in range(200))
reply = call(b"get " + keys + b"\r\n", b"END\r\n")
assert reply == b"".join(b"VALUE k%d 0 %d\r\n%d\r\n" % (i, len(b"%d" % i), i) for i in range(200)) + b"END\r\n"
assert b"STAT ssl_enabled yes\r\n" in call(b"stats settings\r\n", b"END\r\n")
print("ok")
"#;

fn tls_memcache_client(address: &str, ca: &Path, client: Option<(&Path, &Path)>) -> Output {
    let mut command = Command::new("timeout");
    command.args(["60", "python3", "-c", TLS_MEMCACHE_CLIENT, address]).arg(ca);
    if let Some((certificate, key)) = client {
        command.arg(certificate).arg(key);
    }
    command.output().expect("python3 runs")
}

/// `remem kv --enable-ssl` (memcached's -Z): a TLS client is served (large values, pipelining,
/// a multi-get); a plain client gets no memcache answer; with `--ssl-ca-cert` a client without
/// a certificate signed by it is refused and one with it served (with reply writers, `-t 2`,
/// beside the loop); bad certificate files fail
/// the start with the flag named.
#[test]
fn kv_with_enable_ssl_serves_tls_clients_and_refuses_plain_and_unsigned_ones() {
    let dir = std::env::temp_dir().join(format!("remem-kv-certificates-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    make_certificates(&dir);
    let (certificate, key, ca) =
        (dir.join("server-cert.pem"), dir.join("server-key.pem"), dir.join("ca-cert.pem"));
    let path = |path: &Path| path.display().to_string();
    let tls = ["--enable-ssl".to_owned(), "--ssl-chain-cert".to_owned(), path(&certificate)];
    let tls = [&tls[..], &["--ssl-key".to_owned(), path(&key)]].concat();
    let tls_args: Vec<&str> = tls.iter().map(String::as_str).collect();

    let target = crate::kv_support::Target::remem_kv("tls", "rep2", "16MiB", &tls_args);
    let address = target.server.address.to_string();
    let served = tls_memcache_client(&address, &ca, None);
    let stdout = String::from_utf8_lossy(&served.stdout);
    assert!(stdout.trim() == "ok", "{stdout}{}", String::from_utf8_lossy(&served.stderr));
    // A plain client: the server waits for a TLS handshake, never answers memcache.
    let mut plain = std::net::TcpStream::connect(&address).expect("connects");
    plain.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    std::io::Write::write_all(&mut plain, b"version\r\n").unwrap();
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut plain, &mut answer);
    assert!(!answer.starts_with(b"VERSION"), "a plain client was answered: {answer:?}");
    drop(target);

    let ca_path = path(&ca);
    // With reply writers too (`-t 2`): TLS connections are written by the loop's thread.
    let ca_args = [&tls_args[..], &["--ssl-ca-cert", &ca_path, "-t", "2"]].concat();
    let target = crate::kv_support::Target::remem_kv("tls-ca", "rep2", "16MiB", &ca_args);
    let address = target.server.address.to_string();
    let refused = tls_memcache_client(&address, &ca, None);
    assert!(!refused.status.success(), "a client without a certificate was served");
    let client = (dir.join("client/client-cert.pem"), dir.join("client/client-key.pem"));
    let served = tls_memcache_client(&address, &ca, Some((&client.0, &client.1)));
    let stdout = String::from_utf8_lossy(&served.stdout);
    assert!(stdout.trim() == "ok", "{stdout}{}", String::from_utf8_lossy(&served.stderr));
    drop(target);

    // A key that is not a key: refused at the start, naming the flag.
    let output = Command::new(binary())
        .args(["kv", "--enable-ssl", "--ssl-chain-cert", &path(&certificate), "--ssl-key", &path(&ca)])
        .output()
        .expect("remem kv runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("--enable-ssl"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
