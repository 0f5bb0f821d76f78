//! The reconcile tests' harness: a [`Daemon`] whose controller runs against the real LXD (started,
//! killed and restarted with a fault point by the one launcher in `support::daemon`), plus
//! creating and patching projects, waiting on their status, and looking at LXD with the `lxc`
//! client. Everything a test creates is deleted when it ends.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::daemon::{Daemon, Launch, Reply};

pub const PROJECTS: &str = "/apis/berth.dev/v1alpha1/projects";
/// Generous: a busy 2-core machine unpacks the Debian image in seconds, not milliseconds.
pub const READY_DEADLINE: Duration = Duration::from_secs(300);
/// The exit code of a fault point (`berth::reconcile::fault::FAULT_EXIT_CODE`).
pub const FAULT_EXIT_CODE: i32 = 86;

/// `berth-t-rc-<random>`: unique on this machine.
pub fn unique_name() -> String {
    format!("berth-t-rc-{:08x}", rand::random::<u32>())
}

/// The tests of one binary take turns: LXD on a 2-core machine shared with other suites
/// answers slowly enough under parallel container churn that deadlines become a lottery.
static TURN: Mutex<()> = Mutex::new(());

/// A running (or killed) `berth serve` whose controller acts, and the projects the test made
/// with it: deleted (through berth, then with lxc) when the test ends. It is a [`Daemon`] (all
/// of whose methods it has) plus the projects and LXD's turn.
pub struct Berth {
    daemon: Daemon,
    /// Projects (name, uid) to delete with their containers and volumes when the test ends.
    projects: Vec<(String, String)>,
    /// Dropped after the daemon and its cleanup: the next test's turn starts on a clean LXD.
    _turn: MutexGuard<'static, ()>,
}

impl std::ops::Deref for Berth {
    type Target = Daemon;

    fn deref(&self) -> &Daemon {
        &self.daemon
    }
}

impl std::ops::DerefMut for Berth {
    fn deref_mut(&mut self) -> &mut Daemon {
        &mut self.daemon
    }
}

impl Berth {
    /// Starts a daemon whose controller acts, optionally with a fault point armed.
    pub fn start(fault: Option<&str>) -> Berth {
        Self::launch(Daemon::running().fault(fault))
    }

    /// Starts a daemon whose controller acts, with extra environment (overriding the default
    /// `BERTH_LOG=info`) and extra `serve` arguments.
    pub fn start_with(env: &[(&str, &str)], args: &[&str]) -> Berth {
        Self::launch(Daemon::running().envs(env).args(args))
    }

    /// Starts the daemon `launch` describes, in this test's turn on LXD.
    pub fn launch(launch: Launch) -> Berth {
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        Berth {
            daemon: launch.start(),
            projects: Vec::new(),
            _turn: turn,
        }
    }

    /// Creates a project from `spec` and remembers it for cleanup.
    pub fn create_project(&mut self, name: &str, spec: Value) -> Value {
        let reply = self.client().post_json(PROJECTS, &project(name, spec));
        assert_eq!(reply.status, 201, "create {name}: {}", reply.text());
        let created = reply.json();
        self.projects.push((name.to_string(), uid_of(&created)));
        created
    }

    /// Remembers a project something else created (a GitSource, a CLI apply) for cleanup.
    pub fn track(&mut self, project: &Value) {
        let name = project["metadata"]["name"]
            .as_str()
            .expect("a name")
            .to_string();
        if !self.projects.iter().any(|(n, _)| *n == name) {
            self.projects.push((name, uid_of(project)));
        }
    }

    /// The names of the projects this test tracks.
    pub fn tracked_names(&self) -> Vec<String> {
        self.projects.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The uid a project of this test had when it was tracked (it may be gone since).
    pub fn tracked_uid(&self, name: &str) -> Option<String> {
        self.projects
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, uid)| uid.clone())
    }
}

