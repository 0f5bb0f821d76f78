//! Agent provisioning against a real LXD: bootstrap of profiles, a file:// checkout done once,
//! seeds written once, and the offline shell agent working a brief through a `BLOCK:` line.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::support::lxd::{BASE, OP_TIMEOUT, POOL, TINY, create, eventually, request, unique_name};
use berth::agent::{
    self, AgentError, CheckoutMode, CheckoutOutcome, InstallOutcome, RunnerOutcome, WrittenFiles,
};
use berth::file_roots::FileRoots;
use berth::lxd::{Endpoint, LxdClient, LxdConfig};
use berth::runtime::{CreateVolume, ExecRequest, ImageSource, Runtime, StopOptions};
use berth_api::{
    AgentInstall, AgentInstructions, AgentProfileSpec, AgentRunner, AgentState, CredentialRef,
    FileMode, MergeMode, ProjectSpec, Repo, RuntimeAsset, SeedFile,
};

/// A client on the local daemon. The shared daemon sometimes stalls for longer than one
/// connect's deadline while other suites load it, so connecting is retried until a generous
/// deadline; the test images must be there (`scripts/setup-lxd`).
async fn connect() -> Arc<LxdClient> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    let lxd = loop {
        match LxdClient::connect(LxdConfig::new(Endpoint::local())).await {
            Ok(lxd) => break lxd,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "LXD unreachable ({e}); run scripts/setup-lxd first"
                );
                eprintln!("LXD did not answer ({e}); retrying");
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
        }
    };
    for image in [BASE, TINY] {
        let found = lxd
            .resolve_image(&ImageSource::Alias(image.to_string()))
            .await
            .expect("resolve test image");
        assert!(
            found.is_some(),
            "LXD image {image} is missing; run scripts/setup-lxd first"
        );
    }
    Arc::new(lxd)
}

/// A running berth-base container with a fresh workspace volume at /workspace.
struct Workspace {
    lxd: Arc<LxdClient>,
    name: String,
    volume: Option<String>,
}

impl Drop for Workspace {
    /// Deletes the container and its volume, also when the test failed. The shared daemon can be
    /// slow to answer under load, so every call is retried until a generous deadline; on its own
    /// thread and runtime, so it works from inside the test's runtime.
    fn drop(&mut self) {
        let (name, volume) = (self.name.clone(), self.volume.take());
        let worker = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("cleanup runtime");
            runtime.block_on(async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
                let pause = || tokio::time::sleep(Duration::from_secs(2));
                let lxd = connect().await;
                let stop = StopOptions {
                    clean_timeout: Duration::ZERO,
                    force_after: true,
                };
                loop {
                    let stopped = match lxd.stop_instance(&name, stop).await {
                        Ok(()) => true,
                        Err(e) => e.is_not_found(),
                    };
                    if stopped && lxd.delete_instance(&name, OP_TIMEOUT).await.is_ok() {
                        break;
                    }
                    if tokio::time::Instant::now() > deadline {
                        eprintln!("cleanup: could not delete instance {name}");
                        return;
                    }
                    pause().await;
                }
                let Some(volume) = volume else { return };
                while let Err(e) = lxd.delete_volume(POOL, &volume, None).await {
                    if tokio::time::Instant::now() > deadline {
                        eprintln!("cleanup: could not delete volume {volume}: {e}");
                        return;
                    }
                    pause().await;
                }
            });
        });
        let _ = worker.join();
    }
}

impl Workspace {
    async fn new() -> Workspace {
        Workspace::from_image(BASE, true).await
    }

