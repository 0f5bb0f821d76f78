//! GitSource end to end: a real `berth serve` (its controller running) polls a real bare git
//! repository on this host through a `file://` URL.
//!
//! Most repositories hold AgentProfiles and Projects annotated `berth.dev/reconcile: paused` and
//! `state: Stopped`: the daemon stores, updates and prunes them exactly as it would any other,
//! while the project reconciler leaves them alone, so those tests exercise GitOps without LXD.
//! One repository's projects come up in real LXD containers, change, and are pruned, one of
//! them while its workspace holds work.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::support::daemon::{Client, Daemon};
use crate::support::git;
use serde_json::{Value, json};

const API: &str = "/apis/berth.dev/v1alpha1";
/// Generous: a sync is a fetch, a checkout and one store transaction.
const DEADLINE: Duration = Duration::from_secs(60);

/// A bare repository and a working clone that commits and pushes to it.
struct Repo {
    _dir: tempfile::TempDir,
    bare: PathBuf,
    work: PathBuf,
}

impl Repo {
    fn new() -> Repo {
        let dir = tempfile::tempdir().expect("temp dir");
        let bare = dir.path().join("fleet.git");
        let work = dir.path().join("work");
        std::fs::create_dir_all(&bare).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        git(
            &bare,
            &["init", "--quiet", "--bare", "--initial-branch=main"],
        );
        git(&work, &["init", "--quiet", "--initial-branch=main"]);
        git(&work, &["config", "user.name", "Fleet"]);
        git(&work, &["config", "user.email", "fleet@example.invalid"]);
        git(
            &work,
            &[
                "remote",
                "add",
                "origin",
                bare.to_str().expect("utf-8 path"),
            ],
        );
        Repo {
            _dir: dir,
            bare,
            work,
        }
    }

    fn url(&self) -> String {
        format!("file://{}", self.bare.display())
    }

    fn write(&self, file: &str, text: &str) {
        let path = self.work.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn remove(&self, file: &str) {
        std::fs::remove_file(self.work.join(file)).unwrap();
    }

    /// Commits everything and pushes `main`; returns the commit id.
    fn commit(&self, message: &str) -> String {
        git(&self.work, &["add", "--all"]);
        git(
            &self.work,
            &["commit", "--quiet", "--allow-empty", "-m", message],
        );
        git(&self.work, &["push", "--quiet", "origin", "main"]);
        git(&self.work, &["rev-parse", "HEAD"])
    }
}

fn profile(name: &str, extra_metadata: &str) -> String {
    format!(
        "apiVersion: berth.dev/v1alpha1\nkind: AgentProfile\nmetadata:\n  name: {name}\n{extra_metadata}\
         spec:\n  home: /home/agent\n  install:\n    check: \"true\"\n  runner:\n    command: [agent]\n"
    )
}

fn project(name: &str, description: &str) -> String {
    format!(
        "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: {name}\n  annotations:\n    \
         berth.dev/reconcile: paused\nspec:\n  state: Stopped\n  displayName: {description:?}\n"
    )
}

fn gitsource(name: &str, url: &str, git_ref: &str, path: &str, interval: &str) -> Value {
    json!({
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "GitSource",
        "metadata": {"name": name},
        "spec": {"url": url, "ref": git_ref, "path": path, "interval": interval},
    })
}

fn must_get(client: &Client, plural: &str, name: &str) -> Value {
    client
        .object(plural, name)
        .unwrap_or_else(|| panic!("{plural}/{name} does not exist"))
}

fn rv(object: &Value) -> String {
    object["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .to_string()
}

fn generation(object: &Value) -> i64 {
    object["metadata"]["generation"]
        .as_i64()
        .expect("generation")
}

fn condition<'a>(source: &'a Value, type_: &str) -> Option<&'a Value> {
    source["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Waits until the GitSource has applied `revision` and is Ready; returns it.
fn wait_applied(daemon: &Daemon, name: &str, revision: &str) -> Value {
    let client = daemon.client();
    daemon.eventually(
        DEADLINE,
        &format!("gitsource {name} to apply {revision}"),
        || {
            let source = client.object("gitsources", name)?;
            let ready = condition(&source, "Ready")?;
            (source["status"]["lastAppliedRevision"] == revision && ready["status"] == "True")
                .then_some(source)
        },
    )
}

/// How many syncs of GitSource `name` the daemon has logged.
fn syncs(daemon: &Daemon, name: &str) -> usize {
    daemon
        .log_text()
        .lines()
        .filter(|line| line.contains("GitSource synced") && line.contains(&format!("={name}")))
        .count()
}

/// Changes the stored GitSource with `edit` and writes it back (PUT, guarded by resourceVersion;
/// a status write by the controller in between is a conflict, and the edit is made again).
fn edit_gitsource(client: &Client, name: &str, edit: impl Fn(&mut Value)) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut source = must_get(client, "gitsources", name);
        edit(&mut source);
        let reply = client.put_json(&format!("{API}/gitsources/{name}"), &source);
        if reply.status == 409 && Instant::now() < deadline {
            continue;
        }
        assert_eq!(reply.status, 200, "PUT gitsource {name}: {}", reply.text());
        return reply.json();
    }
}

