//! [`LxdClient`]: the runtime operations as LXD REST calls.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Method;
use serde_json::json;
use tokio::time::Instant;

use crate::runtime::{
    CreateInstance, CreateVolume, Created, EventStream, ExecOutput, ExecRequest, FileWrite,
    HostCapacity, ImageSource, Instance, InstanceEdit, InstanceEditFn, InstancePatch,
    InstanceState, InteractiveExec, Mkdir, Operation, OperationStatus, PoolSpace, Result, Runtime,
    RuntimeError, ServerInfo, StopOptions, StoragePool, TerminalSize, Volume, Watch,
};

use super::endpoint::{Endpoint, LxdConfig};
use super::exec_capture::Capture;
use super::file_watch::FileWatch;
use super::nic_restart::NicRestart;
use super::transport::{Call, Keep, Reply, Transport, decode, parse_envelope};
use super::wire::{
    InstanceJson, MemberJson, OperationJson, ResourcesJson, ServerJson, StateJson, VolumeJson,
};
use super::{events, exec_ws, tls};

/// Characters escaped in a path segment (instance, volume, pool and alias names).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');

/// How often `update_instance` re-reads and retries when someone else changed the instance.
const UPDATE_ATTEMPTS: usize = 8;

/// Force stops tried while a previous stop still holds the instance's operation lock.
const FORCE_STOP_ATTEMPTS: usize = 3;

/// Extra time given to an operation wait beyond what the server was told, so the server's own
/// timeout (and its message) arrives before ours.
const WAIT_GRACE: Duration = Duration::from_secs(5);
/// How long copying a workspace volume may take (every byte of it is read and written).
const VOLUME_COPY_TIMEOUT: Duration = Duration::from_secs(30 * 60);

fn seg(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

pub(super) fn instance_path(name: &str) -> String {
    format!("/1.0/instances/{}", seg(name))
}

/// The name a listing's URL ends in, and the member it names when it does:
/// `/1.0/storage-pools/P/volumes/custom/NAME?target=M`, `/1.0/instances/NAME?project=P`.
pub(super) fn name_of_url(url: &str) -> Option<(String, Option<String>)> {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let name = path.rsplit_once('/')?.1;
    let name = percent_encoding::percent_decode_str(name)
        .decode_utf8()
        .ok()?
        .into_owned();
    let target = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("target="))
        .map(str::to_string);
    Some((name, target))
}

fn volume_path(pool: &str, name: &str) -> String {
    format!(
        "/1.0/storage-pools/{}/volumes/custom/{}",
        seg(pool),
        seg(name)
    )
}

/// Whole seconds for LXD's integer timeouts, never 0 (which means "forever" to some calls).
fn whole_seconds(d: Duration) -> u64 {
    d.as_secs_f64().ceil().max(1.0) as u64
}

/// A connected LXD client. Cheap to share behind an `Arc`.
pub struct LxdClient {
    config: LxdConfig,
    transport: Arc<Transport>,
    tls: Option<Arc<rustls::ClientConfig>>,
    server: RwLock<(ServerInfo, bool)>,
    files: FileWatch,
}

impl std::fmt::Debug for LxdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LxdClient")
            .field("endpoint", &self.config.endpoint.describe())
            .field("project", &self.config.project)
            .finish()
    }
}

impl LxdClient {
    /// Builds the client and reads the server's version and API extensions. Fails with
    /// `Transport` when the daemon cannot be reached and `Config` for bad certificate settings.
    pub async fn connect(config: LxdConfig) -> Result<LxdClient> {
        let tls = match &config.endpoint {
            Endpoint::Https(https) => Some(Arc::new(tls::client_config(https)?)),
            Endpoint::Unix(_) => None,
        };
        let transport = Arc::new(Transport::new(&config)?);
        let client = LxdClient {
            config,
            transport,
            tls,
            server: RwLock::new((empty_server(), false)),
            files: FileWatch::new(),
        };
        client.refresh_server().await?;
        Ok(client)
    }

    pub fn config(&self) -> &LxdConfig {
        &self.config
    }

    /// Whether the server trusts this client (always over the unix socket; over HTTPS once the
    /// client certificate was added).
    pub fn is_trusted(&self) -> bool {
        self.server.read().map(|s| s.1).unwrap_or(false)
    }

    /// The server as read at connect time (or the last refresh).
    pub fn server(&self) -> ServerInfo {
        self.server
            .read()
            .map(|s| s.0.clone())
            .unwrap_or_else(|_| empty_server())
    }

    /// Re-reads `/1.0` (version, extensions, trust).
    pub async fn refresh_server(&self) -> Result<ServerInfo> {
        let server: ServerJson = self
            .transport
            .call(Method::GET, "/1.0", "read LXD server info")
            .get()
            .await?;
        let trusted = server.auth == "trusted";
        let info = ServerInfo {
            version: server.environment.server_version,
            api_extensions: server.api_extensions,
            clustered: server.environment.server_clustered,
            server_name: server.environment.server_name,
            members: Vec::new(),
        };
        if let Ok(mut slot) = self.server.write() {
            *slot = (info.clone(), trusted);
        }
        Ok(info)
    }

