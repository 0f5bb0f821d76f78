//! One admission for every writer, attacked through the real daemon: a user who is not an
//! admin, with a valid token over the TCP listener, tries what the API refuses through the
//! entry points that used to carry their own copies of the checks (a replace, a batch apply
//! into a GitSource's applyset, a GitSource's manifests, a GitSource's credentials).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::project;
use crate::support::daemon::{Daemon, TcpClient};
use crate::support::git;
use serde_json::{Value, json};

const P: &str = "/apis/berth.dev/v1alpha1";
const DEADLINE: Duration = Duration::from_secs(90);

/// A paused daemon with a TCP listener, a member `mia` of project `mine`, and her client.
fn daemon_with_member() -> (Daemon, TcpClient) {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let token = daemon.add_user("mia", false);
    let local = daemon.client();
    let reply = local.post_json(&format!("{P}/projects"), &project("mine", json!({})));
    assert_eq!(reply.status, 201, "{}", reply.text());
    let reply = local.request("PUT", &format!("{P}/projects/mine/members/mia"), None, b"");
    assert!(reply.status < 300, "{}", reply.text());
    let member = TcpClient::new(&daemon.tcp_addr(), None, None).with_token(Some(&token));
    (daemon, member)
}

/// Issue item: a member removed `berth.dev/teardown` from a held deletion with a PUT, and the
/// object went, its workspace left behind outside the trash; adding a foreign finalizer wedged
/// a deletion. Finalizers are the server's: a manifest may repeat them, never change them.
#[test]
fn a_member_cannot_remove_or_add_finalizers() {
    let (daemon, member) = daemon_with_member();
    let local = daemon.client();
    let path = format!("{P}/projects/mine");

    // The controller's finalizer, as the reconciler sets it, holds the deletion.
    let mut held = local.get(&path).json();
    held["metadata"]["finalizers"] = json!(["berth.dev/teardown"]);
    let reply = local.put_json(&path, &held);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(local.delete(&path).status, 202);

    // Removing it: refused, and the deletion is still held.
    let mut stripped = member.get(&path).json();
    assert!(stripped["metadata"]["deletionTimestamp"].is_string());
    stripped["metadata"]["finalizers"] = json!([]);
    let reply = member.json("PUT", &path, &stripped);
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(
        reply.text().contains("metadata.finalizers"),
        "{}",
        reply.text()
    );
    let still = local.get(&path);
    assert_eq!(still.status, 200, "the refused replace removed the object");
    assert_eq!(
        still.json()["metadata"]["finalizers"],
        json!(["berth.dev/teardown"])
    );

    // Repeating them as stored (get, edit, put back) is no change and passes.
    let mut same = member.get(&path).json();
    same["spec"]["brief"] = json!("edited while held");
    let reply = member.json("PUT", &path, &same);
    assert_eq!(reply.status, 200, "{}", reply.text());

    // Adding a foreign one to another project, or creating one with it: refused.
    let reply = local.post_json(&format!("{P}/projects"), &project("open", json!({})));
    assert_eq!(reply.status, 201, "{}", reply.text());
    let reply = local.request("PUT", &format!("{P}/projects/open/members/mia"), None, b"");
    assert!(reply.status < 300, "{}", reply.text());
    let open = format!("{P}/projects/open");
    let mut wedged = member.get(&open).json();
    wedged["metadata"]["finalizers"] = json!(["example.com/wedge"]);
    let reply = member.json("PUT", &open, &wedged);
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(!local.get(&open).text().contains("example.com/wedge"));
    let mut created = project("wedged", json!({}));
    created["metadata"]["finalizers"] = json!(["example.com/wedge"]);
    let reply = member.json("POST", &format!("{P}/projects"), &created);
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert_eq!(local.get(&format!("{P}/projects/wedged")).status, 404);
}

