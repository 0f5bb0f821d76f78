//! Scheduled briefs, planned: which of a project's `spec.schedules` is due at a moment, and
//! the status that records it. Pure; the schedules pass (`passes.rs`) acts on the plan: it
//! wakes an idled project, writes the plan, and the agent steps hand the brief over
//! ([`crate::agent::current_brief`]).

use berth_api::{
    ProjectSpec, ProjectStatus, Schedule, ScheduleSpec, ScheduleStatus, ScheduledBrief,
};
use chrono::{DateTime, Utc};

/// The id of a schedule: its content, so an edited schedule is planned afresh.
pub fn schedule_id(spec: &ScheduleSpec) -> String {
    let digest = crate::agent::sha256_hex(
        format!(
            "{}\0{}\0{}",
            spec.cron.trim(),
            spec.timezone.trim(),
            spec.brief
        )
        .as_bytes(),
    );
    format!("s-{}", &digest[..12])
}

/// What a project's schedules ask for at a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectPlan {
    /// `status.schedules` as it should be now, in the order of `spec.schedules`.
    pub schedules: Vec<ScheduleStatus>,
    /// The run to hand over: the latest due time (the first schedule listed on a tie).
    pub run: Option<Due>,
    /// Every other schedule that came due in the same round: its run is recorded (its next
    /// run moves on) but its brief gives way to `run`'s.
    pub superseded: Vec<Due>,
}

/// One due run of one schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// Its place in `spec.schedules`.
    pub index: usize,
    pub id: String,
    pub at: DateTime<Utc>,
}

impl ProjectPlan {
    /// Whether the plan changes nothing stored.
    pub fn is_quiet(&self, status: &ProjectStatus) -> bool {
        self.run.is_none() && self.schedules == status.schedules
    }

    /// The status after the due run is handed over: `brief` is the run's, `over` the id of
    /// the brief `spec.brief` makes (see [`ScheduledBrief::over`]).
    pub fn scheduled_brief(&self, spec: &ProjectSpec, over: String) -> Option<ScheduledBrief> {
        let run = self.run.as_ref()?;
        Some(ScheduledBrief {
            schedule: run.id.clone(),
            at: run.at,
            brief: spec.schedules.get(run.index)?.brief.clone(),
            over,
        })
    }
}

/// Plans every schedule of `spec` at `now` from what `status` recorded. A schedule not yet in
/// status (new or edited) gets its first time after `now`; one that was due runs once however
/// many of its times went by.
pub fn plan(spec: &ProjectSpec, status: &ProjectStatus, now: DateTime<Utc>) -> ProjectPlan {
    let mut schedules = Vec::with_capacity(spec.schedules.len());
    let mut due = Vec::new();
    for (index, entry) in spec.schedules.iter().enumerate() {
        let id = schedule_id(entry);
        let recorded = status.schedules.iter().find(|s| s.id == id);
        let Some(schedule) = Schedule::of(entry) else {
            // Refused by admission; kept as recorded so nothing runs from it.
            schedules.push(recorded.cloned().unwrap_or(ScheduleStatus {
                id,
                cron: entry.cron.clone(),
                next_run: None,
                last_run: None,
            }));
            continue;
        };
        let planned = schedule.plan(recorded.and_then(|s| s.next_run), now);
        let mut last_run = recorded.and_then(|s| s.last_run);
        if let Some(at) = planned.run {
            last_run = Some(at);
            due.push(Due {
                index,
                id: id.clone(),
                at,
            });
        }
        schedules.push(ScheduleStatus {
            id,
            cron: entry.cron.clone(),
            next_run: planned.next,
            last_run,
        });
    }
    // The latest time wins; on a tie, the first listed (a stable sort keeps spec order).
    due.sort_by_key(|d| std::cmp::Reverse(d.at));
    let mut due = due.into_iter();
    let run = due.next();
    ProjectPlan {
        schedules,
        run,
        superseded: due.collect(),
    }
}

#[cfg(test)]
#[path = "schedules_tests.rs"]
mod tests;
