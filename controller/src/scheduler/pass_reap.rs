//! The reap pass: the decision for every project on what this round's inspections recorded, the
//! verdict in status, and the idle stops and deletions two passes agree on, carried out under
//! the project's slot in the work queue after a re-check.
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use berth_api::{ConditionStatus, Kind, ProjectStatus, ReapAction, condition_types, set_condition};
use futures::FutureExt;
use tokio::time::Instant;

use super::*;
use crate::metrics::ActionLabels;
use crate::scheduler::policy::{self, Decision, Evidence, Verdict};
use crate::scheduler::reap;
use crate::store::{Commit, EventType, StoreError, StoredObject};
use crate::workspace::inspect::Inspection;
use crate::workspace::protection::{self, reasons_text};

impl DaemonPasses {
    /// Decides for every project, records the verdict and carries out what two passes agree on.
    pub(super) async fn reap(&self) {
        let round = self.round.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for object in self.projects() {
            // One project whose reaping panics must not keep the others from being reaped.
            let reaped = AssertUnwindSafe(self.reap_one(&object, &round))
                .catch_unwind()
                .await;
            if let Err(payload) = reaped {
                let message = crate::scheduler::panic_message(payload.as_ref());
                tracing::error!(project = object.name(), panic = %message, "reaping one project panicked; the pass goes on");
                self.metrics.count_scheduler_panic(Pass::Reap.label());
            }
        }
    }

    /// Decides on one project and acts when two agreeing passes say so.
    pub(super) async fn reap_one(
        &self,
        object: &Arc<StoredObject>,
        round: &BTreeMap<String, Result<Inspection, String>>,
    ) {
        if object.is_deleting() {
            return;
        }
        // Not looked at yet, so nothing to judge: not "could not be inspected".
        if self
            .settling
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(object.uid())
        {
            return;
        }
        let Some(facts) = Facts::of(object, round.get(object.uid())) else {
            return;
        };
        let previous_due = self.memory().previous_due(object.uid());
        let verdict = policy::decide(&facts.subject(self.now(), previous_due));
        self.memory().record_verdict(object.uid(), &verdict);
        self.count_refusals(object.uid(), &verdict);
        let failure = match round.get(object.uid()) {
            Some(Err(e)) => Some(e.clone()),
            _ => None,
        };
        if let Err(e) = self
            .record_verdict(object, &verdict, facts.evidence.clone(), failure)
            .await
        {
            tracing::warn!(project = object.name(), error = %e, "recording the reap verdict failed");
        }
        if let Some(action) = verdict.act().filter(|_| !paused(object)) {
            self.act(object.name(), action).await;
            self.memory().forget_due(object.uid());
        }
    }

    /// `reap_refusals_total{reason}` counts a refusal once, when a due action is first declined
    /// for a reason, not in every pass it stays declined.
    pub(super) fn count_refusals(&self, uid: &str, verdict: &Verdict) {
        let Decision::Refuse { reasons, .. } = &verdict.decision else {
            self.memory().not_refused(uid);
            return;
        };
        let new = self.memory().refused(uid, reasons);
        for reason in new {
            self.metrics.count_refusal(reason.as_str());
        }
    }

    /// `status.reap` and the `ReapProtected` condition; a Warning event when protection begins
    /// or changes reason, with its cause (the files and commits, the agent's question, the
    /// inspection's error: `evidence` and `failure` are what the verdict was judged on).
    pub(super) async fn record_verdict(
        &self,
        object: &StoredObject,
        verdict: &Verdict,
        evidence: Evidence,
        failure: Option<String>,
    ) -> Result<(), StoreError> {
        let verdict = verdict.clone();
        let changed = Arc::new(Mutex::new(None::<String>));
        let seen = changed.clone();
        let now = self.now();
        let updated = self
            .update_status(object.name(), move |status, generation| {
                let idled_at = status.reap.as_ref().and_then(|r| r.idled_at);
                status.reap = Some(reap::reap_status(&verdict, idled_at));
                // The one reading of what protects it, as `get` and `reap --dry-run` show it.
                let protected_by = protection::recorded(status);
                if let Some(reap) = status.reap.as_mut() {
                    reap.protected_by = protected_by.clone();
                }
                let protected = !protected_by.is_empty();
                let had =
                    berth_api::find_condition(&status.conditions, condition_types::REAP_PROTECTED)
                        .is_some();
                if !protected && !had {
                    return;
                }
                let question = status.agent.as_ref().map(|a| a.message.as_str());
                let cause =
                    protection::cause(&protected_by, &evidence, failure.as_deref(), question);
                let (cond, reason, message) = match protected_by.first() {
                    Some(first) if cause.is_empty() => (
                        ConditionStatus::True,
                        first.as_str(),
                        format!("reaping declines: {}", reasons_text(&protected_by)),
                    ),
                    Some(first) => (
                        ConditionStatus::True,
                        first.as_str(),
                        format!(
                            "reaping declines: {} ({cause})",
                            reasons_text(&protected_by)
                        ),
                    ),
                    None => (ConditionStatus::False, "NotProtected", String::new()),
                };
                let before =
                    berth_api::find_condition(&status.conditions, condition_types::REAP_PROTECTED)
                        .map(|c| (c.status, c.message.clone()));
                set_condition(
                    &mut status.conditions,
                    condition_types::REAP_PROTECTED,
                    cond,
                    reason,
                    &message,
                    generation,
                    now,
                );
                if protected && before != Some((ConditionStatus::True, message.clone())) {
                    *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(message);
                }
            })
            .await?;
        let message = changed.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let (Some(message), Some(updated)) = (message, updated) {
            self.event(&updated, EventType::Warning, "ReapProtected", &message)
                .await;
        }
        Ok(())
    }