/// Finalizers are the server's for admins over the network too: an admin token cannot end a
/// held deletion by stripping `berth.dev/teardown` (that would leave the container and its
/// volumes outside the trash); only the local administrator on the unix socket holds that last
/// resort, as the controller does.
#[test]
fn an_admin_over_tcp_cannot_edit_finalizers_either() {
    let (daemon, _member) = daemon_with_member();
    let local = daemon.client();
    let admin_token = daemon.add_user("ada", true);
    let admin = TcpClient::new(&daemon.tcp_addr(), None, None).with_token(Some(&admin_token));
    let path = format!("{P}/projects/mine");
    let mut held = local.get(&path).json();
    held["metadata"]["finalizers"] = json!(["berth.dev/teardown"]);
    assert_eq!(local.put_json(&path, &held).status, 200);
    assert_eq!(local.delete(&path).status, 202);

    let mut stripped = admin.get(&path).json();
    stripped["metadata"]["finalizers"] = json!([]);
    let reply = admin.json("PUT", &path, &stripped);
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(
        reply.text().contains("metadata.finalizers"),
        "{}",
        reply.text()
    );
    let mut wedged = admin.get(&path).json();
    wedged["metadata"]["finalizers"] = json!(["berth.dev/teardown", "example.com/wedge"]);
    assert_eq!(admin.json("PUT", &path, &wedged).status, 400);
    assert_eq!(
        local.get(&path).json()["metadata"]["finalizers"],
        json!(["berth.dev/teardown"])
    );

    // The local administrator may: the object goes once nothing holds it.
    let mut released = local.get(&path).json();
    released["metadata"]["finalizers"] = json!([]);
    let reply = local.put_json(&path, &released);
    assert!(reply.status < 300, "{}", reply.text());
    assert_eq!(local.get(&path).status, 404);
}

/// Issue item: a member applied her project with `?applyset=gitsource-fleet` and could then
/// read the GitSource `fleet` (URL, inventory, events). A GitSource's applyset is its
/// controller's alone, for admins too.
#[test]
fn a_gitsource_applyset_is_joined_by_nobody_but_its_controller() {
    let (daemon, member) = daemon_with_member();
    let local = daemon.client();
    let admin_token = daemon.add_user("ada", true);
    let admin = TcpClient::new(&daemon.tcp_addr(), None, None).with_token(Some(&admin_token));
    let reply = local.post_json(
        &format!("{P}/gitsources"),
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "GitSource",
            "metadata": {"name": "fleet"},
            "spec": {"url": "https://git.example/fleet.git", "ref": "main", "suspend": true}}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    assert_eq!(member.get(&format!("{P}/gitsources/fleet")).status, 404);

    let mine = member.get(&format!("{P}/projects/mine")).json();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [mine]});
    for (who, client) in [("member", &member), ("admin", &admin)] {
        let reply = client.json(
            "POST",
            &format!("{P}/apply?applyset=gitsource-fleet"),
            &list,
        );
        assert_eq!(reply.status, 403, "{who}: {}", reply.text());
        assert!(reply.text().contains("gitsource-fleet"), "{}", reply.text());
    }
    let after = local.get(&format!("{P}/projects/mine")).json();
    assert!(
        after["metadata"]["annotations"]
            .get("berth.dev/applyset")
            .is_none(),
        "{after}"
    );
    assert_eq!(member.get(&format!("{P}/gitsources/fleet")).status, 404);
    let listed = member.get(&format!("{P}/gitsources")).json();
    assert_eq!(listed["items"], json!([]), "{listed}");
}

/// Issue item: a displayName conflict named the other user's project, also under
/// `dryRun=All`.
#[test]
fn a_display_name_conflict_names_no_project_the_caller_cannot_get() {
    let (daemon, member) = daemon_with_member();
    let local = daemon.client();
    let hidden = project("secret-plan-x7", json!({"displayName": "Shared Name"}));
    let reply = local.post_json(&format!("{P}/projects"), &hidden);
    assert_eq!(reply.status, 201, "{}", reply.text());
    let clash = project("clash", json!({"displayName": "shared name"}));
    for path in [format!("{P}/projects"), format!("{P}/projects?dryRun=All")] {
        let reply = member.json("POST", &path, &clash);
        assert_eq!(reply.status, 409, "{path}: {}", reply.text());
        assert!(
            reply.text().contains("spec.displayName"),
            "{}",
            reply.text()
        );
        assert!(
            !reply.text().contains("secret-plan-x7"),
            "{path}: {}",
            reply.text()
        );
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [clash]});
    let reply = member.json("POST", &format!("{P}/apply"), &list);
    assert_eq!(reply.status, 409, "{}", reply.text());
    assert!(!reply.text().contains("secret-plan-x7"), "{}", reply.text());
}

