//! The workspace inspection against a real container (`berth-base`, real git): every git state
//! that holds unsaved work, files berth wrote, a workspace that is not a repository, a real
//! listener, CPU use, file changes, and that inspecting does not itself touch the repository.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::lxd::{
    BASE, Cleanup, OP_TIMEOUT, POOL, TINY, client, create, eventually, request, unique_name,
};
use berth::layout::disk_device;
use berth::lxd::LxdClient;
use berth::runtime::CreateVolume;
use berth::runtime::{ExecRequest, Runtime, StopOptions};
use berth::scheduler::policy::{Decision, Evidence, ReapSubject};
use berth::scheduler::reap::{Seen, recheck};
use berth::workspace::inspect::{
    Expected, InspectError, Inspection, KnownFiles, WorkspaceKind, inspect,
};
use berth::workspace::look::{inspect_in_place, inspect_stopped};
use berth_api::{AgentState, ProtectionReason, ReapAction, UnsavedWork};
use sha2::{Digest, Sha256};

/// Generous: on a loaded machine one exec round trip can take a minute.
const INSPECT_TIMEOUT: Duration = Duration::from_secs(180);

/// Booting several containers at once on a busy 2-core machine can outrun LXD's start
/// deadline, and each holds a Debian root filesystem: the tests of this file hold at most two
/// containers at a time (a test takes a slot before its cleanup guard, so it frees the slot only
/// after its container is gone).
static SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// Creates and starts a `berth-base` container and waits until its init has set up /run and
/// /workspace (`/run/init.ready`), so nothing the test writes races the boot.
async fn boot(lxd: &LxdClient, cleanup: &mut Cleanup) -> String {
    boot_image(lxd, cleanup, BASE).await
}

async fn boot_image(lxd: &LxdClient, cleanup: &mut Cleanup, image: &str) -> String {
    let name = unique_name();
    cleanup.instance(&name);
    cleanup.volume(POOL, &volume_of(&name));
    lxd.create_volume(&CreateVolume {
        pool: POOL.to_string(),
        name: volume_of(&name),
        size: None,
        config: BTreeMap::new(),
        target: None,
    })
    .await
    .expect("create the workspace volume");
    let mut create_request = request(&name, image);
    create_request.devices.insert(
        "workspace".into(),
        disk_device(POOL, &volume_of(&name), "/workspace"),
    );
    create(lxd, &create_request).await;
    // A loaded machine may take longer than one start deadline; starting is idempotent.
    let until = tokio::time::Instant::now() + OP_TIMEOUT * 2;
    while let Err(e) = lxd.start_instance(&name, OP_TIMEOUT).await {
        assert!(tokio::time::Instant::now() < until, "start {name}: {e}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eventually(OP_TIMEOUT, "init ready", || async {
        let mut ready =
            ExecRequest::new(["test", "-f", "/run/init.ready"], Duration::from_secs(30));
        ready.cwd = Some("/".into());
        lxd.exec(&name, &ready).await.is_ok_and(|o| o.success())
    })
    .await;
    name
}

/// The workspace volume of a test's container, mounted on /workspace as berth mounts it.
fn volume_of(name: &str) -> String {
    format!("{name}-workspace")
}

/// What the inspection of container `name` expects: its volume and `known`.
fn expect(name: &str, known: &KnownFiles) -> Expected {
    Expected {
        known: known.clone(),
        volume: volume_of(name),
        protect_ignored: Vec::new(),
        // The project's own repository, named as `workspace` names its origin.
        origin: Some("file:///berth-host/origin.git".to_string()),
    }
}