    /// Carries out `action` on `name` under its slot, after a fresh re-check agrees. When the
    /// re-check holds the project, what it found is recorded like any pass's findings, so the
    /// next pass decides on it instead of finding the project due again.
    pub(super) async fn act(&self, name: &str, action: ReapAction) {
        let _slot = self.slot(name).await;
        let Some(object) = self.store.get(Kind::Project, name) else {
            return;
        };
        if object.is_deleting() || paused(&object) {
            return;
        }
        let Some(facts) = Facts::of(&object, None) else {
            return;
        };
        let uid = object.uid().to_string();
        let status: ProjectStatus = object.status.decode().unwrap_or_default();
        let previous = self.memory().previous_inspection(&uid).cloned();
        let checked = reap::recheck(
            self.runtime.as_ref(),
            name,
            &crate::workspace::inspect::expected_of(&object),
            self.inspect_timeout,
            facts.subject(self.now(), Some(action)),
            reap::Seen {
                previous: previous.as_ref(),
                activity: status.activity.as_ref(),
                touches: self.touches(&uid),
            },
        )
        .await;
        if checked.booted {
            self.memory().looked_while_stopped(&uid, Instant::now());
        }
        self.note_inspection(&object, &checked.result);
        let recorded = self
            .record_findings(&object, &checked.result, checked.booted)
            .await;
        if !checked.booted
            && let Ok(inspection) = &checked.result
        {
            self.memory().record_inspection(&uid, inspection.clone());
        }
        let verdict = checked.verdict;
        if verdict.act() != Some(action) {
            tracing::info!(
                project = name,
                action = action.metric_label(),
                protected_by = %reasons_text(&verdict.protected_by),
                booted = checked.booted,
                "the re-check holds the project"
            );
            self.count_refusals(&uid, &verdict);
            let (evidence, failure) = match &checked.result {
                Ok(inspection) => (Evidence::Inspected(inspection.unsaved.clone()), None),
                Err(e) => (Evidence::Failed, Some(e.to_string())),
            };
            if let Err(e) = self
                .record_verdict(&object, &verdict, evidence, failure)
                .await
            {
                tracing::warn!(project = name, error = %e, "recording the re-check failed");
            }
            return;
        }
        // The deletion names the version just written: a spec or annotation changed meanwhile
        // makes it fail, and the next pass decides again.
        let Some(current) = recorded.filter(|o| o.generation() == object.generation()) else {
            tracing::info!(project = name, "changed while being re-checked; not reaped");
            return;
        };
        let done = match action {
            ReapAction::Stop => self.idle(name).await,
            ReapAction::Delete => self.delete(&current).await,
        };
        match done {
            Ok(()) => {
                self.metrics
                    .reap_actions
                    .get_or_create(&ActionLabels {
                        action: action.metric_label(),
                    })
                    .inc();
                let message = match action {
                    ReapAction::Stop => "idle: stopped by the reaper until woken",
                    ReapAction::Delete => "deleted by the reaper",
                };
                tracing::info!(project = name, action = action.metric_label(), "reaped");
                self.event(&object, EventType::Normal, "Reaped", message)
                    .await;
                self.queue.request_now(name);
            }
            Err(e) => {
                tracing::warn!(project = name, error = %e, "reaping failed");
            }
        }
    }

    /// Idles the project: the reconciler stops it and keeps it stopped until woken.
    pub(super) async fn idle(&self, name: &str) -> Result<(), StoreError> {
        let now = self.now();
        self.update_status(name, move |status, _| {
            let reap = status.reap.get_or_insert_with(Default::default);
            reap.idled_at = Some(now);
        })
        .await
        .map(|_| ())
    }

    pub(super) async fn delete(&self, object: &Arc<StoredObject>) -> Result<(), StoreError> {
        let name = object.name().to_string();
        let rv = object.resource_version();
        self.store
            .call(move |store| {
                let annotations =
                    BTreeMap::from([(REAPED_ANNOTATION.to_string(), "reaper".into())]);
                store.delete(Kind::Project, &name, Some(rv), annotations, Commit::Persist)
            })
            .await
            .map(|_| ())
    }
}