    async fn from_image(image: &str, with_volume: bool) -> Workspace {
        let lxd = connect().await;
        let name = unique_name();
        let mut req = request(&name, image);
        let volume = with_volume.then(|| format!("{name}-workspace"));
        if let Some(volume) = &volume {
            lxd.create_volume(&CreateVolume {
                pool: POOL.into(),
                name: volume.clone(),
                ..Default::default()
            })
            .await
            .expect("create workspace volume");
            req.devices.insert(
                "workspace".into(),
                [
                    ("type", "disk"),
                    ("pool", POOL),
                    ("source", volume.as_str()),
                    ("path", "/workspace"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            );
        }
        // From here on a failure still deletes what was created.
        let ws = Workspace {
            lxd: lxd.clone(),
            name: name.clone(),
            volume,
        };
        create(&lxd, &req).await;
        // A start can fail while the shared daemon is overloaded (its pre-start hook times
        // out, then the instance is busy stopping); what these tests check begins after the
        // start, so retry it with a pause until a generous deadline.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
        while let Err(e) = lxd.start_instance(&name, OP_TIMEOUT).await {
            assert!(tokio::time::Instant::now() < deadline, "start {name}: {e}");
            eprintln!("start {name}: {e}; retrying");
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let ready = || async { ws.init_ready().await };
        eventually(Duration::from_secs(60), "the container's init", ready).await;
        ws
    }

    fn rt(&self) -> &dyn Runtime {
        self.lxd.as_ref()
    }

    /// Whether the container's init finished its set-up. An exec that fails while the container
    /// is still coming up (or the daemon is busy) is "not yet", not a failure.
    async fn init_ready(&self) -> bool {
        let check = ExecRequest::new(["test", "-f", "/run/init.ready"], Duration::from_secs(30));
        matches!(self.lxd.exec(&self.name, &check).await, Ok(out) if out.success())
    }

    /// Exit code and stdout of a shell command inside.
    async fn sh(&self, script: &str) -> (i32, String) {
        let out = self
            .lxd
            .exec(
                &self.name,
                &ExecRequest::new(["sh", "-c", script], Duration::from_secs(60)),
            )
            .await
            .expect("exec");
        (out.exit_code, out.stdout_str())
    }

    /// Stdout of a command that must succeed.
    async fn ok(&self, script: &str) -> String {
        let (code, out) = self.sh(script).await;
        assert_eq!(code, 0, "{script} exited {code}: {out}");
        out
    }
}

fn secrets(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn shell_profile() -> AgentProfileSpec {
    AgentProfileSpec {
        home: "/root/.berth-shell".into(),
        install: AgentInstall {
            check: "test -x /usr/local/lib/berth/shell-agent".into(),
            command: None,
            version: None,
        },
        instructions: Some(AgentInstructions {
            target: "AGENTS.md".into(),
            content: "Work the brief line by line.\n".into(),
        }),
        runner: AgentRunner {
            command: vec![
                "/usr/local/lib/berth/shell-agent".into(),
                "{briefFile}".into(),
            ],
            protocol: Default::default(),
        },
        ..AgentProfileSpec::default()
    }
}

/// A profile whose CLI is missing until its install command writes it.
fn installable_profile() -> AgentProfileSpec {
    AgentProfileSpec {
        home: "/root/.fake".into(),
        install: AgentInstall {
            check: "fake-cli --version".into(),
            command: Some(
                "printf '#!/bin/sh\\necho fake 1.2.3\\n' >/usr/local/bin/fake-cli && chmod 755 /usr/local/bin/fake-cli"
                    .into(),
            ),
            version: Some("1.2.3".into()),
        },
        credentials: vec![CredentialRef {
            secret: "FAKE_TOKEN".into(),
        }],
        runtime_assets: vec![RuntimeAsset {
            path: "/root/.fake/conf/settings.json".into(),
            content: "{\"model\": \"x\"}\n".into(),
            mode: Some(FileMode::new(0o640).unwrap()),
        }],
        instructions: Some(AgentInstructions {
            target: "CLAUDE.md".into(),
            content: "Fake rules.\n".into(),
        }),
        runner: AgentRunner {
            command: vec!["fake-cli".into()],
            protocol: Default::default(),
        },
        ..AgentProfileSpec::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bootstrap_verifies_installs_and_places_files_outside_the_workspace() {
    let ws = Workspace::new().await;
    let shell = shell_profile();
    let fake = installable_profile();
    let profiles = [("shell", &shell), ("fake", &fake)];
    let values = secrets(&[("FAKE_TOKEN", "tok'en $1"), ("UNUSED", "x")]);

    // A missing credential fails before anything is written, naming the key only.
    let err = agent::bootstrap(ws.rt(), &ws.name, &profiles, &BTreeMap::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::CredentialMissing { key, .. } if key == "FAKE_TOKEN"),
        "{err}"
    );
    assert_eq!(err.reason(), "CredentialMissing");
    assert_eq!(ws.sh("test -e /usr/local/lib/berth").await.0, 1);

    let report = agent::bootstrap(ws.rt(), &ws.name, &profiles, &values)
        .await
        .unwrap();
    let outcomes: Vec<_> = report.profiles.iter().map(|p| p.install).collect();
    assert_eq!(
        outcomes,
        [InstallOutcome::Present, InstallOutcome::Installed]
    );
    assert_eq!(report.profiles[1].credentials, ["FAKE_TOKEN"]);
    // What the checks printed, for the version found: the shell check prints nothing.
    let reported: Vec<_> = report
        .profiles
        .iter()
        .map(|p| p.reported.as_deref())
        .collect();
    assert_eq!(reported, [None, Some("fake 1.2.3")]);
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert_eq!(ws.ok("fake-cli --version").await, "fake 1.2.3\n");
    assert_eq!(
        ws.ok("stat -c %a /usr/local/lib/berth/shell-agent /usr/local/lib/berth/runner /root/.fake/conf/settings.json /root/.fake/.berth-credentials.env")
            .await,
        "755\n755\n640\n600\n"
    );
    assert_eq!(
        ws.ok("cat /root/.fake/conf/settings.json").await,
        "{\"model\": \"x\"}\n"
    );
    // The credentials file is a shell file that yields the exact value.
    assert_eq!(
        ws.ok(". /root/.fake/.berth-credentials.env && printf '%s' \"$FAKE_TOKEN\"")
            .await,
        "tok'en $1"
    );
    assert_eq!(
        ws.ok("grep -c UNUSED /root/.fake/.berth-credentials.env || true")
            .await,
        "0\n"
    );
    // Nothing under /workspace before the checkout.
    assert_eq!(ws.ok("ls -A /workspace").await, "");

    // Again: everything is present, nothing changes.
    let again = agent::bootstrap(ws.rt(), &ws.name, &profiles, &values)
        .await
        .unwrap();
    let outcomes: Vec<_> = again.profiles.iter().map(|p| p.install).collect();
    assert_eq!(outcomes, [InstallOutcome::Present, InstallOutcome::Present]);

    // Secrets propagation: a changed value is rewritten, a deleted one leaves no copy behind.
    let changed = secrets(&[("FAKE_TOKEN", "r0tated-v4lue")]);
    let missing = agent::sync_credentials(ws.rt(), &ws.name, &profiles, &changed)
        .await
        .unwrap();
    assert!(missing.is_empty(), "{missing:?}");
    assert_eq!(
        ws.ok(". /root/.fake/.berth-credentials.env && printf '%s' \"$FAKE_TOKEN\"")
            .await,
        "r0tated-v4lue"
    );
    let missing = agent::sync_credentials(ws.rt(), &ws.name, &profiles, &BTreeMap::new())
        .await
        .unwrap();
    assert_eq!(missing, ["fake/FAKE_TOKEN"]);
    assert_eq!(
        ws.sh("test -e /root/.fake/.berth-credentials.env").await.0,
        1
    );
    assert_eq!(
        ws.ok("grep -rl r0tated-v4lue /root /usr/local/lib/berth || true")
            .await,
        ""
    );

    // A profile whose install does not make the check pass fails with its reason.
    let mut broken = installable_profile();
    broken.install.check = "test -x /nonexistent/tool".into();
    broken.install.command = Some("echo installing; echo no mirror reachable >&2; exit 7".into());
    let err = agent::bootstrap(ws.rt(), &ws.name, &[("broken", &broken)], &values)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "InstallFailed");
    assert!(err.to_string().contains("no mirror reachable"), "{err}");
    let mut no_install = broken.clone();
    no_install.install.command = None;
    let err = agent::bootstrap(ws.rt(), &ws.name, &[("bare", &no_install)], &values)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "InstallFailed");
    assert!(err.to_string().contains("no install.command"), "{err}");
}

/// A host repository with commits on `main` and `feature`.
fn host_repo(dir: &Path) -> String {
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args([
                "-c",
                "init.defaultBranch=main",
                "-c",
                "commit.gpgsign=false",
            ])
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .expect("run git");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    git(&["init", "-q"]);
    std::fs::write(dir.join("README.md"), "hello\n").unwrap();
    std::fs::write(dir.join(".gitignore"), "target/\n").unwrap();
    git(&["add", "."]);
    git(&["commit", "-qm", "first"]);
    git(&["checkout", "-qb", "feature"]);
    std::fs::write(dir.join("feature.txt"), "wip\n").unwrap();
    git(&["add", "."]);
    git(&["commit", "-qm", "feature"]);
    git(&["checkout", "-q", "main"]);
    format!("file://{}", dir.display())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_repository_is_checked_out_once_with_origin_and_offline_unpushed_detection() {
    let ws = Workspace::new().await;
    let host = tempfile::tempdir().unwrap();
    let url = host_repo(host.path());
    let repo = Repo {
        url: url.clone(),
        branch: Some("feature".into()),
    };

    match agent::checkout(
        ws.rt(),
        &ws.name,
        &repo,
        &FileRoots::default(),
        &WrittenFiles::default(),
        CheckoutMode::Careful,
    )
    .await
    .unwrap()
    {
        CheckoutOutcome::Cloned { branch, head } => {
            assert_eq!(branch.as_deref(), Some("feature"));
            assert_eq!(head.len(), 40, "{head}");
        }
        other => panic!("first checkout: {other:?}"),
    }
    assert_eq!(ws.ok("cat /workspace/feature.txt").await, "wip\n");
    assert_eq!(
        ws.ok("git -C /workspace remote get-url origin")
            .await
            .trim(),
        url
    );
    assert_eq!(
        ws.ok("git -C /workspace status --porcelain").await,
        "",
        "a fresh checkout is clean"
    );
    // Remote-tracking refs exist, so unpushed commits show offline.
    assert_eq!(
        ws.ok("git -C /workspace rev-list --branches --not --remotes")
            .await,
        ""
    );
    assert!(
        ws.ok("git -C /workspace branch -r")
            .await
            .contains("origin/main")
    );
    ws.ok("cd /workspace && echo more >>feature.txt && git -c user.name=a -c user.email=a@example.invalid commit -qam local")
        .await;
    assert_eq!(
        ws.ok("git -C /workspace rev-list --branches --not --remotes")
            .await
            .lines()
            .count(),
        1
    );
    // No scratch directory or bundle left behind.
    assert_eq!(
        ws.sh("test -e /workspace/.berth-checkout || test -e /tmp/berth-checkout.bundle")
            .await
            .0,
        1
    );

    // Once: a second call keeps the checkout and its local commit.
    assert_eq!(
        agent::checkout(
            ws.rt(),
            &ws.name,
            &repo,
            &FileRoots::default(),
            &WrittenFiles::default(),
            CheckoutMode::Careful
        )
        .await
        .unwrap(),
        CheckoutOutcome::Kept
    );
    assert_eq!(
        ws.ok("git -C /workspace log -1 --format=%s").await,
        "local\n"
    );

    // A missing host path fails with the checkout's reason.
    let ws2 = Workspace::new().await;
    let missing = Repo {
        url: format!("file://{}/nope", host.path().display()),
        branch: None,
    };
    let err = agent::checkout(
        ws2.rt(),
        &ws2.name,
        &missing,
        &FileRoots::default(),
        &WrittenFiles::default(),
        CheckoutMode::Careful,
    )
    .await
    .unwrap_err();
    assert_eq!(err.reason(), "CheckoutFailed", "{err}");
    assert_eq!(ws2.sh("test -e /workspace/.git").await.0, 1);
}

/// A repository named under allowedFileRoots is bundled through the git directory it resolves
/// to; one that leads outside them (a link, a `gitdir:` file, alternates) is not bundled at all.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_repository_under_the_roots_is_checked_out_only_while_it_stays_under_them() {
    let host = tempfile::tempdir().unwrap();
    let allowed = host.path().join("allowed");
    let outside = host.path().join("outside");
    std::fs::create_dir_all(allowed.join("app")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    host_repo(&allowed.join("app"));
    host_repo(&outside);
    std::fs::write(outside.join("SECRET.txt"), "host secret\n").unwrap();
    let roots = FileRoots::new(vec![allowed.clone()]);

    let ws = Workspace::new().await;
    let escapes = {
        let link = allowed.join("link");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let gitfile = allowed.join("gitfile");
        std::fs::create_dir_all(&gitfile).unwrap();
        std::fs::write(
            gitfile.join(".git"),
            format!("gitdir: {}\n", outside.join(".git").display()),
        )
        .unwrap();
        let borrower = allowed.join("borrower");
        std::fs::create_dir_all(&borrower).unwrap();
        host_repo(&borrower);
        std::fs::write(
            borrower.join(".git/objects/info/alternates"),
            format!("{}\n", outside.join(".git/objects").display()),
        )
        .unwrap();
        [link, gitfile, borrower]
    };
    for escape in escapes {
        let repo = Repo {
            url: format!("file://{}", escape.display()),
            branch: None,
        };
        let err = agent::checkout(
            ws.rt(),
            &ws.name,
            &repo,
            &roots,
            &WrittenFiles::default(),
            CheckoutMode::Careful,
        )
        .await
        .unwrap_err();
        assert_eq!(err.reason(), "CheckoutFailed", "{err}");
        assert!(
            err.to_string().contains("not under allowedFileRoots"),
            "{}: {err}",
            escape.display()
        );
        assert_eq!(ws.sh("test -e /workspace/.git").await.0, 1);
        assert_eq!(ws.sh("test -e /tmp/berth-checkout.bundle").await.0, 1);
    }

    // The repository that stays under the root is checked out through its resolved git dir.
    let repo = Repo {
        url: format!("file://{}", allowed.join("app").display()),
        branch: Some("feature".into()),
    };
    match agent::checkout(
        ws.rt(),
        &ws.name,
        &repo,
        &roots,
        &WrittenFiles::default(),
        CheckoutMode::Careful,
    )
    .await
    .unwrap()
    {
        CheckoutOutcome::Cloned { branch, .. } => assert_eq!(branch.as_deref(), Some("feature")),
        other => panic!("checkout under the root: {other:?}"),
    }
    assert_eq!(ws.ok("cat /workspace/feature.txt").await, "wip\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn seeds_are_written_once_with_modes_append_env_block_and_recorded_hashes() {
    let ws = Workspace::new().await;
    let host = tempfile::tempdir().unwrap();
    let repo = Repo {
        url: host_repo(host.path()),
        branch: None,
    };
    agent::checkout(
        ws.rt(),
        &ws.name,
        &repo,
        &FileRoots::default(),
        &WrittenFiles::default(),
        CheckoutMode::Careful,
    )
    .await
    .unwrap();
    // The user keeps their own lines in .env.
    ws.ok("printf 'MINE=kept\\n' >/workspace/.env").await;

    let shell = shell_profile();
    let fake = installable_profile();
    let profiles = [("shell", &shell), ("fake", &fake)];
    let mut spec = ProjectSpec {
        env: secrets(&[("NODE_ENV", "development")]),
        seed_files: vec![
            SeedFile {
                path: "AGENTS.md".into(),
                content: "Project rules.\n".into(),
                mode: None,
                merge: Some(MergeMode::Append),
            },
            SeedFile {
                path: "scripts/dev.sh".into(),
                content: "#!/bin/sh\necho dev\n".into(),
                mode: Some(FileMode::new(0o755).unwrap()),
                merge: None,
            },
        ],
        ..ProjectSpec::default()
    };
    let values = secrets(&[("API_TOKEN", "s3cret value")]);
    let no_skills = agent::SkillSet::default();

    let first = agent::seed(
        ws.rt(),
        &ws.name,
        &spec,
        agent::SeedInputs {
            profiles: &profiles,
            skills: &no_skills,
            capabilities: &Default::default(),
            secrets: &values,
            previous: &WrittenFiles::default(),
        },
    )
    .await
    .unwrap();
    assert!(first.warnings.is_empty(), "{:?}", first.warnings);
    assert_eq!(
        ws.ok("cat /workspace/AGENTS.md").await,
        "Work the brief line by line.\nProject rules.\n"
    );
    assert_eq!(ws.ok("cat /workspace/CLAUDE.md").await, "Fake rules.\n");
    assert_eq!(
        ws.ok("stat -c '%a %n' /workspace/AGENTS.md /workspace/CLAUDE.md /workspace/scripts/dev.sh /workspace/.env")
            .await,
        "644 /workspace/AGENTS.md\n644 /workspace/CLAUDE.md\n755 /workspace/scripts/dev.sh\n600 /workspace/.env\n"
    );
    let env = ws.ok("cat /workspace/.env").await;
    assert!(env.starts_with("MINE=kept\n"), "{env}");
    assert!(
        env.contains("\nAPI_TOKEN='s3cret value'\nNODE_ENV=development\n"),
        "{env}"
    );
    // The record holds what sha256sum says inside, for every file berth wrote.
    let sums = ws
        .ok("cd /workspace && sha256sum AGENTS.md CLAUDE.md scripts/dev.sh .env")
        .await;
    for line in sums.lines() {
        let (hash, file) = line.split_once("  ").unwrap();
        let path = format!("/workspace/{file}");
        assert_eq!(first.written.get(&path), Some(hash), "{path}");
    }
    assert_eq!(first.written.files.len(), 4);
    // Listed in .git/info/exclude, so the checkout still looks clean to git.
    assert_eq!(ws.ok("git -C /workspace status --porcelain").await, "");

    // Again with the same spec: nothing is written, the record is the same.
    let second = agent::seed(
        ws.rt(),
        &ws.name,
        &spec,
        agent::SeedInputs {
            profiles: &profiles,
            skills: &no_skills,
            capabilities: &Default::default(),
            secrets: &values,
            previous: &first.written,
        },
    )
    .await
    .unwrap();
    assert!(second.changed.is_empty(), "{:?}", second.changed);
    assert_eq!(second.written, first.written);
    assert_eq!(
        ws.ok("grep -c dev.sh /workspace/.git/info/exclude").await,
        "1\n"
    );

    // The user edits a seed file; a changed spec rewrites only the untouched one.
    ws.ok("echo 'echo mine' >>/workspace/scripts/dev.sh").await;
    spec.seed_files[1].content = "#!/bin/sh\necho dev v2\n".into();
    spec.seed_files[0].content = "Project rules v2.\n".into();
    let third = agent::seed(
        ws.rt(),
        &ws.name,
        &spec,
        agent::SeedInputs {
            profiles: &profiles,
            skills: &no_skills,
            capabilities: &Default::default(),
            secrets: &secrets(&[]),
            previous: &second.written,
        },
    )
    .await
    .unwrap();
    assert_eq!(third.changed, ["/workspace/AGENTS.md", "/workspace/.env"]);
    assert_eq!(third.warnings.len(), 1, "{:?}", third.warnings);
    assert!(third.warnings[0].contains("scripts/dev.sh"));
    assert!(
        ws.ok("cat /workspace/scripts/dev.sh")
            .await
            .ends_with("echo mine\n")
    );
    // berth keeps the record of what it wrote there, so the person's edit counts as work.
    assert_eq!(
        third.written.files.get("/workspace/scripts/dev.sh"),
        second.written.files.get("/workspace/scripts/dev.sh")
    );
    assert!(
        ws.ok("cat /workspace/AGENTS.md")
            .await
            .ends_with("Project rules v2.\n")
    );
    // A deleted secret leaves the managed block; the user's line stays.
    let env = ws.ok("cat /workspace/.env").await;
    assert!(
        env.contains("MINE=kept") && !env.contains("s3cret"),
        "{env}"
    );

    // Secrets propagation touches .env only: a new secret appears, then is removed again.
    let (with_secret, changed) = agent::sync_env(
        ws.rt(),
        &ws.name,
        &spec.env,
        &secrets(&[("NEW_KEY", "n3w")]),
        &third.written,
    )
    .await
    .unwrap();
    assert!(changed);
    let env = ws.ok("cat /workspace/.env").await;
    assert!(
        env.contains("NEW_KEY=n3w") && env.contains("MINE=kept"),
        "{env}"
    );
    assert_eq!(ws.ok("stat -c %a /workspace/.env").await, "600\n");
    let sum = ws.ok("sha256sum /workspace/.env").await;
    assert_eq!(
        with_secret.get("/workspace/.env"),
        sum.split_whitespace().next()
    );
    let (without, _) = agent::sync_env(ws.rt(), &ws.name, &spec.env, &secrets(&[]), &with_secret)
        .await
        .unwrap();
    assert!(!ws.ok("cat /workspace/.env").await.contains("n3w"));
    assert_eq!(without.files.len(), with_secret.files.len());
    // The other seeded files were not touched.
    assert!(
        ws.ok("cat /workspace/scripts/dev.sh")
            .await
            .ends_with("echo mine\n")
    );

    // A seed path that is a symbolic link out of the workspace is refused, not written through.
    ws.ok("ln -s /etc /workspace/etc-link").await;
    spec.seed_files.push(SeedFile {
        path: "etc-link/berth-was-here".into(),
        content: "x".into(),
        mode: None,
        merge: None,
    });
    let err = agent::seed(
        ws.rt(),
        &ws.name,
        &spec,
        agent::SeedInputs {
            profiles: &profiles,
            skills: &no_skills,
            capabilities: &Default::default(),
            secrets: &values,
            previous: &third.written,
        },
    )
    .await
    .unwrap_err();
    assert_eq!(err.reason(), "SeedFailed", "{err}");
    assert_eq!(ws.sh("test -e /etc/berth-was-here").await.0, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shell_agent_works_a_brief_through_a_block_and_an_answer() {
    let ws = Workspace::new().await;
    let shell = shell_profile();
    agent::bootstrap(ws.rt(), &ws.name, &[("shell", &shell)], &BTreeMap::new())
        .await
        .unwrap();
    assert_eq!(
        agent::read_agent_status(ws.rt(), &ws.name).await.unwrap(),
        None
    );
    assert_eq!(
        agent::runner_log(ws.rt(), &ws.name, 4096).await.unwrap(),
        ""
    );

    let brief = "Fix the flaky checkout test\nlook at the CI logs\nBLOCK: Which database should I use?\nwrite the fix\n";
    let env = secrets(&[("NODE_ENV", "development")]);
    let values = secrets(&[("API_TOKEN", "t0ken")]);
    let started = agent::start_runner(ws.rt(), &ws.name, &shell, "brief-1", brief, &env, &values)
        .await
        .unwrap();
    let RunnerOutcome::Started { pid } = started else {
        panic!("first start: {started:?}");
    };
    // A second start in the same boot does nothing: for the same brief it was done, and
    // another brief waits while this one's runner works.
    match agent::start_runner(ws.rt(), &ws.name, &shell, "brief-1", brief, &env, &values)
        .await
        .unwrap()
    {
        RunnerOutcome::AlreadyStarted {
            pid: again,
            running,
        } => {
            assert_eq!(again, pid);
            assert!(running, "the runner is working its brief");
        }
        other => panic!("second start: {other:?}"),
    }
    match agent::start_runner(ws.rt(), &ws.name, &shell, "brief-2", "other", &env, &values)
        .await
        .unwrap()
    {
        RunnerOutcome::Busy {
            pid: again,
            brief_id,
        } => {
            assert_eq!(again, pid);
            assert_eq!(brief_id, "brief-1");
        }
        other => panic!("start of another brief: {other:?}"),
    }
    assert_eq!(ws.ok("cat /run/berth/brief.md").await, brief);

    let blocked = || async {
        agent::read_agent_status(ws.rt(), &ws.name)
            .await
            .unwrap()
            .is_some_and(|r| r.status.state == AgentState::Blocked)
    };
    eventually(Duration::from_secs(60), "the agent to block", blocked).await;
    let report = agent::read_agent_status(ws.rt(), &ws.name)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.status.message, "Which database should I use?");
    assert_eq!(report.status.brief_id.as_deref(), Some("brief-1"));
    assert_eq!(report.title.as_deref(), Some("Fix the flaky checkout test"));
    assert!(report.status.updated_at.is_some());
    // The runner has the project's environment and secrets.
    let environ = ws.ok(&format!("tr '\\0' '\\n' </proc/{pid}/environ")).await;
    assert!(environ.contains("NODE_ENV=development\n"), "{environ}");
    assert!(environ.contains("API_TOKEN=t0ken\n"));
    assert!(environ.contains("BERTH_BRIEF_ID=brief-1\n"));

    agent::answer(ws.rt(), &ws.name, "Postgres, please")
        .await
        .unwrap();
    let done = || async {
        agent::read_agent_status(ws.rt(), &ws.name)
            .await
            .unwrap()
            .is_some_and(|r| r.status.state == AgentState::Done)
    };
    eventually(Duration::from_secs(60), "the agent to finish", done).await;
    assert_eq!(
        ws.ok("cat /run/berth/shell.log").await,
        "Fix the flaky checkout test\nlook at the CI logs\nanswer: Postgres, please\nwrite the fix\n"
    );
    let log_done = || async {
        agent::runner_log(ws.rt(), &ws.name, 1 << 20)
            .await
            .unwrap()
            .contains("runner exited with status 0")
    };
    eventually(Duration::from_secs(30), "the runner to exit", log_done).await;
    let log = agent::runner_log(ws.rt(), &ws.name, 1 << 20).await.unwrap();
    assert!(
        log.contains("shell agent: blocked: Which database should I use?"),
        "{log}"
    );
    assert!(log.contains("shell agent: done"), "{log}");
    assert!(!log.contains("t0ken"), "{log}");
    let tail = agent::runner_log(ws.rt(), &ws.name, 10).await.unwrap();
    assert_eq!(tail.len(), 10);
    // Following the log in pieces yields the whole log, then nothing new.
    let mut followed = String::new();
    let mut offset = 0;
    loop {
        let chunk = agent::runner_log_from(ws.rt(), &ws.name, offset, 64)
            .await
            .unwrap();
        if chunk.text.is_empty() {
            break;
        }
        assert!(chunk.text.len() <= 64);
        followed.push_str(&chunk.text);
        offset = chunk.next_offset;
    }
    assert_eq!(followed, log);
    // An offset past the end (the log was r0tated-v4lue) starts over.
    let again = agent::runner_log_from(ws.rt(), &ws.name, offset + 1000, 1 << 20)
        .await
        .unwrap();
    assert_eq!(again.text, log);

    // Finished, still the same boot: no second runner.
    assert!(matches!(
        agent::start_runner(ws.rt(), &ws.name, &shell, "brief-1", brief, &env, &values)
            .await
            .unwrap(),
        RunnerOutcome::AlreadyStarted { running: false, .. }
    ));

    // A new brief once the runner exited: a runner of its own, without the answer left over.
    agent::answer(ws.rt(), &ws.name, "stale").await.unwrap();
    let second = "Second brief\nsecond line\n";
    let started = agent::start_runner(ws.rt(), &ws.name, &shell, "brief-2", second, &env, &values)
        .await
        .unwrap();
    assert!(
        matches!(started, RunnerOutcome::Started { pid: new } if new != pid),
        "{started:?}"
    );
    assert_eq!(ws.ok("cat /run/berth/brief.md").await, second);
    let second_done = || async {
        agent::read_agent_status(ws.rt(), &ws.name)
            .await
            .unwrap()
            .is_some_and(|r| {
                r.status.state == AgentState::Done
                    && r.status.brief_id.as_deref() == Some("brief-2")
            })
    };
    eventually(
        Duration::from_secs(60),
        "the second brief done",
        second_done,
    )
    .await;
    assert!(
        ws.ok("cat /run/berth/shell.log")
            .await
            .ends_with("second line\n")
    );
    assert_eq!(ws.sh("test -e /run/berth/answer").await.0, 1);

    // After a reboot /run is fresh: the runner starts again.
    ws.lxd
        .restart_instance(&ws.name, false, OP_TIMEOUT)
        .await
        .unwrap();
    let ready = || async { ws.init_ready().await };
    eventually(Duration::from_secs(60), "the container's init", ready).await;
    assert_eq!(
        agent::read_agent_status(ws.rt(), &ws.name).await.unwrap(),
        None
    );
    assert!(matches!(
        agent::start_runner(ws.rt(), &ws.name, &shell, "brief-1", brief, &env, &values)
            .await
            .unwrap(),
        RunnerOutcome::Started { .. }
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shell_agent_also_runs_on_busybox() {
    let ws = Workspace::from_image(TINY, false).await;
    let shell = shell_profile();
    agent::bootstrap(ws.rt(), &ws.name, &[("shell", &shell)], &BTreeMap::new())
        .await
        .unwrap();
    let brief = "Tiny brief\nBLOCK: Go on?\n";
    let none = BTreeMap::new();
    let started = agent::start_runner(ws.rt(), &ws.name, &shell, "tiny-1", brief, &none, &none)
        .await
        .unwrap();
    assert!(
        matches!(started, RunnerOutcome::Started { .. }),
        "{started:?}"
    );
    let state_is = |want: AgentState| {
        let ws = &ws;
        move || async move {
            agent::read_agent_status(ws.rt(), &ws.name)
                .await
                .unwrap()
                .is_some_and(|r| r.status.state == want)
        }
    };
    eventually(
        Duration::from_secs(60),
        "the agent to block",
        state_is(AgentState::Blocked),
    )
    .await;
    agent::answer(ws.rt(), &ws.name, "yes").await.unwrap();
    eventually(
        Duration::from_secs(60),
        "the agent to finish",
        state_is(AgentState::Done),
    )
    .await;
    let report = agent::read_agent_status(ws.rt(), &ws.name)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.status.brief_id.as_deref(), Some("tiny-1"));
    assert_eq!(report.title.as_deref(), Some("Tiny brief"));
}

/// A shipped profile as `berth apply` reads it.
fn shipped_profile(name: &str) -> AgentProfileSpec {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../manifests/agents/{name}.yaml"));
    let value: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    match berth_api::decode_manifest(value).unwrap() {
        berth_api::Object::AgentProfile(profile) => profile.spec,
        other => panic!("{}: {other:?}", path.display()),
    }
}

/// On an image without the CLIs and a container without network, the shipped npm profiles
/// fail as best-effort profiles with a reason a person can act on, and hold nothing up.
#[tokio::test(flavor = "multi_thread")]
async fn shipped_cli_profiles_say_why_they_cannot_install_without_network() {
    let ws = Workspace::from_image(BASE, false).await;
    let shell = shell_profile();
    let claude = shipped_profile("claude");
    let codex = shipped_profile("codex");
    let profiles = [("shell", &shell), ("claude", &claude), ("codex", &codex)];
    let values = secrets(&[("ANTHROPIC_API_KEY", "sk-a"), ("OPENAI_API_KEY", "sk-o")]);
    let report = agent::bootstrap_best_effort(ws.rt(), &ws.name, Some("shell"), &profiles, &values)
        .await
        .unwrap();
    let failed: Vec<&str> = report
        .failed
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(failed, ["claude", "codex"], "{:?}", report.failed);
    for (name, why) in &report.failed {
        assert!(
            why.contains("could not install (no network")
                && why.contains("use the image berth-agents"),
            "{name}: {why}"
        );
    }
    assert_eq!(report.profiles.len(), 1, "{:?}", report.profiles);
    assert_eq!(
        ws.ok("for c in claude codex; do command -v $c; done; true")
            .await,
        ""
    );
}

/// The image berth-agents has every shipped CLI on no registry's say-so: with no network, each
/// profile's `install.check` passes and nothing is installed; antigravity, on no registry,
/// fails saying what it needs.
#[tokio::test(flavor = "multi_thread")]
async fn berth_agents_has_the_shipped_clis_without_network() {
    let ws = Workspace::from_image("berth-agents", false).await;
    let names = ["claude", "codex", "kimi", "minimax", "antigravity"];
    let specs: Vec<AgentProfileSpec> = names.iter().map(|n| shipped_profile(n)).collect();
    let profiles: Vec<(&str, &AgentProfileSpec)> = names.iter().copied().zip(&specs).collect();
    let values = secrets(&[
        ("ANTHROPIC_API_KEY", "sk-a"),
        ("OPENAI_API_KEY", "sk-o"),
        ("MOONSHOT_API_KEY", "sk-m"),
        ("MINIMAX_API_KEY", "sk-x"),
        ("GEMINI_API_KEY", "sk-g"),
    ]);
    let report =
        agent::bootstrap_best_effort(ws.rt(), &ws.name, Some("claude"), &profiles, &values)
            .await
            .unwrap();
    let present: Vec<_> = report
        .profiles
        .iter()
        .map(|p| (p.profile.as_str(), p.install))
        .collect();
    assert_eq!(
        present,
        [
            ("claude", InstallOutcome::Present),
            ("codex", InstallOutcome::Present),
            ("kimi", InstallOutcome::Present),
            ("minimax", InstallOutcome::Present),
        ]
    );
    assert_eq!(report.failed.len(), 1, "{:?}", report.failed);
    let (name, why) = &report.failed[0];
    assert_eq!(name, "antigravity");
    assert!(
        why.contains("network access to storage.googleapis.com"),
        "{why}"
    );

    // Every tool README's image table promises answers, in a container with no NIC.
    let links = crate::harness::exec(&ws.name, "ls /sys/class/net").unwrap();
    assert_eq!(links.split_whitespace().collect::<Vec<_>>(), ["lo"]);
    for (tool, says) in [
        ("git --version", "git version"),
        ("ssh -V", "OpenSSH"),
        ("jq --version", "jq-"),
        ("curl --version", "curl "),
        ("gcc --version", "gcc"),
        ("make --version", "GNU Make"),
        ("python3 --version", "Python 3."),
        ("python3 -m venv --help", "usage: venv"),
        ("pip3 --version", "pip "),
        ("gh --version", "gh version"),
        ("node --version", "v22."),
        ("npm --version", "10."),
        ("claude --version", "2.1.332"),
        ("codex --version", "0.171.0"),
        ("code-server --version", "4.105.1"),
        ("playwright-mcp --version", "0.0.86"),
        ("chromium --version", "Chromium"),
        ("rg --version", "ripgrep"),
    ] {
        let said = crate::harness::exec(&ws.name, &format!("{tool} 2>&1"))
            .unwrap_or_else(|e| panic!("{tool}: {e}"));
        assert!(said.contains(says), "{tool} said: {said}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_runner_log_is_capped_by_rotation() {
    let ws = Workspace::from_image(TINY, false).await;
    let chatty = AgentProfileSpec {
        home: "/root/.chatty".into(),
        install: AgentInstall {
            check: "true".into(),
            command: None,
            version: None,
        },
        runner: AgentRunner {
            command: vec![
                "sh".into(),
                "-c".into(),
                "i=0; while [ $i -lt 2000 ]; do echo \"line $i of a chatty agent\"; i=$((i+1)); done".into(),
            ],
            protocol: Default::default(),
        },
        ..AgentProfileSpec::default()
    };
    agent::bootstrap(ws.rt(), &ws.name, &[("chatty", &chatty)], &BTreeMap::new())
        .await
        .unwrap();
    // A reader must never find the log missing: a watcher looks for it as fast as a shell can
    // from the first line until the runner's status is written.
    ws.ok(
        "setsid sh -c 'until [ -e /var/log/berth/runner.log ]; do :; done; \
         until [ -e /run/berth/runner.rc ]; do \
             [ -e /var/log/berth/runner.log ] || echo gone >>/tmp/log-gone; \
         done; touch /tmp/watched' </dev/null >/dev/null 2>&1 &",
    )
    .await;
    // A small cap for the test; the default is 1 MiB.
    let env = secrets(&[("BERTH_RUNNER_LOG_CAP", "8000")]);
    agent::start_runner(
        ws.rt(),
        &ws.name,
        &chatty,
        "chatty-1",
        "talk",
        &env,
        &BTreeMap::new(),
    )
    .await
    .unwrap();
    let exited = || async {
        agent::runner_log(ws.rt(), &ws.name, 200)
            .await
            .unwrap()
            .contains("runner exited with status 0")
    };
    eventually(
        Duration::from_secs(120),
        "the chatty runner to exit",
        exited,
    )
    .await;
    let sizes = ws
        .ok("wc -c </var/log/berth/runner.log; wc -c </var/log/berth/runner.log.1")
        .await;
    let sizes: Vec<u64> = sizes.lines().map(|l| l.trim().parse().unwrap()).collect();
    // Checked every 100 lines: at most the cap plus 100 lines of ~30 bytes over it.
    assert!(sizes.iter().all(|s| *s <= 8000 + 100 * 40), "{sizes:?}");
    let log = agent::runner_log(ws.rt(), &ws.name, 1 << 20).await.unwrap();
    assert!(log.contains("line 1999 of a chatty agent"), "{log}");
    eventually(Duration::from_secs(60), "the watcher to finish", || async {
        ws.ok("[ -e /tmp/watched ] && echo yes || true")
            .await
            .trim()
            == "yes"
    })
    .await;
    let gone = ws.ok("cat /tmp/log-gone 2>/dev/null | wc -l").await;
    assert_eq!(gone.trim(), "0", "the log was missing during a rotation");
}