/// Runs a shell script in the container as root in /workspace and returns its stdout; panics
/// with its stderr when it fails.
async fn sh(lxd: &LxdClient, name: &str, script: &str) -> String {
    let mut request = ExecRequest::new(["sh", "-c", script], Duration::from_secs(60));
    request.env = BTreeMap::from([
        ("HOME".to_string(), "/root".to_string()),
        (
            "PATH".to_string(),
            "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin".to_string(),
        ),
        ("GIT_AUTHOR_NAME".into(), "t".into()),
        ("GIT_AUTHOR_EMAIL".into(), "t@example.invalid".into()),
        ("GIT_COMMITTER_NAME".into(), "t".into()),
        ("GIT_COMMITTER_EMAIL".into(), "t@example.invalid".into()),
    ]);
    request.cwd = Some("/workspace".into());
    let out = lxd.exec(name, &request).await.expect("exec");
    assert!(
        out.success(),
        "{script} exited {}: {}",
        out.exit_code,
        out.stderr_str()
    );
    out.stdout_str()
}

fn sha256(content: &str) -> String {
    hex::encode(Sha256::digest(content.as_bytes()))
}

async fn look(lxd: &LxdClient, name: &str, known: &KnownFiles) -> Inspection {
    match inspect(lxd, name, &expect(name, known), INSPECT_TIMEOUT).await {
        Ok(i) => i,
        Err(e) => panic!("inspection of {name} failed: {e}"),
    }
}

fn counts(uncommitted: u32, untracked: u32, stashes: u32, unpushed: u32) -> [u32; 4] {
    [uncommitted, untracked, stashes, unpushed]
}

/// The first four counts of `status.unsavedWork`; a test of the others says so.
fn work(unsaved: &UnsavedWork) -> [u32; 4] {
    assert_eq!(
        [unsaved.ignored, unsaved.modified_seeds, unsaved.worktrees],
        [0, 0, 0],
        "{unsaved:?}"
    );
    [
        unsaved.uncommitted,
        unsaved.untracked,
        unsaved.stashes,
        unsaved.unpushed,
    ]
}

/// A running `berth-base` container with /workspace cloned from a bare repository in /srv, so
/// it has a remote, one pushed commit and a clean tree. Its `origin` is then named by a path
/// that does not exist in the container, as a berth checkout's `file://` origin on the host:
/// a remote inside the container saves nothing, so its commits would count as unpushed.
async fn workspace(lxd: &LxdClient, cleanup: &mut Cleanup) -> String {
    let name = boot(lxd, cleanup).await;
    sh(
        lxd,
        &name,
        &format!(
            "git init -q --bare -b main /srv/origin.git \
             && git clone -q /srv/origin.git /workspace 2>/dev/null \
             && echo hello > README.md && git add README.md && git commit -qm first \
             && {PUSH} && git remote set-url origin file:///berth-host/origin.git"
        ),
    )
    .await;
    name
}

/// `git push origin main` to the origin that `workspace` names on the host: the commits go to
/// the bare repository in /srv, and the remote-tracking ref moves as a push would move it.
const PUSH: &str =
    "git push -q /srv/origin.git main && git update-ref refs/remotes/origin/main main";

