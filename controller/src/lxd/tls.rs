//! TLS to a remote LXD: our client certificate, and the server's certificate pinned by its
//! SHA-256 fingerprint. LXD servers use self-signed certificates whose names rarely match the
//! address dialled, so the pin replaces CA and name checks entirely.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

use crate::runtime::RuntimeError;

use super::endpoint::HttpsEndpoint;

/// Lowercase hex SHA-256 of a DER certificate, as LXD prints fingerprints.
pub fn certificate_fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// The fingerprint of the first certificate in a PEM file (for pinning `cluster.crt` or
/// `server.crt`).
pub fn pem_file_fingerprint(path: &std::path::Path) -> Result<String, RuntimeError> {
    let cert = CertificateDer::from_pem_file(path)
        .map_err(|e| RuntimeError::Config(format!("certificate {}: {e}", path.display())))?;
    Ok(certificate_fingerprint(&cert))
}

/// A rustls client configuration for `endpoint`, offering only http/1.1 (the events websocket
/// needs it, and LXD's API needs nothing newer).
pub fn client_config(endpoint: &HttpsEndpoint) -> Result<ClientConfig, RuntimeError> {
    let certs = CertificateDer::pem_file_iter(&endpoint.client_cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            RuntimeError::Config(format!(
                "lxd.clientCert {}: {e}",
                endpoint.client_cert.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(RuntimeError::Config(format!(
            "lxd.clientCert {}: no certificate in the file",
            endpoint.client_cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(&endpoint.client_key).map_err(|e| {
        RuntimeError::Config(format!(
            "lxd.clientKey {}: {e}",
            endpoint.client_key.display()
        ))
    })?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = PinnedServer {
        fingerprint: endpoint.server_fingerprint.clone(),
        algorithms: provider.signature_verification_algorithms,
    };
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| RuntimeError::Config(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_auth_cert(certs, key)
        .map_err(|e| {
            RuntimeError::Config(format!("lxd.clientKey does not fit lxd.clientCert: {e}"))
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Accepts exactly the server certificate whose SHA-256 matches the pin; signatures are still
/// verified so the server must hold the certificate's key.
#[derive(Debug)]
struct PinnedServer {
    fingerprint: String,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedServer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = certificate_fingerprint(end_entity);
        if got == self.fingerprint {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "server certificate fingerprint {got} does not match the pinned {}",
                self.fingerprint
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