/// A bare repository holding `files` on `main`, as a `file://` URL.
fn repository(dir: &Path, files: &[(&str, &str)]) -> String {
    let bare = dir.join("fleet.git");
    let work = dir.join("work");
    std::fs::create_dir_all(&bare).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    git(
        &bare,
        &["init", "--quiet", "--bare", "--initial-branch=main"],
    );
    git(&work, &["init", "--quiet", "--initial-branch=main"]);
    for (file, text) in files {
        std::fs::write(work.join(file), text).unwrap();
    }
    git(&work, &["add", "--all"]);
    git(
        &work,
        &[
            "-c",
            "user.name=Fleet",
            "-c",
            "user.email=fleet@example.invalid",
            "commit",
            "--quiet",
            "-m",
            "one",
        ],
    );
    git(&work, &["push", "--quiet", bare.to_str().unwrap(), "main"]);
    format!("file://{}", bare.display())
}

fn ready(source: &Value) -> Option<&Value> {
    source["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
}

/// Issue item: the API refuses a forward to `192.0.2.10:80`, but the same manifest committed
/// to a GitSource became the project's forwards. Only admission is tested: the project is
/// paused and nothing connects anywhere.
#[test]
fn gitsource_manifests_meet_allowed_forward_targets() {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("fwd-{}", std::process::id());
    let manifest = format!(
        "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: {name}\n  annotations:\n    \
         berth.dev/reconcile: paused\nspec:\n  state: Stopped\n  forwards:\n  - port: 80\n    to: 192.0.2.10:80\n"
    );
    let url = repository(dir.path(), &[("project.yaml", &manifest)]);
    let daemon = Daemon::running().start();
    let local = daemon.client();

    // The API refuses it.
    let refused = local.post_json(
        &format!("{P}/projects"),
        &project(
            &name,
            json!({"state": "Stopped", "forwards": [{"port": 80, "to": "192.0.2.10:80"}]}),
        ),
    );
    assert_eq!(refused.status, 422, "{}", refused.text());

    let reply = local.post_json(
        &format!("{P}/gitsources"),
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "GitSource",
            "metadata": {"name": "fleet"},
            "spec": {"url": url, "ref": "main", "interval": "1h"}}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let source = daemon.eventually(DEADLINE, "the GitSource to try its revision", || {
        let source = local.get(&format!("{P}/gitsources/fleet")).json();
        source["status"]["lastAttemptedRevision"]
            .is_string()
            .then_some(())?;
        let ready = ready(&source)?;
        (ready["status"] != "Unknown").then_some(source)
    });
    let message = ready(&source).unwrap()["message"].as_str().unwrap_or("");
    assert_eq!(ready(&source).unwrap()["status"], "False", "{source}");
    assert!(message.contains("spec.forwards[0].to"), "{message}");
    assert_eq!(
        local.get(&format!("{P}/projects/{name}")).status,
        404,
        "the forward was admitted"
    );
}

/// An HTTPS server on `host` that answers every request 401 with a Basic challenge and records
/// each request's Authorization header (Basic decoded to `user:password`), one a line. No repository behind it: the test is about
/// where credentials go.
const RECORDER: &str = r#"
import base64, http.server, ssl, sys
cert, key, host, log = sys.argv[1:5]

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, "a") as f:
            sent = self.headers.get("Authorization") or "-"
            if sent.startswith("Basic "):
                sent = base64.b64decode(sent[6:]).decode(errors="replace")
            f.write(sent + "\n")
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="git"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer((host, 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

struct Recorder {
    server: Child,
    url: String,
    log: PathBuf,
}

impl Recorder {
    fn start(dir: &Path, host: &str) -> Recorder {
        let log = dir.join(format!("auth-{host}"));
        let mut server = Command::new("python3")
            .arg(dir.join("recorder.py"))
            .arg(dir.join("cert.pem"))
            .arg(dir.join("key.pem"))
            .arg(host)
            .arg(&log)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn python3");
        let mut line = String::new();
        BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("the server's port");
        let port: u16 = line.trim().parse().expect("a port number");
        Recorder {
            server,
            url: format!("https://{host}:{port}/fleet.git"),
            log,
        }
    }

    fn headers(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// Issue item: a second GitSource naming `secretRef: fleet` with a URL on another host was
/// sent fleet's token. A credential goes only to the host it was set for.
#[test]
fn a_gitsource_credential_goes_only_to_the_host_it_was_set_for() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let status = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,IP:127.0.0.2",
        ])
        .arg("-keyout")
        .arg(d.join("key.pem"))
        .arg("-out")
        .arg(d.join("cert.pem"))
        .stderr(Stdio::null())
        .status()
        .expect("run openssl");
    assert!(status.success(), "openssl req failed");
    std::fs::write(d.join("recorder.py"), RECORDER).unwrap();
    let home = Recorder::start(d, "127.0.0.1");
    let elsewhere = Recorder::start(d, "127.0.0.2");
    let ca = d.join("cert.pem");
    let daemon = Daemon::running()
        .env("GIT_SSL_CAINFO", ca.to_str().unwrap())
        .start();
    let local = daemon.client();
    let token = format!("tok-{}", std::process::id());
    let source = |name: &str, url: &str| {
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "GitSource",
            "metadata": {"name": name},
            "spec": {"url": url, "ref": "main", "interval": "1h", "secretRef": "fleet"}})
    };
    let reply = local.post_json(&format!("{P}/gitsources"), &source("fleet", &home.url));
    assert_eq!(reply.status, 201, "{}", reply.text());
    let reply = local.put_json(
        &format!("{P}/gitsources/fleet/secrets/token"),
        &json!({"value": token}),
    );
    assert!(reply.status < 300, "{}", reply.text());
    // A sync now, with the token (the first found none).
    let reply = local.request(
        "PATCH",
        &format!("{P}/gitsources/fleet"),
        Some("application/merge-patch+json"),
        br#"{"metadata": {"annotations": {"berth.dev/requestedAt": "now"}}}"#,
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    // The token's own host is offered it (the recorder then refuses everybody).
    let basic = format!("x-access-token:{token}");
    daemon.eventually(DEADLINE, "fleet's host to be offered the token", || {
        home.headers().contains(&basic).then_some(())
    });

    let reply = local.post_json(&format!("{P}/gitsources"), &source("thief", &elsewhere.url));
    assert_eq!(reply.status, 201, "{}", reply.text());
    let thief = daemon.eventually(DEADLINE, "thief's sync to fail", || {
        let source = local.get(&format!("{P}/gitsources/thief")).json();
        let ready = ready(&source)?;
        (ready["status"] == "False").then_some(source)
    });
    assert!(
        !elsewhere.headers().contains(&basic),
        "the token went to another host: {}",
        elsewhere.headers()
    );
    let message = ready(&thief).unwrap()["message"].as_str().unwrap_or("");
    assert!(message.contains("spec.secretRef"), "{thief}");
    assert!(message.contains("127.0.0.1"), "{thief}");
}

