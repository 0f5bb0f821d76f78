//! The whole provisioning pipeline against a real LXD with the offline `shell` agent: a project
//! waits for its AgentProfile, then goes Reachable → Bootstrapped → CheckedOut (a `file://` repo
//! made with real git) → Seeded → RunnerStarted → Briefed and Ready; the daemon crashing right
//! after each of those steps clones once, seeds once and starts one runner; secrets reach
//! /workspace/.env (never a file git would commit) and leave it; a blocked agent shows its
//! question and goes on once answered, and only a blocked agent takes an answer; a new brief
//! reaches a running agent, one runner at a time; `Provisioned` says what bootstrap found; a
//! changed AgentProfile is provisioned again, its new instructions written, with no second runner.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{
    Berth, FAULT_EXIT_CODE, PROJECTS, exec, read_file, ready_reason, unique_name,
};
use serde_json::{Value, json};

const PROFILES: &str = "/apis/berth.dev/v1alpha1/agentprofiles";
const DEADLINE: Duration = Duration::from_secs(300);
/// Secret values that must show up in the workspace and nowhere berth reports.
const CANARY_1: &str = "canary-one-5e1f";
const CANARY_2: &str = "canary-two-9c3d";

/// The `shell` profile of `manifests/agents/shell.yaml`, under a name of this test's own.
pub(crate) fn shell_profile(name: &str) -> Value {
    json!({
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "AgentProfile",
        "metadata": {"name": name},
        "spec": {
            "home": format!("/root/.{name}"),
            "install": {"check": "test -x /usr/local/lib/berth/shell-agent"},
            "instructions": {"target": "AGENTS.md", "content": "# Working here\nCommit your work.\n"},
            "runner": {"command": ["/usr/local/lib/berth/shell-agent", "{briefFile}"]},
        },
    })
}

pub(crate) fn apply_profile(berth: &Berth, name: &str) {
    let reply = berth.client().post_json(PROFILES, &shell_profile(name));
    assert_eq!(reply.status, 201, "create profile {name}: {}", reply.text());
}

pub(crate) fn delete_profile(berth: &Berth, name: &str) {
    let _ = berth
        .client()
        .try_request("DELETE", &format!("{PROFILES}/{name}"), None, &[]);
}

/// A git repository with one commit, in `dir`.
fn git_repo(dir: &Path) -> String {
    git_repo_with(dir, &[])
}

/// A git repository whose one commit holds README.md and `files` (path, content).
fn git_repo_with(dir: &Path, files: &[(&str, &str)]) -> String {
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("README.md"), "pipeline repo\n").unwrap();
    for (path, content) in files {
        std::fs::write(repo.join(path), content).unwrap();
    }
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "-A"],
        &[
            "-c",
            "user.name=berth test",
            "-c",
            "user.email=test@berth.invalid",
            "commit",
            "-q",
            "-m",
            "marker commit",
        ],
    ] {
        let out = Command::new("git")
            .args(args)
            .current_dir(&repo)
            .output()
            .expect("git");
        assert!(out.status.success(), "git {args:?}: {out:?}");
    }
    format!("file://{}", repo.display())
}

fn delete_secret(berth: &Berth, project: &str, key: &str) {
    let reply = berth
        .client()
        .delete(&format!("{PROJECTS}/{project}/secrets/{key}"));
    assert!(
        [200, 204].contains(&reply.status),
        "delete secret {key}: {}",
        reply.text()
    );
}

/// Runs the `berth` CLI against the test's daemon, with `stdin` as its input.
/// The condition of `type_` as (status, reason, message).
fn condition(project: &Value, type_: &str) -> Option<(String, String, String)> {
    project["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (text("status"), text("reason"), text("message"))
        })
}

/// Polls a shell check in the container until it succeeds.
fn wait_in_container(name: &str, what: &str, script: &str) {
    crate::support::eventually(DEADLINE, &format!("{name}: {what}"), String::new, || {
        exec(name, script).ok()
    });
}

