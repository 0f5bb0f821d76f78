//! `FakeRuntime`: an in-memory LXD for unit tests, with fault injection.
//!
//! It keeps instances (with their files), custom volumes, images and operations in memory and
//! answers the way LXD does where the reconciler depends on it (idempotent create returns
//! `Exists`, a missing image fails inside the operation, exec on a stopped instance is a 400, a
//! volume in use cannot be deleted). Faults: added latency, failure of the Nth call or of a named
//! method, a lost reply after the side effect happened, a wedged init that ignores clean stops,
//! and scripted exec results. Latency uses tokio time, so tests can run on paused time.
//!
//! Never stands in for LXD in an end-to-end test.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use tokio::sync::broadcast;

use crate::runtime::{
    CreateInstance, CreateVolume, Created, EventKind, EventStream, ExecOutput, ExecRequest,
    FileWrite, HostCapacity, ImageSource, Instance, InstanceEdit, InstanceEditFn, InstancePatch,
    InstanceState, InstanceStatus, InteractiveExec, Mkdir, Operation, OperationStatus, PoolSpace,
    Result, Runtime, RuntimeError, RuntimeEvent, ServerInfo, StopOptions, StoragePool,
    TerminalSize, Volume, Watch,
};

/// What an injected fault does to a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The call fails with this error before doing anything.
    Fail(RuntimeError),
    /// The call does its work, then its reply is lost: the caller sees a transport error.
    LoseReply,
    /// The call runs normally: queued before a fault, it makes that fault hit a later call.
    Pass,
}

/// Decides the result of an exec in the fake; `None` passes to the next handler (or the
/// default: exit 0, no output).
pub type ExecHandler = dyn Fn(&str, &ExecRequest) -> Option<Result<ExecOutput>> + Send + Sync;

#[derive(Debug, Clone)]
struct FakeFile {
    content: Vec<u8>,
    uid: u32,
    gid: u32,
    mode: u32,
    directory: bool,
}

#[derive(Debug, Clone)]
struct FakeInstance {
    instance: Instance,
    files: BTreeMap<String, FakeFile>,
    /// Init ignores the clean-stop signal.
    wedged: bool,
    console: String,
    /// Directories watched for writes (`watch_files`); a stop or restart forgets them, as
    /// unmounting the container's tmpfs `/run` ends an inotify watch, so the next
    /// `watch_files` starts a new one.
    watched: BTreeSet<String>,
}

/// Something done to the fake just before a call, as another client of LXD would.
type BeforeCall = dyn FnOnce(&FakeRuntime) + Send;

#[derive(Default)]
struct Faults {
    latency: Duration,
    /// Call number (1-based, counted over all methods) to fault.
    nth: BTreeMap<u64, Fault>,
    /// Per method, faults for its next calls in order.
    by_method: BTreeMap<String, VecDeque<Fault>>,
    exec_handlers: Vec<Arc<ExecHandler>>,
    /// Per method, what happens just before its next call: someone else's doing in between.
    before: BTreeMap<String, Box<BeforeCall>>,
}

struct State {
    server: ServerInfo,
    host: HostCapacity,
    instances: BTreeMap<String, FakeInstance>,
    volumes: BTreeMap<(String, String), Volume>,
    /// Bytes used by a volume, where a test said; a volume without is one the pool cannot size.
    usage: BTreeMap<(String, String), u64>,
    /// alias -> fingerprint
    images: BTreeMap<String, String>,
    /// pool name -> driver; a pool the fake was not told about is a `dir` pool.
    pool_drivers: BTreeMap<String, String>,
    /// pool name -> its space; a pool the fake was not told about does not know its total.
    pool_space: BTreeMap<String, PoolSpace>,
    /// fingerprint -> size LXD reports; an image the fake was not told about has size 0.
    image_sizes: BTreeMap<String, u64>,
    /// Finished operations and how they ended (error message when failed); like LXD, the fake
    /// forgets the oldest ones (`OPERATIONS_KEPT`), which then answer as vanished.
    operations: BTreeMap<String, std::result::Result<(), String>>,
    next_pid: i64,
    /// Instances (existing or not yet) whose start fails inside LXD's operation with this
    /// message (`forkstart` refusing a limit, a missing device).
    start_failures: BTreeMap<String, String>,
    /// Config keys a create is refused for (LXD's 400), with the message.
    refused_config: BTreeMap<String, String>,
    /// The most recent calls (`CALLS_KEPT`), as `method subject` or `method`.
    calls: VecDeque<String>,
    /// Every call counted by method, however many there were.
    counts: BTreeMap<String, usize>,
}

/// Finished operations the fake remembers; LXD forgets them within seconds.
const OPERATIONS_KEPT: usize = 4096;
/// Calls kept for `calls()`: enough for any unit test, bounded for scale simulations.
const CALLS_KEPT: usize = 4096;

/// An in-memory runtime for unit tests. Share it as `Arc<FakeRuntime>` and hand the reconciler
/// `Arc<dyn Runtime>`.
pub struct FakeRuntime {
    state: Mutex<State>,
    faults: Mutex<Faults>,
    call_count: AtomicU64,
    next_operation: AtomicU64,
    events: broadcast::Sender<RuntimeEvent>,
    file_notices: broadcast::Sender<String>,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        FakeRuntime::new()
    }
}

/// Fingerprint the fake gives an alias it was seeded with.
pub fn fake_fingerprint(alias: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(alias.as_bytes()))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked while holding the lock must not hide its own failure behind a
    // poisoned-lock panic elsewhere.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn not_found(what: impl Into<String>) -> RuntimeError {
    RuntimeError::NotFound {
        what: what.into(),
        message: String::new(),
    }
}

fn rejected(what: impl Into<String>, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Rejected {
        what: what.into(),
        status: 400,
        message: message.into(),
    }
}

/// LXD's instance name rule.
fn valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !name.is_empty()
        && name.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        && !bytes[0].is_ascii_digit()
        && bytes[0] != b'-'
        && !name.ends_with('-')
}

impl FakeRuntime {
    /// A standalone fake server with the images `berth-base` and `berth-tiny`.
    pub fn new() -> FakeRuntime {
        let (events, _) = broadcast::channel(1024);
        let images = ["berth-base", "berth-tiny"]
            .into_iter()
            .map(|a| (a.to_string(), fake_fingerprint(a)))
            .collect();
        FakeRuntime {
            state: Mutex::new(State {
                server: ServerInfo {
                    version: "5.0.2".into(),
                    api_extensions: vec!["instances".into(), "custom_volume_size".into()],
                    clustered: false,
                    server_name: "none".into(),
                    members: Vec::new(),
                },
                host: HostCapacity {
                    memory_bytes: 8 << 30,
                    cpus: 4,
                },
                instances: BTreeMap::new(),
                volumes: BTreeMap::new(),
                usage: BTreeMap::new(),
                images,
                pool_drivers: BTreeMap::new(),
                pool_space: BTreeMap::new(),
                image_sizes: BTreeMap::new(),
                operations: BTreeMap::new(),
                next_pid: 1000,
                start_failures: BTreeMap::new(),
                refused_config: BTreeMap::new(),
                calls: VecDeque::new(),
                counts: BTreeMap::new(),
            }),
            faults: Mutex::new(Faults::default()),
            call_count: AtomicU64::new(0),
            next_operation: AtomicU64::new(1),
            events,
            file_notices: broadcast::channel(1024).0,
        }
    }

