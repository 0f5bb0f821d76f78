//! Waiting on objects (`apply --wait`, `wait`, `delete`): a watch on each collection, with a
//! periodic re-read as a safety net, and polling with backoff when the watch is unavailable.
//! Prints one progress line each time an object's step (or its blocking reason) changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use berth_api::{Kind, WatchEventType, annotations};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde_json::Value;
use tokio::time::Instant;

use super::duration;
use super::render::{condition, reason_and_message, str_at, time_at, value_at};
use crate::client::{Client, ClientError, WatchStream};

/// What the wait is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Goal {
    /// Ready, or Stopped, for the object's current generation.
    Ready,
    /// Ready and running for the current generation (`berth start --wait`).
    Running,
    /// Stopped for the current generation (`berth stop --wait`).
    Stopped,
    /// Running and ready again, with the field at `path` (the container's pid, or its creation
    /// time) no longer what it was before (`berth restart --wait`).
    RunningAgain { path: &'static str, before: Value },
    /// A condition of this type with this status (`True` by default).
    Condition { type_: String, status: String },
    /// `jsonpath={.status.agent.state}=blocked`: the template, as `-o jsonpath` prints it,
    /// prints `value` (`expression` is the template as given, for messages).
    JsonPath {
        expression: String,
        template: super::jsonpath::Template,
        value: String,
    },
    /// The object is gone.
    Deleted,
}

impl Goal {
    fn describe(&self) -> String {
        match self {
            Goal::Ready => "to be ready".to_string(),
            Goal::Running => "to be running and ready".to_string(),
            Goal::Stopped => "to be stopped".to_string(),
            Goal::RunningAgain { .. } => "to be running and ready again".to_string(),
            Goal::Condition { type_, status } => format!("to have condition {type_}={status}"),
            Goal::JsonPath {
                expression, value, ..
            } => format!("to have {expression}={value}"),
            Goal::Deleted => "to be deleted".to_string(),
        }
    }
}

/// Where an object stands against a goal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Pending,
    /// The goal cannot be met without someone acting (a held deletion, an object that vanished).
    Failed(String),
}

#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("timed out after {after} waiting for {waiting}")]
    Timeout { after: String, waiting: String },
    #[error("{reference}: {message}")]
    Failed { reference: String, message: String },
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Judges one observation of an object (`None`: it does not exist).
pub fn evaluate(resource: Kind, goal: &Goal, object: Option<&Value>) -> Verdict {
    let Some(object) = object else {
        return match goal {
            Goal::Deleted => Verdict::Met,
            _ => Verdict::Failed("was deleted while waiting".to_string()),
        };
    };
    match goal {
        Goal::Deleted => match condition(object, "DeletionBlocked") {
            // A hold that has not answered the last request for a fresh look is an old answer.
            Some(c) if str_at(c, "status") == "True" && hold_answers_request(object) => {
                Verdict::Failed(format!(
                    "deletion blocked: {}{}",
                    reason_and_message(c),
                    next_look(object, Utc::now())
                ))
            }
            _ => Verdict::Pending,
        },
        Goal::RunningAgain { path, before } => {
            let now = value_at(object, path).unwrap_or(&Value::Null);
            if now.is_null() || now == before {
                return Verdict::Pending;
            }
            evaluate(resource, &Goal::Running, Some(object))
        }
        Goal::Ready | Goal::Running | Goal::Stopped => {
            // Only projects and git sources have a controller that reports readiness.
            if resource == Kind::AgentProfile {
                return Verdict::Met;
            }
            let ready_condition = condition(object, "Ready");
            if !describes_current_generation(object, ready_condition) {
                return Verdict::Pending;
            }
            let ready = ready_condition.is_some_and(|c| str_at(c, "status") == "True");
            let stopped = str_at(object, "status.phase") == "Stopped";
            let met = match goal {
                Goal::Running => ready && !stopped,
                Goal::Stopped => stopped,
                _ => ready || stopped,
            };
            if met { Verdict::Met } else { Verdict::Pending }
        }
        Goal::Condition { type_, status } => match condition(object, type_) {
            Some(c)
                if str_at(c, "status").eq_ignore_ascii_case(status)
                    && describes_current_generation(object, Some(c)) =>
            {
                Verdict::Met
            }
            _ => Verdict::Pending,
        },
        Goal::JsonPath {
            template, value, ..
        } => match template.render(object) == *value {
            true => Verdict::Met,
            false => Verdict::Pending,
        },
    }
}