/// Waits for LXD's `environment.KEY` of the container to be `value` ("" for unset).
fn wait_lxd_env(name: &str, key: &str, value: &str) {
    let deadline = Instant::now() + DEADLINE;
    let config_key = format!("environment.{key}");
    loop {
        let now = crate::harness::lxc(&["config", "get", name, &config_key]).unwrap_or_default();
        if now.trim() == value {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: {config_key} is {now:?}, not {value:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `berth restart NAME`, then waits until the project is briefed again after its `boots`th boot.
fn reboot(berth: &Berth, name: &str, boots: usize) {
    exec(name, "touch /run/berth-before-boot").unwrap();
    let out = berth.cli(&["restart", name]);
    assert!(out.status.success(), "berth restart: {out:?}");
    wait_in_container(name, "a new boot", "! test -e /run/berth-before-boot");
    berth.wait_for(name, "Briefed again after the boot", |p| {
        ready_reason(p).is_some_and(|(s, _)| s == "True")
            && p["status"]["step"] == "Briefed"
            && event_messages(berth, name)
                .iter()
                .filter(|m| m.starts_with("back to step Started"))
                .count()
                >= boots
    });
}

/// How many times berth started the project's runner.
fn runner_starts(berth: &Berth, name: &str) -> usize {
    event_messages(berth, name)
        .into_iter()
        .filter(|m| m.starts_with("runner started"))
        .count()
}

/// The project's events as `(reason, message)`, an event repeated as often as it happened
/// (the server folds repeats of one reason and message into one event with a count).
fn events(berth: &Berth, name: &str) -> Vec<(String, String)> {
    let list = berth
        .client()
        .get(&format!("{PROJECTS}/{name}/events"))
        .json();
    let mut out = Vec::new();
    for event in list["items"].as_array().unwrap() {
        let reason = event["reason"].as_str().unwrap_or_default().to_string();
        let message = event["message"].as_str().unwrap_or_default().to_string();
        for _ in 0..event["count"].as_u64().unwrap_or(1) {
            out.push((reason.clone(), message.clone()));
        }
    }
    out
}

fn event_messages(berth: &Berth, name: &str) -> Vec<String> {
    events(berth, name).into_iter().map(|(_, m)| m).collect()
}

fn event_reasons(berth: &Berth, name: &str) -> Vec<String> {
    events(berth, name).into_iter().map(|(r, _)| r).collect()
}

#[test]
fn pipeline_reaches_briefed_through_crashes_between_steps() {
    let mut berth = Berth::start(Some("after-step:Bootstrapped"));
    let name = unique_name();
    let profile = format!("shell-{}", &name[name.len() - 8..]);
    let url = git_repo(berth.dir.path());
    berth.create_project(
        &name,
        json!({
            "image": "berth-base",
            "agent": profile,
            "repo": {"url": url},
            "seedFiles": [{"path": "notes/seed.txt", "content": "seeded once\n"}],
            "env": {"GREETING": "hello"},
            "brief": "Pipeline brief\necho working\n",
        }),
    );

    // The profile does not exist yet: the project says so and waits.
    berth.wait_for(&name, "waiting for its profile", |p| {
        ready_reason(p).is_some_and(|(s, r)| s == "False" && r == "ProfileNotFound")
    });
    berth.set_secret(&name, "PIPELINE_TOKEN", CANARY_1);
    apply_profile(&berth, &profile);

    // Crash right after each later step is committed, then go on without a fault.
    for (fault, next) in [
        ("after-step:Bootstrapped", Some("after-step:CheckedOut")),
        ("after-step:CheckedOut", Some("after-step:Seeded")),
        ("after-step:Seeded", Some("after-step:RunnerStarted")),
        ("after-step:RunnerStarted", None),
    ] {
        let status = berth.wait_exit(DEADLINE);
        assert_eq!(
            status.code(),
            Some(FAULT_EXIT_CODE),
            "{fault}: the daemon did not stop at its fault point:\n{}",
            berth.log_text()
        );
        berth.restart_with(next);
    }

    let project = berth.wait_ready(&name);
    let status = &project["status"];
    assert_eq!(status["step"], "Briefed", "{status}");
    let brief_id = status["briefId"].as_str().expect("briefId").to_string();
    assert_eq!(status["agent"]["briefId"], brief_id.as_str());
    assert_eq!(status["title"], "Pipeline brief");
    let seeded = status["seededFiles"].as_object().expect("seededFiles");
    assert!(
        seeded.contains_key("/workspace/notes/seed.txt"),
        "{seeded:?}"
    );
    assert!(seeded.contains_key("/workspace/AGENTS.md"), "{seeded:?}");
    // Bootstrap said what it found, for the profile it verified.
    let (provisioned, reason, message) = condition(&project, "Provisioned").expect("Provisioned");
    assert_eq!(
        (provisioned.as_str(), reason.as_str()),
        ("True", "Bootstrapped")
    );
    assert!(message.contains(&profile), "{message}");

    // One clone (its event below counts them): the repository's single commit.
    assert_eq!(
        exec(&name, "git -C /workspace rev-list --count HEAD")
            .unwrap()
            .trim(),
        "1"
    );
    assert_eq!(
        read_file(&name, "/workspace/notes/seed.txt").unwrap(),
        "seeded once\n"
    );
    // One runner: the brief was worked once.
    wait_in_container(
        &name,
        "the agent done",
        "grep -q '\"state\":\"done\"' /run/berth/agent.json",
    );
    assert_eq!(
        exec(&name, "grep -c '^echo working$' /run/berth/shell.log")
            .unwrap()
            .trim(),
        "1"
    );
    let reasons = event_reasons(&berth, &name);
    assert_eq!(
        reasons.iter().filter(|r| *r == "RunnerStarted").count(),
        2,
        "the step's event and the one start: {reasons:?}"
    );
    for once in ["Cloned", "SeedWritten"] {
        assert_eq!(
            reasons.iter().filter(|r| *r == once).count(),
            1,
            "{once}: {reasons:?}"
        );
    }

    // Secrets: in .env, changed, then gone.
    wait_in_container(
        &name,
        "the secret in .env",
        "grep -q '^PIPELINE_TOKEN=.*canary-one-5e1f' /workspace/.env && grep -q '^GREETING=.*hello' /workspace/.env",
    );
    berth.set_secret(&name, "PIPELINE_TOKEN", CANARY_2);
    wait_in_container(
        &name,
        "the new value in .env",
        "grep -q '^PIPELINE_TOKEN=.*canary-two-9c3d' /workspace/.env",
    );
    // Not mirrored into LXD's database by default: the sync that wrote the first value has
    // finished, mirroring included, before the one that wrote the second.
    for key in [
        "environment.PIPELINE_TOKEN",
        "environment.BERTH_SECRET_KEYS",
    ] {
        let mirrored = crate::harness::lxc(&["config", "get", &name, key]).unwrap_or_default();
        assert_eq!(mirrored.trim(), "", "{key}");
    }
    delete_secret(&berth, &name, "PIPELINE_TOKEN");
    wait_in_container(
        &name,
        "the secret gone from .env",
        "! grep -q PIPELINE_TOKEN /workspace/.env",
    );
    let synced = berth.wait_for(&name, "SecretsSynced", |p| {
        p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "SecretsSynced" && c["status"] == "True")
        })
    });
    assert_eq!(synced["status"]["briefId"], brief_id.as_str());

    // The values went into the workspace, never into what berth tells about it.
    let client = berth.client();
    let told = [
        berth.log_text(),
        synced.to_string(),
        client.get(&format!("{PROJECTS}/{name}/events")).text(),
        client.get(&format!("{PROJECTS}/{name}/secrets")).text(),
        client.get("/metrics").text(),
    ];
    for canary in [CANARY_1, CANARY_2] {
        for text in &told {
            assert!(!text.contains(canary), "{canary} leaked into {text}");
        }
    }

    berth.delete_project(&name);
    delete_profile(&berth, &profile);
}

#[test]
fn pipeline_blocked_agent_is_answered() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    let profile = format!("shell-{}", &name[name.len() - 8..]);
    apply_profile(&berth, &profile);
    berth.create_project(
        &name,
        json!({
            "image": "berth-base",
            "agent": profile,
            "brief": "Ask then finish\nBLOCK: which colour?\necho finishing\n",
        }),
    );
    // The report is recorded as the step finishes, so it may show a moment before Briefed.
    let blocked = berth.wait_for(&name, "blocked and briefed", |p| {
        p["status"]["agent"]["state"] == "blocked" && p["status"]["step"] == "Briefed"
    });
    assert_eq!(blocked["status"]["agent"]["message"], "which colour?");
    assert_eq!(blocked["status"]["title"], "Ask then finish");

    // A boot before the brief is done hands it over again: the agent asks once more.
    reboot(&berth, &name, 1);
    assert_eq!(runner_starts(&berth, &name), 2);
    wait_in_container(
        &name,
        "the agent blocked again",
        "grep -q '\"state\":\"blocked\"' /run/berth/agent.json",
    );

    let out = berth.cli(&["answer", &name, "blue"]);
    assert!(out.status.success(), "berth answer: {out:?}");

    berth.wait_for(&name, "done", |p| p["status"]["agent"]["state"] == "done");
    assert_eq!(
        exec(&name, "grep -c '^answer: blue$' /run/berth/shell.log")
            .unwrap()
            .trim(),
        "1"
    );

    // Nobody asks now: an answer is refused and leaves nothing for a later question to take.
    let out = berth.cli(&["answer", &name, "green"]);
    assert!(
        !out.status.success(),
        "berth answer to a done agent: {out:?}"
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!(
            "agent of project {name} is not waiting for an answer (state: done)"
        )),
        "{said}"
    );
    let reply = berth.client().request(
        "POST",
        &format!("{PROJECTS}/{name}/answer"),
        Some("text/plain"),
        b"green",
    );
    assert_eq!(reply.status, 409, "{}", reply.text());
    assert!(exec(&name, "test -e /run/berth/answer").is_err());

    let out = berth.cli(&["logs", &name]);
    assert!(out.status.success(), "berth logs: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("shell agent: answered"), "{text}");
    // Following reads on from where the last read ended.
    let whole = berth
        .client()
        .get(&format!("{PROJECTS}/{name}/logs/0"))
        .json();
    assert!(whole["text"].as_str().unwrap().contains("answered"));
    let end = whole["nextOffset"].as_u64().unwrap();
    assert_eq!(end as usize, whole["text"].as_str().unwrap().len());
    let rest = berth
        .client()
        .get(&format!("{PROJECTS}/{name}/logs?offset={end}"))
        .json();
    assert_eq!(rest["text"], "");
    assert_eq!(rest["nextOffset"], end);
    assert_eq!(rest["runner"], "Exited");
    let last = berth.cli(&["logs", "--tail", "1", &name]);
    assert!(last.status.success(), "berth logs --tail 1: {last:?}");
    let last = String::from_utf8_lossy(&last.stdout).into_owned();
    assert_eq!(last.lines().count(), 1, "{last}");
    assert!(text.ends_with(&last), "{last}");
    // The runner has exited: following prints the log and ends.
    let followed = berth.cli(&["logs", "-f", &name]);
    assert!(followed.status.success(), "berth logs -f: {followed:?}");
    assert!(
        String::from_utf8_lossy(&followed.stdout).contains("shell agent: answered"),
        "{followed:?}"
    );

    // A boot after the brief is done does not hand it over again.
    reboot(&berth, &name, 2);
    assert_eq!(
        runner_starts(&berth, &name),
        2,
        "the done brief was handed over again"
    );
    assert!(exec(&name, "test -e /run/berth/shell.log").is_err());

    berth.delete_project(&name);
    delete_profile(&berth, &profile);
}

