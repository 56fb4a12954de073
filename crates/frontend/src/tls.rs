//! TLS server settings from PEM files, on rustls, for the front ends that serve TLS (`remem
//! nbd`'s `NBD_OPT_STARTTLS`, `remem kv`'s `--enable-ssl`).
//!
//! The server presents a certificate chain and key read from PEM files; with a client CA, it
//! also asks every client for a certificate and accepts only those that CA signed (mutual
//! TLS). TLS 1.2 and 1.3, rustls's safe defaults, ring as the crypto provider. TLS-PSK is not
//! offered: rustls does not implement it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("reading {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path} holds no certificate")]
    NoCertificate { path: PathBuf },
    #[error("client CA {path}: {message}")]
    ClientCa { path: PathBuf, message: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let read_error = |error: rustls::pki_types::pem::Error| TlsSetupError::Read {
        path: path.to_owned(),
        message: error.to_string(),
    };
    let certificates: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(read_error)?
        .collect::<Result<_, _>>()
        .map_err(read_error)?;
    if certificates.is_empty() {
        return Err(TlsSetupError::NoCertificate { path: path.to_owned() });
    }
    Ok(certificates)
}

/// Builds the server's TLS configuration: `certificate` (PEM, the server's chain, leaf first),
/// `key` (PEM, PKCS#8, PKCS#1 or SEC1), and, if given, `client_ca` (PEM): then every client must
/// present a certificate it signed.
///
/// Errors: a file that cannot be read or holds no certificate or key, a key that does not
/// match, a CA rustls cannot use.
pub fn server_config(
    certificate: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsSetupError> {
    let chain = certificates(certificate)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|error| TlsSetupError::Read { path: key.to_owned(), message: error.to_string() })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let ca_error = |message: String| TlsSetupError::ClientCa { path: path.to_owned(), message };
            let mut roots = rustls::RootCertStore::empty();
            for certificate in certificates(path)? {
                roots.add(certificate).map_err(|error| ca_error(error.to_string()))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|error| ca_error(error.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    Ok(Arc::new(builder.with_single_cert(chain, key)?))
}