    /// Adds this client's certificate to the server's trust store using the server's trust
    /// password (`core.trust_password`), then re-reads the server.
    pub async fn trust_with_password(&self, name: &str, password: &str) -> Result<()> {
        if !self.is_trusted() {
            self.transport
                .call(Method::POST, "/1.0/certificates", "add client certificate")
                .json(json!({"type": "client", "name": name, "password": password}))
                .send()
                .await?;
        }
        self.refresh_server().await?;
        if self.is_trusted() {
            Ok(())
        } else {
            Err(RuntimeError::Rejected {
                what: "add client certificate".into(),
                status: 403,
                message: "the server still does not trust this client".into(),
            })
        }
    }

    fn target<'a>(&'a self, explicit: Option<&'a str>) -> Option<&'a str> {
        explicit
            .filter(|t| !t.is_empty())
            .or(self.config.target.as_deref())
    }

    /// Sends `call` and waits for its operation when it is async, all within `timeout`.
    async fn run(&self, call: Call<'_>, what: &str, timeout: Duration) -> Result<Operation> {
        let started = Instant::now();
        let submit = call.timeout(timeout.min(self.transport.request_timeout()));
        match submit.send().await? {
            Reply::Async { operation } => {
                let remaining = timeout.saturating_sub(started.elapsed());
                match self.wait(&operation, what, remaining).await {
                    Err(RuntimeError::Timeout { what, .. }) => Err(RuntimeError::Timeout {
                        what,
                        after: timeout,
                    }),
                    other => other,
                }
            }
            Reply::Sync { metadata, .. } => Ok(Operation {
                id: String::new(),
                status: OperationStatus::Success,
                err: String::new(),
                metadata,
            }),
        }
    }

    async fn wait(&self, operation: &str, what: &str, timeout: Duration) -> Result<Operation> {
        wait_operation(&self.transport, operation, what, timeout).await
    }

    async fn change_state(
        &self,
        name: &str,
        body: serde_json::Value,
        what: &str,
        timeout: Duration,
    ) -> Result<()> {
        let call = self
            .transport
            .call(Method::PUT, &format!("{}/state", instance_path(name)), what)
            .json(body);
        self.run(call, what, timeout).await.map(|_| ())
    }
}

/// Waits for an operation with LXD's long-poll, until it ends or `timeout` passes.
/// The exit code a finished exec operation reports.
fn exit_code(op: &Operation, what: &str) -> Result<i32> {
    let code = op
        .metadata
        .get("return")
        .and_then(|v| v.as_i64())
        .ok_or_else(|| RuntimeError::Protocol {
            what: what.to_string(),
            message: "exec finished without an exit code".into(),
        })?;
    Ok(i32::try_from(code).unwrap_or(-1))
}