#[test]
fn pipeline_example_is_a_valid_project_for_the_shell_profile() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    for file in ["examples/agent/project.yaml", "manifests/agents/shell.yaml"] {
        let text = std::fs::read_to_string(format!("{dir}/{file}")).expect(file);
        let object: berth_api::Object =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        object
            .validate()
            .unwrap_or_else(|e| panic!("{file}: {e:?}"));
        if let berth_api::Object::Project(project) = &object {
            assert_eq!(project.spec.agent.as_deref(), Some("shell"));
            assert!(project.spec.brief.contains("BLOCK:"), "{file}");
        }
    }
}

#[test]
fn pipeline_secrets_reach_a_project_without_agent() {
    // Mirroring into LXD's `environment.*` is off by default; this daemon opts in.
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("berth.yaml");
    std::fs::write(&config, "secrets: {mirrorToLxd: true}\n").unwrap();
    let mut berth = Berth::start_with(&[], &["--config", config.to_str().unwrap()]);
    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-base"}));
    let project = berth.wait_ready(&name);
    assert_eq!(project["status"]["step"], "Reachable");

    berth.set_secret(&name, "PLAIN_TOKEN", "plain-value");
    wait_in_container(
        &name,
        "the secret in .env",
        "grep -q '^PLAIN_TOKEN=.*plain-value' /workspace/.env && test \"$(stat -c %a /workspace/.env)\" = 600",
    );
    wait_lxd_env(&name, "PLAIN_TOKEN", "plain-value");
    delete_secret(&berth, &name, "PLAIN_TOKEN");
    wait_in_container(
        &name,
        "the secret gone from .env",
        "! grep -q PLAIN_TOKEN /workspace/.env 2>/dev/null",
    );
    wait_lxd_env(&name, "PLAIN_TOKEN", "");
    berth.delete_project(&name);
}

