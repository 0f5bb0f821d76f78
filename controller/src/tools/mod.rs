//! The workspace tools endpoint: a fixed set of tools (Read, Glob, Grep, Write, Edit, Bash)
//! executed inside a project's container for a member, and nothing else.
//!
//! Every call fails closed (a timeout, a cancel, an unreachable container or an unsupported
//! call has its own reason and never falls back) and never replays: the execution is recorded
//! before it runs and its outcome after, so a repeated id answers from the record, and an id
//! whose outcome was lost (the daemon died mid-call) answers that the outcome is unknown.
//!
//! A call's tool and arguments are checked before anything is recorded (`call.rs`) and carried out
//! by `run.rs`: containment inside the container by POSIX `sh` scripts (`script.rs`), agents'
//! glob and ripgrep syntax made exact (`pattern.rs`), content staged through LXD's file API, a call
//! on an idled project waking it (`wake.rs`, through `reconcile::wake`). Executions are deleted
//! with their project; `?uid=` refuses a replaced project (`ProjectReplaced`), and a lost LXD
//! connection after the mutating exec answered is `Reason::OutcomeUnknown`
//! (`REMOTE_MUTATION_OUTCOME_UNKNOWN`), never `Unreachable`. Failures are `ToolError`s with a
//! `Reason`; no HTTP here.

mod call;
mod error;
mod pattern;
mod run;
mod script;
pub mod wake;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use chrono::Utc;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use call::{MAX_OUTPUT_BYTES, MAX_REQUEST_BYTES, MAX_TIMEOUT, Shell, Tool, ToolCall};
pub use error::{Reason, ToolError};

use crate::inspect::reach::owned_container;
use crate::runtime::{ExecRequest, Instance, Runtime};
use crate::runtime_handle::RuntimeHandle;
use crate::secrets::Secrets;
use crate::store::{ExecutionState, Store, StoredObject};
use run::{Run, SIDE_CALL_TIMEOUT, verdict_error};
use script::Verdict;

/// The protocol version `GET .../tools` announces.
pub const PROTOCOL_VERSION: &str = berth_api::wire::TOOLS_PROTOCOL_VERSION;
/// How long recorded outcomes answer repeated ids.
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How often expired records are deleted, at most.
const EXPIRY_INTERVAL: Duration = Duration::from_secs(60);

/// What a call answers, once it is known not to have failed before anything was recorded.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The tool's output.
    Output(Value),
    /// An outcome recorded before failures were typed: the status code and body as answered.
    Answered { code: u16, body: Value },
}

/// A call running in this process, for cancellation.
struct Running {
    cancel: CancellationToken,
}

pub struct Tools {
    store: Arc<Store>,
    secrets: Arc<Secrets>,
    /// The daemon's one LXD connection.
    lxd: Arc<RuntimeHandle>,
    running: Mutex<HashMap<(String, String), Running>>,
    last_expiry: Mutex<Option<Instant>>,
}

impl Tools {
    pub fn new(store: Arc<Store>, secrets: Arc<Secrets>, lxd: Arc<RuntimeHandle>) -> Tools {
        Tools {
            store,
            secrets,
            lxd,
            running: Mutex::new(HashMap::new()),
            last_expiry: Mutex::new(None),
        }
    }

    /// LXD, connected on the first tool call when nothing connected it before, so a daemon
    /// starts (and a paused one serves the tools) whether or not LXD is up.
    async fn runtime(&self) -> Result<Arc<dyn Runtime>, ToolError> {
        self.lxd
            .connect()
            .await
            .map_err(|err| ToolError::unreachable(format!("LXD is not reachable: {err}")))
    }

