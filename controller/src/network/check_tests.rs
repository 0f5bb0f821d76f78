use std::collections::BTreeMap;

use berth_api::NetworkStatus;
use chrono::{TimeZone, Utc};

use super::*;

fn addresses(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    pairs
        .iter()
        .map(|(i, a)| (i.to_string(), a.iter().map(|a| a.to_string()).collect()))
        .collect()
}

/// What the case is, `status.network`, what the inspection saw, what the check decides.
type Case = (
    &'static str,
    Option<NetworkStatus>,
    Option<BTreeMap<String, Vec<String>>>,
    Check,
);

fn had(pairs: &[(&str, &[&str])]) -> NetworkStatus {
    NetworkStatus {
        ipv4: addresses(pairs),
        repair_failed_at: None,
    }
}

#[test]
fn the_check_records_repairs_once_and_waits_for_an_address() {
    let failed_at = Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap();
    let eth0 = [("eth0", &["10.0.0.5/24"][..])];
    let only_loopback = addresses(&[("lo", &["127.0.0.1/8"])]);
    let failed = repair_failed(&had(&eth0), failed_at);
    let cases: Vec<Case> = vec![
        (
            "first addresses are recorded, loopback left out",
            None,
            Some(addresses(&[
                ("lo", &["127.0.0.1/8"]),
                ("eth0", &["10.0.0.5/24"]),
            ])),
            Check::Record(had(&eth0)),
        ),
        (
            "the same addresses write nothing",
            Some(had(&eth0)),
            Some(addresses(&[
                ("lo", &["127.0.0.1/8"]),
                ("eth0", &["10.0.0.5/24"]),
            ])),
            Check::Steady,
        ),
        (
            "a new address is recorded",
            Some(had(&eth0)),
            Some(addresses(&[("eth0", &["10.0.0.6/24"])])),
            Check::Record(had(&[("eth0", &["10.0.0.6/24"])])),
        ),
        (
            "a container that never had one is left alone",
            None,
            Some(only_loopback.clone()),
            Check::Steady,
        ),
        (
            "an interface without addresses does not count",
            None,
            Some(addresses(&[("eth0", &[])])),
            Check::Steady,
        ),
        (
            "a lost address is repaired",
            Some(had(&eth0)),
            Some(only_loopback.clone()),
            Check::Repair,
        ),
        (
            "after a failed repair, nothing more until one returns",
            Some(failed.clone()),
            Some(only_loopback.clone()),
            Check::Steady,
        ),
        (
            "an address back clears the failure",
            Some(failed.clone()),
            Some(addresses(&[("eth0", &["10.0.0.5/24"])])),
            Check::Record(had(&eth0)),
        ),
        (
            "an inspection that could not tell decides nothing",
            Some(had(&eth0)),
            None,
            Check::Steady,
        ),
    ];
    for (case, recorded, seen, want) in cases {
        assert_eq!(check(recorded.as_ref(), seen.as_ref()), want, "{case}");
    }
    assert_eq!(failed.ipv4, addresses(&eth0), "what was lost stays shown");
}