#[tokio::test(flavor = "multi_thread")]
async fn inspection_sees_every_kind_of_unsaved_work() {
    let lxd = client().await;
    let _slot = SLOTS.acquire().await.expect("container slot");
    let mut cleanup = Cleanup::new();
    let name = workspace(&lxd, &mut cleanup).await;
    let agents_md = "# Instructions berth wrote\n";
    let known: KnownFiles = [("AGENTS.md".to_string(), sha256(agents_md))].into();

    let clean = look(&lxd, &name, &known).await;
    assert_eq!(clean.kind, WorkspaceKind::Git);
    assert_eq!(
        work(&clean.unsaved),
        counts(0, 0, 0, 0),
        "a pushed, clean clone"
    );
    assert_eq!(clean.agent, None);

    // A file berth wrote, still as written, is not unsaved work; edited, it is.
    sh(
        &lxd,
        &name,
        &format!("printf '{}' > AGENTS.md", agents_md.replace('\n', "\\n")),
    )
    .await;
    assert_eq!(
        work(&look(&lxd, &name, &known).await.unsaved),
        counts(0, 0, 0, 0)
    );
    // Edited, it is both untracked (not excluded here) and a modified seed.
    sh(&lxd, &name, "echo 'my own note' >> AGENTS.md").await;
    let edited = look(&lxd, &name, &known).await.unsaved;
    assert_eq!(
        (edited.untracked, edited.modified_seeds),
        (1, 1),
        "{edited:?}"
    );
    assert_eq!(edited.files, ["AGENTS.md"]);
    sh(&lxd, &name, "rm AGENTS.md").await;

    // Untracked, including one in a new directory, and an ignored file that does not count.
    sh(
        &lxd,
        &name,
        "mkdir -p src/deep && echo x > notes.txt && echo y > src/deep/new.rs \
         && echo build > .git/info/exclude && mkdir -p build && echo o > build/out.o",
    )
    .await;
    assert_eq!(
        work(&look(&lxd, &name, &known).await.unsaved),
        counts(0, 2, 0, 0)
    );
    sh(&lxd, &name, "rm -r notes.txt src").await;

    // Uncommitted change to a tracked file.
    sh(&lxd, &name, "echo changed >> README.md").await;
    assert_eq!(
        work(&look(&lxd, &name, &known).await.unsaved),
        counts(1, 0, 0, 0)
    );

    // Stashed: no longer uncommitted, but a stash.
    sh(&lxd, &name, "git stash -q").await;
    assert_eq!(
        work(&look(&lxd, &name, &known).await.unsaved),
        counts(0, 0, 1, 0)
    );
    sh(&lxd, &name, "git stash drop -q").await;
    assert_eq!(
        work(&look(&lxd, &name, &known).await.unsaved),
        counts(0, 0, 0, 0)
    );

    // A commit on the tracked branch, not pushed.
    sh(
        &lxd,
        &name,
        "echo more >> README.md && git commit -qam second",
    )
    .await;
    assert_eq!(
        work(&look(&lxd, &name, &known).await.unsaved),
        counts(0, 0, 0, 1)
    );
    sh(&lxd, &name, PUSH).await;
    assert_eq!(
        work(&look(&lxd, &name, &known).await.unsaved),
        counts(0, 0, 0, 0)
    );

    // A branch with no upstream at all.
    sh(
        &lxd,
        &name,
        "git checkout -qb feature && echo f > f.txt && git add f.txt && git commit -qm feat \
         && git checkout -q main",
    )
    .await;
    assert_eq!(
        work(&look(&lxd, &name, &known).await.unsaved),
        counts(0, 0, 0, 1)
    );
    sh(&lxd, &name, "git branch -qD feature").await;

    // A commit on a detached HEAD, on no branch at all.
    sh(
        &lxd,
        &name,
        "git checkout -q --detach && echo d > d.txt && git add d.txt && git commit -qm detached",
    )
    .await;
    assert_eq!(
        work(&look(&lxd, &name, &known).await.unsaved),
        counts(0, 0, 0, 1)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn inspection_does_not_touch_the_repository() {
    let lxd = client().await;
    let _slot = SLOTS.acquire().await.expect("container slot");
    let mut cleanup = Cleanup::new();
    let name = workspace(&lxd, &mut cleanup).await;
    // Same content, new mtime: a plain `git status` would refresh and rewrite the index.
    sh(&lxd, &name, "sleep 1.1; touch README.md").await;
    let before = sh(&lxd, &name, "stat -c %Y.%y .git/index; ls -a .git | sort").await;
    look(&lxd, &name, &KnownFiles::new()).await;
    look(&lxd, &name, &KnownFiles::new()).await;
    let after = sh(&lxd, &name, "stat -c %Y.%y .git/index; ls -a .git | sort").await;
    assert_eq!(before, after, "the inspection changed .git");
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_workspace_counts_files_berth_did_not_write() {
    let lxd = client().await;
    let _slot = SLOTS.acquire().await.expect("container slot");
    let mut cleanup = Cleanup::new();
    let name = workspace(&lxd, &mut cleanup).await;
    let env = "PORT=3000\n";
    sh(
        &lxd,
        &name,
        "rm -rf .git README.md && printf 'PORT=3000\\n' > .env.local",
    )
    .await;
    let known: KnownFiles = [(".env.local".to_string(), sha256(env))].into();
    let got = look(&lxd, &name, &known).await;
    assert_eq!(got.kind, WorkspaceKind::Plain);
    assert_eq!(
        work(&got.unsaved),
        counts(0, 0, 0, 0),
        "only files berth wrote"
    );

    // Nothing recorded: every file is the person's.
    assert_eq!(
        work(&look(&lxd, &name, &KnownFiles::new()).await.unsaved),
        counts(0, 1, 0, 0)
    );

    sh(
        &lxd,
        &name,
        "mkdir -p 'a dir' && echo x > 'a dir/my file.txt'",
    )
    .await;
    assert_eq!(
        work(&look(&lxd, &name, &known).await.unsaved),
        counts(0, 1, 0, 0)
    );
    // A file berth wrote, edited since, is judged by its hash: a modified seed.
    sh(&lxd, &name, "echo PORT=4000 > .env.local").await;
    let got = look(&lxd, &name, &known).await.unsaved;
    assert_eq!((got.untracked, got.modified_seeds), (1, 1), "{got:?}");
    assert!(got.files.contains(&".env.local".to_string()), "{got:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn inspection_reads_agent_ports_cpu_and_file_changes() {
    let lxd = client().await;
    let _slot = SLOTS.acquire().await.expect("container slot");
    let mut cleanup = Cleanup::new();
    let name = workspace(&lxd, &mut cleanup).await;
    sh(
        &lxd,
        &name,
        r#"printf '{"briefId":"b1","state":"blocked","title":"Fix the tests","message":"Which DB?","updatedAt":"2026-01-01T00:00:00Z"}' > /run/berth/agent.json"#,
    )
    .await;

    // A real listener on all addresses, port 3000, and one on loopback only.
    sh(
        &lxd,
        &name,
        "(setsid git daemon --listen=0.0.0.0 --port=3000 --base-path=/srv --detach \
            --pid-file=/tmp/d1.pid && \
          setsid git daemon --listen=127.0.0.1 --port=3001 --base-path=/srv --detach \
            --pid-file=/tmp/d2.pid) </dev/null >/dev/null 2>&1",
    )
    .await;
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    let first = loop {
        let got = look(&lxd, &name, &KnownFiles::new()).await;
        if got.ports == vec![3000] {
            break got;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "port 3000 never listed: {:?}",
            got.ports
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let agent = first.agent.clone().expect("agent status read");
    assert_eq!(agent.state, AgentState::Blocked);
    assert_eq!(agent.title.as_deref(), Some("Fix the tests"));
    assert_eq!(agent.message.as_deref(), Some("Which DB?"));

    // Inspecting an idle container twice: the inspection's own CPU is not counted.
    let quiet = look(&lxd, &name, &KnownFiles::new()).await;
    let quiet_again = look(&lxd, &name, &KnownFiles::new()).await;
    assert!(
        quiet_again.cpu.saturating_sub(quiet.cpu) < Duration::from_millis(500),
        "idle container used {:?} between inspections",
        quiet_again.cpu.saturating_sub(quiet.cpu)
    );

    // A busy process is seen.
    sh(
        &lxd,
        &name,
        "setsid sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & echo $! > /tmp/busy.pid",
    )
    .await;
    eventually(Duration::from_secs(60), "CPU use seen", || {
        let lxd = lxd.clone();
        let name = name.clone();
        let base = quiet_again.cpu;
        async move {
            look(&lxd, &name, &KnownFiles::new()).await.cpu > base + Duration::from_millis(500)
        }
    })
    .await;
    sh(&lxd, &name, "kill $(cat /tmp/busy.pid)").await;

    // A file change moves the newest mtime; a change inside .git does not.
    let before = quiet_again.newest_mtime.expect("newest mtime");
    sh(&lxd, &name, "sleep 1.1; touch .git/description").await;
    assert_eq!(
        look(&lxd, &name, &KnownFiles::new()).await.newest_mtime,
        Some(before)
    );
    sh(&lxd, &name, "echo new > README.md").await;
    let after = look(&lxd, &name, &KnownFiles::new()).await;
    assert!(after.newest_mtime.unwrap() > before);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_or_missing_container_fails_the_inspection() {
    let lxd = client().await;
    let missing = unique_name();
    let err = inspect(
        lxd.as_ref(),
        &missing,
        &expect(&missing, &KnownFiles::new()),
        INSPECT_TIMEOUT,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, InspectError::Exec(_)), "{err:?}");

    // No /workspace at all (the volume unmounted, the directory gone): could not tell, never
    // nothing to lose.
    let _slot = SLOTS.acquire().await.expect("container slot");
    let mut cleanup = Cleanup::new();
    let name = boot(&lxd, &mut cleanup).await;
    let mut rm = ExecRequest::new(
        ["sh", "-c", "umount /workspace && rmdir /workspace"],
        Duration::from_secs(60),
    );
    rm.cwd = Some("/".into());
    assert!(lxd.exec(&name, &rm).await.unwrap().success());
    let err = inspect(
        lxd.as_ref(),
        &name,
        &expect(&name, &KnownFiles::new()),
        INSPECT_TIMEOUT,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, InspectError::Exited { detail, .. } if detail == "workspace-not-mounted"),
        "{err:?}"
    );
}

/// What the reaper decides on a real workspace, through the re-check it makes right before
/// acting: an idle, clean, pushed workspace may be stopped; unsaved work, a blocked agent and a
/// workspace that cannot be inspected each hold it, and say why.
#[tokio::test(flavor = "multi_thread")]
async fn recheck_before_acting_on_real_workspaces() {
    let lxd = client().await;
    let _slot = SLOTS.acquire().await.expect("container slot");
    let mut cleanup = Cleanup::new();
    let name = workspace(&lxd, &mut cleanup).await;
    let known = expect(&name, &KnownFiles::new());
    let policy = berth_api::ReapPolicy {
        idle_after: Some("2h".parse().unwrap()),
        idle_action: Some(berth_api::IdleAction::Stop),
        max_age: Some("never".parse().unwrap()),
        protect_ignored: None,
    }
    .resolve();
    let now = chrono::Utc::now();
    // Created and last active long ago (the files' mtimes are now, which the re-check counts,
    // so the decision is made as of tomorrow).
    let subject = || ReapSubject {
        now: now + chrono::Duration::days(1),
        policy: &policy,
        created_at: now - chrono::Duration::days(3),
        last_active_at: Some(now - chrono::Duration::days(2)),
        ready_since: None,
        building: false,
        agent: AgentState::Done,
        evidence: Evidence::Failed,
        ever_reachable: true,
        stopped: false,
        previous_due: Some(ReapAction::Stop),
    };
    let decide = |label: &'static str| {
        let lxd = lxd.clone();
        let name = name.clone();
        let known = known.clone();
        let subject = subject();
        async move {
            let checked = recheck(
                lxd.as_ref(),
                &name,
                &known,
                INSPECT_TIMEOUT,
                subject,
                Seen::default(),
            )
            .await;
            assert!(
                !checked.booted,
                "{label}: a running container is not booted"
            );
            eprintln!(
                "{label}: {:?} from {:?}",
                checked.verdict.decision,
                checked.result.map(|i| i.unsaved)
            );
            checked.verdict.decision
        }
    };

    assert_eq!(
        decide("clean").await,
        Decision::Act {
            action: ReapAction::Stop
        }
    );

    sh(&lxd, &name, "echo wip >> README.md && git commit -qam wip").await;
    assert_eq!(
        decide("unpushed").await,
        Decision::Refuse {
            action: ReapAction::Stop,
            reasons: vec![ProtectionReason::UnsavedWork]
        }
    );
    sh(&lxd, &name, PUSH).await;

    sh(
        &lxd,
        &name,
        r#"printf '{"state":"blocked","message":"Which DB?"}' > /run/berth/agent.json"#,
    )
    .await;
    assert_eq!(
        decide("blocked").await,
        Decision::Refuse {
            action: ReapAction::Stop,
            reasons: vec![ProtectionReason::AgentBlocked]
        }
    );
    sh(&lxd, &name, "rm /run/berth/agent.json").await;

    // A repository git cannot read: could not tell, so it is kept.
    sh(
        &lxd,
        &name,
        "mv .git/HEAD .git/HEAD.moved && echo garbage > .git/HEAD",
    )
    .await;
    assert_eq!(
        decide("broken").await,
        Decision::Refuse {
            action: ReapAction::Stop,
            reasons: vec![ProtectionReason::InspectionFailed]
        }
    );
    sh(&lxd, &name, "mv .git/HEAD.moved .git/HEAD").await;
    assert_eq!(
        decide("repaired").await,
        Decision::Act {
            action: ReapAction::Stop
        }
    );
}

/// A stopped project is booted to be inspected and left stopped again, whatever was found.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_workspace_is_inspected_and_stopped_again() {
    let lxd = client().await;
    let _slot = SLOTS.acquire().await.expect("container slot");
    let mut cleanup = Cleanup::new();
    let name = workspace(&lxd, &mut cleanup).await;
    sh(&lxd, &name, "echo wip > wip.txt && sync").await;
    lxd.stop_instance(&name, StopOptions::clean_then_force(OP_TIMEOUT))
        .await
        .expect("stop");

    let got = inspect_stopped(
        lxd.as_ref(),
        &name,
        &expect(&name, &KnownFiles::new()),
        OP_TIMEOUT,
    )
    .await
    .expect("inspected");
    assert_eq!(work(&got.unsaved), counts(0, 1, 0, 0));
    let after = lxd.get_instance(&name).await.unwrap().expect("still there");
    assert!(!after.is_running(), "left running after its inspection");

    // Inspected where it is: a stopped container is booted for it and stopped again.
    let (got, booted) = inspect_in_place(
        lxd.as_ref(),
        &name,
        &expect(&name, &KnownFiles::new()),
        OP_TIMEOUT,
    )
    .await;
    assert!(booted);
    assert_eq!(work(&got.expect("inspected").unsaved), counts(0, 1, 0, 0));
    let after = lxd.get_instance(&name).await.unwrap().expect("still there");
    assert!(!after.is_running(), "left running after its inspection");
}

/// busybox has no `find -printf`: on the busybox image too a file change moves the newest mtime,
/// so file activity is seen there as well.
#[tokio::test(flavor = "multi_thread")]
async fn file_changes_are_seen_on_a_busybox_image() {
    let _slot = SLOTS.acquire().await.unwrap();
    let lxd = client().await;
    let mut cleanup = Cleanup::new();
    let name = boot_image(&lxd, &mut cleanup, TINY).await;
    sh(&lxd, &name, "echo draft > notes.txt").await;
    let before = look(&lxd, &name, &KnownFiles::new())
        .await
        .newest_mtime
        .expect("a newest mtime on busybox");
    sh(&lxd, &name, "sleep 1.1; echo more > notes.txt").await;
    let after = look(&lxd, &name, &KnownFiles::new()).await;
    assert!(
        after.newest_mtime.is_some_and(|t| t > before),
        "{:?} after {before}",
        after.newest_mtime
    );
}
