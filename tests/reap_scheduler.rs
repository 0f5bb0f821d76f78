//! The scheduler in a real daemon against real LXD and real git: an idle project is stopped;
//! projects with an uncommitted file, an unpushed commit or a blocked agent are kept, with the
//! protection shown in `get -o wide` and `reap --dry-run`; a plain delete of unpushed work is
//! held (DeletionBlocked) until `--force`; a listener on 0.0.0.0:3000 shows in `berth ports`.

mod support;

#[path = "reconcile_harness.rs"]
mod harness;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use harness::{PROJECTS, READY_DEADLINE, exec, instance_count, instance_state, lxc, volumes_of};
use serde_json::{Value, json};
use support::daemon::{Client, Daemon};

/// How long the scheduler gets to notice something, many rounds of its 2s interval on a busy
/// machine.
const NOTICE_DEADLINE: Duration = Duration::from_secs(240);

/// `berth-t-reap-<random>`: unique on this machine.
fn unique_name() -> String {
    format!("berth-t-reap-{:08x}", rand::random::<u32>())
}

/// A daemon whose controller and scheduler run every 2 seconds, and the projects it made:
/// deleted with `--force` (then checked with lxc) when the test ends, whatever happened.
struct Reaper {
    daemon: Daemon,
    _config: tempfile::TempDir,
    projects: Vec<(String, String)>,
}

impl Reaper {
    fn start() -> Reaper {
        let config = tempfile::tempdir().expect("temp dir");
        let path = config.path().join("berth.yaml");
        std::fs::write(&path, "scheduler: {interval: 2s, workers: 4}\n").expect("config");
        let daemon = Daemon::start_running(&["--config", path.to_str().expect("utf-8 path")]);
        Reaper {
            daemon,
            _config: config,
            projects: Vec::new(),
        }
    }

    fn client(&self) -> Client {
        self.daemon.client()
    }

