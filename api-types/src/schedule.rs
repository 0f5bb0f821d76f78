//! Scheduled briefs: `spec.schedules`, a schedule's cron and timezone, and when it is due.
//!
//! A schedule is a five-field cron (minute granularity) read in an IANA timezone (UTC when none
//! is given). The persisted state of a schedule is its next run (`status.schedules`);
//! [`Schedule::plan`] turns that and the current time into what to do, so that however many
//! times were missed while berth was down, a due schedule runs once and its next run moves past
//! the present.
//!
//! The cron is read by croner and the timezone by chrono-tz; validation names the bad field
//! (`spec.schedules[N].cron`, `.timezone`).

use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ValidationErrors;

/// At a cron's time, berth hands the project's agent `brief` (waking an idled project first).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Five fields: minute, hour, day of month, month, day of week (`0 9 * * MON-FRI`).
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub cron: String,
    /// The brief handed to the agent at each run.
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub brief: String,
    /// The IANA timezone the cron is read in (`Europe/Paris`); UTC when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub timezone: String,
}

/// What berth last did with one schedule, keyed by the schedule's [`ScheduleStatus::id`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleStatus {
    /// Names the schedule by its content (cron, timezone, brief): an edited schedule is a new
    /// one, planned afresh from the time of the edit.
    pub id: String,
    /// The cron, as written, for people reading the status.
    pub cron: String,
    /// The next time the schedule runs; absent when its cron never matches again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run: Option<DateTime<Utc>>,
    /// The scheduled time of the last run (not when berth got to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<DateTime<Utc>>,
}

/// The brief a schedule handed over, which the agent works instead of `spec.brief` until
/// `spec.brief` changes or another run replaces it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledBrief {
    /// The [`ScheduleStatus::id`] of the schedule that ran.
    pub schedule: String,
    /// The scheduled time of the run.
    pub at: DateTime<Utc>,
    pub brief: String,
    /// The id of the brief `spec.brief` made when the schedule ran: a `spec.brief` changed since
    /// is newer than this run, and wins.
    pub over: String,
}

/// A parsed schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    timezone: Tz,
}

/// What a schedule asks for at a given moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The scheduled time being run now, if one is due (the persisted next run).
    pub run: Option<DateTime<Utc>>,
    /// The next run to persist: unchanged when nothing is due.
    pub next: Option<DateTime<Utc>>,
}

impl Schedule {
    /// Parses a schedule's cron and timezone; an error names the field (`cron`, `timezone`)
    /// and says what is wrong on one line.
    pub fn parse(cron: &str, timezone: &str) -> Result<Self, (&'static str, String)> {
        let parser = CronParser::builder().seconds(Seconds::Disallowed).build();
        let parsed = parser.parse(cron.trim()).map_err(|e| {
            (
                "cron",
                format!("{cron:?} is not a five-field cron expression: {e}"),
            )
        })?;
        let timezone = match timezone.trim() {
            "" => Tz::UTC,
            name => Tz::from_str(name).map_err(|_| {
                (
                    "timezone",
                    format!("{name:?} is not an IANA timezone (e.g. Europe/Paris)"),
                )
            })?,
        };
        Ok(Schedule {
            cron: parsed,
            timezone,
        })
    }

    /// The parsed schedule of a spec entry, `None` when it does not parse (admission refused
    /// such a spec, so only a stored object older than a rule change can hold one).
    pub fn of(spec: &ScheduleSpec) -> Option<Self> {
        Schedule::parse(&spec.cron, &spec.timezone).ok()
    }

    /// The first scheduled time strictly after `after`, or `None` if the cron never matches again.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = after.with_timezone(&self.timezone);
        self.cron
            .find_next_occurrence(&local, false)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    }

    /// What to do at `now`, given the persisted next run. A schedule without one (just added)
    /// runs at its first time after `now`, never for the past. A due schedule runs once for its
    /// persisted time, and its next run is the first time after `now`: missed times collapse.
    pub fn plan(&self, next_run: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Plan {
        match next_run {
            Some(at) if at <= now => Plan {
                run: Some(at),
                next: self.next_after(now),
            },
            Some(at) => Plan {
                run: None,
                next: Some(at),
            },
            None => Plan {
                run: None,
                next: self.next_after(now),
            },
        }
    }
}

/// The most schedules one project may have.
pub const MAX_SCHEDULES: usize = 50;

/// Checks every schedule of a spec, naming each bad field (`spec.schedules[N].cron`).
pub(crate) fn validate_schedules(schedules: &[ScheduleSpec], errs: &mut ValidationErrors) {
    if schedules.len() > MAX_SCHEDULES {
        errs.push(
            "spec.schedules",
            format!("at most {MAX_SCHEDULES} schedules, not {}", schedules.len()),
        );
    }
    for (n, schedule) in schedules.iter().enumerate() {
        let field = format!("spec.schedules[{n}]");
        if let Err((part, message)) = Schedule::parse(&schedule.cron, &schedule.timezone) {
            errs.push(format!("{field}.{part}"), message);
        }
        if schedule.brief.trim().is_empty() {
            errs.push(format!("{field}.brief"), "must not be empty");
        }
    }
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
