use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::runtime::InstanceEdit;

fn instance(value: serde_json::Value) -> InstanceJson {
    serde_json::from_value(value).expect("instance JSON")
}

fn device(pairs: &[(&str, &str)]) -> Device {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn edit_of(devices: BTreeMap<String, Device>) -> InstanceEdit {
    InstanceEdit {
        config: BTreeMap::new(),
        devices,
        profiles: vec!["default".into()],
    }
}

#[test]
fn a_profile_nic_is_restarted_through_an_instance_copy_and_then_left_to_the_profile() {
    let profile_nic = json!({"type": "nic", "nictype": "p2p"});
    let restart = NicRestart::of(&instance(json!({
        "name": "web",
        "config": {"volatile.eth0.name": "eth0", "volatile.eth0.hwaddr": "00:16:3e:00:00:01"},
        "devices": {"workspace": {"type": "disk", "path": "/workspace", "source": "v"}},
        "expanded_devices": {
            "eth0": profile_nic,
            "root": {"type": "disk", "path": "/", "pool": "default"},
            "workspace": {"type": "disk", "path": "/workspace", "source": "v"},
        },
    })));
    assert_eq!(restart.interfaces, ["eth0"]);

    let own = BTreeMap::from([(
        "workspace".to_string(),
        device(&[("type", "disk"), ("path", "/workspace"), ("source", "v")]),
    )]);
    let mut edit = edit_of(own.clone());
    restart.nudge(&mut edit);
    assert_eq!(
        edit.devices["eth0"],
        device(&[("type", "nic"), ("nictype", "p2p"), ("boot.priority", "1")]),
        "the profile's configuration, one key no container reads changed"
    );
    assert_eq!(edit.devices["workspace"], own["workspace"]);
    // The MAC address LXD chose is volatile config: nothing here touches it.
    assert!(edit.config.is_empty());

    restart.restore(&mut edit);
    assert_eq!(edit.devices, own, "the instance is left as it was found");
}

#[test]
fn an_own_nic_is_changed_and_written_back_as_it_was() {
    let restart = NicRestart::of(&instance(json!({
        "name": "web",
        "config": {},
        "devices": {"net": {"type": "nic", "nictype": "routed", "name": "eth1", "boot.priority": "1"}},
        "expanded_devices": {"net": {"type": "nic", "nictype": "routed", "name": "eth1", "boot.priority": "1"}},
    })));
    assert_eq!(restart.interfaces, ["eth1"], "the device's own name wins");
    let original = device(&[
        ("type", "nic"),
        ("nictype", "routed"),
        ("name", "eth1"),
        ("boot.priority", "1"),
    ]);
    let mut edit = edit_of(BTreeMap::from([("net".to_string(), original.clone())]));
    restart.nudge(&mut edit);
    assert_eq!(
        edit.devices["net"]["boot.priority"], "2",
        "a value it did not have"
    );
    restart.restore(&mut edit);
    assert_eq!(edit.devices["net"], original);
}

#[test]
fn an_instance_without_a_nic_has_nothing_to_restart() {
    let restart = NicRestart::of(&instance(json!({
        "name": "web",
        "expanded_devices": {"root": {"type": "disk", "path": "/", "pool": "default"}},
    })));
    assert!(restart.interfaces.is_empty());
    let unnamed = NicRestart::of(&instance(json!({
        "name": "web",
        "expanded_devices": {"uplink": {"type": "nic", "nictype": "p2p"}},
    })));
    assert_eq!(
        unnamed.interfaces,
        ["uplink"],
        "without a recorded name, LXD names it after the device"
    );
}