pub(super) async fn wait_operation(
    transport: &Transport,
    operation: &str,
    what: &str,
    timeout: Duration,
) -> Result<Operation> {
    let deadline = Instant::now() + timeout;
    let path = format!("/1.0/operations/{}/wait", seg(operation));
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(RuntimeError::Timeout {
                what: what.to_string(),
                after: timeout,
            });
        }
        let secs = whole_seconds(remaining);
        let asked = Instant::now();
        let reply = transport
            .call(Method::GET, &path, format!("wait for {what}"))
            .query("timeout", secs.to_string())
            .timeout(remaining + WAIT_GRACE.min(transport.request_timeout()))
            .send()
            .await;
        let op: OperationJson = match reply {
            Ok(reply) => decode(what, reply.into_metadata())?,
            Err(RuntimeError::NotFound { .. }) => {
                return Err(RuntimeError::OperationVanished {
                    operation: operation.to_string(),
                });
            }
            Err(RuntimeError::Timeout { .. }) => {
                return Err(RuntimeError::Timeout {
                    what: what.to_string(),
                    after: timeout,
                });
            }
            Err(e) => return Err(e),
        };
        let op = Operation::from(op);
        match op.status {
            OperationStatus::Success => return Ok(op),
            OperationStatus::Failure | OperationStatus::Cancelled => {
                if super::transport::says_busy(&op.err) {
                    return Err(RuntimeError::Busy {
                        what: what.to_string(),
                        message: op.err,
                    });
                }
                return Err(RuntimeError::OperationFailed {
                    what: what.to_string(),
                    message: op.err,
                });
            }
            OperationStatus::Running | OperationStatus::Other(_) => {
                // LXD long-polls; a server that answers at once must not be hammered.
                if asked.elapsed() < Duration::from_millis(50) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

fn empty_server() -> ServerInfo {
    ServerInfo {
        version: String::new(),
        api_extensions: Vec::new(),
        clustered: false,
        server_name: String::new(),
        members: Vec::new(),
    }
}

fn message_says(error: &RuntimeError, needles: &[&str]) -> bool {
    error
        .lxd_message()
        .map(|m| {
            let m = m.to_ascii_lowercase();
            needles.iter().any(|n| m.contains(n))
        })
        .unwrap_or(false)
}

#[async_trait]
impl Runtime for LxdClient {
    async fn server_info(&self) -> Result<ServerInfo> {
        let mut info = self.server();
        if info.clustered {
            let members: Vec<MemberJson> = self
                .transport
                .call(Method::GET, "/1.0/cluster/members", "list cluster members")
                .query("recursion", "1")
                .get()
                .await?;
            info.members = members.into_iter().map(Into::into).collect();
        }
        Ok(info)
    }

    async fn host_capacity(&self) -> Result<HostCapacity> {
        let resources: ResourcesJson = self
            .transport
            .call(Method::GET, "/1.0/resources", "read the host's resources")
            .get()
            .await?;
        Ok(HostCapacity {
            memory_bytes: resources.memory.total,
            cpus: resources.cpu.total,
        })
    }

    async fn list_instances(
        &self,
        config_prefix: Option<&str>,
        with_state: bool,
    ) -> Result<Vec<Instance>> {
        let instances: Vec<InstanceJson> = self
            .transport
            .call(Method::GET, "/1.0/instances", "list instances")
            .query("recursion", if with_state { "2" } else { "1" })
            .get()
            .await?;
        Ok(instances
            .into_iter()
            .filter(|i| match config_prefix {
                Some(prefix) => i.config.keys().any(|k| k.starts_with(prefix)),
                None => true,
            })
            .map(Instance::from)
            .collect())
    }

    async fn instance_names(&self) -> Result<Vec<String>> {
        let urls: Vec<String> = self
            .transport
            .call(Method::GET, "/1.0/instances", "list instance names")
            .get()
            .await?;
        Ok(urls
            .iter()
            .filter_map(|url| name_of_url(url).map(|(name, _)| name))
            .collect())
    }

    async fn get_instance(&self, name: &str) -> Result<Option<Instance>> {
        let what = format!("instance {name}");
        let found: Option<InstanceJson> = self
            .transport
            .call(Method::GET, &instance_path(name), what.clone())
            .query("recursion", "1")
            .get_opt()
            .await?;
        let Some(json) = found else {
            return Ok(None);
        };
        let mut instance = Instance::from(json);
        if instance.state.is_none() {
            // Servers without the full-instance extension need a second call for state.
            let state: Option<StateJson> = self
                .transport
                .call(Method::GET, &format!("{}/state", instance_path(name)), what)
                .get_opt()
                .await?;
            instance.state = state.map(InstanceState::from);
        }
        Ok(Some(instance))
    }

    async fn get_instance_record(&self, name: &str) -> Result<Option<Instance>> {
        let found: Option<InstanceJson> = self
            .transport
            .call(
                Method::GET,
                &instance_path(name),
                format!("instance {name}"),
            )
            .get_opt()
            .await?;
        // Without recursion, LXD leaves the state out.
        Ok(found.map(Instance::from))
    }

    async fn create_instance(&self, request: &CreateInstance) -> Result<Created> {
        let what = format!("create instance {}", request.name);
        if !request.known_absent {
            let existing: Option<InstanceJson> = self
                .transport
                .call(Method::GET, &instance_path(&request.name), what.clone())
                .get_opt()
                .await?;
            if let Some(existing) = existing {
                return Ok(Created::Exists(Box::new(Instance::from(existing))));
            }
        }
        let source = match &request.image {
            ImageSource::Alias(alias) => json!({"type": "image", "alias": alias}),
            ImageSource::Fingerprint(fp) => json!({"type": "image", "fingerprint": fp}),
        };
        let mut body = json!({
            "name": request.name,
            "type": "container",
            "source": source,
            "config": request.config,
            "devices": request.devices,
        });
        if !request.profiles.is_empty() {
            body["profiles"] = json!(request.profiles);
        }
        let reply = self
            .transport
            .call(Method::POST, "/1.0/instances", what.clone())
            .query_opt("target", self.target(request.target.as_deref()))
            .json(body)
            .send()
            .await?;
        match reply {
            Reply::Async { operation } => Ok(Created::Submitted { operation }),
            Reply::Sync { .. } => Err(RuntimeError::Protocol {
                what,
                message: "instance creation answered without an operation".into(),
            }),
        }
    }

    async fn wait_operation(&self, operation: &str, timeout: Duration) -> Result<Operation> {
        self.wait(operation, &format!("operation {operation}"), timeout)
            .await
    }

    async fn start_instance(&self, name: &str, timeout: Duration) -> Result<()> {
        let what = format!("start instance {name}");
        let body = json!({"action": "start", "timeout": whole_seconds(timeout)});
        match self.change_state(name, body, &what, timeout).await {
            Err(e) if message_says(&e, &["already running"]) => Ok(()),
            other => other,
        }
    }

    async fn stop_instance(&self, name: &str, stop: StopOptions) -> Result<()> {
        let what = format!("stop instance {name}");
        let already = |e: &RuntimeError| message_says(e, &["already stopped", "not running"]);
        let clean = async {
            if stop.clean_timeout.is_zero() {
                return Err(RuntimeError::Timeout {
                    what: what.clone(),
                    after: stop.clean_timeout,
                });
            }
            let secs = whole_seconds(stop.clean_timeout);
            let body = json!({"action": "stop", "timeout": secs, "force": false});
            self.change_state(name, body, &what, stop.clean_timeout + WAIT_GRACE)
                .await
        };
        match clean.await {
            Ok(()) => Ok(()),
            Err(e) if already(&e) => Ok(()),
            Err(e) if !stop.force_after => Err(e),
            Err(e) => {
                if !stop.clean_timeout.is_zero() {
                    tracing::info!(instance = name, error = %e, "clean stop failed, forcing");
                }
                let what = format!("force stop instance {name}");
                let mut attempt = 1;
                loop {
                    let body = json!({"action": "stop", "force": true});
                    match self
                        .change_state(name, body, &what, self.transport.request_timeout())
                        .await
                    {
                        Err(e) if already(&e) => return Ok(()),
                        // The failed clean stop can still hold LXD's per-instance operation
                        // lock; once it lets go, the kill goes through.
                        Err(e)
                            if attempt < FORCE_STOP_ATTEMPTS
                                && (e.is_busy() || message_says(&e, &["operation timed out"])) =>
                        {
                            attempt += 1;
                        }
                        other => return other,
                    }
                }
            }
        }
    }

    async fn restart_instance(&self, name: &str, force: bool, timeout: Duration) -> Result<()> {
        let what = format!("restart instance {name}");
        let body = json!({"action": "restart", "force": force, "timeout": whole_seconds(timeout)});
        self.change_state(name, body, &what, timeout + WAIT_GRACE)
            .await
    }

    async fn delete_instance(&self, name: &str, timeout: Duration) -> Result<()> {
        let what = format!("delete instance {name}");
        let call = self
            .transport
            .call(Method::DELETE, &instance_path(name), what.clone());
        match self.run(call, &what, timeout).await {
            Ok(_) | Err(RuntimeError::NotFound { .. }) => Ok(()),
            Err(e) if message_says(&e, &["not found"]) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn rename_instance(&self, name: &str, new_name: &str, timeout: Duration) -> Result<()> {
        if name == new_name {
            return Ok(());
        }
        let what = format!("rename instance {name} to {new_name}");
        let call = self
            .transport
            .call(Method::POST, &instance_path(name), what.clone())
            .json(json!({"name": new_name}));
        self.run(call, &what, timeout).await.map(|_| ())
    }

    async fn patch_instance(&self, name: &str, patch: &InstancePatch) -> Result<()> {
        let what = format!("update instance {name}");
        let mut body = json!({});
        if !patch.config.is_empty() {
            body["config"] = json!(patch.config);
        }
        if !patch.devices.is_empty() {
            body["devices"] = json!(patch.devices);
        }
        let call = self
            .transport
            .call(Method::PATCH, &instance_path(name), what.clone())
            .json(body);
        self.run(call, &what, self.transport.request_timeout())
            .await
            .map(|_| ())
    }

    async fn update_instance(&self, name: &str, edit: InstanceEditFn<'_>) -> Result<()> {
        let what = format!("update instance {name}");
        let mut last_conflict = None;
        for _ in 0..UPDATE_ATTEMPTS {
            let (metadata, etag) = match self
                .transport
                .call(Method::GET, &instance_path(name), what.clone())
                .send()
                .await?
            {
                Reply::Sync { metadata, etag } => (metadata, etag),
                Reply::Async { .. } => {
                    return Err(RuntimeError::Protocol {
                        what,
                        message: "reading an instance answered with an operation".into(),
                    });
                }
            };
            let current: InstanceJson = decode(&what, metadata)?;
            let mut editable = InstanceEdit {
                config: current.config.clone(),
                devices: current.devices.clone(),
                profiles: current.profiles.clone(),
            };
            edit(&mut editable);
            let body = json!({
                "architecture": current.architecture,
                "config": editable.config,
                "devices": editable.devices,
                "profiles": editable.profiles,
                "ephemeral": current.ephemeral,
                "stateful": current.stateful,
                "description": current.description,
            });
            let mut call = self
                .transport
                .call(Method::PUT, &instance_path(name), what.clone())
                .json(body);
            if let Some(etag) = etag {
                call = call.header("If-Match", etag);
            }
            match self
                .run(call, &what, self.transport.request_timeout())
                .await
            {
                Ok(_) => return Ok(()),
                Err(RuntimeError::Rejected {
                    status: 412,
                    message,
                    ..
                }) => {
                    last_conflict = Some(message);
                }
                Err(e) => return Err(e),
            }
        }
        Err(RuntimeError::Conflict {
            what,
            message: format!(
                "changed concurrently {UPDATE_ATTEMPTS} times in a row: {}",
                last_conflict.unwrap_or_default()
            ),
        })
    }

    async fn restart_nics(&self, name: &str) -> Result<Vec<String>> {
        let what = format!("restart the network interfaces of {name}");
        let current: InstanceJson = self
            .transport
            .call(Method::GET, &instance_path(name), what.clone())
            .get_opt()
            .await?
            .ok_or_else(|| RuntimeError::NotFound {
                what: what.clone(),
                message: String::new(),
            })?;
        let plan = NicRestart::of(&current);
        if plan.interfaces.is_empty() {
            return Ok(Vec::new());
        }
        self.update_instance(name, &|edit| plan.nudge(edit)).await?;
        self.update_instance(name, &|edit| plan.restore(edit))
            .await?;
        Ok(plan.interfaces)
    }

    async fn exec(&self, name: &str, request: &ExecRequest) -> Result<ExecOutput> {
        let what = format!("exec in {name}");
        let capture = Capture::new(request.max_output);
        let command = if request.discard_output {
            request.command.clone()
        } else {
            capture.wrap(&request.command)
        };
        let mut body = exec_ws::exec_body(&command, request);
        body["wait-for-websocket"] = json!(false);
        body["interactive"] = json!(false);
        let call = self
            .transport
            .call(
                Method::POST,
                &format!("{}/exec", instance_path(name)),
                what.clone(),
            )
            .json(body);
        let started = Instant::now();
        let submitted = call
            .timeout(request.timeout.min(self.transport.request_timeout()))
            .send()
            .await?;
        let Reply::Async { operation } = submitted else {
            return Err(RuntimeError::Protocol {
                what,
                message: "exec answered without an operation".into(),
            });
        };
        if request.discard_output {
            let op = self.wait(&operation, &what, request.timeout).await?;
            let exit_code = exit_code(&op, &what)?;
            return Ok(ExecOutput {
                exit_code,
                ..ExecOutput::default()
            });
        }
        // From here on a caller that stops waiting (the timeout, a dropped request) leaves
        // nothing running: dropping `running` stops the command and deletes its files.
        let running = capture.running(&self.transport, name);
        let mut gaps = Capture::gaps();
        let op = loop {
            let remaining = request.timeout.saturating_sub(started.elapsed());
            let gap = gaps.next().unwrap_or(remaining).min(remaining);
            match self.wait(&operation, &what, gap).await {
                Ok(op) => break op,
                Err(RuntimeError::Timeout { .. }) if started.elapsed() >= request.timeout => {
                    return Err(RuntimeError::Timeout {
                        what,
                        after: request.timeout,
                    });
                }
                Err(RuntimeError::Timeout { .. }) => {
                    if capture.past_cap(&self.transport, name).await? {
                        if let Err(e) = capture.stop(&self.transport, name).await {
                            tracing::warn!(instance = name, error = %e, "could not stop a command past its output cap");
                        }
                        running.finished();
                        return capture.collect(&self.transport, name, &what, -1).await;
                    }
                }
                Err(e) => return Err(e),
            }
        };
        let exit_code = exit_code(&op, &what)?;
        running.finished();
        capture
            .collect(&self.transport, name, &what, exit_code)
            .await
    }

    async fn exec_interactive(
        &self,
        name: &str,
        request: &ExecRequest,
        terminal: Option<TerminalSize>,
    ) -> Result<InteractiveExec> {
        let websockets = exec_ws::Websockets {
            endpoint: &self.config.endpoint,
            tls: self.tls.clone(),
            project: &self.config.project,
        };
        exec_ws::start(
            Arc::clone(&self.transport),
            websockets,
            name,
            request,
            terminal,
        )
        .await
    }

    async fn file_write(&self, name: &str, file: &FileWrite) -> Result<()> {
        let what = format!("write {} in {name}", file.path);
        self.transport
            .call(
                Method::POST,
                &format!("{}/files", instance_path(name)),
                what,
            )
            .query("path", file.path.clone())
            .header("X-LXD-uid", file.uid.to_string())
            .header("X-LXD-gid", file.gid.to_string())
            .header("X-LXD-mode", format!("{:04o}", file.mode))
            .header("X-LXD-type", "file")
            .header("X-LXD-write", "overwrite")
            .bytes(file.content.clone())
            .send()
            .await
            .map(|_| ())
    }

    async fn file_read(&self, name: &str, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        let what = format!("read {path} in {name}");
        let raw = self
            .transport
            .call(
                Method::GET,
                &format!("{}/files", instance_path(name)),
                what.clone(),
            )
            .query("path", path)
            .keep(Keep::AtMost(
                usize::try_from(max_bytes).unwrap_or(usize::MAX),
            ))
            .send_raw()
            .await?;
        if raw.status >= 400 {
            parse_envelope(&what, &raw)?;
        }
        let kind = raw
            .headers
            .get("x-lxd-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("file");
        if kind != "file" {
            return Err(RuntimeError::Rejected {
                what,
                status: 400,
                message: format!("{path} is a {kind}, not a file"),
            });
        }
        if raw.cut {
            return Err(RuntimeError::TooLarge {
                what,
                limit: max_bytes,
                partial: None,
            });
        }
        Ok(raw.body.to_vec())
    }

    async fn mkdir(&self, name: &str, dir: &Mkdir) -> Result<()> {
        let what = format!("create directory {} in {name}", dir.path);
        let result = self
            .transport
            .call(
                Method::POST,
                &format!("{}/files", instance_path(name)),
                what.clone(),
            )
            .query("path", dir.path.clone())
            .header("X-LXD-uid", dir.uid.to_string())
            .header("X-LXD-gid", dir.gid.to_string())
            .header("X-LXD-mode", format!("{:04o}", dir.mode))
            .header("X-LXD-type", "directory")
            .bytes(Vec::new())
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e @ RuntimeError::NotFound { .. }) => Err(e),
            Err(e) => {
                // An existing directory is what was asked for.
                let raw = self
                    .transport
                    .call(Method::GET, &format!("{}/files", instance_path(name)), what)
                    .query("path", dir.path.clone())
                    .send_raw()
                    .await?;
                let is_dir = raw.status == 200
                    && raw.headers.get("x-lxd-type").and_then(|v| v.to_str().ok())
                        == Some("directory");
                if is_dir { Ok(()) } else { Err(e) }
            }
        }
    }

    async fn file_delete(&self, name: &str, path: &str) -> Result<()> {
        let what = format!("delete {path} in {name}");
        match self
            .transport
            .call(
                Method::DELETE,
                &format!("{}/files", instance_path(name)),
                what,
            )
            .query("path", path)
            .send()
            .await
        {
            Ok(_) | Err(RuntimeError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn create_volume(&self, request: &CreateVolume) -> Result<Volume> {
        let target = self.target(request.target.as_deref());
        let what = format!("create volume {}/{}", request.pool, request.name);
        let mut config: BTreeMap<String, String> = request.config.clone();
        if let Some(size) = &request.size {
            config.insert("size".into(), size.clone());
        }
        let call = self
            .transport
            .call(
                Method::POST,
                &format!("/1.0/storage-pools/{}/volumes/custom", seg(&request.pool)),
                what.clone(),
            )
            .query_opt("target", target)
            .json(json!({"name": request.name, "config": config, "content_type": "filesystem"}));
        // Created unless it exists (409): no look before, and none after when its member is known.
        match self
            .run(call, &what, self.transport.request_timeout())
            .await
        {
            Ok(_) if target.is_some() || !self.server().clustered => Ok(Volume {
                pool: request.pool.clone(),
                name: request.name.clone(),
                config,
                location: target.unwrap_or("none").to_string(),
                used_by: Vec::new(),
            }),
            Ok(_) | Err(RuntimeError::Conflict { .. }) => self
                .get_volume(&request.pool, &request.name, target)
                .await?
                .ok_or(RuntimeError::NotFound {
                    what,
                    message: "volume missing right after its creation".into(),
                }),
            Err(e) => Err(e),
        }
    }

    async fn copy_volume(&self, source: &str, request: &CreateVolume) -> Result<Volume> {
        let target = self.target(request.target.as_deref());
        let what = format!("copy volume {}/{source} to {}", request.pool, request.name);
        let call = self
            .transport
            .call(
                Method::POST,
                &format!("/1.0/storage-pools/{}/volumes/custom", seg(&request.pool)),
                what.clone(),
            )
            .query_opt("target", target)
            .json(json!({
                "name": request.name,
                "content_type": "filesystem",
                "config": request.config,
                "source": {"type": "copy", "pool": request.pool, "name": source},
            }));
        self.run(call, &what, VOLUME_COPY_TIMEOUT).await?;
        // LXD 5.0 may take the source's config for the copy's: the labels are set after it.
        self.patch_volume(&request.pool, &request.name, &request.config, target)
            .await?;
        Ok(Volume {
            pool: request.pool.clone(),
            name: request.name.clone(),
            config: request.config.clone(),
            location: target.unwrap_or("none").to_string(),
            used_by: Vec::new(),
        })
    }

    async fn get_volume(
        &self,
        pool: &str,
        name: &str,
        target: Option<&str>,
    ) -> Result<Option<Volume>> {
        let volume: Option<VolumeJson> = self
            .transport
            .call(
                Method::GET,
                &volume_path(pool, name),
                format!("volume {pool}/{name}"),
            )
            .query_opt("target", self.target(target))
            .get_opt()
            .await?;
        Ok(volume.map(|v| v.into_volume(pool)))
    }

    async fn storage_pool(&self, pool: &str) -> Result<StoragePool> {
        #[derive(serde::Deserialize)]
        struct PoolJson {
            name: String,
            #[serde(default)]
            driver: String,
        }
        let found: PoolJson = self
            .transport
            .call(
                Method::GET,
                &format!("/1.0/storage-pools/{}", seg(pool)),
                format!("storage pool {pool}"),
            )
            .get()
            .await?;
        Ok(StoragePool {
            name: found.name,
            driver: found.driver,
        })
    }

    async fn storage_pool_space(&self, pool: &str) -> Result<PoolSpace> {
        #[derive(serde::Deserialize)]
        struct ResourcesJson {
            #[serde(default)]
            space: SpaceJson,
        }
        #[derive(Default, serde::Deserialize)]
        struct SpaceJson {
            #[serde(default)]
            used: u64,
            #[serde(default)]
            total: u64,
        }
        let found: ResourcesJson = self
            .transport
            .call(
                Method::GET,
                &format!("/1.0/storage-pools/{}/resources", seg(pool)),
                format!("space of storage pool {pool}"),
            )
            // A local pool's space is per member; a group (`@name`) names none.
            .query_opt("target", self.target(None).filter(|t| !t.starts_with('@')))
            .get()
            .await?;
        Ok(PoolSpace {
            used: found.space.used,
            total: found.space.total,
        })
    }

    async fn volumes_named(&self, pool: &str, name_prefix: &str) -> Result<Vec<Volume>> {
        let urls: Vec<String> = self
            .transport
            .call(
                Method::GET,
                &format!("/1.0/storage-pools/{}/volumes/custom", seg(pool)),
                format!("list volume names of pool {pool}"),
            )
            .get()
            .await?;
        let mut volumes = Vec::new();
        for url in urls {
            let Some((name, target)) = name_of_url(&url) else {
                continue;
            };
            if !name.starts_with(name_prefix) {
                continue;
            }
            if let Some(volume) = self.get_volume(pool, &name, target.as_deref()).await? {
                volumes.push(volume);
            }
        }
        Ok(volumes)
    }

    async fn list_volumes(&self, pool: &str, config_prefix: Option<&str>) -> Result<Vec<Volume>> {
        let volumes: Vec<VolumeJson> = self
            .transport
            .call(
                Method::GET,
                &format!("/1.0/storage-pools/{}/volumes", seg(pool)),
                format!("list volumes of pool {pool}"),
            )
            .query("recursion", "1")
            .get()
            .await?;
        Ok(volumes
            .into_iter()
            .filter(|v| v.kind == "custom")
            .filter(|v| match config_prefix {
                Some(prefix) => v.config.keys().any(|k| k.starts_with(prefix)),
                None => true,
            })
            .map(|v| v.into_volume(pool))
            .collect())
    }

    async fn delete_volume(&self, pool: &str, name: &str, target: Option<&str>) -> Result<()> {
        let what = format!("delete volume {pool}/{name}");
        let call = self
            .transport
            .call(Method::DELETE, &volume_path(pool, name), what.clone())
            .query_opt("target", self.target(target));
        match self
            .run(call, &what, self.transport.request_timeout())
            .await
        {
            Ok(_) | Err(RuntimeError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn rename_volume(
        &self,
        pool: &str,
        name: &str,
        new_name: &str,
        target: Option<&str>,
    ) -> Result<()> {
        let what = format!("rename volume {pool}/{name} to {new_name}");
        let call = self
            .transport
            .call(Method::POST, &volume_path(pool, name), what.clone())
            .query_opt("target", self.target(target))
            .json(json!({"name": new_name}));
        self.run(call, &what, self.transport.request_timeout())
            .await
            .map(|_| ())
    }

    async fn patch_volume(
        &self,
        pool: &str,
        name: &str,
        config: &BTreeMap<String, String>,
        target: Option<&str>,
    ) -> Result<()> {
        let what = format!("update volume {pool}/{name}");
        let call = self
            .transport
            .call(Method::PATCH, &volume_path(pool, name), what.clone())
            .query_opt("target", self.target(target))
            .json(json!({"config": config}));
        self.run(call, &what, self.transport.request_timeout())
            .await
            .map(|_| ())
    }

    async fn volume_usage(
        &self,
        pool: &str,
        name: &str,
        target: Option<&str>,
    ) -> Result<Option<u64>> {
        #[derive(serde::Deserialize)]
        struct UsageJson {
            #[serde(default)]
            used: u64,
        }
        #[derive(serde::Deserialize)]
        struct StateJson {
            usage: Option<UsageJson>,
        }
        let found: std::result::Result<StateJson, RuntimeError> = self
            .transport
            .call(
                Method::GET,
                &format!("{}/state", volume_path(pool, name)),
                format!("state of volume {pool}/{name}"),
            )
            .query_opt("target", self.target(target))
            .get()
            .await;
        match found {
            Ok(state) => Ok(state.usage.map(|u| u.used)),
            // LXD 5.0's dir driver answers 500 "Not supported": the pool cannot tell.
            Err(RuntimeError::Rejected { message, .. }) if message.contains("Not supported") => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    async fn resolve_image(&self, image: &ImageSource) -> Result<Option<String>> {
        match image {
            ImageSource::Alias(alias) => {
                let found: Option<serde_json::Value> = self
                    .transport
                    .call(
                        Method::GET,
                        &format!("/1.0/images/aliases/{}", seg(alias)),
                        format!("image alias {alias}"),
                    )
                    .get_opt()
                    .await?;
                Ok(found.and_then(|v| v.get("target")?.as_str().map(str::to_string)))
            }
            ImageSource::Fingerprint(fp) => {
                let found: Option<serde_json::Value> = self
                    .transport
                    .call(
                        Method::GET,
                        &format!("/1.0/images/{}", seg(fp)),
                        format!("image {fp}"),
                    )
                    .get_opt()
                    .await?;
                Ok(found.and_then(|v| v.get("fingerprint")?.as_str().map(str::to_string)))
            }
        }
    }

    async fn image_size(&self, fingerprint: &str) -> Result<Option<u64>> {
        #[derive(serde::Deserialize)]
        struct ImageJson {
            #[serde(default)]
            size: u64,
        }
        let found: Option<ImageJson> = self
            .transport
            .call(
                Method::GET,
                &format!("/1.0/images/{}", seg(fingerprint)),
                format!("image {fingerprint}"),
            )
            .get_opt()
            .await?;
        Ok(found.map(|image| image.size))
    }

    async fn console_log_tail(&self, name: &str, max_bytes: usize) -> Result<String> {
        let what = format!("console log of {name}");
        let raw = self
            .transport
            .call(
                Method::GET,
                &format!("{}/console", instance_path(name)),
                what.clone(),
            )
            .keep(Keep::Last(max_bytes))
            .send_raw()
            .await?;
        let raw = if raw.status < 400 {
            raw
        } else {
            // LXD 5.0 answers 500 "open : no such file" when the console log is not kept; the
            // container's lxc.log still says why a boot failed.
            let log = self
                .transport
                .call(
                    Method::GET,
                    &format!("{}/logs/lxc.log", instance_path(name)),
                    what.clone(),
                )
                .send_raw()
                .await?;
            if log.status == 404 {
                // Never started: an empty log; a missing instance is an error.
                return match self.get_instance(name).await? {
                    Some(_) => Ok(String::new()),
                    None => Err(RuntimeError::NotFound {
                        what,
                        message: String::new(),
                    }),
                };
            }
            if log.status >= 400 {
                parse_envelope(&what, &log)?;
            }
            log
        };
        let body = &raw.body[raw.body.len().saturating_sub(max_bytes)..];
        Ok(String::from_utf8_lossy(body).into_owned())
    }

    async fn events(&self) -> Result<EventStream> {
        events::subscribe(
            &self.config.endpoint,
            self.tls.clone(),
            &self.config.project,
            self.transport.request_timeout(),
        )
        .await
    }

    async fn watch_files(&self, instance: &str, dir: &str) -> Result<Watch> {
        if !matches!(self.config.endpoint, Endpoint::Unix(_)) {
            return Ok(Watch::Unavailable);
        }
        if self.files.is_watching(instance, dir) {
            return Ok(Watch::Already);
        }
        let server = self.server();
        let pid = if server.clustered {
            // Only the member answering the socket shares berth's pid namespace.
            match self.get_instance(instance).await? {
                Some(found) if found.location == server.server_name => {
                    found.state.map_or(0, |s| s.pid)
                }
                _ => return Ok(Watch::Unavailable),
            }
        } else {
            let what = format!("instance {instance}");
            let state: Option<StateJson> = self
                .transport
                .call(
                    Method::GET,
                    &format!("{}/state", instance_path(instance)),
                    what,
                )
                .get_opt()
                .await?;
            state.map_or(0, |s| InstanceState::from(s).pid)
        };
        match self.files.watch(instance, pid, dir).await {
            Ok(watching) => Ok(watching),
            Err(e) => {
                // Not a failure of the instance: the caller polls instead.
                tracing::debug!(instance, error = %e, "cannot watch {dir}");
                Ok(Watch::Unavailable)
            }
        }
    }

    fn file_notices(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.files.subscribe()
    }
}
