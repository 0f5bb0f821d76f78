//! Where the LXD daemon is and how to reach it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::runtime::RuntimeError;

use super::RequestObserver;

/// The socket path used when neither the configuration nor `BERTH_LXD_SOCKET` names one.
pub const DEFAULT_SOCKET: &str = "/var/lib/lxd/unix.socket";

/// How to reach LXD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// The local daemon's unix socket (trusted by file permissions).
    Unix(PathBuf),
    /// A remote daemon or cluster member over HTTPS with a client certificate, the server's
    /// certificate pinned by its SHA-256 fingerprint.
    Https(HttpsEndpoint),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpsEndpoint {
    /// e.g. `https://127.0.0.2:8443`
    pub url: String,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// Lowercase hex SHA-256 of the server certificate's DER (colons and case are ignored on input).
    pub server_fingerprint: String,
}

impl Endpoint {
    /// The local socket: `BERTH_LXD_SOCKET` when set, else [`DEFAULT_SOCKET`].
    pub fn local() -> Endpoint {
        match std::env::var_os("BERTH_LXD_SOCKET") {
            Some(path) if !path.is_empty() => Endpoint::Unix(PathBuf::from(path)),
            _ => Endpoint::Unix(PathBuf::from(DEFAULT_SOCKET)),
        }
    }

    /// Parses the configuration's `lxd.endpoint` (`unix:///path`, a bare absolute path, or
    /// `https://host:port`) with the certificate settings an https endpoint needs. An empty
    /// endpoint means [`Endpoint::local`].
    pub fn parse(
        endpoint: &str,
        client_cert: Option<PathBuf>,
        client_key: Option<PathBuf>,
        server_fingerprint: Option<&str>,
    ) -> Result<Endpoint, RuntimeError> {
        let endpoint = endpoint.trim();
        if endpoint.is_empty() {
            return Ok(Endpoint::local());
        }
        if let Some(path) = endpoint.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(RuntimeError::Config(format!(
                    "lxd.endpoint: unix socket path must be absolute, got {endpoint:?}"
                )));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        if endpoint.starts_with('/') {
            return Ok(Endpoint::Unix(PathBuf::from(endpoint)));
        }
        if endpoint.starts_with("https://") {
            url::Url::parse(endpoint).map_err(|e| {
                RuntimeError::Config(format!("lxd.endpoint: {endpoint:?} is not a URL: {e}"))
            })?;
            let client_cert = client_cert
                .filter(|p| !p.as_os_str().is_empty())
                .ok_or_else(|| {
                    RuntimeError::Config("lxd.clientCert is required for an https endpoint".into())
                })?;
            let client_key = client_key
                .filter(|p| !p.as_os_str().is_empty())
                .ok_or_else(|| {
                    RuntimeError::Config("lxd.clientKey is required for an https endpoint".into())
                })?;
            let server_fingerprint = normalize_fingerprint(server_fingerprint.unwrap_or(""))?;
            return Ok(Endpoint::Https(HttpsEndpoint {
                url: endpoint.trim_end_matches('/').to_string(),
                client_cert,
                client_key,
                server_fingerprint,
            }));
        }
        Err(RuntimeError::Config(format!(
            "lxd.endpoint: expected unix:///PATH or https://HOST:PORT, got {endpoint:?}"
        )))
    }

    pub fn describe(&self) -> String {
        match self {
            Endpoint::Unix(path) => format!("unix://{}", path.display()),
            Endpoint::Https(h) => h.url.clone(),
        }
    }
}

/// Lowercase hex without separators; refuses anything that is not 32 bytes of hex, so an https
/// client can never be built without a pin.
pub fn normalize_fingerprint(fingerprint: &str) -> Result<String, RuntimeError> {
    let hex: String = fingerprint
        .chars()
        .filter(|c| *c != ':' && !c.is_whitespace())
        .collect::<String>()
        .to_ascii_lowercase();
    if hex.is_empty() {
        return Err(RuntimeError::Config(
            "lxd.serverFingerprint is required for an https endpoint (sha256 of the server certificate)"
                .into(),
        ));
    }
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(RuntimeError::Config(format!(
            "lxd.serverFingerprint: expected 64 hex digits (sha256), got {fingerprint:?}"
        )));
    }
    Ok(hex)
}

/// Everything an [`super::LxdClient`] needs.
#[derive(Clone)]
pub struct LxdConfig {
    pub endpoint: Endpoint,
    /// LXD project every call is made in.
    pub project: String,
    /// Default cluster member (or `@group`) for creating instances and volumes.
    pub target: Option<String>,
    /// Deadline of one HTTP request that is not an operation wait.
    pub request_timeout: Duration,
    /// Told about every request (method, HTTP status, seconds), for metrics.
    pub observer: Option<Arc<dyn RequestObserver>>,
}

impl LxdConfig {
    pub fn new(endpoint: Endpoint) -> LxdConfig {
        LxdConfig {
            endpoint,
            project: "default".to_string(),
            target: None,
            request_timeout: Duration::from_secs(30),
            observer: None,
        }
    }
}

impl std::fmt::Debug for LxdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LxdConfig")
            .field("endpoint", &self.endpoint)
            .field("project", &self.project)
            .field("target", &self.target)
            .field("request_timeout", &self.request_timeout)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_or_name_the_bad_field() {
        let fp = "AB:".repeat(31) + "AB";
        type Case<'a> = (
            &'a str,
            bool,
            bool,
            Option<&'a str>,
            Result<&'a str, &'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                "unix:///var/lib/lxd/unix.socket",
                false,
                false,
                None,
                Ok("unix:///var/lib/lxd/unix.socket"),
            ),
            ("/tmp/x.sock", false, false, None, Ok("unix:///tmp/x.sock")),
            (
                "unix://relative",
                false,
                false,
                None,
                Err("must be absolute"),
            ),
            (
                "https://127.0.0.1:8443/",
                true,
                true,
                Some(&fp),
                Ok("https://127.0.0.1:8443"),
            ),
            (
                "https://127.0.0.1:8443",
                true,
                true,
                None,
                Err("lxd.serverFingerprint is required"),
            ),
            (
                "https://127.0.0.1:8443",
                true,
                true,
                Some("abcd"),
                Err("expected 64 hex digits"),
            ),
            (
                "https://127.0.0.1:8443",
                false,
                true,
                Some(&fp),
                Err("lxd.clientCert"),
            ),
            (
                "https://127.0.0.1:8443",
                true,
                false,
                Some(&fp),
                Err("lxd.clientKey"),
            ),
            (
                "http://127.0.0.1:8443",
                true,
                true,
                Some(&fp),
                Err("expected unix:///PATH"),
            ),
        ];
        for (input, cert, key, fingerprint, expected) in cases {
            let got = Endpoint::parse(
                input,
                cert.then(|| PathBuf::from("/c.pem")),
                key.then(|| PathBuf::from("/k.pem")),
                fingerprint,
            );
            match (got, expected) {
                (Ok(e), Ok(want)) => assert_eq!(e.describe(), want, "{input}"),
                (Err(e), Err(want)) => assert!(e.to_string().contains(want), "{input}: {e}"),
                (got, want) => panic!("{input}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn fingerprint_is_normalized() {
        let fp = "AB:".repeat(31) + "AB";
        assert_eq!(normalize_fingerprint(&fp).unwrap(), "ab".repeat(32));
    }
}