/// Whether the held deletion's last look answered the last request for one
/// (`berth.dev/lookRequestedAt`, set by every delete request and `wait --for=delete`).
fn hold_answers_request(object: &Value) -> bool {
    let requested = object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(annotations::LOOK_REQUESTED_AT))
        .and_then(Value::as_str);
    requested.is_none()
        || requested == value_at(object, "status.deletionHold.answered").and_then(Value::as_str)
}

/// `; looked at again at 23:15:02 UTC (in 4m)`, from `status.deletionHold.nextLookAt`.
pub fn next_look(object: &Value, now: DateTime<Utc>) -> String {
    let Some(at) = time_at(object, "status.deletionHold.nextLookAt") else {
        return String::new();
    };
    let wait = (at - now).num_seconds();
    let when = if wait > 0 {
        format!("in {}", duration::human_age(wait))
    } else {
        "due now".to_string()
    };
    format!(
        "; next look at {} ({when})",
        at.format("%Y-%m-%d %H:%M:%S UTC")
    )
}

fn generation(object: &Value) -> Option<i64> {
    value_at(object, "metadata.generation").and_then(Value::as_i64)
}

/// Whether the status (or the condition itself) speaks of the object's current generation. A
/// status that reports no generation at all is taken at its word.
fn describes_current_generation(object: &Value, condition: Option<&Value>) -> bool {
    let Some(generation) = generation(object) else {
        return true;
    };
    let reported = |v: Option<&Value>| v.and_then(Value::as_i64).filter(|g| *g > 0);
    let from_status = reported(value_at(object, "status.observedGeneration"));
    let from_condition = reported(condition.and_then(|c| c.get("observedGeneration")));
    match from_status.max(from_condition) {
        Some(observed) => observed >= generation,
        None => true,
    }
}

/// The line that shows where an object stands: its step, and why it is held when it is.
pub fn summary(object: &Value) -> String {
    let step = str_at(object, "status.step");
    let phase = str_at(object, "status.phase");
    let mut line = match (step.is_empty(), phase) {
        (true, "") => return String::new(),
        (true, phase) => phase.to_string(),
        // A stopped project's step says how far it got before; the phase is what it reached.
        (false, "Stopped") => phase.to_string(),
        (false, "Error" | "Missing" | "Deleting") => format!("{step} ({phase})"),
        (false, _) => step.to_string(),
    };
    for type_ in ["DeletionBlocked", "Ready"] {
        let Some(c) = condition(object, type_) else {
            continue;
        };
        let held = (type_ == "Ready" && str_at(c, "status") == "False")
            || (type_ == "DeletionBlocked" && str_at(c, "status") == "True");
        let reason = str_at(c, "reason");
        if held && !reason.is_empty() && reason != step && reason != phase {
            line.push_str(&format!(": {reason}"));
            // Progress stays one line per change; `describe` shows a long message whole.
            let message = str_at(c, "message").lines().next().unwrap_or("");
            if !message.is_empty() {
                line.push_str(&format!(": {message}"));
            }
            break;
        }
    }
    line
}

type Key = (Kind, String);

struct Tracker {
    goal: Goal,
    /// Last progress line printed per object still awaited.
    pending: BTreeMap<Key, String>,
    /// The awaited objects that were Stopped when their wait ended.
    stopped: BTreeSet<Key>,
    print: bool,
}

