//! The schedules pass: hands the agent the brief of every schedule that came due, waking an
//! idled project first. A project stopped by `spec.state: Stopped` stays stopped (its run is
//! recorded as skipped); one being deleted is left alone.

use std::sync::Arc;

use berth_api::{PowerState, ProjectSpec, ProjectStatus};
use chrono::SecondsFormat;

use super::DaemonPasses;
use crate::reconcile::status::{Idling, idling};
use crate::scheduler::schedules::{self, Due, ProjectPlan};
use crate::store::{EventType, StoredObject};

impl DaemonPasses {
    pub(super) async fn schedules(&self) {
        let now = self.now();
        for object in self.projects() {
            if object.is_deleting() || !has_schedules(&object) {
                continue;
            }
            let (Ok(spec), Ok(status)) = (
                object.spec.decode::<ProjectSpec>(),
                object.status.decode::<ProjectStatus>(),
            ) else {
                continue;
            };
            let plan = schedules::plan(&spec, &status, now);
            if plan.is_quiet(&status) {
                continue;
            }
            self.carry_out(&object, &spec, &status, plan).await;
        }
    }

    async fn carry_out(
        &self,
        object: &Arc<StoredObject>,
        spec: &ProjectSpec,
        status: &ProjectStatus,
        plan: ProjectPlan,
    ) {
        let handing = plan.run.is_some() && spec.state == PowerState::Running;
        if handing && idling(status, &object.metadata.annotations) == Idling::Idled {
            let name = object.name().to_string();
            // Woken before the run is recorded: a crash in between runs it again, once.
            let uid = object.uid().to_string();
            let woke = self
                .store
                .call(move |store| {
                    crate::reconcile::wake::request_wake(store, &name, &uid, "a scheduled brief")
                })
                .await;
            if let Err(e) = woke {
                tracing::warn!(project = object.name(), error = %e, "waking a project for its scheduled brief failed; the next round tries again");
                return;
            }
        }
        let over = crate::agent::brief_id(object.uid(), &spec.brief);
        let brief = handing.then(|| plan.scheduled_brief(spec, over)).flatten();
        let recorded = plan.schedules.clone();
        let written = {
            let brief = brief.clone();
            self.update_status(object.name(), move |status, _| {
                status.schedules = recorded.clone();
                if let Some(brief) = &brief {
                    status.scheduled_brief = Some(brief.clone());
                }
            })
            .await
        };
        let object = match written {
            Ok(Some(object)) => object,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(project = object.name(), error = %e, "recording a schedule's run failed; the next round tries again");
                return;
            }
        };
        let Some(run) = &plan.run else {
            return;
        };
        let what = |due: &Due| {
            format!(
                "schedule {} ({}) due at {}",
                due.index,
                spec.schedules[due.index].cron,
                due.at.to_rfc3339_opts(SecondsFormat::Secs, true)
            )
        };
        match &brief {
            Some(brief) => {
                let id = crate::agent::scheduled_brief_id(object.uid(), brief);
                self.event(
                    &object,
                    EventType::Normal,
                    "ScheduleRan",
                    &format!("{}: brief {id} goes to the agent", what(run)),
                )
                .await;
                self.queue.request_now(object.name());
            }
            None => {
                self.event(
                    &object,
                    EventType::Warning,
                    "ScheduleSkipped",
                    &format!(
                        "{}: the project is stopped (spec.state: Stopped), so its brief was not handed over; berth start runs the next one",
                        what(run)
                    ),
                )
                .await;
            }
        }
        for due in &plan.superseded {
            self.event(
                &object,
                EventType::Normal,
                "ScheduleSuperseded",
                &format!(
                    "{}: the later run of schedule {} went instead",
                    what(due),
                    run.index
                ),
            )
            .await;
        }
    }
}

/// Whether the project has or had schedules, read from the stored text without decoding it (the
/// pass looks at every project each round). A quote inside a JSON string is escaped, so the key
/// cannot be matched inside a value.
fn has_schedules(object: &StoredObject) -> bool {
    const KEY: &str = "\"schedules\"";
    object.spec.as_str().contains(KEY) || object.status.as_str().contains(KEY)
}
