use chrono::{TimeZone, Utc};

use super::*;

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
}

fn spec(cron: &str, timezone: &str, brief: &str) -> ScheduleSpec {
    ScheduleSpec {
        cron: cron.to_string(),
        brief: brief.to_string(),
        timezone: timezone.to_string(),
    }
}

#[test]
fn a_bad_cron_or_timezone_names_its_field() {
    for (cron, tz, brief, want) in [
        ("61 * * * *", "", "b", "spec.schedules[1].cron: "),
        ("* * * *", "", "b", "spec.schedules[1].cron: "),
        ("0 * * * * *", "", "b", "spec.schedules[1].cron: "),
        (
            "0 9 * * MON",
            "Mars/Olympus",
            "b",
            "spec.schedules[1].timezone: ",
        ),
        ("0 9 * * MON", "UTC", "  ", "spec.schedules[1].brief: "),
    ] {
        let mut errs = ValidationErrors::new();
        validate_schedules(
            &[
                spec("*/5 * * * *", "Europe/Paris", "ok"),
                spec(cron, tz, brief),
            ],
            &mut errs,
        );
        let err = errs.into_result().expect_err(cron).to_string();
        assert!(err.starts_with(want), "{cron} {tz}: {err}");
        assert!(!err.contains('\n'), "{err}");
    }
    let mut errs = ValidationErrors::new();
    validate_schedules(
        &[spec("0 9 * * MON-FRI", "America/New_York", "standup")],
        &mut errs,
    );
    assert!(errs.is_empty());
}

#[test]
fn the_next_run_is_read_in_the_schedules_timezone() {
    let s = Schedule::parse("0 9 * * *", "Europe/Paris").unwrap();
    // 09:00 in Paris is 08:00 UTC in winter and 07:00 UTC in summer.
    assert_eq!(
        s.next_after(utc(2026, 1, 10, 12, 0, 0)),
        Some(utc(2026, 1, 11, 8, 0, 0))
    );
    assert_eq!(
        s.next_after(utc(2026, 7, 10, 12, 0, 0)),
        Some(utc(2026, 7, 11, 7, 0, 0))
    );
    let utc_default = Schedule::parse("0 9 * * *", "").unwrap();
    assert_eq!(
        utc_default.next_after(utc(2026, 1, 10, 9, 0, 0)),
        Some(utc(2026, 1, 11, 9, 0, 0))
    );
}

#[test]
fn a_new_schedule_waits_for_its_first_time() {
    let s = Schedule::parse("* * * * *", "").unwrap();
    let now = utc(2026, 3, 1, 10, 0, 30);
    assert_eq!(
        s.plan(None, now),
        Plan {
            run: None,
            next: Some(utc(2026, 3, 1, 10, 1, 0))
        }
    );
}

#[test]
fn missed_times_run_once_and_the_next_run_moves_past_now() {
    let s = Schedule::parse("* * * * *", "").unwrap();
    let persisted = utc(2026, 3, 1, 10, 1, 0);
    // Down from 10:00:30 to 10:05:10: four times missed, one run.
    let now = utc(2026, 3, 1, 10, 5, 10);
    let plan = s.plan(Some(persisted), now);
    assert_eq!(plan.run, Some(persisted));
    assert_eq!(plan.next, Some(utc(2026, 3, 1, 10, 6, 0)));
    // Planning again with what was persisted does not run again.
    assert_eq!(
        s.plan(plan.next, now),
        Plan {
            run: None,
            next: plan.next
        }
    );
}

#[test]
fn a_schedule_is_due_at_its_time_not_before() {
    let s = Schedule::parse("30 14 * * *", "UTC").unwrap();
    let at = utc(2026, 3, 1, 14, 30, 0);
    assert_eq!(s.plan(Some(at), utc(2026, 3, 1, 14, 29, 59)).run, None);
    assert_eq!(s.plan(Some(at), at).run, Some(at));
    assert_eq!(s.plan(Some(at), at).next, Some(utc(2026, 3, 2, 14, 30, 0)));
}