    /// Runs `call` once for its execution id: a repeated id answers what the first call
    /// answered (a failure as the error); a lost outcome is never run again.
    pub async fn call(
        self: &Arc<Self>,
        project: &Arc<StoredObject>,
        call: ToolCall,
    ) -> Result<Reply, ToolError> {
        self.expire();
        let uid = project.uid().to_string();
        let key = (uid.clone(), call.execution_id.clone());
        // Registered before the execution is recorded, so a cancel arriving in between finds
        // the call and is not mistaken for one whose outcome was lost.
        let cancel = CancellationToken::new();
        {
            let mut running = self.lock();
            if running.contains_key(&key) {
                return Err(ToolError::new(
                    Reason::Conflict,
                    format!("execution {:?} is running", call.execution_id),
                ));
            }
            running.insert(
                key.clone(),
                Running {
                    cancel: cancel.clone(),
                },
            );
        }
        let _registered = Registered {
            tools: Arc::clone(self),
            key: key.clone(),
        };
        let store = Arc::clone(&self.store);
        let (begin_uid, begin_id, tool) = (uid.clone(), call.execution_id.clone(), call.tool);
        let existing = blocking(move || {
            store.begin_execution(&begin_uid, &begin_id, tool.as_str(), Utc::now())
        })
        .await??;
        if let Some(existing) = existing {
            return match (existing.state, existing.outcome) {
                (ExecutionState::Finished, Some(outcome)) => replay(outcome),
                _ if call.tool.mutates() => Err(ToolError::new(
                    Reason::OutcomeUnknown,
                    format!(
                        "execution {:?} ({}) started but its outcome was lost; inspect the workspace instead of running it again",
                        call.execution_id, existing.tool
                    ),
                )),
                _ => Err(ToolError::cancelled(&call.execution_id)),
            };
        }
        let pidfile = format!("/run/berth-tool-{}.pid", uuid::Uuid::new_v4().simple());
        // Dropped with the request when the caller disconnects: the call is then cancelled,
        // its process group killed and the cancel recorded.
        let mut guard = Abandoned {
            tools: Arc::clone(self),
            project: project.name().to_string(),
            key: key.clone(),
            tool: call.tool,
            pidfile: pidfile.clone(),
            armed: true,
        };
        let outcome = if cancel.is_cancelled() {
            Err(ToolError::cancelled(&call.execution_id))
        } else {
            self.dispatch(project, call.clone(), &cancel, &pidfile)
                .await
        };
        guard.armed = false;
        let record = self.redact(&uid, &record_of(&outcome));
        let store = Arc::clone(&self.store);
        let id = call.execution_id.clone();
        let finished =
            blocking(move || store.finish_execution(&uid, &id, tool.as_str(), &record, Utc::now()))
                .await;
        if let Err(err) = finished.and_then(|r| r.map_err(ToolError::from)) {
            tracing::error!(execution = %call.execution_id, error = %err.message, "recording a tool outcome failed");
        }
        outcome.map(Reply::Output)
    }

    /// Wakes the project if the reaper idled it, then runs the call within its timeout (the
    /// wake counts against it): a cancel or the deadline kills what the call started.
    async fn dispatch(
        &self,
        project: &StoredObject,
        mut call: ToolCall,
        cancel: &CancellationToken,
        pidfile: &str,
    ) -> Result<Value, ToolError> {
        let total = call.timeout;
        let deadline = tokio::time::Instant::now() + total;
        let woke = wake::ensure_awake(
            &self.store,
            project,
            deadline,
            cancel,
            &call.execution_id,
            wake::Waker {
                by: "a tool call",
                retry: "call again with a new executionId",
            },
        )
        .await?;
        if woke {
            tracing::info!(project = project.name(), execution = %call.execution_id, "a tool call woke the idled project");
        }
        call.timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
        if call.timeout.is_zero() {
            return Err(timeout(call.tool, total));
        }
        let runtime = self.runtime().await?;
        let instance = project.name();
        self.reach(&runtime, project).await?;
        let env = if call.tool == Tool::Bash {
            self.project_env(project)?
        } else {
            BTreeMap::new()
        };
        let run = Run {
            runtime: &runtime,
            instance,
            call: &call,
            pidfile,
            env,
        };
        let outcome = tokio::select! {
            // A cancel that is already there wins before anything is sent.
            biased;
            () = cancel.cancelled() => Err(ToolError::cancelled(&call.execution_id)),
            outcome = run.tool() => outcome,
            () = tokio::time::sleep_until(deadline) => Err(timeout(call.tool, total)),
        };
        if let Err(err) = &outcome
            && matches!(err.reason, Reason::Cancelled | Reason::Timeout)
        {
            kill(&runtime, instance, pidfile).await;
        }
        outcome
    }

    /// The project's container, if it is the project's own: a container of that name that
    /// berth did not make for this project is 409 `NameConflict`, and nothing runs in it.
    async fn reach(
        &self,
        runtime: &Arc<dyn Runtime>,
        project: &StoredObject,
    ) -> Result<Instance, ToolError> {
        let name = project.name();
        let controller = self.store.controller_id();
        let owned = owned_container(runtime.as_ref(), name, project.uid(), controller);
        match tokio::time::timeout(SIDE_CALL_TIMEOUT, owned).await {
            Ok(reached) => Ok(reached?),
            Err(_) => Err(ToolError::unreachable(format!(
                "reading the container {name:?} took longer than {SIDE_CALL_TIMEOUT:?}"
            ))),
        }
    }