#[test]
fn pipeline_a_secret_set_after_provisioning_stays_out_of_git() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    let url = git_repo(berth.dir.path());
    berth.create_project(&name, json!({"image": "berth-base", "repo": {"url": url}}));
    let project = berth.wait_ready(&name);
    assert_eq!(project["status"]["step"], "CheckedOut");
    assert_eq!(
        exec(&name, "git -C /workspace status --porcelain").unwrap(),
        ""
    );

    let out = berth.cli_input(
        &["secret", "set", &name, "LATE_TOKEN"],
        "late-value\n".as_bytes(),
    );
    assert!(out.status.success(), "berth secret set: {out:?}");
    wait_in_container(
        &name,
        "the secret in .env",
        "grep -q '^LATE_TOKEN=late-value$' /workspace/.env",
    );

    // The secret is nothing git would add, commit or push, and not the user's unsaved work.
    let hash = exec(&name, "sha256sum < /workspace/.env").unwrap();
    let hash = hash.split_whitespace().next().unwrap().to_string();
    berth.wait_for(&name, "the .env recorded as berth's", |p| {
        p["status"]["seededFiles"]["/workspace/.env"] == hash.as_str()
    });
    assert_eq!(
        exec(&name, "git -C /workspace status --porcelain").unwrap(),
        ""
    );
    assert_eq!(
        exec(&name, "git -C /workspace check-ignore .env").unwrap(),
        ".env\n"
    );
    assert_eq!(
        exec(
            &name,
            "git -C /workspace add -A && git -C /workspace diff --cached --name-only"
        )
        .unwrap(),
        ""
    );
    // Converging again lists it once.
    let out = berth.cli_input(
        &["secret", "set", &name, "OTHER_TOKEN"],
        "other\n".as_bytes(),
    );
    assert!(out.status.success(), "berth secret set: {out:?}");
    wait_in_container(
        &name,
        "the second secret in .env",
        "grep -q '^OTHER_TOKEN=other$' /workspace/.env",
    );
    assert_eq!(
        exec(&name, "grep -c '^/.env$' /workspace/.git/info/exclude")
            .unwrap()
            .trim(),
        "1"
    );
    berth.delete_project(&name);
}