#[test]
fn a_repository_is_applied_updated_pruned_and_guarded_against_broken_commits() {
    let repo = Repo::new();
    let daemon = Daemon::running().start();
    let client = daemon.client();

    // Two objects in the repository, and a file outside `path` that must be ignored.
    repo.write("deploy/profiles/alpha.yaml", &profile("alpha", ""));
    repo.write("deploy/projects/pay.yml", &project("pay", "payments"));
    repo.write("README.md", "not a manifest\n");
    let first = repo.commit("two objects");
    let reply = client.post_json(
        &format!("{API}/gitsources"),
        &gitsource("fleet", &repo.url(), "main", "deploy", "1s"),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());

    let source = wait_applied(&daemon, "fleet", &first);
    assert_eq!(source["status"]["lastAttemptedRevision"], first);
    assert_eq!(
        source["status"]["inventory"],
        json!(["AgentProfile/alpha", "Project/pay"])
    );
    assert_eq!(
        condition(&source, "Reconciling").unwrap()["status"],
        "False"
    );
    let alpha = must_get(&client, "agentprofiles", "alpha");
    let pay = must_get(&client, "projects", "pay");
    assert_eq!(
        alpha["metadata"]["annotations"]["berth.dev/applyset"],
        "gitsource-fleet"
    );
    assert_eq!(pay["spec"]["displayName"], "payments");
    let events = client.get(&format!("{API}/gitsources/fleet/events")).json();
    let applied_event = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["reason"] == "Applied" && e["message"].as_str().unwrap().contains(&first));
    assert!(applied_event, "no Applied event: {events}");

    // Idempotency: more syncs of the same revision change no resourceVersion, not even the
    // GitSource's own.
    let before = syncs(&daemon, "fleet");
    daemon.eventually(DEADLINE, "two more syncs of the same revision", || {
        (syncs(&daemon, "fleet") >= before + 2).then_some(())
    });
    assert_eq!(rv(&must_get(&client, "agentprofiles", "alpha")), rv(&alpha));
    assert_eq!(rv(&must_get(&client, "projects", "pay")), rv(&pay));
    assert_eq!(rv(&must_get(&client, "gitsources", "fleet")), rv(&source));

    // A new revision that changes nothing under `path` changes no object either.
    repo.write("README.md", "still not a manifest\n");
    let readme_only = repo.commit("docs");
    wait_applied(&daemon, "fleet", &readme_only);
    assert_eq!(rv(&must_get(&client, "agentprofiles", "alpha")), rv(&alpha));
    assert_eq!(rv(&must_get(&client, "projects", "pay")), rv(&pay));

    // Change one object: only it moves.
    repo.write("deploy/projects/pay.yml", &project("pay", "payments v2"));
    let changed = repo.commit("change pay");
    wait_applied(&daemon, "fleet", &changed);
    let pay2 = must_get(&client, "projects", "pay");
    assert_eq!(pay2["spec"]["displayName"], "payments v2");
    assert_eq!(generation(&pay2), generation(&pay) + 1);
    let alpha_now = must_get(&client, "agentprofiles", "alpha");
    assert_eq!(rv(&alpha_now), rv(&alpha));
    assert_eq!(generation(&alpha_now), generation(&alpha));

    // Opt alpha out of pruning, add beta; then remove alpha and pay from the repository.
    repo.write(
        "deploy/profiles/alpha.yaml",
        &profile("alpha", "  annotations:\n    berth.dev/prune: disabled\n"),
    );
    repo.write("deploy/profiles/beta.yaml", &profile("beta", ""));
    let opted_out = repo.commit("keep alpha, add beta");
    wait_applied(&daemon, "fleet", &opted_out);
    repo.remove("deploy/profiles/alpha.yaml");
    repo.remove("deploy/projects/pay.yml");
    let removed = repo.commit("remove alpha and pay");
    let source = wait_applied(&daemon, "fleet", &removed);
    assert!(
        client.object("projects", "pay").is_none(),
        "pay was not pruned"
    );
    assert!(
        client.object("agentprofiles", "alpha").is_some(),
        "alpha is annotated prune: disabled and must survive"
    );
    let inventory = source["status"]["inventory"].as_array().unwrap();
    assert!(inventory.contains(&json!("AgentProfile/beta")), "{source}");
    assert!(!inventory.contains(&json!("Project/pay")), "{source}");
    let beta = must_get(&client, "agentprofiles", "beta");

    // A broken commit (an unknown field) keeps everything applied and says file and field.
    repo.write(
        "deploy/profiles/gamma.yaml",
        &profile("gamma", "").replace("  install:", "  instal:"),
    );
    repo.write(
        "deploy/profiles/beta.yaml",
        &profile("beta", "  labels: {a: b}\n"),
    );
    let broken = repo.commit("typo");
    let source = daemon.eventually(DEADLINE, "Ready=False for the broken commit", || {
        let source = client.object("gitsources", "fleet")?;
        (source["status"]["lastAttemptedRevision"] == broken
            && condition(&source, "Ready")?["status"] == "False")
            .then_some(source)
    });
    let ready = condition(&source, "Ready").unwrap();
    let message = ready["message"].as_str().unwrap();
    assert_eq!(ready["reason"], "ApplyFailed");
    assert!(message.contains("deploy/profiles/gamma.yaml"), "{message}");
    assert!(message.contains("instal"), "{message}");
    assert_eq!(source["status"]["lastAppliedRevision"], removed);
    assert!(client.object("agentprofiles", "gamma").is_none());
    // All or nothing: beta's label from the same commit was not applied either.
    assert_eq!(rv(&must_get(&client, "agentprofiles", "beta")), rv(&beta));

    // Broken YAML: the message names the file and the line.
    repo.write("deploy/profiles/gamma.yaml", "kind: [unclosed\n");
    let bad_yaml = repo.commit("bad yaml");
    let source = daemon.eventually(DEADLINE, "Ready=False for the bad YAML", || {
        let source = client.object("gitsources", "fleet")?;
        (source["status"]["lastAttemptedRevision"] == bad_yaml).then_some(source)
    });
    let message = condition(&source, "Ready").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("deploy/profiles/gamma.yaml: document 1:") && message.contains("line"),
        "{message}"
    );
    assert_eq!(source["status"]["lastAppliedRevision"], removed);

    // A commit arming a force on an object (only a delete request may): nothing of it is
    // applied, and Ready names the file and the annotation.
    repo.write("deploy/profiles/gamma.yaml", &profile("gamma", ""));
    repo.write(
        "deploy/profiles/beta.yaml",
        &profile(
            "beta",
            "  labels: {a: b}\n  annotations: {berth.dev/forceDelete: \"true\"}\n",
        ),
    );
    let armed = repo.commit("arm a force");
    let source = daemon.eventually(DEADLINE, "Ready=False for the armed force", || {
        let source = client.object("gitsources", "fleet")?;
        (source["status"]["lastAttemptedRevision"] == armed
            && condition(&source, "Ready")?["status"] == "False")
            .then_some(source)
    });
    let message = condition(&source, "Ready").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("deploy/profiles/beta.yaml")
            && message.contains(
                "metadata.annotations[berth.dev/forceDelete]: set only by a delete request (berth delete --force)"
            ),
        "{message}"
    );
    assert_eq!(source["status"]["lastAppliedRevision"], removed);
    assert!(client.object("agentprofiles", "gamma").is_none());
    assert_eq!(rv(&must_get(&client, "agentprofiles", "beta")), rv(&beta));
    repo.write(
        "deploy/profiles/beta.yaml",
        &profile("beta", "  labels: {a: b}\n"),
    );

    // Fixed: applied again.
    repo.write("deploy/profiles/gamma.yaml", &profile("gamma", ""));
    let fixed = repo.commit("fix");
    wait_applied(&daemon, "fleet", &fixed);
    assert!(client.object("agentprofiles", "gamma").is_some());
    assert_eq!(
        must_get(&client, "agentprofiles", "beta")["metadata"]["labels"]["a"],
        "b"
    );
}