    // ---- fault injection and scripting ----

    /// Makes `pool` a pool of `driver` ("zfs", "btrfs", ...) instead of `dir`.
    pub fn set_pool_driver(&self, pool: &str, driver: &str) {
        lock(&self.state)
            .pool_drivers
            .insert(pool.to_string(), driver.to_string());
    }

    /// What `storage_pool_space` answers for `pool` from now on.
    pub fn set_pool_space(&self, pool: &str, space: PoolSpace) {
        lock(&self.state).pool_space.insert(pool.to_string(), space);
    }

    /// What `image_size` answers for the image `fingerprint` (while it exists).
    pub fn set_image_size(&self, fingerprint: &str, size: u64) {
        lock(&self.state)
            .image_sizes
            .insert(fingerprint.to_string(), size);
    }

    /// Every call waits this long first (tokio time).
    pub fn set_latency(&self, latency: Duration) {
        lock(&self.faults).latency = latency;
    }

    /// The `n`th call from the fake's creation (1-based, all methods counted) gets `fault`.
    pub fn fault_nth_call(&self, n: u64, fault: Fault) {
        lock(&self.faults).nth.insert(n, fault);
    }

    /// The next call of `method` (the trait method's name, e.g. "create_instance") gets `fault`;
    /// calling this again queues another for the call after.
    pub fn fault_method(&self, method: &str, fault: Fault) {
        lock(&self.faults)
            .by_method
            .entry(method.to_string())
            .or_default()
            .push_back(fault);
    }

    /// Runs `then` just before the next call of `method` does anything, as another client of
    /// LXD acting between two of the caller's calls.
    pub fn before_next(&self, method: &str, then: impl FnOnce(&FakeRuntime) + Send + 'static) {
        lock(&self.faults)
            .before
            .insert(method.to_string(), Box::new(then));
    }

    /// Removes every queued fault and the latency.
    pub fn clear_faults(&self) {
        let mut faults = lock(&self.faults);
        faults.latency = Duration::ZERO;
        faults.nth.clear();
        faults.by_method.clear();
        faults.before.clear();
    }

    /// Adds an exec handler, consulted before earlier ones.
    pub fn on_exec<F>(&self, handler: F)
    where
        F: Fn(&str, &ExecRequest) -> Option<Result<ExecOutput>> + Send + Sync + 'static,
    {
        lock(&self.faults)
            .exec_handlers
            .insert(0, Arc::new(handler));
    }

    /// Execs whose command starts with `prefix` return `output`.
    pub fn script_exec(&self, prefix: &[&str], output: ExecOutput) {
        let prefix: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
        self.on_exec(move |_, request| {
            request
                .command
                .starts_with(&prefix)
                .then(|| Ok(output.clone()))
        });
    }

    /// The instance's init ignores clean stops (a stop then needs force).
    pub fn set_wedged(&self, name: &str, wedged: bool) {
        if let Some(i) = lock(&self.state).instances.get_mut(name) {
            i.wedged = wedged;
        }
    }

    /// Makes every start of the instance fail the way LXD's does when the container cannot
    /// run: the operation is created, runs and fails with `message`, each step sent on the
    /// event stream. `None` lets it start again.
    pub fn fail_start(&self, name: &str, message: Option<&str>) {
        let mut state = lock(&self.state);
        match message {
            Some(message) => state.start_failures.insert(name.into(), message.into()),
            None => state.start_failures.remove(name),
        };
    }

    /// Refuses every create whose config sets `key`, as LXD refuses a value it cannot apply
    /// (`None` accepts it again).
    pub fn refuse_config(&self, key: &str, message: Option<&str>) {
        let mut state = lock(&self.state);
        match message {
            Some(message) => state.refused_config.insert(key.into(), message.into()),
            None => state.refused_config.remove(key),
        };
    }

    /// Sets the status of an instance behind the client's back (e.g. Frozen, Error, Stopped
    /// as if it crashed).
    pub fn set_status(&self, name: &str, status: InstanceStatus) {
        let mut state = lock(&self.state);
        if let Some(i) = state.instances.get_mut(name) {
            if status != InstanceStatus::Running {
                i.watched.clear();
            }
            set_status(&mut i.instance, status, 0);
        }
    }

    /// Deletes an instance behind the client's back (drift, or someone else's `lxc delete`).
    pub fn vanish(&self, name: &str) {
        lock(&self.state).instances.remove(name);
    }

    /// Puts an instance in place directly, as if someone else created it.
    pub fn insert_instance(&self, instance: Instance) {
        lock(&self.state).instances.insert(
            instance.name.clone(),
            FakeInstance {
                instance,
                files: BTreeMap::new(),
                wedged: false,
                console: String::new(),
                watched: BTreeSet::new(),
            },
        );
    }

    pub fn add_image(&self, alias: &str, fingerprint: &str) {
        lock(&self.state)
            .images
            .insert(alias.to_string(), fingerprint.to_string());
    }

    pub fn remove_image(&self, alias: &str) {
        lock(&self.state).images.remove(alias);
    }

    pub fn set_server(&self, server: ServerInfo) {
        lock(&self.state).server = server;
    }

    pub fn set_host_capacity(&self, host: HostCapacity) {
        lock(&self.state).host = host;
    }

    pub fn set_console(&self, name: &str, log: &str) {
        if let Some(i) = lock(&self.state).instances.get_mut(name) {
            i.console = log.to_string();
        }
    }

    /// Sends an event to every subscriber.
    pub fn emit(&self, event: RuntimeEvent) {
        let _ = self.events.send(event);
    }

    // ---- inspection ----

    /// The most recent calls (the last 4096), as `method name` or `method` strings, in order.
    pub fn calls(&self) -> Vec<String> {
        lock(&self.state).calls.iter().cloned().collect()
    }

    /// How many times `method` was called.
    pub fn count(&self, method: &str) -> usize {
        lock(&self.state).counts.get(method).copied().unwrap_or(0)
    }

    pub fn instance(&self, name: &str) -> Option<Instance> {
        lock(&self.state)
            .instances
            .get(name)
            .map(|i| i.instance.clone())
    }

    pub fn instance_names(&self) -> Vec<String> {
        lock(&self.state).instances.keys().cloned().collect()
    }

    pub fn volume(&self, pool: &str, name: &str) -> Option<Volume> {
        let state = lock(&self.state);
        state
            .volumes
            .get(&(pool.to_string(), name.to_string()))
            .map(|v| with_used_by(v, &state.instances))
    }

    /// Makes the pool report `bytes` used by a volume (by default it cannot tell, as `dir`).
    pub fn set_volume_usage(&self, pool: &str, name: &str, bytes: u64) {
        lock(&self.state)
            .usage
            .insert((pool.to_string(), name.to_string()), bytes);
    }

    /// Every volume of `pool`, by name.
    pub fn volume_names(&self, pool: &str) -> Vec<String> {
        lock(&self.state)
            .volumes
            .keys()
            .filter(|(p, _)| p == pool)
            .map(|(_, name)| name.clone())
            .collect()
    }

