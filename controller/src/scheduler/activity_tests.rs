use super::*;
use crate::workspace::inspect::WorkspaceKind;
use berth_api::UnsavedWork;
use chrono::{Duration as Span, TimeZone};

fn t(minutes: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap() + Span::minutes(minutes)
}

fn inspection(cpu_ms: u64, newest: i64, agent: Option<(AgentState, i64)>) -> Inspection {
    Inspection {
        agent: agent.map(|(state, updated)| AgentReport {
            state,
            brief_id: None,
            title: None,
            message: None,
            updated_at: Some(t(updated)),
            session_id: None,
            exit_code: None,
        }),
        agent_unreadable: false,
        kind: WorkspaceKind::Git,
        unsaved: UnsavedWork::default(),
        ports: Vec::new(),
        cpu: Duration::from_millis(cpu_ms),
        newest_mtime: Some(t(newest)),
        ipv4: None,
    }
}

fn status(last: i64, source: ActivitySource) -> ActivityStatus {
    ActivityStatus {
        last_active_at: Some(t(last)),
        source: Some(source),
        inspected_at: Some(t(last)),
    }
}

fn update(
    now: i64,
    previous_status: Option<&ActivityStatus>,
    previous: Option<&Inspection>,
    current: Option<&Inspection>,
    touches: Touches,
) -> ActivityStatus {
    update_activity(&ActivityInputs {
        now: t(now),
        previous_status,
        previous,
        current,
        touches,
        cpu_threshold: DEFAULT_CPU_THRESHOLD,
    })
}

#[test]
fn nothing_changed_is_no_activity() {
    let before = status(10, ActivitySource::Files);
    let a = inspection(5_000, 10, Some((AgentState::Done, 5)));
    let b = inspection(5_200, 10, Some((AgentState::Done, 5)));
    let got = update(60, Some(&before), Some(&a), Some(&b), Touches::default());
    assert_eq!(got.last_active_at, Some(t(10)));
    assert_eq!(got.source, Some(ActivitySource::Files));
    assert_eq!(got.inspected_at, Some(t(60)), "the inspection is recorded");
}

#[test]
fn each_signal_is_named() {
    let before = status(10, ActivitySource::Files);
    let a = inspection(5_000, 10, Some((AgentState::Working, 5)));
    let cases = [
        (
            "agent updated while working",
            inspection(5_000, 10, Some((AgentState::Working, 50))),
            Touches::default(),
            (t(50), ActivitySource::Agent),
        ),
        (
            "cpu",
            inspection(9_000, 10, Some((AgentState::Working, 5))),
            Touches::default(),
            (t(60), ActivitySource::Cpu),
        ),
        (
            "files",
            inspection(5_000, 40, Some((AgentState::Working, 5))),
            Touches::default(),
            (t(40), ActivitySource::Files),
        ),
        (
            "exec",
            inspection(5_000, 10, None),
            Touches {
                exec: Some(t(30)),
                tool: Some(t(20)),
                preview: Some(t(25)),
                ide: Some(t(28)),
            },
            (t(30), ActivitySource::Exec),
        ),
        (
            "tool, newest of several",
            inspection(5_000, 40, None),
            Touches {
                exec: None,
                tool: Some(t(55)),
                preview: None,
                ide: None,
            },
            (t(55), ActivitySource::Tool),
        ),
        (
            "preview",
            inspection(5_000, 40, None),
            Touches {
                exec: Some(t(50)),
                tool: None,
                preview: Some(t(57)),
                ide: None,
            },
            (t(57), ActivitySource::Preview),
        ),
        (
            "ide",
            inspection(5_000, 40, None),
            Touches {
                exec: None,
                tool: Some(t(45)),
                preview: Some(t(50)),
                ide: Some(t(58)),
            },
            (t(58), ActivitySource::Ide),
        ),
    ];
    for (name, current, touches, (at, source)) in cases {
        let got = update(60, Some(&before), Some(&a), Some(&current), touches);
        assert_eq!(
            (got.last_active_at, got.source),
            (Some(at), Some(source)),
            "{name}"
        );
    }
}

#[test]
fn an_agent_that_finished_or_is_blocked_is_not_active() {
    let before = status(10, ActivitySource::Files);
    let a = inspection(5_000, 10, Some((AgentState::Working, 5)));
    for state in [AgentState::Blocked, AgentState::Done, AgentState::Idle] {
        let b = inspection(5_000, 10, Some((state, 50)));
        let got = update(60, Some(&before), Some(&a), Some(&b), Touches::default());
        assert_eq!(got.last_active_at, Some(t(10)), "{state:?}");
    }
}

