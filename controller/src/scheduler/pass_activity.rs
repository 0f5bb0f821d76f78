//! The activity pass: every running project inspected (and a stopped one looked at when its
//! last findings stand between it and an outcome), and what each inspection found recorded in
//! status, whichever pass made it.
use std::collections::BTreeMap;
use std::sync::Arc;

use berth_api::{Kind, ProjectStatus, ProtectionReason};
use futures::StreamExt;
use tokio::time::Instant;

use super::*;
use crate::scheduler::activity::{self, ActivityInputs, Touches};
use crate::scheduler::policy::{self, Decision, Evidence};
use crate::scheduler::{InspectTarget, ports, reap};
use crate::store::StoredObject;
use crate::workspace::inspect::{InspectError, Inspection};

impl DaemonPasses {
    /// Inspects every running project, and the stopped ones whose last findings stand between
    /// them and an outcome, and records what it found in status.
    pub(super) async fn activity(&self) {
        self.yield_to_reconciles().await;
        let projects = self.projects();
        let live = projects.iter().map(|o| o.uid().to_string()).collect();
        self.memory().retain(&live);
        let settled_before = self.now() - self.settle;
        let (settling, running): (Vec<Arc<StoredObject>>, Vec<Arc<StoredObject>>) = projects
            .iter()
            .filter(|o| running(o))
            .cloned()
            .partition(|o| ready_since_after(o, settled_before));
        *self.settling.lock().unwrap_or_else(|e| e.into_inner()) =
            settling.iter().map(|o| o.uid().to_string()).collect();
        let targets = running
            .iter()
            .map(|o| InspectTarget {
                instance: o.name().to_string(),
                expected: crate::workspace::inspect::expected_of(o),
            })
            .collect();
        let results = crate::scheduler::inspect_all(
            self.runtime.clone(),
            targets,
            self.workers,
            self.inspect_timeout,
        )
        .await;
        let mut round = BTreeMap::new();
        for object in &running {
            let Some(result) = results.get(object.name()) else {
                continue;
            };
            self.memory().saw_running(object.uid());
            self.note_inspection(object, result);
            let _ = self.record_findings(object, result, false).await;
            round.insert(
                object.uid().to_string(),
                result.as_ref().cloned().map_err(|e| e.to_string()),
            );
            if let Ok(inspection) = result {
                self.memory()
                    .record_inspection(object.uid(), inspection.clone());
            }
        }

        let stopped: Vec<String> = projects
            .iter()
            .filter(|o| self.wants_stopped_look(o))
            .map(|o| o.name().to_string())
            .collect();
        // No per-item deadline here: a boot cut short would leave the container running.
        // `inspect_stopped` bounds every step of its own.
        let looks: Vec<(String, Result<Inspection, String>)> = futures::stream::iter(stopped)
            .map(|name| async move { self.look_while_stopped(&name).await })
            .buffer_unordered(self.workers)
            .filter_map(|found| async move { found })
            .collect()
            .await;
        round.extend(looks);
        *self.round.lock().unwrap_or_else(|e| e.into_inner()) = round;
    }

    /// Whether a stopped project is to be booted for a look this pass: it could hold work, it
    /// was not looked at within the recheck interval, and what was last found is what keeps it
    /// (an inspection that failed, or unsaved work holding a due deletion). A blocked agent is
    /// not a reason: its state lives on a tmpfs, so a boot cannot tell anything new.
    pub(super) fn wants_stopped_look(&self, object: &StoredObject) -> bool {
        // The cheap tests first: this runs for every project in every pass.
        if object.is_deleting()
            || paused(object)
            || !self
                .memory()
                .stopped_look_due(object.uid(), Instant::now(), self.recheck_interval)
            || running(object)
        {
            return false;
        }
        let Some(facts) = Facts::of(object, None) else {
            return false;
        };
        if !facts.ever_reachable {
            return false;
        }
        let verdict = policy::decide(&facts.subject(self.now(), None));
        let held_by_findings = matches!(&verdict.decision, Decision::Refuse { reasons, .. }
            if reasons.iter().any(|r| *r != ProtectionReason::AgentBlocked));
        facts.evidence == Evidence::Failed || held_by_findings
    }

    /// Inspects a stopped project under its slot without starting its agent, and records what
    /// was found. `None` when it is no longer a stopped project by then.
    pub(super) async fn look_while_stopped(
        &self,
        name: &str,
    ) -> Option<(String, Result<Inspection, String>)> {
        let _slot = self.slot(name).await;
        let object = self.store.get(Kind::Project, name)?;
        if object.is_deleting() || running(&object) || paused(&object) {
            return None;
        }
        let (result, booted) = crate::workspace::look::inspect_in_place(
            self.runtime.as_ref(),
            name,
            &crate::workspace::inspect::expected_of(&object),
            self.inspect_timeout,
        )
        .await;
        // Also after a failure: trying again every pass would boot it every pass.
        self.memory()
            .looked_while_stopped(object.uid(), Instant::now());
        tracing::debug!(
            project = name,
            booted,
            ok = result.is_ok(),
            "looked at a stopped project"
        );
        self.note_inspection(&object, &result);
        let _ = self.record_findings(&object, &result, booted).await;
        Some((object.uid().to_string(), result.map_err(|e| e.to_string())))
    }