impl Tracker {
    /// Records an observation; `Ok(true)` when the object no longer needs waiting on.
    fn observe(&mut self, key: &Key, object: Option<&Value>) -> Result<bool, WaitError> {
        let Some(last) = self.pending.get_mut(key) else {
            return Ok(true);
        };
        if let Some(object) = object {
            let line = summary(object);
            if self.print && !line.is_empty() && *last != line {
                println!("{}: {line}", key.1);
            }
            *last = line;
        }
        match evaluate(key.0, &self.goal, object) {
            Verdict::Met => {
                self.pending.remove(key);
                if object.is_some_and(|o| str_at(o, "status.phase") == "Stopped") {
                    self.stopped.insert(key.clone());
                }
                Ok(true)
            }
            Verdict::Pending => Ok(false),
            Verdict::Failed(message) => Err(WaitError::Failed {
                reference: format!("{}/{}", key.0.singular(), key.1),
                message,
            }),
        }
    }

    /// Reads every awaited object: one GET each for a few, one list per kind for many.
    async fn poll_all(&mut self, client: &Client) -> Result<(), WaitError> {
        let keys: Vec<Key> = self.pending.keys().cloned().collect();
        let mut kinds: Vec<Kind> = keys.iter().map(|k| k.0).collect();
        kinds.sort();
        kinds.dedup();
        for resource in kinds {
            let names: Vec<&String> = keys
                .iter()
                .filter(|k| k.0 == resource)
                .map(|k| &k.1)
                .collect();
            if names.len() <= LIST_THRESHOLD {
                for name in names {
                    let object = client.get_opt(resource, name).await?;
                    self.observe(&(resource, name.clone()), object.as_ref())?;
                }
                continue;
            }
            let list = client.list(resource, None).await?;
            let mut by_name: HashMap<&str, &Value> = list
                .get("items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|o| (str_at(o, "metadata.name"), o))
                .collect();
            for name in names {
                let object = by_name.remove(name.as_str());
                self.observe(&(resource, name.clone()), object)?;
            }
        }
        Ok(())
    }
}

/// Above this many awaited objects of one kind, a re-read lists the kind instead of GETs.
const LIST_THRESHOLD: usize = 20;
/// Poll interval bounds when no watch is available, and the re-read period while one is.
const POLL_START: Duration = Duration::from_millis(250);
const POLL_MAX: Duration = Duration::from_secs(5);
const WATCH_RESYNC: Duration = Duration::from_secs(5);

/// Waits until every target meets the goal, or the timeout passes. The server going away for a
/// moment (a daemon restart) does not end the wait: it polls until the server answers again.
pub async fn wait_for(
    client: &Client,
    targets: &[(Kind, String)],
    goal: Goal,
    timeout: Duration,
    print_progress: bool,
) -> Result<Reached, WaitError> {
    let deadline = Instant::now() + timeout;
    let mut tracker = Tracker {
        goal: goal.clone(),
        pending: targets.iter().map(|k| (k.clone(), String::new())).collect(),
        stopped: BTreeSet::new(),
        print: print_progress,
    };
    let mut last_error = None;
    let outcome =
        tokio::time::timeout_at(deadline, follow(client, &mut tracker, &mut last_error)).await;
    match outcome {
        Ok(result) => result.map(|()| Reached {
            stopped: tracker.stopped,
        }),
        Err(_) => Err(timeout_error(&tracker, &goal, timeout, last_error.as_ref())),
    }
}

/// Where the awaited objects stood when their wait ended.
#[derive(Debug, Default)]
pub struct Reached {
    stopped: BTreeSet<Key>,
}

impl Reached {
    /// The word for where `target` ended: `stopped` for a Stopped project, `ready` otherwise.
    pub fn word(&self, target: &(Kind, String)) -> &'static str {
        if self.stopped.contains(target) {
            "stopped"
        } else {
            "ready"
        }
    }
}

