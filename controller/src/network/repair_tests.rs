use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::*;
use crate::runtime::{Instance, InstanceState, InstanceStatus, NetworkState};
use crate::testing::fake_runtime::FakeRuntime;

fn nic(name: &str) -> (String, BTreeMap<String, String>) {
    (
        name.to_string(),
        BTreeMap::from([
            ("type".to_string(), "nic".to_string()),
            ("nictype".to_string(), "p2p".to_string()),
        ]),
    )
}

fn interface(addresses: &[&str]) -> NetworkState {
    NetworkState {
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
        mac: "00:16:3e:00:00:01".to_string(),
        mtu: 1500,
        ..NetworkState::default()
    }
}

fn container(
    devices: &[(String, BTreeMap<String, String>)],
    network: &[(&str, NetworkState)],
) -> Instance {
    let mut instance = Instance::running("web", BTreeMap::new());
    instance.devices = devices.iter().cloned().collect();
    instance.state = Some(InstanceState {
        network: network
            .iter()
            .map(|(n, s)| (n.to_string(), s.clone()))
            .collect(),
        ..InstanceState::default()
    });
    instance
}

#[tokio::test]
async fn a_repair_restarts_the_nics_runs_the_networking_inside_and_reads_lxd_back() {
    let fake = FakeRuntime::new();
    fake.insert_instance(container(
        &[nic("eth0")],
        &[
            ("lo", interface(&["127.0.0.1"])),
            ("eth0", interface(&["10.0.0.5", "fe80::1"])),
        ],
    ));
    let ran: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let seen = ran.clone();
    fake.on_exec(move |_, request| {
        seen.lock().unwrap().push(request.command.clone());
        Some(Ok(crate::runtime::ExecOutput {
            exit_code: 0,
            stdout: Vec::new(),
            stderr: b"eth0: ifup said \x1b[31mno\n\n".to_vec(),
        }))
    });

    let repaired = repair(&fake, "web").await.expect("repaired");
    assert_eq!(fake.count("restart_nics"), 1);
    let commands = ran.lock().unwrap().clone();
    assert_eq!(commands.len(), 1);
    assert_eq!(commands[0][..2], ["sh", "-c"]);
    assert_eq!(
        commands[0][3..],
        ["berth-network", "eth0"],
        "the interfaces are arguments"
    );
    assert_eq!(
        repaired.interfaces,
        [RepairedInterface {
            name: "eth0".into(),
            mac: "00:16:3e:00:00:01".into(),
            mtu: 1500,
            addresses: vec!["10.0.0.5".into(), "fe80::1".into()],
        }],
        "loopback is not a NIC"
    );
    assert_eq!(repaired.ipv4(), ["10.0.0.5"]);
    assert_eq!(repaired.summary(), "eth0 10.0.0.5");
    assert_eq!(
        repaired.notes,
        ["eth0: ifup said  [31mno"],
        "untrusted text, cleaned"
    );
}

#[tokio::test]
async fn an_interface_that_did_not_come_back_has_no_address() {
    let fake = FakeRuntime::new();
    fake.insert_instance(container(
        &[nic("eth0")],
        &[("lo", interface(&["127.0.0.1"]))],
    ));
    let repaired = repair(&fake, "web").await.expect("repaired");
    assert!(repaired.ipv4().is_empty());
    assert_eq!(repaired.interfaces[0].mac, "");
    assert_eq!(repaired.summary(), "eth0 no IPv4 address");
}

#[tokio::test]
async fn no_nic_or_not_running_is_said_and_nothing_runs_inside() {
    let fake = FakeRuntime::new();
    fake.insert_instance(container(&[], &[("lo", interface(&["127.0.0.1"]))]));
    assert!(matches!(
        repair(&fake, "web").await,
        Err(RepairError::NoInterface)
    ));
    fake.set_status("web", InstanceStatus::Stopped);
    assert!(matches!(
        repair(&fake, "web").await,
        Err(RepairError::NotRunning)
    ));
    assert_eq!(fake.count("exec"), 0);
    assert_eq!(fake.count("restart_nics"), 1, "only while it ran");
}
