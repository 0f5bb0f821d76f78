//! Scheduled briefs: a schedule's cron and timezone, and when it is due.
//!
//! A schedule is a five-field cron (minute granularity) read in an IANA timezone (UTC when none
//! is given). The persisted state of a schedule is its next run; [`Schedule::plan`] turns that and
//! the current time into what to do, so that however many times were missed while berth was down,
//! a due schedule runs once and its next run moves past the present.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds};

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
    /// Parses `cron` and `timezone`; the error is one line naming the field under `field`
    /// (e.g. `spec.schedules[0]`).
    pub fn parse(field: &str, cron: &str, timezone: &str) -> Result<Self, String> {
        let parser = CronParser::builder().seconds(Seconds::Disallowed).build();
        let parsed = parser.parse(cron.trim()).map_err(|e| {
            format!("{field}.cron: {cron:?} is not a five-field cron expression: {e}")
        })?;
        let timezone = match timezone.trim() {
            "" => Tz::UTC,
            name => Tz::from_str(name).map_err(|_| {
                format!("{field}.timezone: {name:?} is not an IANA timezone (e.g. Europe/Paris)")
            })?,
        };
        Ok(Schedule {
            cron: parsed,
            timezone,
        })
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

/// Checks every schedule of a spec; the error names the first bad field.
pub fn validate<'a>(
    schedules: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
) -> Result<(), String> {
    for (n, (cron, timezone, brief)) in schedules.into_iter().enumerate() {
        let field = format!("spec.schedules[{n}]");
        Schedule::parse(&field, cron, timezone)?;
        if brief.trim().is_empty() {
            return Err(format!("{field}.brief: must not be empty"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