/// The wait itself, without its deadline.
async fn follow(
    client: &Client,
    tracker: &mut Tracker,
    last_error: &mut Option<ClientError>,
) -> Result<(), WaitError> {
    tracker.poll_all(client).await?;
    if tracker.pending.is_empty() {
        return Ok(());
    }
    let keys: Vec<Key> = tracker.pending.keys().cloned().collect();
    let mut watch = open_watches(client, &keys).await;
    let mut interval = if watch.is_some() {
        WATCH_RESYNC
    } else {
        POLL_START
    };
    let mut next_poll = Instant::now() + interval;
    while !tracker.pending.is_empty() {
        tokio::select! {
            _ = tokio::time::sleep_until(next_poll) => {
                match tracker.poll_all(client).await {
                    Ok(()) => *last_error = None,
                    Err(WaitError::Client(err)) if is_transient(&err) => {
                        *last_error = Some(err);
                        watch = None;
                    }
                    Err(err) => return Err(err),
                }
                if watch.is_none() {
                    interval = (interval * 2).min(POLL_MAX);
                }
                next_poll = Instant::now() + interval;
            }
            event = next_event(&mut watch) => match event {
                // The server ended the watch (it fell behind): poll from here on.
                Some(Ok(event)) if event.type_ == WatchEventType::Error => {
                    watch = None;
                    interval = POLL_START;
                    next_poll = Instant::now();
                }
                Some(Ok(event)) => {
                    let Some(resource) = event.object.get("kind").and_then(Value::as_str).and_then(|kind| kind.parse::<Kind>().ok()) else {
                        continue;
                    };
                    let key = (resource, str_at(&event.object, "metadata.name").to_string());
                    let object = (event.type_ != WatchEventType::Deleted).then_some(&event.object);
                    tracker.observe(&key, object)?;
                }
                // The watch ended or broke: fall back to polling for the rest of the wait.
                Some(Err(_)) | None => {
                    watch = None;
                    interval = POLL_START;
                    next_poll = Instant::now();
                }
            },
        }
    }
    Ok(())
}

/// A server that cannot be reached now may be back in a moment.
fn is_transient(err: &ClientError) -> bool {
    match err {
        ClientError::Unreachable { .. } | ClientError::Transport { .. } => true,
        ClientError::Api(status) => status.code == 503,
        _ => false,
    }
}

async fn open_watches(client: &Client, keys: &[Key]) -> Option<WatchStream> {
    // One object: watch just it, so a large collection is not streamed for nothing.
    if let [(resource, name)] = keys {
        return client.watch_object(*resource, name).await.ok();
    }
    let mut kinds: Vec<Kind> = keys.iter().map(|k| k.0).collect();
    kinds.sort();
    kinds.dedup();
    let mut streams = Vec::new();
    for resource in kinds {
        // A server without watch support still answers every GET: poll instead.
        streams.push(client.watch(resource).await.ok()?);
    }
    Some(Box::pin(futures::stream::select_all(streams)))
}