/// Issue item: a GitSource's inventory and events named projects the reader cannot get. A
/// member of one of its projects reads the GitSource, and of the others nothing.
#[test]
fn a_gitsource_names_to_a_member_only_the_projects_it_may_get() {
    let dir = tempfile::tempdir().unwrap();
    let id = std::process::id();
    let (shared, hidden) = (format!("shared-{id}"), format!("hidden-plan-{id}"));
    let paused = |name: &str| {
        format!(
            "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: {name}\n  annotations:\n    \
             berth.dev/reconcile: paused\nspec:\n  state: Stopped\n"
        )
    };
    let url = repository(
        dir.path(),
        &[("a.yaml", &paused(&shared)), ("b.yaml", &paused(&hidden))],
    );
    let daemon = Daemon::running().args(&["--listen", "127.0.0.1:0"]).start();
    let local = daemon.client();
    let token = daemon.add_user("mia", false);
    let member = TcpClient::new(&daemon.tcp_addr(), None, None).with_token(Some(&token));
    let reply = local.post_json(
        &format!("{P}/gitsources"),
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "GitSource",
            "metadata": {"name": "fleet"},
            "spec": {"url": url, "ref": "main", "interval": "1h"}}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    daemon.eventually(DEADLINE, "the GitSource to apply both projects", || {
        let source = local.get(&format!("{P}/gitsources/fleet")).json();
        let inventory = source["status"]["inventory"].as_array()?.len();
        (inventory == 2 && local.get(&format!("{P}/events")).text().contains(&hidden)).then_some(())
    });
    let reply = local.request(
        "PUT",
        &format!("{P}/projects/{shared}/members/mia"),
        None,
        b"",
    );
    assert!(reply.status < 300, "{}", reply.text());

    let source = member.get(&format!("{P}/gitsources/fleet"));
    assert_eq!(source.status, 200, "{}", source.text());
    assert_eq!(
        source.json()["status"]["inventory"],
        json!([format!("Project/{shared}")]),
        "{}",
        source.text()
    );
    for path in [
        format!("{P}/gitsources/fleet"),
        format!("{P}/gitsources"),
        format!("{P}/gitsources/fleet/status"),
        format!("{P}/gitsources/fleet/events"),
        format!("{P}/events"),
    ] {
        let reply = member.get(&path);
        assert_eq!(reply.status, 200, "{path}: {}", reply.text());
        assert!(!reply.text().contains(&hidden), "{path}: {}", reply.text());
    }
    // A watch of GitSources shows the same: its first event names only what she may get.
    let first = first_watch_event(
        &daemon.tcp_addr(),
        &token,
        &format!("{P}/gitsources?watch=true"),
    );
    assert!(
        first.contains("ADDED") && first.contains(&shared),
        "{first}"
    );
    assert!(
        !first.contains(&hidden),
        "the watch names {hidden}: {first}"
    );
    // The admin reads it all.
    let events = local.get(&format!("{P}/gitsources/fleet/events")).text();
    assert!(events.contains(&hidden), "{events}");
}

