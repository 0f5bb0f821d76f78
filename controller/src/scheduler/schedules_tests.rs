use berth_api::{ProjectSpec, ProjectStatus, ScheduleSpec};
use chrono::{DateTime, TimeZone, Utc};

use super::*;

fn utc(h: u32, mi: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, h, mi, s).unwrap()
}

fn spec(schedules: &[(&str, &str)]) -> ProjectSpec {
    ProjectSpec {
        agent: Some("shell".into()),
        brief: "the first brief".into(),
        schedules: schedules
            .iter()
            .map(|(cron, brief)| ScheduleSpec {
                cron: cron.to_string(),
                brief: brief.to_string(),
                timezone: String::new(),
            })
            .collect(),
        ..ProjectSpec::default()
    }
}

fn after(plan: &ProjectPlan) -> ProjectStatus {
    ProjectStatus {
        schedules: plan.schedules.clone(),
        ..ProjectStatus::default()
    }
}

#[test]
fn a_new_schedule_records_its_first_time_and_runs_nothing() {
    let spec = spec(&[("0 * * * *", "hourly")]);
    let plan = plan(&spec, &ProjectStatus::default(), utc(10, 20, 0));
    assert_eq!(plan.run, None);
    assert_eq!(plan.schedules[0].next_run, Some(utc(11, 0, 0)));
    assert_eq!(plan.schedules[0].last_run, None);
    assert!(!plan.is_quiet(&ProjectStatus::default()));
    assert!(plan.is_quiet(&after(&plan)));
}

#[test]
fn a_due_schedule_runs_once_for_many_missed_times() {
    let spec = spec(&[("0 * * * *", "hourly")]);
    let first = plan(&spec, &ProjectStatus::default(), utc(10, 20, 0));
    // Down from 10:20 to 14:05: four times missed.
    let due = plan(&spec, &after(&first), utc(14, 5, 0));
    let run = due.run.clone().expect("due");
    assert_eq!(run.at, utc(11, 0, 0));
    assert_eq!(due.schedules[0].last_run, Some(utc(11, 0, 0)));
    assert_eq!(due.schedules[0].next_run, Some(utc(15, 0, 0)));
    let brief = due.scheduled_brief(&spec, "b-over".into()).unwrap();
    assert_eq!(
        (brief.brief.as_str(), brief.over.as_str()),
        ("hourly", "b-over")
    );
    // The same moment again: nothing more.
    assert_eq!(plan(&spec, &after(&due), utc(14, 5, 0)).run, None);
}

#[test]
fn of_two_due_schedules_the_later_time_is_handed_over() {
    let spec = spec(&[("0 * * * *", "hourly"), ("30 * * * *", "half past")]);
    let first = plan(&spec, &ProjectStatus::default(), utc(10, 20, 0));
    let due = plan(&spec, &after(&first), utc(11, 40, 0));
    assert_eq!(
        due.run.as_ref().map(|r| (r.index, r.at)),
        Some((0, utc(11, 0, 0)))
    );
    assert_eq!(
        due.superseded
            .iter()
            .map(|r| (r.index, r.at))
            .collect::<Vec<_>>(),
        vec![(1, utc(10, 30, 0))]
    );
    assert!(due.schedules.iter().all(|s| s.last_run.is_some()));
}

#[test]
fn an_edited_schedule_is_planned_afresh() {
    let before = spec(&[("0 * * * *", "hourly")]);
    let first = plan(&before, &ProjectStatus::default(), utc(10, 20, 0));
    let edited = spec(&[("0 * * * *", "hourly, reworded")]);
    let replanned = plan(&edited, &after(&first), utc(12, 5, 0));
    // The old entry's missed 11:00 is not the new one's to run.
    assert_eq!(replanned.run, None);
    assert_eq!(replanned.schedules.len(), 1);
    assert_eq!(replanned.schedules[0].next_run, Some(utc(13, 0, 0)));
    assert_ne!(replanned.schedules[0].id, first.schedules[0].id);
}

#[test]
fn a_removed_schedule_leaves_status() {
    let first = plan(
        &spec(&[("0 * * * *", "hourly")]),
        &ProjectStatus::default(),
        utc(10, 0, 0),
    );
    let none = plan(&spec(&[]), &after(&first), utc(10, 5, 0));
    assert!(none.schedules.is_empty());
    assert!(!none.is_quiet(&after(&first)));
}