    async fn require_running(
        &self,
        runtime: &Arc<dyn Runtime>,
        project: &StoredObject,
    ) -> Result<(), ToolError> {
        let name = project.name();
        let idled = project
            .status
            .pointer("/reap/idledAt")
            .is_some_and(|v| !v.is_null());
        let instance = self.reach(runtime, project).await?;
        if instance.is_running() {
            return Ok(());
        }
        Err(ToolError::unreachable(format!(
            "the container {name:?} is {}{}",
            instance.status.as_str(),
            if idled {
                "; the project is idled and a tool call wakes it"
            } else {
                ""
            }
        )))
    }

    /// The project's `spec.env` and its secrets (secrets win), for Bash.
    fn project_env(&self, project: &StoredObject) -> Result<BTreeMap<String, String>, ToolError> {
        let mut env: BTreeMap<String, String> = project
            .spec
            .get("env")
            .as_ref()
            .and_then(Value::as_object)
            .map(|env| {
                env.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let secrets = self
            .secrets
            .values(project.uid())
            .map_err(|err| ToolError::internal(format!("reading the project's secrets: {err}")))?;
        env.extend(secrets);
        Ok(env)
    }

    /// Replaces every secret value of the project in the outcome's strings.
    fn redact(&self, uid: &str, value: &Value) -> Value {
        let values: Vec<String> = match self.secrets.values(uid) {
            Ok(values) => values.into_values().collect(),
            // Without the values nothing can be redacted: keep no output at all.
            Err(_) => return json!({"redacted": "the outcome could not be redacted"}),
        };
        redact_with(value, &values)
    }

    /// Cancels the execution `id`: a running one is killed, one not yet dispatched never runs.
    /// Returns what became of it.
    pub fn cancel(&self, project: &StoredObject, id: &str) -> Result<String, ToolError> {
        let uid = project.uid().to_string();
        if let Some(running) = self.lock().get(&(uid.clone(), id.to_string())) {
            running.cancel.cancel();
            return Ok(format!("execution {id:?} cancelled"));
        }
        let message = match self.store.execution(&uid, id)? {
            Some(e) if e.state == ExecutionState::Finished => {
                format!("execution {id:?} had already finished")
            }
            Some(_) => format!("execution {id:?} started but its outcome was lost"),
            None => {
                let record = record_of(&Err(ToolError::cancelled(id)));
                self.store
                    .finish_execution(&uid, id, "", &record, Utc::now())?;
                format!("execution {id:?} cancelled before it was dispatched")
            }
        };
        Ok(message)
    }

    /// The workspace's instruction files (`CLAUDE.md`, `AGENTS.md`, ...), from a running
    /// container that is the project's.
    pub async fn instructions(&self, project: &StoredObject) -> Result<Value, ToolError> {
        let runtime = self.runtime().await?;
        let name = project.name();
        self.require_running(&runtime, project).await?;
        let mut env = BTreeMap::new();
        env.insert("BERTH_WORKSPACE".to_string(), call::WORKSPACE.to_string());
        env.insert(
            "BERTH_PIDFILE".to_string(),
            format!("/run/berth-tool-{}.pid", uuid::Uuid::new_v4().simple()),
        );
        env.insert("BERTH_MAX_BYTES".to_string(), MAX_OUTPUT_BYTES.to_string());
        let request = ExecRequest {
            env,
            ..ExecRequest::new(
                run::session(&format!("{}{}", script::PRELUDE, script::INSTRUCTIONS)),
                SIDE_CALL_TIMEOUT,
            )
        };
        let output = runtime
            .exec(name, &request)
            .await
            .map_err(|err| run::exec_error(name, "reading instruction files", &err))?;
        if !output.success() {
            return Err(verdict_error(Verdict::of(output.exit_code), &output));
        }
        let files: Vec<Value> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let (path, encoded) = line.split_once(' ').unwrap_or((line, ""));
                let content = base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .ok()?;
                Some(json!({"path": path, "content": String::from_utf8_lossy(&content)}))
            })
            .collect();
        Ok(json!({"workspacePath": call::WORKSPACE, "files": files}))
    }

