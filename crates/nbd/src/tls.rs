//! TLS for NBD over TCP (`NBD_OPT_STARTTLS`) with x509 certificates, on rustls.
//!
//! The configuration (certificate chain, key, client CA for mutual TLS: who holds a certificate
//! it signed may use the export) is built by `remem_frontend::tls::server_config`, shared with
//! `remem kv`. TLS-PSK (qemu-nbd's `tls-creds-psk`) is not offered: rustls does not implement it.
//!
//! The handshake runs lazily, on the first read or write of the session after
//! `NBD_REP_ACK`, under the connection's handshake deadline like the rest of the haggling.

use std::sync::Arc;

pub use remem_frontend::tls::{server_config, TlsSetupError};

/// The TLS half of a server's settings.
#[derive(Clone, Debug)]
pub struct TlsSettings {
    pub config: Arc<rustls::ServerConfig>,
    /// Refuse everything but STARTTLS before TLS (`NBD_REP_ERR_TLS_REQD`).
    pub required: bool,
}