#[test]
fn first_inspection_compares_with_recorded_status() {
    // After a restart there is no previous inspection: only what is newer than status counts,
    // and CPU (a cumulative figure) cannot be compared at all.
    let before = status(30, ActivitySource::Exec);
    let now = inspection(900_000, 20, Some((AgentState::Working, 25)));
    let got = update(60, Some(&before), None, Some(&now), Touches::default());
    assert_eq!(got.last_active_at, Some(t(30)));
    assert_eq!(got.source, Some(ActivitySource::Exec));

    // A brand new project: the clone's files are its first activity.
    let got = update(60, None, None, Some(&now), Touches::default());
    assert_eq!(got.last_active_at, Some(t(25)));
    assert_eq!(got.source, Some(ActivitySource::Agent));
}

#[test]
fn a_container_clock_ahead_does_not_push_activity_into_the_future() {
    let a = inspection(5_000, 10, None);
    let b = inspection(5_000, 10_000, None);
    let got = update(60, None, Some(&a), Some(&b), Touches::default());
    assert_eq!(got.last_active_at, Some(t(60)));
}

#[test]
fn file_times_are_judged_against_what_status_recorded() {
    // The previous inspection already saw these files, but status never recorded them (the
    // write was lost, or status was older): they count, as the re-check before acting counts
    // them.
    let before = status(5, ActivitySource::Exec);
    let a = inspection(5_000, 10, None);
    let b = inspection(5_000, 10, None);
    let got = update(60, Some(&before), Some(&a), Some(&b), Touches::default());
    assert_eq!(
        (got.last_active_at, got.source),
        (Some(t(10)), Some(ActivitySource::Files))
    );
    let got = update(60, None, Some(&a), Some(&b), Touches::default());
    assert_eq!(got.last_active_at, Some(t(10)));
    // Once recorded, the same files are no news.
    let again = update(90, Some(&got), Some(&b), Some(&b), Touches::default());
    assert_eq!(again.last_active_at, Some(t(10)));
}

#[test]
fn a_future_file_time_counts_once() {
    let ahead = inspection(5_000, 10_000, None);
    let first = update(60, None, None, Some(&ahead), Touches::default());
    assert_eq!(first.last_active_at, Some(t(60)));
    let second = update(
        90,
        Some(&first),
        Some(&ahead),
        Some(&ahead),
        Touches::default(),
    );
    assert_eq!(
        second.last_active_at,
        Some(t(60)),
        "the same file is not new"
    );
}

#[test]
fn a_failed_inspection_keeps_what_was_known() {
    let before = status(10, ActivitySource::Cpu);
    let got = update(60, Some(&before), None, None, Touches::default());
    assert_eq!(got, before, "not even inspectedAt moves");
    let got = update(
        60,
        Some(&before),
        None,
        None,
        Touches {
            exec: Some(t(45)),
            tool: None,
            preview: None,
            ide: None,
        },
    );
    assert_eq!(got.last_active_at, Some(t(45)));
    assert_eq!(got.source, Some(ActivitySource::Exec));
}

#[test]
fn texts_are_sanitised() {
    assert_eq!(
        sanitize("Fix\tthe\x1b[31m tests\n\u{7}"),
        "Fix the [31m tests"
    );
    assert_eq!(sanitize(&"é".repeat(500)).chars().count(), MAX_TEXT_CHARS);
    assert_eq!(sanitize("  \n "), "");
}

#[test]
fn title_is_recorded_once() {
    let report = AgentReport {
        state: AgentState::Working,
        brief_id: Some("b1".into()),
        title: Some("Fix\nflaky checkout test".into()),
        message: Some("Which\u{0}DB?".into()),
        updated_at: None,
        session_id: None,
        exit_code: None,
    };
    assert_eq!(
        title_to_record(None, Some(&report)).as_deref(),
        Some("Fix flaky checkout test")
    );
    assert_eq!(title_to_record(Some("Earlier title"), Some(&report)), None);
    assert_eq!(title_to_record(None, None), None);
    let blank = AgentReport {
        title: Some("\u{1}\u{2}".into()),
        ..report.clone()
    };
    assert_eq!(title_to_record(None, Some(&blank)), None);
    assert_eq!(agent_status(&report).message, "Which DB?");
}
