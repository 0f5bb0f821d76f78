//! GitSource credentials end to end: a real `berth serve` polls a private repository served by
//! `git http-backend` over HTTPS on 127.0.0.1, behind Basic auth, with the credentials set by
//! `berth gitsource secret set` and named by `spec.secretRef`. No external network.
//!
//! The server snapshots every process's command line and environment while git talks to it,
//! so the test sees whether the password was anywhere `ps` (or `/proc`) could show it.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::daemon::{Daemon, TcpClient};
use crate::support::git;
use serde_json::{Value, json};

const API: &str = "/apis/berth.dev/v1alpha1";
const DEADLINE: Duration = Duration::from_secs(90);

/// `git http-backend` as CGI behind HTTPS and Basic auth. The expected `user:password` is read
/// from a file (never argv); each authorised request first records every process's cmdline and
/// environ into `snapshots`, then answers.
const SERVER: &str = r#"
import base64, http.server, os, ssl, subprocess, sys
cert, key, root, creds_file, snapshots = sys.argv[1:6]
with open(creds_file, "rb") as f:
    expected = "Basic " + base64.b64encode(f.read()).decode()

def snapshot():
    seen = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for name in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    seen.append(pid.encode() + b" " + name.encode() + b": " + f.read().replace(b"\0", b" "))
            except OSError:
                pass
    with open(snapshots, "ab") as f:
        f.write(b"\n".join(seen) + b"\n----\n")

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.cgi()

    def do_POST(self):
        self.cgi()

    def cgi(self):
        if self.headers.get("Authorization") != expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="fleet"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        snapshot()
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        env = dict(os.environ, GIT_PROJECT_ROOT=root, GIT_HTTP_EXPORT_ALL="1",
                   PATH_INFO=path, QUERY_STRING=query, REQUEST_METHOD=self.command,
                   CONTENT_TYPE=self.headers.get("Content-Type", ""),
                   CONTENT_LENGTH=str(len(body)), REMOTE_USER="fleet", REMOTE_ADDR="127.0.0.1",
                   HTTP_CONTENT_ENCODING=self.headers.get("Content-Encoding", ""),
                   GIT_PROTOCOL=self.headers.get("Git-Protocol", ""))
        out = subprocess.run(["git", "http-backend"], input=body, env=env,
                             capture_output=True).stdout
        sep = b"\r\n\r\n" if b"\r\n\r\n" in out else b"\n\n"
        head, _, payload = out.partition(sep)
        status, headers = 200, []
        for line in head.decode().splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

/// The private repository and the HTTPS server in front of it, killed on drop.
struct PrivateRepo {
    dir: tempfile::TempDir,
    server: Child,
    port: u16,
}

