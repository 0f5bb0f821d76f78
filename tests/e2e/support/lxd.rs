//! Real-LXD helpers: a connected client, unique names, and guards that delete what a test
//! created even when the test fails.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth::lxd::{Endpoint, LxdClient, LxdConfig};
use berth::runtime::{CreateInstance, Created, ExecRequest, ImageSource, Runtime, StopOptions};

/// The fast busybox image; `berth-base` (Debian) when bash or git are needed.
pub const TINY: &str = "berth-tiny";
pub const BASE: &str = "berth-base";
pub const POOL: &str = "default";

/// Generous deadline for one LXD operation in a test on a busy 2-core machine.
pub const OP_TIMEOUT: Duration = Duration::from_secs(120);

/// The local daemon, with request deadlines long enough for a machine busy with other builds
/// and tests (LXD itself stalls for up to a minute under such load).
pub fn local_config() -> LxdConfig {
    let mut config = LxdConfig::new(Endpoint::local());
    config.request_timeout = OP_TIMEOUT;
    config
}

/// A client on the local daemon; fails the test with a clear message when LXD or the test
/// images are not there (`scripts/setup-lxd` provides both).
pub async fn client() -> Arc<LxdClient> {
    let config = local_config();
    let described = config.endpoint.describe();
    let client = match LxdClient::connect(config).await {
        Ok(c) => c,
        Err(e) => panic!("LXD is not reachable at {described} ({e}); run scripts/setup-lxd first"),
    };
    for image in [TINY, BASE] {
        let found = client
            .resolve_image(&ImageSource::Alias(image.to_string()))
            .await
            .expect("resolve test image");
        assert!(
            found.is_some(),
            "LXD image {image} is missing; run scripts/setup-lxd first"
        );
    }
    Arc::new(client)
}

/// `berth-t-<random>`: unique on this machine, never colliding with anything else.
pub fn unique_name() -> String {
    format!("berth-t-{:08x}", rand::random::<u32>())
}

/// Deletes instances and volumes it was told about when dropped (also on panic), on its own
/// thread and runtime so it works from inside a test's runtime.
pub struct Cleanup {
    config: LxdConfig,
    instances: Vec<String>,
    volumes: Vec<(String, String, Option<String>)>,
}

impl Cleanup {
    /// Cleans up on the local daemon.
    pub fn new() -> Cleanup {
        Cleanup::on(local_config())
    }

    /// Cleans up on the daemon `config` reaches (a remote or cluster member).
    pub fn on(config: LxdConfig) -> Cleanup {
        Cleanup {
            config,
            instances: Vec::new(),
            volumes: Vec::new(),
        }
    }

    pub fn instance(&mut self, name: &str) {
        self.instances.push(name.to_string());
    }

    pub fn volume(&mut self, pool: &str, name: &str) {
        self.volumes
            .push((pool.to_string(), name.to_string(), None));
    }

    /// A volume on a cluster member's local pool.
    pub fn volume_on(&mut self, pool: &str, name: &str, member: &str) {
        self.volumes
            .push((pool.to_string(), name.to_string(), Some(member.to_string())));
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let instances = std::mem::take(&mut self.instances);
        let volumes = std::mem::take(&mut self.volumes);
        let config = self.config.clone();
        if instances.is_empty() && volumes.is_empty() {
            return;
        }
        let worker = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("cleanup runtime");
            runtime.block_on(async move {
                let Ok(client) = LxdClient::connect(config).await else {
                    eprintln!("cleanup: LXD unreachable; left {instances:?} {volumes:?}");
                    return;
                };
                let deletes = instances.iter().map(|name| {
                    let client = &client;
                    async move {
                        let stop = StopOptions {
                            clean_timeout: Duration::ZERO,
                            force_after: true,
                        };
                        if let Err(e) = client.stop_instance(name, stop).await
                            && !e.is_not_found()
                        {
                            eprintln!("cleanup: stop {name}: {e}");
                        }
                        // A create or start the test left running makes LXD refuse the
                        // delete as busy for a while.
                        let until = tokio::time::Instant::now() + OP_TIMEOUT;
                        loop {
                            match client.delete_instance(name, OP_TIMEOUT).await {
                                Ok(()) => break,
                                Err(e)
                                    if e.lxd_message().is_some_and(|m| m.contains("busy"))
                                        && tokio::time::Instant::now() < until =>
                                {
                                    tokio::time::sleep(Duration::from_millis(500)).await;
                                    let _ = client.stop_instance(name, stop).await;
                                }
                                Err(e) => {
                                    eprintln!("cleanup: delete {name}: {e}");
                                    break;
                                }
                            }
                        }
                    }
                });
                futures::future::join_all(deletes).await;
                for (pool, name, member) in &volumes {
                    if let Err(e) = client.delete_volume(pool, name, member.as_deref()).await {
                        eprintln!("cleanup: delete volume {pool}/{name}: {e}");
                    }
                }
            });
        });
        let _ = worker.join();
    }
}