    fn create(&mut self, name: &str, spec: Value) {
        let reply = self.client().post_json(
            PROJECTS,
            &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                    "metadata": {"name": name}, "spec": spec}),
        );
        assert!(
            [200, 201].contains(&reply.status),
            "create {name}: {}",
            reply.text()
        );
        let uid = reply.json()["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        self.projects.push((name.to_string(), uid));
    }

    fn get(&self, name: &str) -> Option<Value> {
        let reply = self.client().get(&format!("{PROJECTS}/{name}"));
        (reply.status == 200).then(|| reply.json())
    }

    fn wait_for(
        &self,
        name: &str,
        what: &str,
        deadline: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        let until = Instant::now() + deadline;
        loop {
            if let Some(project) = self.get(name)
                && check(&project)
            {
                return project;
            }
            assert!(
                Instant::now() < until,
                "{name}: {what} not reached; status {}\n{}",
                self.get(name)
                    .map(|p| p["status"].to_string())
                    .unwrap_or_default(),
                self.daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Waits until the container answers with its workspace mounted.
    fn wait_reachable(&self, name: &str) {
        self.wait_for(name, "Reachable", READY_DEADLINE, |p| {
            p["status"]["step"] == "Reachable" && p["status"]["container"]["pid"].is_number()
        });
        let until = Instant::now() + READY_DEADLINE;
        while exec(name, "test -f /run/init.ready").is_err() {
            assert!(Instant::now() < until, "{name}: init never ready");
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn cli(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("--server")
            .arg(&self.daemon.socket)
            .args(args)
            .env_remove("BERTH_TOKEN")
            .stdin(Stdio::null())
            .output()
            .expect("run berth")
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for (name, _) in &self.projects {
            let _ = self.client().try_request(
                "DELETE",
                &format!("{PROJECTS}/{name}?force=true"),
                None,
                &[],
            );
        }
        let until = Instant::now() + Duration::from_secs(120);
        while Instant::now() < until && self.projects.iter().any(|(n, _)| self.get(n).is_some()) {
            std::thread::sleep(Duration::from_millis(200));
        }
        for (name, uid) in &self.projects {
            if harness::instance_uid(name).as_deref() == Some(uid.as_str()) {
                let _ = lxc(&["delete", "--force", name]);
            }
            for volume in volumes_of(uid) {
                let _ = lxc(&["storage", "volume", "delete", "default", &volume]);
            }
        }
    }
}

/// Runs a script in the workspace with a git identity.
fn workspace(name: &str, script: &str) {
    let script = format!(
        "cd /workspace && export HOME=/root GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@example.invalid \
         GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@example.invalid && {script}"
    );
    exec(name, &script).unwrap_or_else(|e| panic!("{name}: {script}: {e}"));
}

fn protected_by(project: &Value) -> Vec<String> {
    project["status"]["reap"]["protectedBy"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn idle_projects_are_stopped_and_work_keeps_the_others() {
    let mut reaper = Reaper::start();
    let spec = json!({"image": "berth-base", "reap": {"idleAfter": "5s", "idleAction": "Stop"}});
    let idle = unique_name();
    let dirty = unique_name();
    let unpushed = unique_name();
    let blocked = unique_name();
    let doomed = unique_name();
    for name in [&idle, &dirty, &unpushed, &blocked] {
        reaper.create(name, spec.clone());
    }
    reaper.create(
        &doomed,
        json!({"image": "berth-base", "reap": {"idleAfter": "5s", "idleAction": "Delete"}}),
    );
    let doomed_uid = reaper.projects.last().unwrap().1.clone();
    // Not waited on: it may be reaped by the time the others are up.
    for name in [&idle, &dirty, &unpushed, &blocked] {
        reaper.wait_reachable(name);
    }
    workspace(&dirty, "git init -q && echo draft > notes.txt");
    workspace(
        &unpushed,
        "git init -q && echo one > a && git add a && git commit -qm one",
    );
    exec(
        &blocked,
        r#"mkdir -p /run/berth && printf '{"state":"blocked","title":"needs a decision","message":"which database?"}' > /run/berth/agent.json"#,
    )
    .unwrap();
    exec(
        &blocked,
        "(setsid git daemon --listen=0.0.0.0 --port=3000 --base-path=/tmp --detach \
           --pid-file=/tmp/gd.pid) </dev/null >/dev/null 2>&1",
    )
    .unwrap();

    // The idle one is idled: idledAt set, container stopped and kept stopped.
    reaper.wait_for(&idle, "idledAt", NOTICE_DEADLINE, |p| {
        p["status"]["reap"]["idledAt"].is_string()
    });
    let until = Instant::now() + NOTICE_DEADLINE;
    while instance_state(&idle).as_deref() != Some("STOPPED") {
        assert!(Instant::now() < until, "{idle} was not stopped");
        std::thread::sleep(Duration::from_millis(250));
    }

    // The clean one whose idle action is Delete is deleted, container and volumes with it.
    let until = Instant::now() + NOTICE_DEADLINE;
    while reaper.get(&doomed).is_some() {
        assert!(
            Instant::now() < until,
            "{doomed} was not reaped: {}\n{}",
            reaper.get(&doomed).unwrap()["status"],
            reaper.daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let log = reaper.daemon.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("reaped") && l.contains(&doomed) && l.contains("delete")),
        "{doomed} went, but not by the reaper:\n{log}"
    );
    assert_eq!(instance_count(&doomed), 0);
    assert!(
        volumes_of(&doomed_uid).is_empty(),
        "{:?}",
        volumes_of(&doomed_uid)
    );

    // The others are kept, each with its protection.
    for (name, reason) in [
        (&dirty, "UnsavedWork"),
        (&unpushed, "UnsavedWork"),
        (&blocked, "AgentBlocked"),
    ] {
        let project = reaper.wait_for(name, reason, NOTICE_DEADLINE, |p| {
            protected_by(p).iter().any(|r| r == reason)
                && p["status"]["reap"]["nextAction"] == "Stop"
        });
        assert!(
            project["status"]["reap"]["idledAt"].is_null(),
            "{name} was idled: {}",
            project["status"]
        );
        assert_eq!(instance_state(name).as_deref(), Some("RUNNING"), "{name}");
        let condition = project["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "ReapProtected").cloned())
            .unwrap_or_default();
        assert_eq!(condition["status"], "True", "{name}: {condition}");
    }
    let unpushed_status = reaper.get(&unpushed).unwrap();
    assert_eq!(
        unpushed_status["status"]["unsavedWork"]["unpushed"], 1,
        "{}",
        unpushed_status["status"]
    );
    let blocked_status = reaper.get(&blocked).unwrap();
    assert_eq!(blocked_status["status"]["title"], "needs a decision");
    assert_eq!(blocked_status["status"]["agent"]["state"], "blocked");

    let wide = reaper.cli(&["get", "projects", "-o", "wide"]);
    assert!(
        wide.status.success(),
        "{}",
        String::from_utf8_lossy(&wide.stderr)
    );
    let wide = stdout(&wide);
    for (name, reason) in [
        (&dirty, "UnsavedWork"),
        (&unpushed, "UnsavedWork"),
        (&blocked, "AgentBlocked"),
    ] {
        let line = wide
            .lines()
            .find(|l| l.starts_with(name.as_str()))
            .unwrap_or_else(|| panic!("{name} not listed:\n{wide}"));
        assert!(line.contains(reason), "{name}: {line}");
    }

    let plan = reaper.cli(&["reap", "--dry-run"]);
    assert!(
        plan.status.success(),
        "{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    let plan = stdout(&plan);
    let header = plan.lines().next().unwrap_or_default();
    for column in ["NAME", "NEXT ACTION", "AT", "PROTECTED BY", "REASON"] {
        assert!(header.contains(column), "{header}");
    }
    for (name, reason) in [
        (&dirty, "UnsavedWork"),
        (&unpushed, "UnsavedWork"),
        (&blocked, "AgentBlocked"),
    ] {
        let line = plan
            .lines()
            .find(|l| l.starts_with(name.as_str()))
            .unwrap_or_else(|| panic!("{name} not in the plan:\n{plan}"));
        assert!(line.contains(reason) && line.contains("Stop"), "{line}");
    }
    let idle_line = plan
        .lines()
        .find(|l| l.starts_with(idle.as_str()))
        .unwrap_or_else(|| panic!("{idle} not in the plan:\n{plan}"));
    assert!(idle_line.contains("idled at"), "{idle_line}");

    // The listener on 0.0.0.0:3000 has its preview URL; the loopback-only ones do not count.
    let until = Instant::now() + NOTICE_DEADLINE;
    loop {
        let ports = reaper.cli(&["ports", &blocked]);
        assert!(
            ports.status.success(),
            "{}",
            String::from_utf8_lossy(&ports.stderr)
        );
        let text = stdout(&ports);
        if text.contains(&format!("http://{blocked}--3000.localhost")) {
            assert!(text.starts_with("PORT"), "{text}");
            break;
        }
        assert!(Instant::now() < until, "port 3000 never listed:\n{text}");
        std::thread::sleep(Duration::from_millis(500));
    }

    // A plain delete of unpushed work is held; the container and volumes stay.
    let uid = reaper.get(&unpushed).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let delete = reaper.cli(&["delete", "project", &unpushed]);
    let said = format!(
        "{}{}",
        stdout(&delete),
        String::from_utf8_lossy(&delete.stderr)
    );
    assert_eq!(delete.status.code(), Some(1), "{said}");
    assert!(said.contains("UnsavedWork"), "{said}");
    let held = reaper.get(&unpushed).expect("held project still there");
    assert_eq!(held["status"]["phase"], "Deleting");
    let blocked_condition = held["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "DeletionBlocked").cloned())
        .unwrap_or_default();
    assert_eq!(blocked_condition["status"], "True", "{blocked_condition}");
    assert_eq!(blocked_condition["reason"], "UnsavedWork");
    assert_eq!(instance_count(&unpushed), 1);
    assert_eq!(volumes_of(&uid).len(), 1, "{:?}", volumes_of(&uid));
    assert_eq!(
        exec(&unpushed, "cd /workspace && cat a").unwrap().trim(),
        "one",
        "the held workspace was touched"
    );

    // --force deletes at once.
    let forced = reaper.cli(&["delete", "project", &unpushed, "--force"]);
    assert!(
        forced.status.success(),
        "{}{}",
        stdout(&forced),
        String::from_utf8_lossy(&forced.stderr)
    );
    assert!(reaper.get(&unpushed).is_none());
    assert_eq!(instance_count(&unpushed), 0);
    assert!(volumes_of(&uid).is_empty(), "{:?}", volumes_of(&uid));
}