#[test]
fn pipeline_a_new_brief_is_handed_to_the_running_agent() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    let profile = format!("shell-{}", &name[name.len() - 8..]);
    apply_profile(&berth, &profile);
    berth.create_project(
        &name,
        json!({"image": "berth-base", "agent": profile, "brief": "First brief\necho one\n"}),
    );
    let first = berth.wait_for(&name, "the first brief done", |p| {
        p["status"]["agent"]["state"] == "done" && p["status"]["step"] == "Briefed"
    });
    let first_id = first["status"]["briefId"].as_str().unwrap().to_string();
    assert_eq!(first["status"]["agent"]["briefId"], first_id.as_str());

    // Waits for the brief of the project's current generation to be acknowledged, failing if
    // status ever calls that generation Briefed for a brief the agent did not acknowledge.
    let briefed_anew = |what: &str, old: &str| -> Value {
        berth.wait_for(&name, what, |p| {
            let status = &p["status"];
            let current = status["observedGeneration"] == p["metadata"]["generation"];
            let ready = ready_reason(p).is_some_and(|(s, _)| s == "True");
            assert!(
                !(current && ready && status["briefId"] == old),
                "Ready for a brief the agent did not get: {status}"
            );
            if current && ready {
                assert_eq!(status["agent"]["briefId"], status["briefId"], "{status}");
            }
            current && ready && status["step"] == "Briefed"
        })
    };

    // The agent finished: the new brief gets a runner of its own.
    berth.patch_project(
        &name,
        json!({"spec": {"brief": "Second brief\necho two\n"}}),
    );
    let second = briefed_anew("briefed with the second brief", &first_id);
    let second_id = second["status"]["briefId"].as_str().unwrap().to_string();
    assert_ne!(second_id, first_id);
    wait_in_container(
        &name,
        "the second brief done",
        "grep -q '\"state\":\"done\"' /run/berth/agent.json",
    );
    assert_eq!(
        read_file(&name, "/run/berth/shell.log").unwrap(),
        "First brief\necho one\nSecond brief\necho two\n"
    );
    assert_eq!(
        read_file(&name, "/run/berth/brief.md").unwrap(),
        "Second brief\necho two\n"
    );
    assert_eq!(runner_starts(&berth, &name), 2);

    // The agent still works the third brief (it waits for an answer) when a fourth comes: no
    // second runner, and status says what it waits for.
    berth.patch_project(
        &name,
        json!({"spec": {"brief": "Third brief\nBLOCK: go on?\necho three\n"}}),
    );
    let third = briefed_anew("briefed with the third brief", &second_id);
    let third_id = third["status"]["briefId"].as_str().unwrap().to_string();
    berth.wait_for(&name, "blocked on the third brief", |p| {
        p["status"]["agent"]["state"] == "blocked"
    });
    berth.patch_project(
        &name,
        json!({"spec": {"brief": "Fourth brief\necho four\n"}}),
    );
    let waiting = berth.wait_for(&name, "waiting for the busy runner", |p| {
        p["status"]["observedGeneration"] == p["metadata"]["generation"]
            && ready_reason(p).is_some_and(|(s, r)| s == "False" && r == "RunnerBusy")
    });
    let message = waiting["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&third_id) && message.contains("berth answer"),
        "{message}"
    );
    assert_eq!(runner_starts(&berth, &name), 3);

    let out = berth.cli(&["answer", &name, "yes"]);
    assert!(out.status.success(), "berth answer: {out:?}");
    let fourth = briefed_anew("briefed with the fourth brief", &third_id);
    assert_ne!(fourth["status"]["briefId"], third_id.as_str());
    wait_in_container(
        &name,
        "the fourth brief done",
        "grep -q '\"state\":\"done\"' /run/berth/agent.json && grep -q '^echo four$' /run/berth/shell.log",
    );
    let log = read_file(&name, "/run/berth/shell.log").unwrap();
    assert!(
        log.ends_with("Third brief\nanswer: yes\necho three\nFourth brief\necho four\n"),
        "{log}"
    );
    assert_eq!(runner_starts(&berth, &name), 4);

    berth.delete_project(&name);
    delete_profile(&berth, &profile);
}