/// What a test does with projects on any daemon, paused or running: read, patch, wait on
/// status and events.
impl Daemon {
    /// The project's events, oldest first.
    pub fn events(&self, name: &str) -> Vec<Value> {
        self.client()
            .get(&format!("{PROJECTS}/{name}/events"))
            .json()["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The events of the project with `reason`.
    pub fn events_of(&self, name: &str, reason: &str) -> Vec<Value> {
        self.events(name)
            .into_iter()
            .filter(|e| e["reason"] == reason)
            .collect()
    }

    /// Applies the shipped AgentProfile `manifests/agents/NAME.yaml` with `berth apply`.
    pub fn apply_shipped_profile(&self, name: &str) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../manifests/agents/{name}.yaml"));
        let out = self.cli(&["apply", "-f", path.to_str().unwrap()]);
        assert!(out.status.success(), "apply {name}: {out:?}");
    }

    /// Sets the project's secret `key`.
    pub fn set_secret(&self, project: &str, key: &str, value: &str) {
        let reply = self.client().request(
            "PUT",
            &format!("{PROJECTS}/{project}/secrets/{key}"),
            Some("application/octet-stream"),
            value.as_bytes(),
        );
        assert_eq!(reply.status, 200, "set secret {key}: {}", reply.text());
    }

    /// Waits for a container other than `old` (its `volatile.uuid`) running under the name,
    /// and the project Ready.
    pub fn wait_replaced(&self, name: &str, old: &str) -> Value {
        self.wait_until(READY_DEADLINE, &format!("{name} replaced"), || {
            let uuid = lxc(&["config", "get", name, "volatile.uuid"]).ok();
            uuid.is_some_and(|u| u != old) && instance_state(name).as_deref() == Some("RUNNING")
        });
        self.wait_ready(name)
    }

    /// Makes `user` a member of `project`.
    pub fn add_member(&self, project: &str, user: &str) {
        let reply = self.client().request(
            "PUT",
            &format!("{PROJECTS}/{project}/members/{user}"),
            None,
            b"",
        );
        assert!(reply.status < 300, "add {user}: {}", reply.text());
    }

    /// A JSON merge patch on the project (spec or metadata).
    pub fn patch_project(&self, name: &str, patch: Value) -> Reply {
        let reply = self.client().request(
            "PATCH",
            &format!("{PROJECTS}/{name}"),
            Some("application/merge-patch+json"),
            patch.to_string().as_bytes(),
        );
        assert_eq!(reply.status, 200, "patch {name}: {}", reply.text());
        reply
    }

    pub fn get_project(&self, name: &str) -> Option<Value> {
        self.client().object("projects", name)
    }

    /// Polls until the project is gone, failing with what it still shows after `within`.
    pub fn wait_gone(&self, name: &str, what: &str, within: Duration) {
        self.wait_object(
            "projects",
            name,
            &format!("{name}: {what}: gone"),
            within,
            |p| p.is_none().then_some(()),
        );
    }

    /// Polls the project until `check` holds for it, failing with its last status.
    pub fn wait_for(&self, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        self.wait_for_within(name, what, READY_DEADLINE, check)
    }

    /// [`Daemon::wait_for`] with a deadline of the caller's.
    pub fn wait_for_within(
        &self,
        name: &str,
        what: &str,
        within: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        self.wait_object("projects", name, &format!("{name}: {what}"), within, |p| {
            p.filter(|p| check(p)).cloned()
        })
    }

    /// Polls the GitSource until `check` holds for it, failing with its last status.
    pub fn wait_for_gitsource(&self, name: &str, check: impl Fn(&Value) -> bool) -> Value {
        self.wait_object(
            "gitsources",
            name,
            &format!("gitsource {name}: as expected"),
            READY_DEADLINE,
            |s| s.filter(|s| check(s)).cloned(),
        )
    }

    /// Polls the object `PLURAL/NAME` (`None` while it is not there) until `check` answers,
    /// failing with the object's last status and the daemon's log.
    fn wait_object<T>(
        &self,
        plural: &str,
        name: &str,
        what: &str,
        within: Duration,
        check: impl Fn(Option<&Value>) -> Option<T>,
    ) -> T {
        let last = std::cell::RefCell::new(Value::Null);
        crate::support::eventually(
            within,
            what,
            || {
                format!(
                    "; last: {}\n{}",
                    serde_json::to_string_pretty(&last.borrow()["status"]).unwrap_or_default(),
                    self.log_text()
                )
            },
            || {
                let object = self.client().object(plural, name);
                let found = check(object.as_ref());
                *last.borrow_mut() = object.unwrap_or(Value::Null);
                found
            },
        )
    }

    /// Waits for `Ready=True` for the current generation.
    pub fn wait_ready(&self, name: &str) -> Value {
        self.wait_for(name, "Ready", |p| {
            ready_reason(p).is_some_and(|(status, _)| status == "True")
                && p["status"]["observedGeneration"] == p["metadata"]["generation"]
        })
    }

    /// Deletes the project as `berth delete --force` does (the workspace may hold files the
    /// test wrote, which would hold a plain delete) and waits until it is gone.
    pub fn delete_project(&self, name: &str) {
        let reply = self
            .client()
            .delete(&format!("{PROJECTS}/{name}?force=true"));
        assert!(
            [200, 202, 404].contains(&reply.status),
            "delete {name}: {} {}",
            reply.status,
            reply.text()
        );
        self.wait_gone(name, "deleted", READY_DEADLINE);
    }
}

impl Drop for Berth {
    fn drop(&mut self) {
        // Delete through berth while it runs, then make sure with lxc: a failed test must not
        // leave containers or volumes behind.
        if self.is_running() {
            for (name, _) in self.projects.clone() {
                let _ = self.client().try_request(
                    "DELETE",
                    &format!("{PROJECTS}/{name}?force=true"),
                    None,
                    &[],
                );
            }
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline
                && self.projects.iter().any(|(n, _)| {
                    self.client()
                        .try_request("GET", &format!("{PROJECTS}/{n}"), None, &[])
                        .is_ok_and(|r| r.status == 200)
                })
            {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        self.kill();
        for (name, uid) in &self.projects {
            if instance_uid(name).as_deref() == Some(uid.as_str()) {
                let _ = lxc(&["delete", "--force", name]);
            }
            // Containers a replacement put in the trash.
            let trashed = format!("berth-trash-{uid}-ct-");
            for instance in lxc(&["list", "--format", "csv", "-c", "n"])
                .unwrap_or_default()
                .lines()
                .filter(|n| n.starts_with(&trashed))
            {
                let _ = lxc(&["delete", "--force", instance]);
            }
            for volume in try_volumes_of(uid).unwrap_or_default() {
                let _ = lxc(&["storage", "volume", "delete", "default", &volume]);
            }
        }
        // Whatever else this daemon put in the trash (a restore under a new uid, a project
        // something else created) the daemon's own drop deletes next, by the controller ids
        // its stores had.
    }
}

/// A Project manifest named `name` with `spec`.
pub fn project(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "Project",
        "metadata": {"name": name},
        "spec": spec,
    })
}

/// The `Ready` condition's status and reason.
pub fn ready_reason(project: &Value) -> Option<(String, String)> {
    project["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
}

pub fn uid_of(project: &Value) -> String {
    project["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string()
}

/// Runs `lxc ARGS` against the default LXD with a deadline; stdout on success, stderr on
/// failure.
pub fn lxc(args: &[&str]) -> Result<String, String> {
    crate::support::lxd::lxc_in(None, args)
}

/// Runs `lxc ARGS`, again while LXD says the instance is busy with another operation (berth
/// may be acting on it at that moment, which is what a person meets too).
pub fn lxc_when_idle(args: &[&str]) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match lxc(args) {
            Err(e) if e.contains("is busy") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

/// Generous: a request through LXD's proxy answers in milliseconds, but the machine is shared.
const HTTP_DEADLINE: Duration = Duration::from_secs(120);

/// An HTTP/1.1 answer from the preview listener, read to its end.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

pub fn connect(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect to the preview listener");
    stream.set_read_timeout(Some(HTTP_DEADLINE)).unwrap();
    stream
}

/// `GET path` on the preview listener with `Host: host` and extra header lines, `Connection: close`.
pub fn get(addr: &str, host: &str, path: &str, headers: &[String]) -> Answer {
    let mut stream = connect(addr);
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for header in headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Answer {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

/// The header line of a bearer token, for raw HTTP requests.
pub fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}")
}

/// A file of the container, read through LXD's file API. Reading rather than `cat` through
/// `lxc exec`: LXD 5.0 under load now and then ends an exec before its last output arrived.
pub fn read_file(name: &str, path: &str) -> Result<String, String> {
    lxc(&["file", "pull", &format!("{name}{path}"), "-"])
}

/// Runs a shell command in the container.
pub fn exec(name: &str, script: &str) -> Result<String, String> {
    lxc(&["exec", name, "--", "sh", "-c", script])
}

/// The instance's `user.berth.uid`, if the instance exists.
pub fn instance_uid(name: &str) -> Option<String> {
    lxc(&["config", "get", name, "user.berth.uid"])
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// How many instances with exactly this name exist (0 or 1; more would be a bug in LXD).
pub fn instance_count(name: &str) -> usize {
    lxc(&["list", "--format", "csv", "-c", "n"])
        .expect("lxc list")
        .lines()
        .filter(|l| l.trim() == name)
        .count()
}

/// The custom volumes whose name carries `uid`.
pub fn volumes_of(uid: &str) -> Vec<String> {
    try_volumes_of(uid).expect("lxc storage volume list")
}

/// The same, or the error of the listing: for cleanup in `Drop`, where a panic during a
/// failed test's unwinding would abort the whole test binary.
pub fn try_volumes_of(uid: &str) -> Result<Vec<String>, String> {
    let list = lxc(&[
        "storage", "volume", "list", "default", "--format", "csv", "-c", "tn",
    ])?;
    Ok(list
        .lines()
        .filter_map(|l| l.split_once(','))
        .filter(|(t, n)| *t == "custom" && n.contains(uid))
        .map(|(_, n)| n.to_string())
        .collect())
}

/// The volumes of `uid` under the project's own names (not those in the trash).
pub fn live_volumes_of(uid: &str) -> Vec<String> {
    volumes_of(uid)
        .into_iter()
        .filter(|v| !v.starts_with("berth-trash-"))
        .collect()
}

/// The instance's status as `lxc list` shows it (RUNNING, STOPPED), if it exists.
pub fn instance_state(name: &str) -> Option<String> {
    lxc(&["list", "--format", "csv", "-c", "ns"])
        .expect("lxc list")
        .lines()
        .filter_map(|l| l.split_once(','))
        .find(|(n, _)| *n == name)
        .map(|(_, s)| s.to_string())
}