async fn next_event(
    watch: &mut Option<WatchStream>,
) -> Option<Result<crate::client::WatchEvent, ClientError>> {
    match watch {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

fn timeout_error(
    tracker: &Tracker,
    goal: &Goal,
    timeout: Duration,
    last_error: Option<&ClientError>,
) -> WaitError {
    let mut waiting: Vec<String> = tracker
        .pending
        .iter()
        .map(|((resource, name), last)| {
            if last.is_empty() {
                format!("{}/{name} {}", resource.singular(), goal.describe())
            } else {
                format!(
                    "{}/{name} {} (now: {last})",
                    resource.singular(),
                    goal.describe()
                )
            }
        })
        .collect();
    if let Some(err) = last_error {
        waiting.push(format!("last error: {err}"));
    }
    WaitError::Timeout {
        after: duration::format(timeout),
        waiting: waiting.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn project(generation: i64, status: Value) -> Value {
        json!({"kind": "Project", "metadata": {"name": "p", "generation": generation}, "status": status})
    }

    #[test]
    fn verdicts() {
        let ready = json!({"observedGeneration": 2, "phase": "Ready", "step": "Seeded",
                           "conditions": [{"type": "Ready", "status": "True", "reason": "Seeded"}]});
        let stale_ready = json!({"observedGeneration": 1, "phase": "Ready",
                                 "conditions": [{"type": "Ready", "status": "True"}]});
        let stopped = json!({"observedGeneration": 2, "phase": "Stopped"});
        let blocked = json!({"observedGeneration": 2, "phase": "Deleting",
                             "conditions": [{"type": "DeletionBlocked", "status": "True", "reason": "UnsavedWork", "message": "2 uncommitted files"}]});
        let cond = |t: &str| Goal::Condition {
            type_: t.to_string(),
            status: "True".to_string(),
        };
        let cases = [
            (Goal::Ready, Some(project(2, ready.clone())), Verdict::Met),
            (Goal::Ready, Some(project(2, stale_ready)), Verdict::Pending),
            (Goal::Ready, Some(project(2, stopped.clone())), Verdict::Met),
            (Goal::Ready, Some(project(1, json!({}))), Verdict::Pending),
            (
                Goal::Ready,
                Some(project(
                    3,
                    json!({"conditions": [{"type": "Ready", "status": "True", "observedGeneration": 3}]}),
                )),
                Verdict::Met,
            ),
            (
                Goal::Ready,
                Some(project(
                    3,
                    json!({"conditions": [{"type": "Ready", "status": "True", "observedGeneration": 2}]}),
                )),
                Verdict::Pending,
            ),
            (
                Goal::Ready,
                None,
                Verdict::Failed("was deleted while waiting".to_string()),
            ),
            (cond("Ready"), Some(project(2, ready.clone())), Verdict::Met),
            (Goal::Running, Some(project(2, ready.clone())), Verdict::Met),
            (
                Goal::Stopped,
                Some(project(2, ready.clone())),
                Verdict::Pending,
            ),
            (
                cond("MountsReady"),
                Some(project(2, ready)),
                Verdict::Pending,
            ),
            (
                Goal::Running,
                Some(project(2, stopped.clone())),
                Verdict::Pending,
            ),
            (
                Goal::Stopped,
                Some(project(2, stopped.clone())),
                Verdict::Met,
            ),
            (Goal::Deleted, None, Verdict::Met),
            (
                Goal::Deleted,
                Some(project(2, json!({"phase": "Deleting"}))),
                Verdict::Pending,
            ),
            (
                Goal::Deleted,
                Some(project(2, blocked)),
                Verdict::Failed("deletion blocked: UnsavedWork: 2 uncommitted files".to_string()),
            ),
        ];
        for (goal, object, expected) in cases {
            assert_eq!(
                evaluate(Kind::Project, &goal, object.as_ref()),
                expected,
                "goal {goal:?} object {object:?}"
            );
        }
        assert_eq!(
            evaluate(
                Kind::AgentProfile,
                &Goal::Ready,
                Some(&json!({"metadata": {"generation": 1}}))
            ),
            Verdict::Met
        );
    }

    #[test]
    fn summaries() {
        let cases = [
            (json!({}), ""),
            (json!({"phase": "Pending"}), "Pending"),
            (
                json!({"phase": "Provisioning", "step": "Created"}),
                "Created",
            ),
            (
                json!({"phase": "Error", "step": "Started",
                       "conditions": [{"type": "Ready", "status": "False", "reason": "BootTimeout", "message": "no answer in 2m"}]}),
                "Started (Error): BootTimeout: no answer in 2m",
            ),
            (
                json!({"phase": "Ready", "step": "Seeded",
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Seeded"}]}),
                "Seeded",
            ),
            (json!({"phase": "Stopped", "step": "Reachable"}), "Stopped"),
        ];
        for (status, expected) in cases {
            assert_eq!(summary(&json!({"status": status})), expected);
        }
    }
}
