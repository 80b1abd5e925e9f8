//! TLS for every port, with `rustls`: a certificate chain and key in PEM files, and optionally a
//! CA whose certificates clients must present (mutual TLS).
//!
//! Connections on every port are wrapped here, with ALPN for HTTP/2 and HTTP/1.1 (gRPC clients
//! ask for HTTP/2).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The TLS configuration of the HTTP, metrics and gRPC ports.
pub type HttpTls = Arc<rustls::ServerConfig>;

/// Where the PEM files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key of the leaf certificate.
    pub key: PathBuf,
    /// A CA bundle: when given, every client must present a certificate it signed.
    pub client_ca: Option<PathBuf>,
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
}

fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the {what} {} is not PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "the {what} {} holds no certificate",
            path.display()
        ));
    }
    Ok(certs)
}

impl TlsFiles {
    /// The `rustls` configuration of every port.
    pub fn server_config(&self) -> Result<HttpTls, String> {
        let chain = certificates(&self.cert, "TLS certificate")?;
        let key_pem = read(&self.key, "TLS key")?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| format!("the TLS key {} is not a PEM key: {e}", self.key.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certificates(ca, "client CA")? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("the client CA {}: {e}", ca.display()))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| format!("the client CA {}: {e}", ca.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            format!(
                "the TLS certificate {} and key {} do not make a pair: {e}",
                self.cert.display(),
                self.key.display()
            )
        })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_or_malformed_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
            client_ca: None,
        };
        let e = files.server_config().unwrap_err();
        assert!(
            e.contains("cannot read the TLS certificate") && e.contains("cert.pem"),
            "{e}"
        );
        std::fs::write(&files.cert, "not a certificate").unwrap();
        let e = files.server_config().unwrap_err();
        assert!(e.contains("holds no certificate"), "{e}");
    }
}