#[test]
fn pipeline_a_repository_agents_md_is_kept_and_the_seeds_not_applied_are_named() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    let profile = format!("shell-{}", &name[name.len() - 8..]);
    apply_profile(&berth, &profile);
    let theirs = "# The repository's own rules\n";
    let url = git_repo_with(berth.dir.path(), &[("AGENTS.md", theirs)]);
    berth.create_project(
        &name,
        json!({
            "image": "berth-base",
            "agent": profile,
            "repo": {"url": url},
            "seedFiles": [
                {"path": "AGENTS.md", "content": "project rules\n", "merge": "append"},
                {"path": "notes.txt", "content": "seeded\n"},
            ],
            "brief": "Keep brief\n",
        }),
    );
    let project = berth.wait_ready(&name);

    assert_eq!(read_file(&name, "/workspace/AGENTS.md").unwrap(), theirs);
    assert_eq!(
        read_file(&name, "/workspace/notes.txt").unwrap(),
        "seeded\n"
    );
    assert_eq!(
        exec(&name, "git -C /workspace status --porcelain").unwrap(),
        ""
    );
    let seeded = project["status"]["seededFiles"].as_object().unwrap();
    assert!(!seeded.contains_key("/workspace/AGENTS.md"), "{seeded:?}");
    let skipped: Vec<String> = events(&berth, &name)
        .into_iter()
        .filter(|(r, _)| r == "SeedSkipped")
        .map(|(_, m)| m)
        .collect();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    for named in [
        "kept /workspace/AGENTS.md",
        &format!("the instructions of profile {profile}"),
        "spec.seedFiles[0] (merge: append)",
        "merge: append adds only to instructions berth writes",
    ] {
        assert!(skipped[0].contains(named), "{named}: {}", skipped[0]);
    }
    berth.delete_project(&name);
    delete_profile(&berth, &profile);
}

