//! The TCP listener over HTTPS: a certificate and key from `listen.tls`, tokens still required,
//! clients that do not trust the certificate refused.

use crate::support::cli::{client, output};
use crate::support::daemon::{Daemon, TcpClient};

const P: &str = "/apis/berth.dev/v1alpha1";

#[test]
fn https_serves_with_the_configured_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = support_tls::self_signed(dir.path());
    let config = dir.path().join("berth.yaml");
    std::fs::write(
        &config,
        format!(
            "listen:\n  http: 127.0.0.1:0\n  tls: {{cert: {}, key: {}}}\n",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let daemon = Daemon::start_with(&["--config", config.to_str().unwrap()]);
    let addr = daemon.tcp_addr();
    let ca_pem = std::fs::read(&ca).unwrap();
    let token = daemon.add_user("tls-admin", true);

    let https = TcpClient::new(&addr, Some(&token), Some(&ca_pem));
    assert_eq!(https.get("/healthz").status, 200);
    let projects = https.get(&format!("{P}/projects"));
    assert_eq!(projects.status, 200, "{}", projects.text());
    assert_eq!(
        https.with_token(None).get(&format!("{P}/projects")).status,
        401
    );
    // The command line trusts the daemon through --certificate-authority (or BERTH_CA_CERT).
    let reply = https.json(
        "POST",
        &format!("{P}/projects"),
        &serde_json::json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                            "metadata": {"name": "over-https"}, "spec": {}}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let out = output(
        client(&["get", "projects", "-o", "name"])
            .env("BERTH_SERVER", format!("https://{addr}"))
            .env("BERTH_TOKEN", &token)
            .env("BERTH_CA_CERT", &ca),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "project/over-https\n");
    let untrusted = output(
        client(&["get", "projects", "--server", &format!("https://{addr}")])
            .args(["--token", &token]),
    );
    assert!(!untrusted.status.success());
    let stderr = String::from_utf8_lossy(&untrusted.stderr);
    assert!(stderr.contains("--certificate-authority"), "{stderr}");
    // Plain HTTP to the TLS port: the command line says to use https.
    let plain = output(
        client(&["get", "projects", "--server", &format!("http://{addr}")])
            .args(["--token", &token]),
    );
    assert!(!plain.status.success());
    let stderr = String::from_utf8_lossy(&plain.stderr);
    assert!(
        stderr.contains(&format!("use --server https://{addr}")),
        "{stderr}"
    );

    // An interactive session upgrades over TLS too: with the CA it reaches the daemon's exec
    // handler (a paused daemon has no LXD to run it through); without it, TLS refuses.
    let session = |ca: Option<&std::path::Path>| {
        let mut command = client(&["exec", "over-https", "-i", "--", "true"]);
        command
            .env("BERTH_SERVER", format!("https://{addr}"))
            .env("BERTH_TOKEN", &token);
        if let Some(ca) = ca {
            command.env("BERTH_CA_CERT", ca);
        }
        output(&mut command)
    };
    let out = session(Some(&ca));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr.contains("not connected to LXD"), "{stderr}");
    let out = session(None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(!stderr.contains("not connected to LXD"), "{stderr}");

    // TLS 1.2 and 1.3 are spoken; 1.1 is refused even to a client willing to use it.
    let handshake = |args: &[&str]| {
        let mut child = std::process::Command::new("openssl")
            .args([
                "s_client",
                "-connect",
                &addr,
                "-CAfile",
                ca.to_str().unwrap(),
            ])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run openssl s_client");
        // Closing stdin ends the session once the handshake is done.
        drop(child.stdin.take());
        let out = child.wait_with_output().expect("openssl s_client ends");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, out) = handshake(&["-tls1_2"]);
    assert!(ok && out.contains("TLSv1.2"), "{out}");
    let (ok, out) = handshake(&["-tls1_3"]);
    assert!(ok && out.contains("TLSv1.3"), "{out}");
    let (ok, out) = handshake(&["-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"]);
    assert!(!ok || !out.contains("TLSv1.1"), "{out}");

    // Plain HTTP to the TLS port gets no API answer.
    let plain = TcpClient::new(&addr, Some(&token), None);
    assert!(
        plain
            .try_request("GET", "/healthz", None, b"")
            .map(|r| r.status != 200)
            .unwrap_or(true)
    );
    // A client that does not trust this CA refuses the server.
    let other_dir = tempfile::tempdir().unwrap();
    let (other_ca, _, _) = support_tls::self_signed(other_dir.path());
    let untrusting = TcpClient::new(&addr, None, Some(&std::fs::read(other_ca).unwrap()));
    assert!(
        untrusting
            .try_request("GET", "/healthz", None, b"")
            .is_err()
    );
}

#[test]
fn an_unreadable_certificate_or_a_mismatched_key_stops_the_daemon_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let (_, cert, key) = support_tls::self_signed(dir.path());
    let other = tempfile::tempdir().unwrap();
    let (_, _, other_key) = support_tls::self_signed(other.path());
    let missing = dir.path().join("missing.pem");
    let table = [
        (missing.as_path(), key.as_path(), "listen.tls.cert"),
        (cert.as_path(), missing.as_path(), "listen.tls.key"),
        (cert.as_path(), other_key.as_path(), "listen.tls.key"),
    ];
    for (index, (cert, key, field)) in table.into_iter().enumerate() {
        let config = dir.path().join(format!("berth-{index}.yaml"));
        std::fs::write(
            &config,
            format!(
                "listen:\n  http: 127.0.0.1:0\n  tls: {{cert: {}, key: {}}}\n",
                cert.display(),
                key.display()
            ),
        )
        .unwrap();
        let log = dir.path().join(format!("daemon-{index}.log"));
        let mut child = crate::support::daemon::spawn_serve(
            &dir.path().join(format!("data-{index}")),
            &dir.path().join(format!("berth-{index}.sock")),
            &log,
            &["--config", config.to_str().unwrap()],
        );
        let status = crate::support::daemon::wait_with_deadline(
            &mut child,
            std::time::Duration::from_secs(30),
        )
        .expect("the daemon exits");
        assert!(!status.success());
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains(field), "{field}: {text}");
    }
}

/// A CA and a server certificate for localhost and 127.0.0.1, made with the openssl CLI.
mod support_tls {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Returns (CA certificate, server certificate, server key) paths.
    pub fn self_signed(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509", "-days", "2", "-subj", "/CN=berth test CA"];
        ca.extend_from_slice(&ec);
        ca.extend_from_slice(&["-keyout", "ca.key", "-out", "ca.pem"]);
        openssl(dir, &ca);
        let mut csr = vec!["req", "-subj", "/CN=localhost"];
        csr.extend_from_slice(&ec);
        csr.extend_from_slice(&["-keyout", "server.key", "-out", "server.csr"]);
        openssl(dir, &csr);
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "server.pem",
            ],
        );
        (
            dir.join("ca.pem"),
            dir.join("server.pem"),
            dir.join("server.key"),
        )
    }
}