    /// Deletes records past the retention period, at most once a minute.
    fn expire(&self) {
        let mut last = self
            .last_expiry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if last.is_some_and(|at| at.elapsed() < EXPIRY_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        let before = Utc::now() - chrono::Duration::from_std(RETENTION).unwrap_or_default();
        match self.store.expire_executions(before) {
            Ok(0) => {}
            Ok(n) => tracing::info!(expired = n, "deleted expired tool execution records"),
            Err(err) => tracing::warn!(error = %err, "deleting expired tool executions failed"),
        }
    }

    /// The protocol, the tools and their limits, and what this workspace offers: a running
    /// container is asked (one exec); a stopped one is only described; a container that is not
    /// the project's is refused.
    pub async fn capabilities(&self, project: &StoredObject) -> Result<Value, ToolError> {
        let offer = match self.runtime().await {
            Ok(runtime) => match self.require_running(&runtime, project).await {
                Ok(()) => run::probe(&runtime, project.name()).await,
                Err(err) if err.reason == Reason::NameConflict => return Err(err),
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        let tools: Vec<Value> = Tool::ALL
            .iter()
            .map(|t| {
                let mut tool =
                    json!({"name": t.as_str(), "mutates": t.mutates(), "arguments": t.schema()});
                if let Ok(offer) = &offer {
                    let lacks = offer.lacks(*t);
                    tool["available"] = json!(lacks.is_none());
                    if let Some(reason) = lacks {
                        tool["unavailableReason"] = json!(reason);
                    }
                }
                tool
            })
            .collect();
        let workspace = match &offer {
            Ok(offer) => {
                let mut workspace = offer.to_value();
                workspace["probed"] = json!(true);
                workspace
            }
            Err(err) => json!({"probed": false, "message": err.message}),
        };
        let bash = offer.as_ref().ok().and_then(|o| o.bash.clone());
        Ok(json!({
            "protocolVersion": PROTOCOL_VERSION,
            "tools": tools,
            "workspacePath": call::WORKSPACE,
            "workspace": workspace,
            "shell": {"name": "bash", "version": bash},
            "limits": {
                "maxRequestBytes": MAX_REQUEST_BYTES,
                "maxOutputBytes": MAX_OUTPUT_BYTES,
                "maxArgumentBytes": call::MAX_ARGUMENT_BYTES,
                "maxFileBytes": call::MAX_FILE_BYTES,
                "maxMatches": call::MAX_MATCHES,
                "readDefaultLines": call::DEFAULT_READ_LINES,
                "readLineMaxChars": call::READ_LINE_MAX,
                "defaultTimeoutMs": call::DEFAULT_TIMEOUT.as_millis() as u64,
                "maxTimeoutMs": call::MAX_TIMEOUT.as_millis() as u64,
                "retentionSeconds": RETENTION.as_secs(),
            },
            "notes": {
                "maxArgumentBytes": "Bash's command, patterns and paths",
                "maxFileBytes": "Write's content, Edit's strings and the file an Edit changes",
                "maxMatches": "Glob lists at most this many files and Grep this many lines, then says the results were capped",
                "timeoutMs": "bounds the whole call, including waking an idled project",
            },
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Running>> {
        self.running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `?uid=UID` on a tools route: the project the caller resolved must still be the one under
/// its name. One deleted and created again is another project: `ProjectReplaced`, and
/// nothing runs.
pub fn check_uid(project: &StoredObject, uid: Option<&str>) -> Result<(), ToolError> {
    match uid {
        None => Ok(()),
        Some("") => Err(ToolError::bad_request("uid: must not be empty")),
        Some(uid) if uid == project.uid() => Ok(()),
        Some(uid) => Err(ToolError::new(
            Reason::ProjectReplaced,
            format!(
                "project {:?} was replaced: uid {uid} was asked for, the project of that name now has uid {}; nothing ran",
                project.name(),
                project.uid()
            ),
        )),
    }
}

/// Removes a call from the running ones however its request ends.
struct Registered {
    tools: Arc<Tools>,
    key: (String, String),
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.tools.lock().remove(&self.key);
    }
}

/// Runs a store write off the async threads: it waits for the disk.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ToolError> {
    crate::store::blocking(f)
        .await
        .map_err(|err| ToolError::internal(format!("a store write did not finish: {err}")))
}

/// Cancels a call whose request was dropped before it finished (the caller went away).
struct Abandoned {
    tools: Arc<Tools>,
    project: String,
    key: (String, String),
    tool: Tool,
    pidfile: String,
    armed: bool,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let tools = Arc::clone(&self.tools);
        let (uid, id) = self.key.clone();
        tools.lock().remove(&self.key);
        let record = record_of(&Err(ToolError::cancelled(&id)));
        if let Err(err) =
            tools
                .store
                .finish_execution(&uid, &id, self.tool.as_str(), &record, Utc::now())
        {
            tracing::error!(execution = %id, error = %err, "recording a cancelled tool call failed");
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let project = self.project.clone();
        let pidfile = self.pidfile.clone();
        handle.spawn(async move {
            if let Ok(runtime) = tools.runtime().await {
                kill(&runtime, &project, &pidfile).await;
            }
        });
    }
}

/// Kills the process group a call registered (a second exec: LXD cannot cancel one).
async fn kill(runtime: &Arc<dyn Runtime>, instance: &str, pidfile: &str) {
    let request = ExecRequest::new(
        ["sh", "-c", script::KILL, "kill", pidfile],
        SIDE_CALL_TIMEOUT,
    );
    if let Err(err) = runtime.exec(instance, &request).await {
        tracing::warn!(instance, error = %err, "killing a tool's process group failed");
    }
}

/// At most [`MAX_OUTPUT_BYTES`], cut at a character boundary, with a note when cut.
pub(crate) fn capped(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if text.len() <= MAX_OUTPUT_BYTES {
        return text.into_owned();
    }
    let mut end = MAX_OUTPUT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[output cut at {MAX_OUTPUT_BYTES} of {} bytes]",
        &text[..end],
        text.len()
    )
}

fn redact_with(value: &Value, secrets: &[String]) -> Value {
    match value {
        Value::String(s) => Value::String(crate::secrets::redact(s, secrets)),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| redact_with(v, secrets)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), redact_with(v, secrets)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// What an execution's record keeps of its outcome: the output, or the typed failure.
fn record_of(outcome: &Result<Value, ToolError>) -> Value {
    match outcome {
        Ok(output) => json!({"output": output}),
        Err(err) => json!({"error": err}),
    }
}

/// Answers a repeated execution id from its record.
fn replay(record: Value) -> Result<Reply, ToolError> {
    if let Some(output) = record.get("output") {
        return Ok(Reply::Output(output.clone()));
    }
    if let Some(error) = record.get("error") {
        return Err(serde_json::from_value(error.clone()).unwrap_or_else(|err| {
            ToolError::internal(format!("the recorded outcome cannot be read: {err}"))
        }));
    }
    // Recorded as answered, by an earlier berth (or unredactable, when neither is there).
    let code = record
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .unwrap_or(500);
    Ok(Reply::Answered {
        code,
        body: record.get("body").cloned().unwrap_or(Value::Null),
    })
}

fn timeout(tool: Tool, after: Duration) -> ToolError {
    ToolError::new(
        Reason::Timeout,
        format!(
            "{} did not finish within {} ms; what it started was killed",
            tool.as_str(),
            after.as_millis()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_everywhere() {
        let value = json!({"output": "token=hunter22", "nested": ["hunter22"]});
        let redacted = redact_with(&value, &["hunter22".to_string()]);
        assert_eq!(
            redacted,
            json!({"output": "token=[REDACTED]", "nested": ["[REDACTED]"]})
        );
    }

    #[test]
    fn a_uid_other_than_the_projects_is_project_replaced() {
        let metadata: berth_api::ObjectMeta =
            serde_json::from_value(json!({"name": "p", "uid": "u-now"})).unwrap();
        let project = StoredObject {
            kind: berth_api::Kind::Project,
            metadata,
            spec: json!({}).into(),
            status: json!({}).into(),
        };
        // (the uid asked for, the answer's reason or None when the call goes on)
        let cases = [
            (None, None),
            (Some("u-now"), None),
            (Some("u-before"), Some(Reason::ProjectReplaced)),
            (Some(""), Some(Reason::BadRequest)),
        ];
        for (uid, want) in cases {
            let got = check_uid(&project, uid).err().map(|err| err.reason);
            assert_eq!(got, want, "{uid:?}");
        }
        let err = check_uid(&project, Some("u-before")).unwrap_err();
        assert!(err.message.contains("nothing ran"), "{}", err.message);
    }

    #[test]
    fn outputs_are_capped() {
        let big = vec![b'a'; MAX_OUTPUT_BYTES + 10];
        let text = capped(&big);
        assert!(text.contains("output cut"));
        assert!(text.len() < MAX_OUTPUT_BYTES + 100);
    }
}