#[test]
fn pipeline_a_stop_right_after_ready_is_no_sync_failure() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-base"}));
    berth.wait_ready(&name);
    // A secret set while the stop is under way is propagated once the container runs again,
    // not reported as a failure to reach it.
    let out = berth.cli(&["stop", &name]);
    assert!(out.status.success(), "berth stop: {out:?}");
    let out = berth.cli_input(
        &["secret", "set", &name, "STOP_TOKEN"],
        "after-stop\n".as_bytes(),
    );
    assert!(out.status.success(), "berth secret set: {out:?}");
    berth.wait_for(&name, "stopped", |p| p["status"]["phase"] == "Stopped");
    let out = berth.cli(&["start", &name]);
    assert!(out.status.success(), "berth start: {out:?}");
    wait_in_container(
        &name,
        "the secret in .env",
        "grep -q '^STOP_TOKEN=after-stop$' /workspace/.env",
    );
    let synced = berth.wait_for(&name, "Ready and synced", |p| {
        ready_reason(p).is_some_and(|(s, _)| s == "True")
            && condition(p, "SecretsSynced").is_some_and(|(s, _, _)| s == "True")
    });
    let failures: Vec<_> = events(&berth, &name)
        .into_iter()
        .filter(|(r, _)| r == "SecretsSyncFailed")
        .collect();
    assert!(failures.is_empty(), "{failures:?}\n{synced}");
    berth.delete_project(&name);
}