    /// A file's content as last written.
    pub fn file(&self, name: &str, path: &str) -> Option<Vec<u8>> {
        lock(&self.state)
            .instances
            .get(name)?
            .files
            .get(path)
            .filter(|f| !f.directory)
            .map(|f| f.content.clone())
    }

    /// Owner, group and mode of a file or directory, as last written.
    pub fn file_owner(&self, name: &str, path: &str) -> Option<(u32, u32, u32)> {
        lock(&self.state)
            .instances
            .get(name)?
            .files
            .get(path)
            .map(|f| (f.uid, f.gid, f.mode))
    }

    // ---- internals ----

    /// Counts and records the call, waits the latency, and returns the fault to apply.
    async fn enter(&self, method: &str, subject: &str) -> Result<bool> {
        let n = self.call_count.fetch_add(1, Ordering::SeqCst) + 1;
        {
            let mut state = lock(&self.state);
            if state.calls.len() == CALLS_KEPT {
                state.calls.pop_front();
            }
            state.calls.push_back(if subject.is_empty() {
                method.to_string()
            } else {
                format!("{method} {subject}")
            });
            *state.counts.entry(method.to_string()).or_default() += 1;
        }
        let before = lock(&self.faults).before.remove(method);
        if let Some(then) = before {
            then(self);
        }
        let (latency, fault) = {
            let mut faults = lock(&self.faults);
            let fault = faults.nth.remove(&n).or_else(|| {
                faults
                    .by_method
                    .get_mut(method)
                    .and_then(VecDeque::pop_front)
            });
            (faults.latency, fault)
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match fault {
            None | Some(Fault::Pass) => Ok(false),
            Some(Fault::LoseReply) => Ok(true),
            Some(Fault::Fail(e)) => Err(e),
        }
    }

    /// `edit` applied to the named instance, under the state lock; a missing one is not found.
    fn in_instance<T>(
        &self,
        name: &str,
        edit: impl FnOnce(&mut FakeInstance) -> Result<T>,
    ) -> Result<T> {
        match lock(&self.state).instances.get_mut(name) {
            None => Err(not_found(format!("instance {name}"))),
            Some(i) => edit(i),
        }
    }

    fn reply<T>(method: &str, lose: bool, result: Result<T>) -> Result<T> {
        match result {
            Ok(_) if lose => Err(RuntimeError::Transport {
                what: method.to_string(),
                message: "connection reset after the request was sent (injected)".into(),
            }),
            other => other,
        }
    }

    fn operation(&self, state: &mut State, outcome: std::result::Result<(), String>) -> String {
        let id = format!(
            "00000000-0000-4000-8000-{:012x}",
            self.next_operation.fetch_add(1, Ordering::SeqCst)
        );
        state.operations.insert(id.clone(), outcome);
        // Ids grow in order, so the first key is the oldest operation.
        while state.operations.len() > OPERATIONS_KEPT {
            state.operations.pop_first();
        }
        id
    }

    /// An `operation` event about `name`, as LXD sends for each state of an operation.
    fn operation_event(&self, description: &str, status: &str, name: &str) {
        self.emit(RuntimeEvent {
            kind: EventKind::Operation,
            action: format!("{description} ({status})"),
            source: "/1.0/operations/fake".into(),
            instance: Some(name.to_string()),
            location: "none".into(),
            timestamp: Some(Utc::now()),
        });
    }

    /// LXD announces commands and file transfers in an instance too, as lifecycle events.
    fn lifecycle_on_success<T>(&self, result: &Result<T>, action: &str, name: &str) {
        if result.is_ok() {
            self.lifecycle(action, name);
        }
    }

    fn lifecycle(&self, action: &str, name: &str) {
        self.emit(RuntimeEvent {
            kind: EventKind::Lifecycle,
            action: action.to_string(),
            source: format!("/1.0/instances/{name}"),
            instance: Some(name.to_string()),
            location: "none".into(),
            timestamp: Some(Utc::now()),
        });
    }
}

fn set_status(instance: &mut Instance, status: InstanceStatus, pid: i64) {
    instance.status_code = status.code();
    if status == InstanceStatus::Running && pid > 0 {
        // LXD records every start (a restart's too) as the instance's last use.
        instance.last_used_at = Some(Utc::now());
    }
    instance.state = Some(if status == InstanceStatus::Running {
        InstanceState {
            pid,
            processes: 1,
            cpu_usage_ns: 1_000_000,
            memory_usage_bytes: 4 << 20,
            memory_peak_bytes: 8 << 20,
            ..InstanceState::default()
        }
    } else {
        InstanceState::default()
    });
    instance.status = status;
}

fn with_used_by(volume: &Volume, instances: &BTreeMap<String, FakeInstance>) -> Volume {
    let mut v = volume.clone();
    v.used_by = instances
        .values()
        .filter(|i| {
            i.instance.devices.values().any(|d| {
                d.get("type").map(String::as_str) == Some("disk")
                    && d.get("pool") == Some(&volume.pool)
                    && d.get("source") == Some(&volume.name)
            })
        })
        .map(|i| format!("/1.0/instances/{}", i.instance.name))
        .collect();
    v
}

fn resolve(images: &BTreeMap<String, String>, image: &ImageSource) -> Option<String> {
    match image {
        ImageSource::Alias(alias) => images.get(alias).cloned(),
        ImageSource::Fingerprint(fp) => images
            .values()
            .find(|f| !fp.is_empty() && f.starts_with(fp.as_str()))
            .cloned(),
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    async fn server_info(&self) -> Result<ServerInfo> {
        let lose = self.enter("server_info", "").await?;
        let server = lock(&self.state).server.clone();
        Self::reply("server_info", lose, Ok(server))
    }

    async fn host_capacity(&self) -> Result<HostCapacity> {
        let lose = self.enter("host_capacity", "").await?;
        let host = lock(&self.state).host;
        Self::reply("host_capacity", lose, Ok(host))
    }

    async fn list_instances(
        &self,
        config_prefix: Option<&str>,
        with_state: bool,
    ) -> Result<Vec<Instance>> {
        let lose = self.enter("list_instances", "").await?;
        let list = lock(&self.state)
            .instances
            .values()
            .filter(|i| match config_prefix {
                Some(p) => i.instance.config.keys().any(|k| k.starts_with(p)),
                None => true,
            })
            .map(|i| {
                let mut instance = i.instance.clone();
                if !with_state {
                    instance.state = None;
                }
                instance
            })
            .collect();
        Self::reply("list_instances", lose, Ok(list))
    }

    async fn instance_names(&self) -> Result<Vec<String>> {
        let lose = self.enter("instance_names", "").await?;
        let names = lock(&self.state).instances.keys().cloned().collect();
        Self::reply("instance_names", lose, Ok(names))
    }

    async fn get_instance(&self, name: &str) -> Result<Option<Instance>> {
        let lose = self.enter("get_instance", name).await?;
        let found = lock(&self.state)
            .instances
            .get(name)
            .map(|i| i.instance.clone());
        Self::reply("get_instance", lose, Ok(found))
    }

    async fn get_instance_record(&self, name: &str) -> Result<Option<Instance>> {
        let lose = self.enter("get_instance_record", name).await?;
        let found = lock(&self.state).instances.get(name).map(|i| Instance {
            state: None,
            ..i.instance.clone()
        });
        Self::reply("get_instance_record", lose, Ok(found))
    }

    async fn create_instance(&self, request: &CreateInstance) -> Result<Created> {
        let lose = self.enter("create_instance", &request.name).await?;
        let what = format!("create instance {}", request.name);
        let mut state = lock(&self.state);
        if let Some(existing) = state.instances.get(&request.name) {
            if request.known_absent {
                // As LXD: the name is checked inside the operation.
                let message = "Failed creating instance record: Add instance info to the \
                               database: This \"instances\" entry already exists";
                let operation = self.operation(&mut state, Err(message.into()));
                drop(state);
                let submitted = Created::Submitted { operation };
                return Self::reply("create_instance", lose, Ok(submitted));
            }
            let existing = Box::new(existing.instance.clone());
            drop(state);
            return Self::reply("create_instance", lose, Ok(Created::Exists(existing)));
        }
        if !valid_name(&request.name) {
            return Err(rejected(
                what,
                format!("Invalid instance name {:?}", request.name),
            ));
        }
        if let Some(message) = request
            .config
            .keys()
            .find_map(|key| state.refused_config.get(key))
        {
            return Err(rejected(what, message.clone()));
        }
        let Some(fingerprint) = resolve(&state.images, &request.image) else {
            let operation = self.operation(&mut state, Err("Image not found".into()));
            drop(state);
            return Self::reply(
                "create_instance",
                lose,
                Ok(Created::Submitted { operation }),
            );
        };
        let mut config = request.config.clone();
        config.insert("volatile.base_image".into(), fingerprint);
        let mut instance = Instance {
            name: request.name.clone(),
            status: InstanceStatus::Stopped,
            status_code: 0,
            location: request.target.clone().unwrap_or_else(|| "none".into()),
            profiles: if request.profiles.is_empty() {
                vec!["default".into()]
            } else {
                request.profiles.clone()
            },
            config,
            devices: request.devices.clone(),
            created_at: Some(Utc::now()),
            last_used_at: None,
            state: None,
        };
        set_status(&mut instance, InstanceStatus::Stopped, 0);
        state.instances.insert(
            request.name.clone(),
            FakeInstance {
                instance,
                files: BTreeMap::new(),
                wedged: false,
                console: String::new(),
                watched: BTreeSet::new(),
            },
        );
        let operation = self.operation(&mut state, Ok(()));
        drop(state);
        self.lifecycle("instance-created", &request.name);
        Self::reply(
            "create_instance",
            lose,
            Ok(Created::Submitted { operation }),
        )
    }

    async fn wait_operation(&self, operation: &str, _timeout: Duration) -> Result<Operation> {
        let lose = self.enter("wait_operation", operation).await?;
        let outcome = lock(&self.state).operations.get(operation).cloned();
        let result = match outcome {
            None => Err(RuntimeError::OperationVanished {
                operation: operation.to_string(),
            }),
            Some(Ok(())) => Ok(Operation {
                id: operation.to_string(),
                status: OperationStatus::Success,
                err: String::new(),
                metadata: serde_json::Value::Null,
            }),
            Some(Err(message)) => Err(RuntimeError::OperationFailed {
                what: format!("operation {operation}"),
                message,
            }),
        };
        Self::reply("wait_operation", lose, result)
    }

    async fn start_instance(&self, name: &str, _timeout: Duration) -> Result<()> {
        let lose = self.enter("start_instance", name).await?;
        let result = {
            let mut state = lock(&self.state);
            state.next_pid += 1;
            let pid = state.next_pid;
            let failure = state.start_failures.get(name).cloned();
            match state.instances.get_mut(name) {
                None => Err(not_found(format!("instance {name}"))),
                Some(i) if i.instance.status != InstanceStatus::Running && failure.is_some() => {
                    Err(RuntimeError::OperationFailed {
                        what: format!("start instance {name}"),
                        message: failure.unwrap_or_default(),
                    })
                }
                Some(i) => {
                    if i.instance.status != InstanceStatus::Running {
                        set_status(&mut i.instance, InstanceStatus::Running, pid);
                    }
                    Ok(())
                }
            }
        };
        match &result {
            Ok(()) => self.lifecycle("instance-started", name),
            Err(RuntimeError::OperationFailed { .. }) => {
                for status in ["Pending", "Running", "Failure"] {
                    self.operation_event("Starting instance", status, name);
                }
            }
            Err(_) => {}
        }
        Self::reply("start_instance", lose, result)
    }

    async fn stop_instance(&self, name: &str, stop: StopOptions) -> Result<()> {
        let lose = self.enter("stop_instance", name).await?;
        let wedged = match lock(&self.state).instances.get(name) {
            None => return Err(not_found(format!("instance {name}"))),
            Some(i) => i.wedged && i.instance.status == InstanceStatus::Running,
        };
        if wedged {
            tokio::time::sleep(stop.clean_timeout).await;
            if !stop.force_after {
                return Err(RuntimeError::OperationFailed {
                    what: format!("stop instance {name}"),
                    message: "Failed shutting down instance, status is \"Running\": shutting down the container failed".into(),
                });
            }
        }
        if let Some(i) = lock(&self.state).instances.get_mut(name) {
            set_status(&mut i.instance, InstanceStatus::Stopped, 0);
            i.watched.clear();
        }
        self.lifecycle("instance-stopped", name);
        Self::reply("stop_instance", lose, Ok(()))
    }

    async fn restart_instance(&self, name: &str, force: bool, _timeout: Duration) -> Result<()> {
        let lose = self.enter("restart_instance", name).await?;
        let result = {
            let mut state = lock(&self.state);
            state.next_pid += 1;
            let pid = state.next_pid;
            match state.instances.get_mut(name) {
                None => Err(not_found(format!("instance {name}"))),
                Some(i) if i.instance.status != InstanceStatus::Running => Err(rejected(
                    format!("restart instance {name}"),
                    "The instance isn't running",
                )),
                Some(i) if i.wedged && !force => Err(RuntimeError::OperationFailed {
                    what: format!("restart instance {name}"),
                    message: "Failed shutting down instance, status is \"Running\"".into(),
                }),
                Some(i) => {
                    set_status(&mut i.instance, InstanceStatus::Running, pid);
                    i.watched.clear();
                    Ok(())
                }
            }
        };
        if result.is_ok() {
            self.lifecycle("instance-restarted", name);
        }
        Self::reply("restart_instance", lose, result)
    }

    async fn delete_instance(&self, name: &str, _timeout: Duration) -> Result<()> {
        let lose = self.enter("delete_instance", name).await?;
        let result = {
            let mut state = lock(&self.state);
            match state.instances.get(name) {
                None => Ok(false),
                Some(i) if i.instance.status == InstanceStatus::Running => Err(rejected(
                    format!("delete instance {name}"),
                    "Instance is running",
                )),
                Some(_) => {
                    state.instances.remove(name);
                    Ok(true)
                }
            }
        };
        if result == Ok(true) {
            self.lifecycle("instance-deleted", name);
        }
        Self::reply("delete_instance", lose, result.map(|_| ()))
    }

    async fn rename_instance(&self, name: &str, new_name: &str, _timeout: Duration) -> Result<()> {
        let lose = self.enter("rename_instance", name).await?;
        let what = format!("rename instance {name} to {new_name}");
        let result = {
            let mut state = lock(&self.state);
            match state.instances.get(name) {
                _ if name == new_name => Ok(false),
                None => Err(not_found(what)),
                Some(i) if i.instance.status != InstanceStatus::Stopped => {
                    Err(rejected(what, "Renaming of running instance not allowed"))
                }
                Some(_) if state.instances.contains_key(new_name) => Err(RuntimeError::Conflict {
                    what,
                    message: "Name already in use".into(),
                }),
                Some(_) => {
                    let mut moved = state.instances.remove(name).expect("checked above");
                    moved.instance.name = new_name.to_string();
                    state.instances.insert(new_name.to_string(), moved);
                    Ok(true)
                }
            }
        };
        if result == Ok(true) {
            self.lifecycle("instance-renamed", new_name);
        }
        Self::reply("rename_instance", lose, result.map(|_| ()))
    }

    async fn patch_instance(&self, name: &str, patch: &InstancePatch) -> Result<()> {
        let lose = self.enter("patch_instance", name).await?;
        let result = self.in_instance(name, |i| {
            for (k, v) in &patch.config {
                if v.is_empty() {
                    i.instance.config.remove(k);
                } else {
                    i.instance.config.insert(k.clone(), v.clone());
                }
            }
            for (k, d) in &patch.devices {
                i.instance.devices.insert(k.clone(), d.clone());
            }
            Ok(())
        });
        if result.is_ok() {
            self.lifecycle("instance-updated", name);
        }
        Self::reply("patch_instance", lose, result)
    }

    async fn update_instance(&self, name: &str, edit: InstanceEditFn<'_>) -> Result<()> {
        let lose = self.enter("update_instance", name).await?;
        let result = self.in_instance(name, |i| {
            let mut editable = InstanceEdit {
                config: i.instance.config.clone(),
                devices: i.instance.devices.clone(),
                profiles: i.instance.profiles.clone(),
            };
            edit(&mut editable);
            i.instance.config = editable.config;
            i.instance.devices = editable.devices;
            i.instance.profiles = editable.profiles;
            Ok(())
        });
        if result.is_ok() {
            self.lifecycle("instance-updated", name);
        }
        Self::reply("update_instance", lose, result)
    }

    /// The fake has no profiles: an instance's NICs are its own `nic` devices.
    async fn restart_nics(&self, name: &str) -> Result<Vec<String>> {
        let lose = self.enter("restart_nics", name).await?;
        let result = self.in_instance(name, |i| {
            Ok(i.instance
                .devices
                .iter()
                .filter(|(_, d)| d.get("type").is_some_and(|t| t == "nic"))
                .map(|(device, d)| d.get("name").cloned().unwrap_or_else(|| device.clone()))
                .collect())
        });
        if result.is_ok() {
            self.lifecycle("instance-updated", name);
        }
        Self::reply("restart_nics", lose, result)
    }

    async fn exec_interactive(
        &self,
        name: &str,
        _request: &ExecRequest,
        _terminal: Option<TerminalSize>,
    ) -> Result<InteractiveExec> {
        Err(RuntimeError::Rejected {
            what: format!("interactive exec in {name}"),
            status: 501,
            message: "interactive exec not supported by the fake".to_string(),
        })
    }

    async fn exec(&self, name: &str, request: &ExecRequest) -> Result<ExecOutput> {
        let lose = self.enter("exec", name).await?;
        let what = format!("exec in {name}");
        match lock(&self.state)
            .instances
            .get(name)
            .map(|i| &i.instance.status)
        {
            None => return Err(not_found(format!("instance {name}"))),
            Some(InstanceStatus::Running) => {}
            Some(InstanceStatus::Frozen) => return Err(rejected(what, "Instance is frozen")),
            Some(_) => return Err(rejected(what, "Instance is not running")),
        }
        let handlers = lock(&self.faults).exec_handlers.clone();
        let result = handlers
            .iter()
            .find_map(|h| h(name, request))
            .unwrap_or_else(|| Ok(ExecOutput::default()))
            .and_then(|output| capped(output, request.max_output, &what))
            .map(|output| {
                if request.discard_output {
                    ExecOutput {
                        exit_code: output.exit_code,
                        ..ExecOutput::default()
                    }
                } else {
                    output
                }
            });
        self.lifecycle_on_success(&result, "instance-exec", name);
        Self::reply("exec", lose, result)
    }

    async fn file_write(&self, name: &str, file: &FileWrite) -> Result<()> {
        let lose = self.enter("file_write", name).await?;
        let result = self.in_instance(name, |i| {
            let dir = file.path.rsplit_once('/').map_or("", |(dir, _)| dir);
            if i.watched.contains(if dir.is_empty() { "/" } else { dir }) {
                let _ = self.file_notices.send(name.to_string());
            }
            i.files.insert(
                file.path.clone(),
                FakeFile {
                    content: file.content.clone(),
                    uid: file.uid,
                    gid: file.gid,
                    mode: file.mode,
                    directory: false,
                },
            );
            Ok(())
        });
        self.lifecycle_on_success(&result, "instance-file-pushed", name);
        Self::reply("file_write", lose, result)
    }

    async fn file_read(&self, name: &str, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        let lose = self.enter("file_read", name).await?;
        let what = format!("read {path} in {name}");
        let result = self.in_instance(name, |i| match i.files.get(path) {
            None => Err(not_found(what)),
            Some(f) if f.directory => {
                Err(rejected(what, format!("{path} is a directory, not a file")))
            }
            Some(f) if f.content.len() as u64 > max_bytes => Err(RuntimeError::TooLarge {
                what,
                limit: max_bytes,
                partial: None,
            }),
            Some(f) => Ok(f.content.clone()),
        });
        self.lifecycle_on_success(&result, "instance-file-retrieved", name);
        Self::reply("file_read", lose, result)
    }

    async fn mkdir(&self, name: &str, dir: &Mkdir) -> Result<()> {
        let lose = self.enter("mkdir", name).await?;
        let result = self.in_instance(name, |i| {
            i.files.entry(dir.path.clone()).or_insert(FakeFile {
                content: Vec::new(),
                uid: dir.uid,
                gid: dir.gid,
                mode: dir.mode,
                directory: true,
            });
            Ok(())
        });
        self.lifecycle_on_success(&result, "instance-file-pushed", name);
        Self::reply("mkdir", lose, result)
    }

    async fn file_delete(&self, name: &str, path: &str) -> Result<()> {
        let lose = self.enter("file_delete", name).await?;
        let result = self.in_instance(name, |i| {
            i.files.remove(path);
            Ok(())
        });
        self.lifecycle_on_success(&result, "instance-file-deleted", name);
        Self::reply("file_delete", lose, result)
    }

    async fn storage_pool(&self, pool: &str) -> Result<StoragePool> {
        let lose = self.enter("storage_pool", pool).await?;
        let driver = lock(&self.state)
            .pool_drivers
            .get(pool)
            .cloned()
            .unwrap_or_else(|| "dir".to_string());
        Self::reply(
            "storage_pool",
            lose,
            Ok(StoragePool {
                name: pool.to_string(),
                driver,
            }),
        )
    }

    async fn storage_pool_space(&self, pool: &str) -> Result<PoolSpace> {
        let lose = self.enter("storage_pool_space", pool).await?;
        let space = lock(&self.state)
            .pool_space
            .get(pool)
            .copied()
            .unwrap_or_default();
        Self::reply("storage_pool_space", lose, Ok(space))
    }

    async fn create_volume(&self, request: &CreateVolume) -> Result<Volume> {
        let lose = self.enter("create_volume", &request.name).await?;
        let mut state = lock(&self.state);
        let key = (request.pool.clone(), request.name.clone());
        let volume = state
            .volumes
            .entry(key)
            .or_insert_with(|| {
                let mut config = request.config.clone();
                if let Some(size) = &request.size {
                    config.insert("size".into(), size.clone());
                }
                Volume {
                    pool: request.pool.clone(),
                    name: request.name.clone(),
                    config,
                    location: request.target.clone().unwrap_or_else(|| "none".into()),
                    used_by: Vec::new(),
                }
            })
            .clone();
        let volume = with_used_by(&volume, &state.instances);
        drop(state);
        Self::reply("create_volume", lose, Ok(volume))
    }

    async fn copy_volume(&self, source: &str, request: &CreateVolume) -> Result<Volume> {
        let lose = self.enter("copy_volume", &request.name).await?;
        let what = format!("copy volume {}/{source} to {}", request.pool, request.name);
        let result = match self.volume(&request.pool, source) {
            None => Err(not_found(what)),
            Some(_) if self.volume(&request.pool, &request.name).is_some() => {
                Err(RuntimeError::Conflict {
                    what,
                    message: "Volume by that name already exists".into(),
                })
            }
            Some(_) => {
                let volume = Volume {
                    pool: request.pool.clone(),
                    name: request.name.clone(),
                    config: request.config.clone(),
                    location: request.target.clone().unwrap_or_else(|| "none".into()),
                    used_by: Vec::new(),
                };
                lock(&self.state)
                    .volumes
                    .insert((request.pool.clone(), request.name.clone()), volume.clone());
                Ok(volume)
            }
        };
        Self::reply("copy_volume", lose, result)
    }

    async fn get_volume(
        &self,
        pool: &str,
        name: &str,
        _target: Option<&str>,
    ) -> Result<Option<Volume>> {
        let lose = self.enter("get_volume", name).await?;
        let found = self.volume(pool, name);
        Self::reply("get_volume", lose, Ok(found))
    }

    async fn volumes_named(&self, pool: &str, name_prefix: &str) -> Result<Vec<Volume>> {
        let lose = self.enter("volumes_named", pool).await?;
        let state = lock(&self.state);
        let list = state
            .volumes
            .values()
            .filter(|v| v.pool == pool && v.name.starts_with(name_prefix))
            .map(|v| with_used_by(v, &state.instances))
            .collect();
        drop(state);
        Self::reply("volumes_named", lose, Ok(list))
    }

    async fn list_volumes(&self, pool: &str, config_prefix: Option<&str>) -> Result<Vec<Volume>> {
        let lose = self.enter("list_volumes", pool).await?;
        let state = lock(&self.state);
        let list = state
            .volumes
            .values()
            .filter(|v| v.pool == pool)
            .filter(|v| match config_prefix {
                Some(p) => v.config.keys().any(|k| k.starts_with(p)),
                None => true,
            })
            .map(|v| with_used_by(v, &state.instances))
            .collect();
        drop(state);
        Self::reply("list_volumes", lose, Ok(list))
    }

    async fn delete_volume(&self, pool: &str, name: &str, _target: Option<&str>) -> Result<()> {
        let lose = self.enter("delete_volume", name).await?;
        let result = match self.volume(pool, name) {
            None => Ok(()),
            Some(v) if !v.used_by.is_empty() => Err(rejected(
                format!("delete volume {pool}/{name}"),
                "The storage volume is still in use",
            )),
            Some(_) => {
                lock(&self.state)
                    .volumes
                    .remove(&(pool.to_string(), name.to_string()));
                Ok(())
            }
        };
        Self::reply("delete_volume", lose, result)
    }

    async fn rename_volume(
        &self,
        pool: &str,
        name: &str,
        new_name: &str,
        _target: Option<&str>,
    ) -> Result<()> {
        let lose = self.enter("rename_volume", name).await?;
        let what = format!("rename volume {pool}/{name} to {new_name}");
        let result = match self.volume(pool, name) {
            None => Err(not_found(what)),
            Some(v) if !v.used_by.is_empty() => Err(rejected(what, "The volume is in use")),
            Some(_) if self.volume(pool, new_name).is_some() => Err(RuntimeError::Conflict {
                what,
                message: "Volume by that name already exists".into(),
            }),
            Some(_) => {
                let mut state = lock(&self.state);
                let mut volume = state
                    .volumes
                    .remove(&(pool.to_string(), name.to_string()))
                    .expect("checked above");
                volume.name = new_name.to_string();
                state
                    .volumes
                    .insert((pool.to_string(), new_name.to_string()), volume);
                if let Some(used) = state.usage.remove(&(pool.to_string(), name.to_string())) {
                    state
                        .usage
                        .insert((pool.to_string(), new_name.to_string()), used);
                }
                Ok(())
            }
        };
        Self::reply("rename_volume", lose, result)
    }

    async fn patch_volume(
        &self,
        pool: &str,
        name: &str,
        config: &BTreeMap<String, String>,
        _target: Option<&str>,
    ) -> Result<()> {
        let lose = self.enter("patch_volume", name).await?;
        let mut state = lock(&self.state);
        let result = match state.volumes.get_mut(&(pool.to_string(), name.to_string())) {
            None => Err(not_found(format!("volume {pool}/{name}"))),
            Some(volume) => {
                for (key, value) in config {
                    if value.is_empty() {
                        volume.config.remove(key);
                    } else {
                        volume.config.insert(key.clone(), value.clone());
                    }
                }
                Ok(())
            }
        };
        drop(state);
        Self::reply("patch_volume", lose, result)
    }

    async fn volume_usage(
        &self,
        pool: &str,
        name: &str,
        _target: Option<&str>,
    ) -> Result<Option<u64>> {
        let lose = self.enter("volume_usage", name).await?;
        let state = lock(&self.state);
        let key = (pool.to_string(), name.to_string());
        let result = if state.volumes.contains_key(&key) {
            Ok(state.usage.get(&key).copied())
        } else {
            Err(not_found(format!("volume {pool}/{name}")))
        };
        drop(state);
        Self::reply("volume_usage", lose, result)
    }

    async fn resolve_image(&self, image: &ImageSource) -> Result<Option<String>> {
        let lose = self.enter("resolve_image", image.as_str()).await?;
        let found = resolve(&lock(&self.state).images, image);
        Self::reply("resolve_image", lose, Ok(found))
    }

    async fn image_size(&self, fingerprint: &str) -> Result<Option<u64>> {
        let lose = self.enter("image_size", fingerprint).await?;
        let state = lock(&self.state);
        let size = resolve(
            &state.images,
            &ImageSource::Fingerprint(fingerprint.to_string()),
        )
        .map(|found| state.image_sizes.get(&found).copied().unwrap_or(0));
        drop(state);
        Self::reply("image_size", lose, Ok(size))
    }

    async fn console_log_tail(&self, name: &str, max_bytes: usize) -> Result<String> {
        let lose = self.enter("console_log_tail", name).await?;
        let result = self.in_instance(name, |i| {
            let log = i.console.as_bytes();
            let tail = &log[log.len().saturating_sub(max_bytes)..];
            Ok(String::from_utf8_lossy(tail).into_owned())
        });
        Self::reply("console_log_tail", lose, result)
    }

    async fn events(&self) -> Result<EventStream> {
        let lose = self.enter("events", "").await?;
        let receiver = self.events.subscribe();
        let stream = futures::stream::unfold(receiver, |mut rx| async move {
            match rx.recv().await {
                Ok(event) => Some((Ok(event), rx)),
                // A slow subscriber missed events; like a dropped websocket, it must resync.
                Err(broadcast::error::RecvError::Lagged(_)) => Some((
                    Err(RuntimeError::Transport {
                        what: "fake event stream".into(),
                        message: "subscriber lagged; events were dropped".into(),
                    }),
                    rx,
                )),
                Err(broadcast::error::RecvError::Closed) => None,
            }
        });
        Self::reply("events", lose, Ok(Box::pin(stream) as EventStream))
    }

    async fn watch_files(&self, name: &str, dir: &str) -> Result<Watch> {
        let lose = self.enter("watch_files", name).await?;
        let watch = match lock(&self.state).instances.get_mut(name) {
            Some(i) if i.instance.status == InstanceStatus::Running => {
                if i.watched.insert(dir.trim_end_matches('/').to_string()) {
                    Watch::Started
                } else {
                    Watch::Already
                }
            }
            _ => Watch::Unavailable,
        };
        Self::reply("watch_files", lose, Ok(watch))
    }

    fn file_notices(&self) -> broadcast::Receiver<String> {
        self.file_notices.subscribe()
    }
}

/// An output past the request's cap, as the LXD client answers it: each stream kept up to the
/// cap, with the exit code.
fn capped(output: ExecOutput, limit: usize, what: &str) -> Result<ExecOutput> {
    if output.stdout.len() <= limit && output.stderr.len() <= limit {
        return Ok(output);
    }
    let cut = |bytes: &[u8]| bytes[..bytes.len().min(limit)].to_vec();
    Err(RuntimeError::TooLarge {
        what: what.to_string(),
        limit: limit as u64,
        partial: Some(Box::new(ExecOutput {
            exit_code: output.exit_code,
            stdout: cut(&output.stdout),
            stderr: cut(&output.stderr),
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn request(name: &str) -> CreateInstance {
        CreateInstance {
            name: name.into(),
            image: ImageSource::Alias("berth-tiny".into()),
            config: [("user.berth.uid".to_string(), "u1".to_string())].into(),
            devices: BTreeMap::new(),
            profiles: Vec::new(),
            target: None,
            known_absent: false,
        }
    }

    async fn created(fake: &FakeRuntime, name: &str) {
        match fake.create_instance(&request(name)).await.unwrap() {
            Created::Submitted { operation } => {
                fake.wait_operation(&operation, Duration::from_secs(1))
                    .await
                    .unwrap();
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn create_is_idempotent_and_lifecycle_works() {
        let fake = FakeRuntime::new();
        created(&fake, "web").await;
        assert!(matches!(
            fake.create_instance(&request("web")).await.unwrap(),
            Created::Exists(_)
        ));
        let i = fake.get_instance("web").await.unwrap().unwrap();
        assert_eq!(i.status, InstanceStatus::Stopped);
        assert_eq!(
            i.base_image(),
            Some(fake_fingerprint("berth-tiny").as_str())
        );
        fake.start_instance("web", Duration::from_secs(1))
            .await
            .unwrap();
        assert!(fake.instance("web").unwrap().is_running());
        assert_eq!(
            fake.list_instances(Some("user.berth."), true)
                .await
                .unwrap()
                .len(),
            1
        );
        assert!(
            fake.list_instances(Some("user.other."), true)
                .await
                .unwrap()
                .is_empty()
        );
        let busy = fake.delete_instance("web", Duration::from_secs(1)).await;
        assert!(matches!(
            busy,
            Err(RuntimeError::Rejected { status: 400, .. })
        ));
        fake.stop_instance("web", StopOptions::clean_then_force(Duration::from_secs(1)))
            .await
            .unwrap();
        fake.delete_instance("web", Duration::from_secs(1))
            .await
            .unwrap();
        fake.delete_instance("web", Duration::from_secs(1))
            .await
            .unwrap();
        assert!(fake.get_instance("web").await.unwrap().is_none());
        assert_eq!(fake.count("create_instance"), 2);
    }

    #[tokio::test]
    async fn missing_image_fails_inside_the_operation_and_bad_names_are_rejected() {
        let fake = FakeRuntime::new();
        let mut req = request("web");
        req.image = ImageSource::Alias("nope".into());
        let Created::Submitted { operation } = fake.create_instance(&req).await.unwrap() else {
            panic!("expected an operation");
        };
        let err = fake
            .wait_operation(&operation, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err.lxd_message(), Some("Image not found"));
        assert!(fake.instance("web").is_none());
        let err = fake.create_instance(&request("9bad")).await.unwrap_err();
        assert!(
            matches!(err, RuntimeError::Rejected { status: 400, .. }),
            "{err}"
        );
        let err = fake
            .wait_operation("unknown", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(err, RuntimeError::OperationVanished { .. }));
    }

    #[tokio::test]
    async fn nth_call_and_named_method_faults() {
        let fake = FakeRuntime::new();
        let boom = RuntimeError::Transport {
            what: "x".into(),
            message: "down".into(),
        };
        fake.fault_nth_call(2, Fault::Fail(boom.clone()));
        fake.fault_method("start_instance", Fault::Fail(boom.clone()));
        assert!(fake.server_info().await.is_ok());
        assert_eq!(fake.server_info().await.unwrap_err(), boom);
        assert!(fake.server_info().await.is_ok());
        created(&fake, "web").await;
        assert_eq!(
            fake.start_instance("web", Duration::from_secs(1))
                .await
                .unwrap_err(),
            boom
        );
        assert!(
            !fake.instance("web").unwrap().is_running(),
            "failed before the effect"
        );
        fake.start_instance("web", Duration::from_secs(1))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn lost_reply_happens_after_the_side_effect() {
        let fake = FakeRuntime::new();
        fake.fault_method("create_instance", Fault::LoseReply);
        let err = fake.create_instance(&request("web")).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(
            fake.instance("web").is_some(),
            "the instance was created anyway"
        );
        // A retry sees it and submits nothing new.
        assert!(matches!(
            fake.create_instance(&request("web")).await.unwrap(),
            Created::Exists(_)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn latency_and_wedged_stop_run_on_tokio_time() {
        let fake = FakeRuntime::new();
        created(&fake, "web").await;
        fake.start_instance("web", Duration::from_secs(1))
            .await
            .unwrap();
        fake.set_latency(Duration::from_secs(2));
        let started = tokio::time::Instant::now();
        fake.get_instance("web").await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        fake.clear_faults();

        fake.set_wedged("web", true);
        let refuse = StopOptions {
            clean_timeout: Duration::from_secs(30),
            force_after: false,
        };
        let err = fake.stop_instance("web", refuse).await.unwrap_err();
        assert!(err.lxd_message().unwrap().contains("Failed shutting down"));
        assert!(fake.instance("web").unwrap().is_running());
        fake.stop_instance(
            "web",
            StopOptions::clean_then_force(Duration::from_secs(30)),
        )
        .await
        .unwrap();
        assert_eq!(
            fake.instance("web").unwrap().status,
            InstanceStatus::Stopped
        );
    }

    #[tokio::test]
    async fn scripted_exec_and_exec_state_errors() {
        let fake = FakeRuntime::new();
        created(&fake, "web").await;
        let req = ExecRequest::new(["git", "status"], Duration::from_secs(5));
        let err = fake.exec("web", &req).await.unwrap_err();
        assert_eq!(err.lxd_message(), Some("Instance is not running"));
        fake.start_instance("web", Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(fake.exec("web", &req).await.unwrap(), ExecOutput::default());
        fake.script_exec(
            &["git"],
            ExecOutput {
                exit_code: 128,
                stdout: Vec::new(),
                stderr: b"fatal".to_vec(),
            },
        );
        assert_eq!(fake.exec("web", &req).await.unwrap().exit_code, 128);
        fake.on_exec(|_, r| {
            (r.command[0] == "sleep").then(|| {
                Err(RuntimeError::Timeout {
                    what: "exec".into(),
                    after: r.timeout,
                })
            })
        });
        let slow = ExecRequest::new(["sleep", "9"], Duration::from_secs(1));
        assert!(matches!(
            fake.exec("web", &slow).await,
            Err(RuntimeError::Timeout { .. })
        ));
        fake.set_status("web", InstanceStatus::Frozen);
        assert_eq!(
            fake.exec("web", &req).await.unwrap_err().lxd_message(),
            Some("Instance is frozen")
        );
    }

    #[tokio::test]
    async fn files_devices_and_volumes() {
        let fake = FakeRuntime::new();
        let volume = fake
            .create_volume(&CreateVolume {
                pool: "default".into(),
                name: "berth-u1-workspace".into(),
                size: Some("1GiB".into()),
                config: [("user.berth.uid".to_string(), "u1".to_string())].into(),
                target: None,
            })
            .await
            .unwrap();
        assert_eq!(volume.config["size"], "1GiB");
        created(&fake, "web").await;
        let disk: crate::runtime::Device = [
            ("type", "disk"),
            ("pool", "default"),
            ("source", "berth-u1-workspace"),
            ("path", "/workspace"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        fake.patch_instance(
            "web",
            &InstancePatch {
                config: BTreeMap::new(),
                devices: [("workspace".to_string(), disk)].into(),
            },
        )
        .await
        .unwrap();
        let used = fake
            .list_volumes("default", Some("user.berth."))
            .await
            .unwrap();
        assert_eq!(used[0].used_by, vec!["/1.0/instances/web".to_string()]);
        assert!(
            fake.delete_volume("default", "berth-u1-workspace", None)
                .await
                .is_err()
        );
        fake.update_instance("web", &|e| {
            e.devices.remove("workspace");
        })
        .await
        .unwrap();
        let web = fake.instance("web").unwrap();
        assert!(!web.devices.contains_key("workspace"));
        fake.delete_volume("default", "berth-u1-workspace", None)
            .await
            .unwrap();

        fake.mkdir(
            "web",
            &Mkdir {
                path: "/w".into(),
                uid: 1,
                gid: 2,
                mode: 0o750,
            },
        )
        .await
        .unwrap();
        let file = FileWrite {
            path: "/w/a".into(),
            content: b"hi".to_vec(),
            uid: 1000,
            gid: 1000,
            mode: 0o600,
        };
        fake.file_write("web", &file).await.unwrap();
        assert_eq!(fake.file_read("web", "/w/a", 2).await.unwrap(), b"hi");
        assert!(matches!(
            fake.file_read("web", "/w/a", 1).await,
            Err(RuntimeError::TooLarge { limit: 1, .. })
        ));
        assert_eq!(fake.file_owner("web", "/w/a"), Some((1000, 1000, 0o600)));
        assert!(fake.file_read("web", "/w", 1024).await.is_err());
        fake.file_delete("web", "/w/a").await.unwrap();
        assert!(
            fake.file_read("web", "/w/a", 1024)
                .await
                .unwrap_err()
                .is_not_found()
        );
    }

    #[tokio::test]
    async fn events_are_broadcast() {
        let fake = FakeRuntime::new();
        let mut events = fake.events().await.unwrap();
        created(&fake, "web").await;
        fake.start_instance("web", Duration::from_secs(1))
            .await
            .unwrap();
        let first = events.next().await.unwrap().unwrap();
        assert_eq!(first.action, "instance-created");
        let second = events.next().await.unwrap().unwrap();
        assert_eq!(second.action, "instance-started");
        assert_eq!(second.instance.as_deref(), Some("web"));
    }

    /// A watch is new once, in place after, and ended by a restart or a stop as a tmpfs
    /// `/run` ends it: the next ask starts a new one.
    #[tokio::test]
    async fn a_watch_says_whether_it_is_new() {
        let fake = FakeRuntime::new();
        created(&fake, "web").await;
        assert_eq!(
            fake.watch_files("web", "/run/berth").await.unwrap(),
            Watch::Unavailable,
            "stopped"
        );
        let second = Duration::from_secs(1);
        fake.start_instance("web", second).await.unwrap();
        let mut notices = fake.file_notices();
        assert_eq!(
            fake.watch_files("web", "/run/berth").await.unwrap(),
            Watch::Started
        );
        assert_eq!(
            fake.watch_files("web", "/run/berth/").await.unwrap(),
            Watch::Already
        );
        let report = FileWrite {
            path: "/run/berth/agent.json".into(),
            content: b"{}".to_vec(),
            uid: 0,
            gid: 0,
            mode: 0o644,
        };
        fake.file_write("web", &report).await.unwrap();
        assert_eq!(notices.try_recv().unwrap(), "web");

        fake.restart_instance("web", false, second).await.unwrap();
        fake.file_write("web", &report).await.unwrap();
        assert!(notices.try_recv().is_err(), "no watch after the restart");
        assert_eq!(
            fake.watch_files("web", "/run/berth").await.unwrap(),
            Watch::Started
        );

        fake.set_status("web", InstanceStatus::Stopped);
        assert_eq!(
            fake.watch_files("web", "/run/berth").await.unwrap(),
            Watch::Unavailable
        );
        fake.set_status("web", InstanceStatus::Running);
        assert_eq!(
            fake.watch_files("web", "/run/berth").await.unwrap(),
            Watch::Started
        );
    }
}