/// Creates (and waits for) a stopped instance from `image`.
pub async fn create(client: &LxdClient, request: &CreateInstance) {
    match client
        .create_instance(request)
        .await
        .expect("submit create")
    {
        Created::Submitted { operation } => {
            client
                .wait_operation(&operation, OP_TIMEOUT)
                .await
                .expect("create operation");
        }
        Created::Exists(_) => panic!("instance {} already existed", request.name),
    }
}

/// A plain create request for `name` from `image` with a test label.
pub fn request(name: &str, image: &str) -> CreateInstance {
    CreateInstance {
        name: name.to_string(),
        image: ImageSource::Alias(image.to_string()),
        config: [("user.berth.test".to_string(), name.to_string())].into(),
        devices: Default::default(),
        profiles: Vec::new(),
        target: None,
        known_absent: false,
    }
}

/// Polls `check` until it returns true or `deadline` passes.
pub async fn eventually<F, Fut>(deadline: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub struct Workspace {
    pub name: String,
    pub lxd: Arc<LxdClient>,
    pub rt: tokio::runtime::Runtime,
    _cleanup: Cleanup,
}

impl Workspace {
    /// A running container from `image` named `name` with an empty `/workspace`.
    pub fn new(name: &str, image: &str) -> Workspace {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let lxd = rt.block_on(client());
        let mut cleanup = Cleanup::new();
        cleanup.instance(name);
        rt.block_on(create(&lxd, &request(name, image)));
        // On a busy host the start call can outlast its request deadline while the start
        // itself goes on: judge by the instance's state.
        if let Err(err) = rt.block_on(lxd.start_instance(name, OP_TIMEOUT)) {
            assert!(err.is_transient(), "start the container: {err}");
            let until = Instant::now() + OP_TIMEOUT;
            while !rt
                .block_on(lxd.get_instance(name))
                .ok()
                .flatten()
                .is_some_and(|i| i.is_running())
            {
                assert!(Instant::now() < until, "the container did not start: {err}");
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        let ws = Workspace {
            name: name.to_string(),
            lxd,
            rt,
            _cleanup: cleanup,
        };
        ws.sh("mkdir -p /workspace");
        ws
    }

    /// Runs a shell command in the container as the test's own hand (not through berth).
    /// Every command given is idempotent, so one that outlasted its deadline on a busy host is
    /// simply run again.
    pub fn sh(&self, command: &str) -> String {
        let request = ExecRequest::new(["sh", "-c", command], Duration::from_secs(60));
        let mut attempts = 0;
        let output = loop {
            attempts += 1;
            match self.rt.block_on(self.lxd.exec(&self.name, &request)) {
                Ok(output) => break output,
                Err(err) if err.is_transient() && attempts < 4 => continue,
                Err(err) => panic!("{command}: {err}"),
            }
        };
        assert!(
            output.success(),
            "{command}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Whether a process whose command line matches `pattern` runs in the container.
    pub fn running(&self, pattern: &str) -> bool {
        !self.sh(&format!("pgrep -f '{pattern}' || true")).is_empty()
    }
}

/// Runs `lxc ARGS` with a deadline (120 s) against the daemon whose state directory is
/// `lxd_dir` (`None`: the default one); stdout on success, stderr on failure. A client that
/// ignores the deadline's SIGTERM (an `lxc exec` under load can) is killed 5 s later.
pub fn lxc_in(lxd_dir: Option<&str>, args: &[&str]) -> Result<String, String> {
    let mut command = std::process::Command::new("timeout");
    command
        .args(["-k", "5", "120", "lxc"])
        .args(args)
        .stdin(std::process::Stdio::null());
    if let Some(dir) = lxd_dir {
        command.env("LXD_DIR", dir);
    }
    let out = command.output().expect("run lxc");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The controller ids a daemon's log names (`store open ... controller=ID`; one per store it
/// opened, so a test that replaced the data dir names both).
pub fn controller_ids(log: &str) -> Vec<String> {
    let mut ids: Vec<String> = log
        .lines()
        .filter(|l| l.contains("store open"))
        .filter_map(|l| l.split("controller=").nth(1))
        .filter_map(|rest| {
            let id = rest.trim_start_matches('"');
            let id: String = id
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            (!id.is_empty()).then_some(id)
        })
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Deletes the trash a test's daemon left on the shared LXD (containers and volumes whose
/// `user.berth.controller` is one of `controllers`): nobody else's is touched. For `Drop`:
/// failures are printed, never panics.
pub fn delete_trash_of(controllers: &[String]) {
    if controllers.is_empty() {
        return;
    }
    let ours = |get: &[&str]| {
        lxc_in(None, get).is_ok_and(|label| controllers.iter().any(|c| c == label.trim()))
    };
    let instances = lxc_in(None, &["list", "--format", "csv", "-c", "n"]).unwrap_or_default();
    for name in instances.lines().filter(|n| n.starts_with("berth-trash-")) {
        if ours(&["config", "get", name, "user.berth.controller"])
            && let Err(e) = lxc_in(None, &["delete", "--force", name])
        {
            eprintln!("cleanup: delete trashed container {name}: {e}");
        }
    }
    let volumes = lxc_in(
        None,
        &[
            "storage", "volume", "list", "default", "--format", "csv", "-c", "tn",
        ],
    )
    .unwrap_or_default();
    for (_, name) in volumes
        .lines()
        .filter_map(|l| l.split_once(','))
        .filter(|(t, n)| *t == "custom" && n.starts_with("berth-trash-"))
    {
        let label = [
            "storage",
            "volume",
            "get",
            "default",
            name,
            "user.berth.controller",
        ];
        if ours(&label)
            && let Err(e) = lxc_in(None, &["storage", "volume", "delete", "default", name])
        {
            eprintln!("cleanup: delete trashed volume {name}: {e}");
        }
    }
}

/// A test-unique LXD project sharing the default project's images, with volumes of its own and,
/// when asked, profiles of its own. Dropped (after a daemon declared later) with every instance
/// and volume in it.
pub struct TestProject {
    pub name: String,
}

impl TestProject {
    /// `prefix-<random>`; `own_profiles` gives it a `default` profile of its own, empty.
    pub fn create(prefix: &str, own_profiles: bool) -> TestProject {
        let name = format!("{prefix}-{:08x}", rand::random::<u32>());
        let profiles = format!("features.profiles={own_profiles}");
        lxc_in(
            None,
            &[
                "project",
                "create",
                &name,
                "-c",
                "features.images=false",
                "-c",
                &profiles,
                "-c",
                "features.storage.volumes=true",
            ],
        )
        .expect("create an LXD project");
        TestProject { name }
    }

    /// Names of what `/1.0/PATH?project=` lists.
    pub fn list(&self, path: &str) -> Vec<String> {
        let listed = lxc_in(
            None,
            &["query", &format!("/1.0/{path}?project={}", self.name)],
        )
        .unwrap_or_else(|_| "[]".to_string());
        let urls: Vec<String> = serde_json::from_str(&listed).unwrap_or_default();
        urls.iter()
            .filter_map(|url| url.split('?').next()?.rsplit('/').next())
            .map(str::to_string)
            .collect()
    }
}

impl Drop for TestProject {
    fn drop(&mut self) {
        let project = self.name.as_str();
        for instance in self.list("instances") {
            let _ = lxc_in(
                None,
                &["delete", "--force", &instance, "--project", project],
            );
        }
        for volume in self.list("storage-pools/default/volumes/custom") {
            let _ = lxc_in(
                None,
                &[
                    "storage",
                    "volume",
                    "delete",
                    "default",
                    &volume,
                    "--project",
                    project,
                ],
            );
        }
        if let Err(err) = lxc_in(None, &["project", "delete", project]) {
            eprintln!("cannot delete LXD project {project}: {err}");
        }
    }
}