#[test]
fn pipeline_provisioned_names_a_failing_cli_until_it_is_there() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    let profile = format!("shell-{}", &name[name.len() - 8..]);
    let mut missing = shell_profile(&profile);
    missing["spec"]["install"]["check"] = json!("berth-test-cli --version");
    let reply = berth.client().post_json(PROFILES, &missing);
    assert_eq!(reply.status, 201, "create profile: {}", reply.text());
    berth.create_project(
        &name,
        json!({"image": "berth-base", "agent": profile, "brief": "Provision brief\n"}),
    );
    let failing = berth.wait_for(&name, "Provisioned=False", |p| {
        condition(p, "Provisioned").is_some_and(|(s, _, _)| s == "False")
    });
    let (_, reason, message) = condition(&failing, "Provisioned").unwrap();
    assert_eq!(reason, "InstallFailed");
    assert!(message.contains(&profile), "{message}");
    assert_ne!(ready_reason(&failing).unwrap().0, "True");

    // The profile learns how to install its CLI: the next bootstrap does, and says so.
    let install = "printf '#!/bin/sh\\necho test-cli 4.5.6\\n' >/usr/local/bin/berth-test-cli && chmod 755 /usr/local/bin/berth-test-cli";
    let reply = berth.client().request(
        "PATCH",
        &format!("{PROFILES}/{profile}"),
        Some("application/merge-patch+json"),
        json!({"spec": {"install": {"command": install}}})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(reply.status, 200, "patch profile: {}", reply.text());
    let ready = berth.wait_ready(&name);
    let (status, reason, message) = condition(&ready, "Provisioned").unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Bootstrapped"));
    assert_eq!(
        message,
        format!("verified {profile}: test-cli 4.5.6, installed now")
    );
    berth.delete_project(&name);
    delete_profile(&berth, &profile);
}

#[test]
fn pipeline_a_changed_profile_is_provisioned_again_without_a_second_runner() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    let profile = format!("shell-{}", &name[name.len() - 8..]);
    apply_profile(&berth, &profile);
    berth.create_project(
        &name,
        json!({"image": "berth-base", "agent": profile, "brief": "Only brief\necho one\n"}),
    );
    let first = berth.wait_for(&name, "the brief done", |p| {
        p["status"]["agent"]["state"] == "done" && p["status"]["step"] == "Briefed"
    });
    let revision = first["status"]["provisionedProfiles"][&profile].clone();
    assert!(revision.is_string(), "{}", first["status"]);
    assert_eq!(
        read_file(&name, "/workspace/AGENTS.md").unwrap(),
        "# Working here\nCommit your work.\n"
    );

    // New instructions in the profile reach the workspace; the finished brief is not handed
    // again and no second runner starts.
    let reply = berth.client().request(
        "PATCH",
        &format!("{PROFILES}/{profile}"),
        Some("application/merge-patch+json"),
        json!({"spec": {"instructions": {"content": "# Working here\nPush your work.\n"}}})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(reply.status, 200, "patch profile: {}", reply.text());
    let again = berth.wait_for(&name, "provisioned again and Ready", |p| {
        let status = &p["status"];
        status["provisionedProfiles"][&profile] != revision
            && ready_reason(p).is_some_and(|(s, _)| s == "True")
            && status["step"] == "Briefed"
    });
    assert_eq!(
        read_file(&name, "/workspace/AGENTS.md").unwrap(),
        "# Working here\nPush your work.\n"
    );
    assert_eq!(again["status"]["agent"]["state"], "done");
    assert_eq!(again["status"]["briefId"], first["status"]["briefId"]);
    assert!(
        event_messages(&berth, &name)
            .iter()
            .any(|m| m == "back to step Reachable (was Briefed)"),
        "{:?}",
        event_messages(&berth, &name)
    );
    assert_eq!(runner_starts(&berth, &name), 1);
    assert_eq!(
        read_file(&name, "/run/berth/shell.log").unwrap(),
        "Only brief\necho one\n"
    );

    berth.delete_project(&name);
    delete_profile(&berth, &profile);
}
