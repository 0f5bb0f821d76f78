//! Condition updates.

use berth_api::{Condition, ConditionStatus, condition_types, reasons, set_condition};
use chrono::{DateTime, TimeZone, Utc};

fn at(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_780_000_000 + secs, 0).unwrap()
}

/// One call of set_condition: (status, reason, message, generation, time, expect changed,
/// expected lastTransitionTime).
type Call = (
    ConditionStatus,
    &'static str,
    &'static str,
    i64,
    i64,
    bool,
    i64,
);

#[test]
fn set_condition_transitions() {
    use ConditionStatus::{False, True, Unknown};
    let calls: &[(&str, Call)] = &[
        ("new condition", (False, "Created", "", 1, 0, true, 0)),
        (
            "same again: no change",
            (False, "Created", "", 1, 5, false, 0),
        ),
        (
            "reason changes, status does not",
            (False, "Started", "", 1, 10, true, 0),
        ),
        (
            "message changes",
            (False, "Started", "booting", 1, 15, true, 0),
        ),
        (
            "generation changes",
            (False, "Started", "booting", 2, 20, true, 0),
        ),
        (
            "status flips: time moves",
            (True, "Briefed", "", 2, 30, true, 30),
        ),
        ("steady", (True, "Briefed", "", 2, 40, false, 30)),
        (
            "unknown",
            (Unknown, "InspectionFailed", "", 2, 50, true, 50),
        ),
    ];
    let mut conds: Vec<Condition> = Vec::new();
    for (case, (status, reason, message, generation, now, changed, transition)) in calls {
        let got = set_condition(
            &mut conds,
            condition_types::READY,
            *status,
            reason,
            message,
            *generation,
            at(*now),
        );
        assert_eq!(got, *changed, "{case}");
        assert_eq!(conds.len(), 1, "{case}");
        let c = &conds[0];
        assert_eq!(
            (
                c.status,
                c.reason.as_str(),
                c.message.as_str(),
                c.observed_generation
            ),
            (*status, *reason, *message, *generation),
            "{case}"
        );
        assert_eq!(c.last_transition_time, at(*transition), "{case}");
    }
}

#[test]
fn conditions_of_other_types_are_left_alone() {
    let mut conds = Vec::new();
    set_condition(
        &mut conds,
        condition_types::READY,
        ConditionStatus::True,
        reasons::STOPPED,
        "",
        1,
        at(0),
    );
    set_condition(
        &mut conds,
        condition_types::MOUNTS_READY,
        ConditionStatus::False,
        reasons::MISSING,
        "",
        1,
        at(1),
    );
    set_condition(
        &mut conds,
        condition_types::READY,
        ConditionStatus::False,
        reasons::BOOT_TIMEOUT,
        "",
        1,
        at(2),
    );
    assert_eq!(conds.len(), 2);
    assert_eq!(conds[1].last_transition_time, at(1));
    assert!(!berth_api::is_condition_true(
        &conds,
        condition_types::READY
    ));
    assert!(berth_api::remove_condition(
        &mut conds,
        condition_types::MOUNTS_READY
    ));
    assert!(!berth_api::remove_condition(
        &mut conds,
        condition_types::MOUNTS_READY
    ));
    assert_eq!(conds.len(), 1);
}
