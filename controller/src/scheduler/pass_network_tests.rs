//! The network pass over the fake runtime: what it records, the one repair per loss, and
//! its events.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::tests::setup;
use super::*;
use crate::runtime::{ExecOutput, InstanceState, NetworkState};
use crate::testing::inspection::{FakeWorkspace, inspection_report, is_inspection};
use serde_json::json;

type Addresses = Option<BTreeMap<String, Vec<String>>>;

fn eth0(addresses: &[&str]) -> Addresses {
    Some(BTreeMap::from([(
        "eth0".to_string(),
        addresses.iter().map(|a| a.to_string()).collect(),
    )]))
}

/// A running project with a NIC, whose inspections report `seen`'s addresses as they are when
/// each runs, and whose container LXD reports with `lxd_says` on eth0 (what a repair reads).
fn networked(s: &super::tests::Setup, seen: &Arc<Mutex<Addresses>>, lxd_says: &[&str]) {
    s.project("web", json!({"idleAfter": "1h"}), true);
    let mut instance = s.fake.instance("web").unwrap();
    instance.devices.insert(
        "eth0".into(),
        BTreeMap::from([
            ("type".into(), "nic".into()),
            ("nictype".into(), "p2p".into()),
        ]),
    );
    instance.state = Some(InstanceState {
        network: BTreeMap::from([(
            "eth0".to_string(),
            NetworkState {
                addresses: lxd_says.iter().map(|a| a.to_string()).collect(),
                mac: "00:16:3e:00:00:01".into(),
                mtu: 1500,
                ..NetworkState::default()
            },
        )]),
        ..InstanceState::default()
    });
    s.fake.insert_instance(instance);
    let seen = seen.clone();
    s.fake.on_exec(move |_, request| {
        is_inspection(request).then(|| {
            let workspace = FakeWorkspace {
                ipv4: seen.lock().unwrap().clone(),
                ..FakeWorkspace::default()
            };
            Ok(ExecOutput {
                exit_code: 0,
                stdout: inspection_report(&workspace).into_bytes(),
                stderr: Vec::new(),
            })
        })
    });
}

async fn round(s: &super::tests::Setup) {
    s.passes.run(Pass::Activity).await;
    s.passes.run(Pass::Network).await;
}

/// The messages of the project's events of `reason`, once per time each was recorded.
fn events(s: &super::tests::Setup, reason: &str) -> Vec<String> {
    s.store
        .events_for(Kind::Project, "web")
        .unwrap()
        .into_iter()
        .filter(|e| e.reason == reason)
        .flat_map(|e| std::iter::repeat_n(e.message, e.count as usize))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn addresses_are_recorded_once_and_a_lost_one_is_repaired() {
    let s = setup();
    let seen = Arc::new(Mutex::new(eth0(&["10.0.0.5/24"])));
    networked(&s, &seen, &["10.0.0.5", "fe80::1"]);

    round(&s).await;
    assert_eq!(
        s.status("web")["network"],
        json!({"ipv4": {"eth0": ["10.0.0.5/24"]}}),
        "loopback is left out"
    );
    let version = s
        .store
        .get(Kind::Project, "web")
        .unwrap()
        .resource_version();
    round(&s).await;
    assert_eq!(
        s.store
            .get(Kind::Project, "web")
            .unwrap()
            .resource_version(),
        version,
        "the same addresses write nothing"
    );
    assert_eq!(s.fake.count("restart_nics"), 0);

    *seen.lock().unwrap() = eth0(&[]);
    round(&s).await;
    assert_eq!(s.fake.count("restart_nics"), 1, "repaired");
    let repaired = events(&s, "NetworkRepaired");
    assert_eq!(repaired.len(), 1, "{repaired:?}");
    assert!(
        repaired[0].contains("eth0 10.0.0.5/24") && repaired[0].contains("repaired: eth0 10.0.0.5"),
        "{}",
        repaired[0]
    );
    assert!(events(&s, "NetworkRepairFailed").is_empty());
    assert_eq!(
        s.status("web")["network"]["ipv4"],
        json!({"eth0": ["10.0.0.5/24"]}),
        "what it had stays recorded"
    );
}

#[tokio::test(start_paused = true)]
async fn a_repair_that_brings_nothing_back_warns_once_and_waits_for_an_address() {
    let s = setup();
    let seen = Arc::new(Mutex::new(eth0(&["10.0.0.5/24"])));
    networked(&s, &seen, &["fe80::1"]);
    round(&s).await;

    *seen.lock().unwrap() = eth0(&[]);
    round(&s).await;
    round(&s).await;
    round(&s).await;
    assert_eq!(s.fake.count("restart_nics"), 1, "one repair per loss");
    let failed = events(&s, "NetworkRepairFailed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].contains("eth0 no IPv4 address"), "{}", failed[0]);
    let network = &s.status("web")["network"];
    assert!(network["repairFailedAt"].is_string(), "{network}");
    assert_eq!(network["ipv4"], json!({"eth0": ["10.0.0.5/24"]}));

    // An address back (a person fixed it) clears the failure, and a later loss is repaired.
    *seen.lock().unwrap() = eth0(&["10.0.0.7/24"]);
    round(&s).await;
    assert_eq!(
        s.status("web")["network"],
        json!({"ipv4": {"eth0": ["10.0.0.7/24"]}})
    );
    *seen.lock().unwrap() = eth0(&[]);
    round(&s).await;
    assert_eq!(s.fake.count("restart_nics"), 2);
}

#[tokio::test(start_paused = true)]
async fn a_container_that_never_had_an_address_or_cannot_tell_is_left_alone() {
    let s = setup();
    let seen = Arc::new(Mutex::new(None));
    networked(&s, &seen, &[]);
    round(&s).await;
    *seen.lock().unwrap() = eth0(&[]);
    round(&s).await;
    assert_eq!(s.fake.count("restart_nics"), 0);
    assert!(s.status("web").get("network").is_none());
}