#[test]
fn suspend_pauses_polling_and_requested_at_syncs_now() {
    let repo = Repo::new();
    let daemon = Daemon::running().start();
    let client = daemon.client();
    repo.write("alpha.yaml", &profile("alpha", ""));
    let first = repo.commit("alpha");
    let reply = client.post_json(
        &format!("{API}/gitsources"),
        &gitsource("fleet", &repo.url(), "", ".", "1s"),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    wait_applied(&daemon, "fleet", &first);

    // Suspended: the controller says so, and a new commit is not applied.
    let suspended = edit_gitsource(&client, "fleet", |s| s["spec"]["suspend"] = json!(true));
    daemon.eventually(DEADLINE, "Reconciling=Suspended", || {
        let source = client.object("gitsources", "fleet")?;
        let reconciling = condition(&source, "Reconciling")?;
        (reconciling["reason"] == "Suspended"
            && source["status"]["observedGeneration"] == suspended["metadata"]["generation"])
            .then_some(())
    });
    repo.write("beta.yaml", &profile("beta", ""));
    let second = repo.commit("beta");
    // A negative claim needs a window: three intervals of a source that would otherwise poll
    // every second.
    let window = Instant::now() + Duration::from_secs(3);
    while Instant::now() < window {
        assert!(
            client.object("agentprofiles", "beta").is_none(),
            "suspended but synced"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let source = must_get(&client, "gitsources", "fleet");
    assert_eq!(source["status"]["lastAttemptedRevision"], first);

    // Resumed with a long interval: the spec change syncs once at once.
    edit_gitsource(&client, "fleet", |s| {
        s["spec"]["suspend"] = json!(false);
        s["spec"]["interval"] = json!("1h");
    });
    wait_applied(&daemon, "fleet", &second);
    assert!(client.object("agentprofiles", "beta").is_some());

    // Nothing would poll for an hour; requestedAt syncs now.
    repo.write("gamma.yaml", &profile("gamma", ""));
    let third = repo.commit("gamma");
    edit_gitsource(&client, "fleet", |s| {
        s["metadata"]["annotations"] = json!({"berth.dev/requestedAt": "2026-01-01T00:00:00Z"});
    });
    wait_applied(&daemon, "fleet", &third);
    assert!(client.object("agentprofiles", "gamma").is_some());

    // The same value again asks for nothing; a new value asks again.
    repo.write("delta.yaml", &profile("delta", ""));
    let fourth = repo.commit("delta");
    edit_gitsource(&client, "fleet", |s| {
        s["metadata"]["annotations"] = json!({"berth.dev/requestedAt": "2026-01-01T00:00:01Z"});
    });
    wait_applied(&daemon, "fleet", &fourth);

    // `berth reconcile gitsource` asks and waits for the answer, news or not.
    let reconcile = || {
        let out = daemon.cli(&["reconcile", "gitsource", "fleet", "--timeout=60s"]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = reconcile();
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.ends_with(&format!("gitsource/fleet synced: revision {fourth}\n")),
        "{stdout}"
    );
    repo.write("epsilon.yaml", &profile("epsilon", ""));
    let fifth = repo.commit("epsilon");
    let (code, stdout, stderr) = reconcile();
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains(&fifth), "{stdout}");
    assert!(client.object("agentprofiles", "epsilon").is_some());
    // A commit that does not apply: the command fails saying why.
    repo.write(
        "epsilon.yaml",
        &profile("epsilon", "").replace("  install:", "  instal:"),
    );
    repo.commit("typo");
    let (code, stdout, stderr) = reconcile();
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("gitsource/fleet is not ready") && stderr.contains("instal"),
        "{stderr}"
    );
}

#[test]
fn refs_resolve_to_branches_tags_and_commits_and_fetch_failures_are_reported() {
    let repo = Repo::new();
    let daemon = Daemon::running().start();
    let client = daemon.client();
    repo.write("a/alpha.yaml", &profile("alpha", ""));
    let tagged = repo.commit("alpha");
    git(&repo.work, &["tag", "v1"]);
    git(&repo.work, &["push", "--quiet", "origin", "v1"]);
    repo.write("b/beta.yaml", &profile("beta", ""));
    // Each source applies a directory of its own: a GitSource leaves another's objects alone.
    repo.write("d/delta.yaml", &profile("delta", ""));
    let head = repo.commit("beta");
    git(&repo.work, &["checkout", "--quiet", "-b", "feature"]);
    repo.write("c/gamma.yaml", &profile("gamma", ""));
    let feature = repo.commit("gamma");
    git(&repo.work, &["push", "--quiet", "origin", "feature"]);

    let url = repo.url();
    for (name, git_ref, path, want) in [
        ("by-tag", "v1", "a", &tagged),
        ("by-commit", head.as_str(), "b", &head),
        ("by-branch", "feature", "c", &feature),
        ("by-default", "", "d", &head),
    ] {
        let reply = client.post_json(
            &format!("{API}/gitsources"),
            &gitsource(name, &url, git_ref, path, "1s"),
        );
        assert_eq!(reply.status, 201, "{name}: {}", reply.text());
        wait_applied(&daemon, name, want);
    }

    let missing = format!(
        "file://{}/nowhere.git",
        repo.bare.parent().unwrap().display()
    );
    for (name, url, git_ref) in [
        ("no-repo", missing.as_str(), "main"),
        ("no-ref", url.as_str(), "no-such-branch"),
    ] {
        let reply = client.post_json(
            &format!("{API}/gitsources"),
            &gitsource(name, url, git_ref, ".", "1s"),
        );
        assert_eq!(reply.status, 201, "{name}: {}", reply.text());
        let source = daemon.eventually(DEADLINE, &format!("{name} to fail"), || {
            let source = client.object("gitsources", name)?;
            (condition(&source, "Ready")?["status"] == "False").then_some(source)
        });
        let ready = condition(&source, "Ready").unwrap();
        assert_eq!(ready["reason"], "FetchFailed", "{name}: {source}");
        assert!(source["status"].get("lastAppliedRevision").is_none());
    }
    let source = must_get(&client, "gitsources", "no-ref");
    let message = condition(&source, "Ready").unwrap()["message"]
        .as_str()
        .unwrap();
    assert!(message.contains("no-such-branch"), "{message}");
}

#[test]
fn a_restarted_daemon_resumes_from_its_checkout_and_rewrites_nothing() {
    let repo = Repo::new();
    let mut daemon = Daemon::running().start();
    repo.write("alpha.yaml", &profile("alpha", ""));
    let first = repo.commit("alpha");
    let reply = daemon.client().post_json(
        &format!("{API}/gitsources"),
        &gitsource("fleet", &repo.url(), "main", ".", "1s"),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let source = wait_applied(&daemon, "fleet", &first);
    let alpha = must_get(&daemon.client(), "agentprofiles", "alpha");
    let uid = source["metadata"]["uid"].as_str().unwrap().to_string();
    assert!(
        daemon
            .data_dir
            .join("gitsources")
            .join(&uid)
            .join(".git")
            .is_dir(),
        "no checkout under the data dir"
    );

    assert!(daemon.terminate().success(), "{}", daemon.log_text());
    let before = syncs(&daemon, "fleet");
    daemon.restart();
    daemon.eventually(DEADLINE, "a sync after the restart", || {
        (syncs(&daemon, "fleet") > before).then_some(())
    });
    let client = daemon.client();
    assert_eq!(rv(&must_get(&client, "gitsources", "fleet")), rv(&source));
    assert_eq!(rv(&must_get(&client, "agentprofiles", "alpha")), rv(&alpha));

    // Deleting the GitSource keeps what it applied and removes its checkout.
    let reply = client.delete(&format!("{API}/gitsources/fleet"));
    assert!(
        reply.status == 200 || reply.status == 202,
        "{}",
        reply.text()
    );
    daemon.eventually(DEADLINE, "the checkout to be removed", || {
        (!daemon.data_dir.join("gitsources").join(&uid).exists()).then_some(())
    });
    assert_eq!(rv(&must_get(&client, "agentprofiles", "alpha")), rv(&alpha));
}

#[test]
fn without_prune_removed_objects_stay_and_a_missing_path_is_reported() {
    let repo = Repo::new();
    let daemon = Daemon::running().start();
    let client = daemon.client();
    repo.write("m/alpha.yaml", &profile("alpha", ""));
    repo.write("m/beta.yaml", &profile("beta", ""));
    let first = repo.commit("two");
    let mut source = gitsource("keep", &repo.url(), "main", "m", "1s");
    source["spec"]["prune"] = json!(false);
    let reply = client.post_json(&format!("{API}/gitsources"), &source);
    assert_eq!(reply.status, 201, "{}", reply.text());
    wait_applied(&daemon, "keep", &first);

    repo.remove("m/beta.yaml");
    let second = repo.commit("drop beta");
    let source = wait_applied(&daemon, "keep", &second);
    assert!(
        client.object("agentprofiles", "beta").is_some(),
        "pruned without prune"
    );
    // Still in the set's inventory, so turning prune on later finds it.
    assert_eq!(
        source["status"]["inventory"],
        json!(["AgentProfile/alpha", "AgentProfile/beta"])
    );

    let reply = client.post_json(
        &format!("{API}/gitsources"),
        &gitsource("nowhere", &repo.url(), "main", "no/such/dir", "1s"),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let source = daemon.eventually(DEADLINE, "a missing path to be reported", || {
        let source = client.object("gitsources", "nowhere")?;
        (condition(&source, "Ready")?["status"] == "False").then_some(source)
    });
    let ready = condition(&source, "Ready").unwrap();
    assert_eq!(ready["reason"], "ApplyFailed");
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains("spec.path") && message.contains("no/such/dir"),
        "{message}"
    );
    assert_eq!(source["status"]["lastAttemptedRevision"], second);
}

/// A Project manifest the reconciler acts on: a real berth-tiny container.
fn live_project(name: &str, greeting: &str) -> String {
    format!(
        "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: {name}\nspec:\n  \
         image: berth-tiny\n  env:\n    GREETING: {greeting:?}\n"
    )
}

#[test]
fn projects_from_a_repository_come_up_change_and_a_prune_keeps_unsaved_work() {
    let repo = Repo::new();
    let mut berth = crate::harness::Berth::start(None);
    let client = berth.client();
    let (keep, drop) = (crate::harness::unique_name(), crate::harness::unique_name());
    repo.write(&format!("fleet/{keep}.yaml"), &live_project(&keep, "hello"));
    repo.write(&format!("fleet/{drop}.yaml"), &live_project(&drop, "hello"));
    // The set keeps one object when both projects leave it.
    let profile_name = format!("p{}", &keep[keep.len() - 8..]);
    repo.write("fleet/profile.yaml", &profile(&profile_name, ""));
    let first = repo.commit("two projects");
    let mut source = gitsource("live", &repo.url(), "main", "fleet", "2s");
    source["spec"]["prune"] = json!(true);
    let reply = client.post_json(&format!("{API}/gitsources"), &source);
    assert_eq!(reply.status, 201, "{}", reply.text());

    // Both come up in real containers.
    let wait_source = |berth: &crate::harness::Berth, revision: &str| {
        berth.wait_for_gitsource("live", |s| {
            s["status"]["lastAppliedRevision"] == revision
                && condition(s, "Ready").is_some_and(|c| c["status"] == "True")
        })
    };
    wait_source(&berth, &first);
    for name in [&keep, &drop] {
        let project = berth.wait_ready(name);
        berth.track(&project);
        let reply = client.post_json(
            &format!("{API}/projects/{name}/exec"),
            &json!({"command": ["sh", "-c", "echo $GREETING"]}),
        );
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(
            reply.json()["stdout"].as_str().map(str::trim),
            Some("hello")
        );
    }

    // A change to one changes only that one.
    let untouched = rv(&must_get(&client, "projects", &drop));
    repo.write(&format!("fleet/{keep}.yaml"), &live_project(&keep, "hi"));
    let second = repo.commit("change one");
    wait_source(&berth, &second);
    let changed = berth.wait_for(&keep, "at generation 2", |p| generation(p) == 2);
    assert_eq!(changed["spec"]["env"]["GREETING"], "hi");
    assert_eq!(rv(&must_get(&client, "projects", &drop)), untouched);

    // Work that exists nowhere else: a file in the workspace of the one about to be pruned...
    crate::harness::exec(&keep, "echo draft > /workspace/notes.txt").unwrap();
    // ...and nothing in the other's.
    repo.remove(&format!("fleet/{keep}.yaml"));
    repo.remove(&format!("fleet/{drop}.yaml"));
    let third = repo.commit("remove both");
    wait_source(&berth, &third);

    // The clean one is pruned, container and volumes with it.
    berth.wait_gone(&drop, "pruned", crate::harness::READY_DEADLINE);
    assert_eq!(crate::harness::instance_count(&drop), 0);
    // The one holding work is held, its container and workspace as they were.
    let held = berth.wait_for(&keep, "held by DeletionBlocked", |p| {
        condition(p, "DeletionBlocked").is_some_and(|c| c["status"] == "True")
    });
    assert_eq!(held["status"]["phase"], "Deleting");
    assert_eq!(
        condition(&held, "DeletionBlocked").unwrap()["reason"],
        "UnsavedWork"
    );
    assert_eq!(
        crate::harness::read_file(&keep, "/workspace/notes.txt")
            .unwrap()
            .trim(),
        "draft"
    );
    // A person decides: --force discards it.
    berth.delete_project(&keep);
    assert_eq!(crate::harness::instance_count(&keep), 0);
    let reply = client.delete(&format!("{API}/agentprofiles/{profile_name}"));
    assert_eq!(reply.status, 200, "{}", reply.text());
}

#[test]
fn objects_another_applyset_owns_are_left_to_it_and_named() {
    let daemon = Daemon::running().start();
    let client = daemon.client();

    // `taken-by-git` belongs to GitSource `first`; `taken-by-cli` to a CLI applyset.
    let first_repo = Repo::new();
    first_repo.write("m/taken-by-git.yaml", &profile("taken-by-git", ""));
    let first_revision = first_repo.commit("first");
    let reply = client.post_json(
        &format!("{API}/gitsources"),
        &gitsource("first", &first_repo.url(), "main", "m", "1s"),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    wait_applied(&daemon, "first", &first_revision);
    let by_cli = daemon.dir.path().join("taken-by-cli.yaml");
    std::fs::write(&by_cli, profile("taken-by-cli", "")).unwrap();
    daemon.cli_ok(&[
        "apply",
        "-f",
        by_cli.to_str().unwrap(),
        "--prune",
        "--applyset",
        "cli-fleet",
    ]);
    let git_owned = must_get(&client, "agentprofiles", "taken-by-git");
    let cli_owned = must_get(&client, "agentprofiles", "taken-by-cli");

    // A second GitSource whose manifests name both, and one object of its own, with another
    // home so a takeover would show.
    let repo = Repo::new();
    let other_home = |name: &str| profile(name, "").replace("/home/agent", "/home/second");
    repo.write("m/a-taken-by-cli.yaml", &other_home("taken-by-cli"));
    repo.write("m/b-taken-by-git.yaml", &other_home("taken-by-git"));
    repo.write("m/c-own.yaml", &other_home("own"));
    let revision = repo.commit("overlapping");
    let reply = client.post_json(
        &format!("{API}/gitsources"),
        &gitsource("second", &repo.url(), "main", "m", "1s"),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let source = daemon.eventually(DEADLINE, "the conflicts to be reported", || {
        let source = client.object("gitsources", "second")?;
        (source["status"]["lastAppliedRevision"] == revision
            && condition(&source, "Ready")?["reason"] == "ApplysetConflict")
            .then_some(source)
    });
    let ready = condition(&source, "Ready").unwrap();
    assert_eq!(ready["status"], "False");
    let message = ready["message"].as_str().unwrap();
    for named in [
        "AgentProfile/taken-by-cli (applyset cli-fleet)",
        "AgentProfile/taken-by-git (applyset gitsource-first)",
    ] {
        assert!(message.contains(named), "{named} not in {message}");
    }
    assert!(!message.contains("AgentProfile/own"), "{message}");

    // Neither is taken over: same object, same owner; the set's own object is applied.
    for (owned, set) in [(&git_owned, "gitsource-first"), (&cli_owned, "cli-fleet")] {
        let name = owned["metadata"]["name"].as_str().unwrap();
        let now = must_get(&client, "agentprofiles", name);
        assert_eq!(rv(&now), rv(owned), "{name} was written");
        assert_eq!(now["metadata"]["annotations"]["berth.dev/applyset"], set);
    }
    let own = must_get(&client, "agentprofiles", "own");
    assert_eq!(own["spec"]["home"], "/home/second");
    assert_eq!(source["status"]["inventory"], json!(["AgentProfile/own"]));
    // The first GitSource still holds its object and goes on syncing it.
    let first = must_get(&client, "gitsources", "first");
    assert_eq!(
        first["status"]["inventory"],
        json!(["AgentProfile/taken-by-git"])
    );

    // A Warning event names them, once for this revision, however many polls follow.
    let warnings = || {
        let events = client
            .get(&format!("{API}/gitsources/second/events"))
            .json();
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "Warning" && e["reason"] == "ApplysetConflict")
            .map(|e| e["message"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let before = syncs(&daemon, "second");
    daemon.eventually(DEADLINE, "two more syncs of the same revision", || {
        (syncs(&daemon, "second") >= before + 2).then_some(())
    });
    assert_eq!(warnings(), [message.to_string()]);

    // The CLI shows it: the table's MESSAGE column and describe's conditions and events.
    let table = daemon.cli_ok(&["get", "gitsources"]);
    let row = table
        .lines()
        .find(|line| line.starts_with("second "))
        .unwrap_or_else(|| panic!("no row for second:\n{table}"));
    assert!(
        row.contains("ApplysetConflict: applied revision")
            && row.contains("AgentProfile/taken-by-cli (applyset cli-fleet)"),
        "{row}"
    );
    let described = daemon.cli_ok(&["describe", "gitsource", "second"]);
    assert!(
        described.contains("ApplysetConflict")
            && described.contains("AgentProfile/taken-by-git (applyset gitsource-first)")
            && described.contains("Warning"),
        "{described}"
    );

    // Dropping the overlapping manifests makes it Ready again.
    repo.remove("m/a-taken-by-cli.yaml");
    repo.remove("m/b-taken-by-git.yaml");
    let clean = repo.commit("only our own");
    let source = wait_applied(&daemon, "second", &clean);
    assert_eq!(condition(&source, "Ready").unwrap()["reason"], "Succeeded");
    assert_eq!(
        must_get(&client, "agentprofiles", "taken-by-cli")["metadata"]["annotations"]["berth.dev/applyset"],
        "cli-fleet"
    );
}
