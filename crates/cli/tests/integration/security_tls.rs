//! NBD over TLS (NBD_OPT_STARTTLS, x509): libnbd's nbdcopy and nbdinfo against `remem nbd`
//! with a throwaway CA and certificates made here with `openssl`. A TLS client reads and writes
//! the export; with `--tls-required` a plain client is refused; with `--tls-ca` a client
//! without a certificate is refused.

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