/// The raw bytes of a watch over plain TCP up to the end of its first event line.
fn first_watch_event(addr: &str, token: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let mut chunk = [0_u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&raw).into_owned();
        if let Some((_, body)) = text.split_once("\r\n\r\n")
            && body.contains("}\n")
        {
            return text;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return text,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A member's read-edit-replace of a project whose resources an admin set, leaving the
/// resources block out, was refused as if it changed them (403): leaving out what the member
/// may not change keeps the stored value, and the limits stay as the admin set them.
#[test]
fn a_member_replace_that_leaves_out_the_resources_keeps_them() {
    let (daemon, member) = daemon_with_member();
    let local = daemon.client();
    let path = format!("{P}/projects/mine");
    let mut limited = local.get(&path).json();
    limited["spec"]["resources"] =
        json!({"cpu": "1", "memory": "1GiB", "disk": "5GiB", "workspaceSize": "2GiB"});
    let reply = local.put_json(&path, &limited);
    assert_eq!(reply.status, 200, "{}", reply.text());
    let set = local.get(&path).json()["spec"]["resources"].clone();

    let mut edited = member.get(&path).json();
    edited["spec"]
        .as_object_mut()
        .unwrap()
        .remove("resources")
        .expect("the project has resources");
    edited["spec"]["brief"] = json!("a new brief");
    let reply = member.json("PUT", &path, &edited);
    assert_eq!(reply.status, 200, "{}", reply.text());
    let after = local.get(&path).json();
    assert_eq!(after["spec"]["resources"], set, "the limits stay as set");
    assert_eq!(after["spec"]["brief"], "a new brief");

    // Changing them is still refused.
    let mut raised = member.get(&path).json();
    raised["spec"]["resources"]["disk"] = json!("500GiB");
    let reply = member.json("PUT", &path, &raised);
    assert_eq!(reply.status, 403, "{}", reply.text());
}