impl PrivateRepo {
    fn start(user: &str, password: &str) -> PrivateRepo {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let status = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args([
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ])
            .arg("-keyout")
            .arg(d.join("key.pem"))
            .arg("-out")
            .arg(d.join("cert.pem"))
            .stderr(Stdio::null())
            .status()
            .expect("run openssl");
        assert!(status.success(), "openssl req failed");

        let bare = d.join("root/fleet.git");
        let work = d.join("work");
        std::fs::create_dir_all(&bare).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        git(
            &bare,
            &["init", "--quiet", "--bare", "--initial-branch=main"],
        );
        git(&work, &["init", "--quiet", "--initial-branch=main"]);
        std::fs::write(
            work.join("profile.yaml"),
            "apiVersion: berth.dev/v1alpha1\nkind: AgentProfile\nmetadata:\n  name: private-profile\n\
             spec:\n  home: /home/agent\n  install:\n    check: \"true\"\n  runner:\n    command: [agent]\n",
        )
        .unwrap();
        std::fs::write(
            work.join("project.yaml"),
            "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: private-app\n  annotations:\n    \
             berth.dev/reconcile: paused\nspec:\n  state: Stopped\n",
        )
        .unwrap();
        git(&work, &["add", "."]);
        git(
            &work,
            &[
                "-c",
                "user.name=Fleet",
                "-c",
                "user.email=f@example.invalid",
                "commit",
                "--quiet",
                "-m",
                "one",
            ],
        );
        git(&work, &["push", "--quiet", bare.to_str().unwrap(), "main"]);

        std::fs::write(d.join("creds"), format!("{user}:{password}")).unwrap();
        std::fs::write(d.join("server.py"), SERVER).unwrap();
        let mut server = Command::new("python3")
            .arg(d.join("server.py"))
            .arg(d.join("cert.pem"))
            .arg(d.join("key.pem"))
            .arg(d.join("root"))
            .arg(d.join("creds"))
            .arg(d.join("snapshots"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn python3");
        let mut line = String::new();
        BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("the server's port");
        let port = line.trim().parse().expect("a port number");
        PrivateRepo { dir, server, port }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}/fleet.git", self.port)
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    fn snapshots(&self) -> Vec<u8> {
        std::fs::read(self.dir.path().join("snapshots")).unwrap_or_default()
    }
}

impl Drop for PrivateRepo {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

fn ready(source: &Value) -> Option<&Value> {
    source["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
}

/// Waits for the GitSource's Ready condition to be `status` with a message containing `text`.
fn wait_ready(daemon: &Daemon, status: &str, text: &str) -> Value {
    let client = daemon.client();
    daemon.eventually(DEADLINE, &format!("Ready={status} saying {text:?}"), || {
        let source = client.get(&format!("{API}/gitsources/fleet")).json();
        let ready = ready(&source)?;
        (ready["status"] == status && ready["message"].as_str()?.contains(text)).then_some(source)
    })
}

#[test]
fn a_private_repository_syncs_through_secret_ref_and_its_password_shows_nowhere() {
    let password = format!(
        "pw-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let wrong = format!("{password}-wrong");
    let repo = PrivateRepo::start("fleet-bot", &password);
    let ca = repo.ca();
    let daemon = Daemon::running()
        .args(&["--listen", "127.0.0.1:0"])
        .env("GIT_SSL_CAINFO", ca.to_str().unwrap())
        .start();
    let client = daemon.client();

    // A token in the URL is refused, and the refusal does not repeat it.
    let leaky = repo
        .url()
        .replace("https://", &format!("https://fleet-bot:{password}@"));
    let reply = client.post_json(
        &format!("{API}/gitsources"),
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "GitSource",
                "metadata": {"name": "leaky"}, "spec": {"url": leaky}}),
    );
    assert_eq!(reply.status, 422, "{}", reply.text());
    assert!(reply.text().contains("spec.secretRef"), "{}", reply.text());
    assert!(!reply.text().contains(&password), "{}", reply.text());

    let reply = client.post_json(
        &format!("{API}/gitsources"),
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "GitSource",
                "metadata": {"name": "fleet"},
                "spec": {"url": repo.url(), "secretRef": "fleet", "interval": "1h"}}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    wait_ready(&daemon, "False", "holds no password or token");

    // A wrong password: a clear Ready=False, the password nowhere.
    daemon
        .berth_with_stdin(
            &["gitsource", "secret", "set", "fleet", "username"],
            Some("fleet-bot\n"),
        )
        .ok();
    daemon
        .berth_with_stdin(
            &["gitsource", "secret", "set", "fleet", "password"],
            Some(&format!("{wrong}\n")),
        )
        .ok();
    let failed = wait_ready(&daemon, "False", "Authentication failed");
    assert_eq!(ready(&failed).unwrap()["reason"], "FetchFailed");

    daemon
        .berth_with_stdin(
            &["gitsource", "secret", "set", "fleet", "password"],
            Some(&format!("{password}\n")),
        )
        .ok();
    let synced = wait_ready(&daemon, "True", "applied revision");
    assert!(
        synced["status"]["lastAppliedRevision"].is_string(),
        "{synced}"
    );
    let profile = client.get(&format!("{API}/agentprofiles/private-profile"));
    assert_eq!(profile.status, 200, "{}", profile.text());

    let listing = daemon
        .berth(&["gitsource", "secret", "list", "fleet"])
        .ok()
        .stdout;
    assert!(
        listing.contains("password") && listing.contains("username"),
        "{listing}"
    );

    // A member of the project the GitSource manages sees it; another user does not know it
    // exists, and neither may touch its credentials.
    let alice = daemon.add_user("alice", false);
    let bob = daemon.add_user("bob", false);
    let reply = client.request(
        "PUT",
        &format!("{API}/projects/private-app/members/alice"),
        None,
        &[],
    );
    assert!(reply.status < 300, "{}", reply.text());
    let tcp = TcpClient::new(&daemon.tcp_addr(), None, None);
    let (alice, bob) = (tcp.with_token(Some(&alice)), tcp.with_token(Some(&bob)));
    let names = |client: &TcpClient| -> Vec<String> {
        let list = client.get(&format!("{API}/gitsources")).json();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&alice), ["fleet"]);
    assert!(names(&bob).is_empty());
    assert_eq!(alice.get(&format!("{API}/gitsources/fleet")).status, 200);
    for path in ["", "/events", "/status"] {
        let reply = bob.get(&format!("{API}/gitsources/fleet{path}"));
        assert_eq!(reply.status, 404, "{path}: {}", reply.text());
    }
    for client in [&alice, &bob] {
        let reply = client.get(&format!("{API}/gitsources/fleet/secrets"));
        assert_eq!(reply.status, 403, "{}", reply.text());
    }
    // Values are never read back, not even by an admin.
    let reply = client.get(&format!("{API}/gitsources/fleet/secrets/password"));
    assert_eq!(reply.status, 405, "{}", reply.text());
    let unknown = daemon.berth_with_stdin(
        &["gitsource", "secret", "set", "fleet", "PASSWORD"],
        Some("x"),
    );
    assert!(!unknown.success(), "an unknown key was taken: {unknown:?}");

    // Neither password is in anything berth shows or logs.
    let shown = [
        client.get(&format!("{API}/gitsources/fleet")).text(),
        client.get(&format!("{API}/gitsources")).text(),
        client.get(&format!("{API}/gitsources/fleet/events")).text(),
        client.get(&format!("{API}/events")).text(),
        {
            let run = daemon.berth(&["describe", "gitsource", "fleet"]);
            format!("{}{}", run.stdout, run.stderr)
        },
        daemon.log_text(),
    ];
    for text in &shown {
        assert!(
            !text.contains(&password) && !text.contains(&wrong),
            "{text}"
        );
    }
    crate::support::daemon::assert_nowhere_under(&daemon.data_dir, password.as_bytes());

    // While git talked to the server, no process showed the password in its argv or
    // environment, and git was one of the processes looked at.
    let snapshots = repo.snapshots();
    assert!(
        !snapshots.is_empty(),
        "the server recorded no authorised request"
    );
    let text = String::from_utf8_lossy(&snapshots);
    assert!(
        text.contains("remote-https"),
        "no git process was seen:\n{text}"
    );
    assert!(!text.contains(&password), "the password was visible to ps");

    // The credentials go with their GitSource.
    let reply = client.delete(&format!("{API}/gitsources/fleet"));
    assert!(reply.status < 300, "{}", reply.text());
    daemon.eventually(DEADLINE, "the GitSource to go", || {
        (client.get(&format!("{API}/gitsources/fleet")).status == 404).then_some(())
    });
    let reply = client.post_json(
        &format!("{API}/gitsources"),
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "GitSource",
                "metadata": {"name": "fleet"},
                "spec": {"url": repo.url(), "secretRef": "fleet", "interval": "1h"}}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let listing = daemon
        .berth(&["gitsource", "secret", "list", "fleet"])
        .ok()
        .stdout;
    assert!(!listing.contains("password"), "{listing}");
}