    /// Logs a failing inspection once when it begins, at debug level while it goes on.
    pub(super) fn note_inspection(
        &self,
        object: &StoredObject,
        result: &Result<Inspection, InspectError>,
    ) {
        self.metrics.count_inspection(result.is_ok());
        let begins = self
            .memory()
            .inspection_failed(object.uid(), result.is_err());
        if let Err(e) = result {
            if begins {
                tracing::warn!(
                    project = object.name(),
                    error = %e,
                    "inspection failed: reaping and unforced deletion hold (InspectionFailed) until one succeeds"
                );
            } else {
                tracing::debug!(project = object.name(), error = %e, "inspection still fails");
            }
        }
    }

    /// Exec, tool calls, previews and the IDE used through berth, the latest of each. An
    /// interactive exec or a relayed preview or IDE connection still open is activity now,
    /// whenever it started.
    pub(super) fn touches(&self, uid: &str) -> Touches {
        let last = self.activity_log.last(uid);
        let at = |source: &str| last.filter(|(_, s)| *s == source).map(|(at, _)| at);
        let open_or_last = |source: &'static str| {
            if self.activity_log.is_open(uid, source) {
                Some(self.now())
            } else {
                at(source)
            }
        };
        let tool_logged = at("tool");
        let tool_stored = self.store.last_tool_call(uid).ok().flatten();
        Touches {
            exec: open_or_last("exec"),
            tool: tool_logged.max(tool_stored),
            preview: open_or_last("preview"),
            ide: open_or_last("ide"),
        }
    }

    /// Writes what an inspection found: activity, unsaved work, the agent's report, ports.
    /// `booted`: the container was booted for this inspection, so its CPU figures cannot be
    /// compared with an earlier inspection's and nothing of its agent runs. Returns the object
    /// as written, `None` when it is gone or the write failed.
    pub(super) async fn record_findings(
        &self,
        object: &StoredObject,
        result: &Result<Inspection, InspectError>,
        booted: bool,
    ) -> Option<Arc<StoredObject>> {
        let uid = object.uid().to_string();
        let touches = self.touches(&uid);
        let previous = if booted {
            None
        } else {
            self.memory().previous_inspection(&uid).cloned()
        };
        let current = result.as_ref().ok().cloned();
        let unsaved_work = reap::unsaved_work_status(result);
        let project = object.name().to_string();
        let preview_site = self.preview_site.clone();
        let now = self.now();
        let write = self
            .update_status(object.name(), move |status, _| {
                let before = status.clone();
                status.activity = Some(activity::update_activity(&ActivityInputs {
                    now,
                    previous_status: status.activity.as_ref(),
                    previous: previous.as_ref(),
                    current: current.as_ref(),
                    touches,
                    cpu_threshold: activity::DEFAULT_CPU_THRESHOLD,
                }));
                status.unsaved_work = unsaved_work.clone();
                let Some(current) = &current else {
                    return;
                };
                let report = current.agent.as_ref();
                if let Some(title) = activity::title_to_record(status.title.as_deref(), report) {
                    status.title = Some(title);
                }
                if let Some(report) = report {
                    status.agent = Some(activity::agent_status(report));
                    crate::agent::record_brief_progress(status);
                }
                status.ports = ports::port_statuses(&project, &current.ports, &preview_site);
                keep_inspected_at_unless_changed(&before, status);
            })
            .await;
        match write {
            Ok(written) => written,
            Err(e) => {
                tracing::warn!(project = object.name(), error = %e, "recording activity failed");
                None
            }
        }
    }
}

/// Leaves `status.activity.inspectedAt` as `before` had it when an inspection changed nothing
/// else, so a steady fleet costs no store write and no watch event per pass. A project's first
/// inspection is recorded (the reaper's plan tells "not inspected yet" by it), and any other
/// change carries the new time along. When the passes last looked is in
/// `berth_scheduler_last_pass_timestamp_seconds`.
fn keep_inspected_at_unless_changed(before: &ProjectStatus, status: &mut ProjectStatus) {
    let Some(inspected_at) = before.activity.as_ref().and_then(|a| a.inspected_at) else {
        return;
    };
    let Some(activity) = status.activity.as_mut() else {
        return;
    };
    let now = activity.inspected_at.replace(inspected_at);
    if status != before
        && let Some(activity) = status.activity.as_mut()
    {
        activity.inspected_at = now;
    }
}
