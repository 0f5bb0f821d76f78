//! `berth repair-network` and the scheduler's IPv4 check against real LXD, with a NIC that
//! carries nothing off the host: the test's own LXD project, whose `default` profile gives
//! every container an LXD `p2p` NIC (a veth pair whose host end has no address and is in no
//! bridge), and whose address is a loopback one (127.77.X.Y/32) set by the container's own
//! busybox ifupdown. berth runs in that LXD project, so every container and volume it makes is
//! there, and everything is deleted with it.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Berth, READY_DEADLINE};
use crate::support::lxd::{TestProject, lxc_in};

/// An LXD project of the test's own (`support::lxd::TestProject`) whose `default` profile has
/// a root disk and a p2p NIC. Dropped after the daemon.
struct NetworkedLxdProject {
    project: TestProject,
}

impl NetworkedLxdProject {
    fn create() -> NetworkedLxdProject {
        let project = TestProject::create("berth-net", true);
        let device = |args: &[&str]| {
            let mut all = vec!["profile", "device", "add", "default"];
            all.extend_from_slice(args);
            all.extend_from_slice(&["--project", &project.name]);
            lxc(&all).expect("add a device to the project's default profile");
        };
        device(&["root", "disk", "path=/", "pool=default"]);
        device(&["eth0", "nic", "nictype=p2p", "name=eth0"]);
        NetworkedLxdProject { project }
    }

    /// The container's eth0 as LXD's instance state reports it.
    fn eth0(&self, instance: &str) -> Value {
        let state = lxc(&[
            "query",
            &format!(
                "/1.0/instances/{instance}/state?project={}",
                self.project.name
            ),
        ])
        .expect("read the instance's state");
        let state: Value = serde_json::from_str(&state).expect("state JSON");
        state["network"]["eth0"].clone()
    }

    fn ipv4(&self, instance: &str) -> Vec<String> {
        self.eth0(instance)["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["family"] == "inet")
            .filter_map(|a| a["address"].as_str().map(str::to_string))
            .collect()
    }
}

fn lxc(args: &[&str]) -> Result<String, String> {
    lxc_in(None, args)
}

/// Waits for `check` on the project, failing with the daemon's log after the deadline.
fn wait(berth: &Berth, what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + READY_DEADLINE;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {READY_DEADLINE:?}\n{}",
            berth.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_lost_address_is_repaired_once_by_the_scheduler_and_on_request() {
    let lxd = NetworkedLxdProject::create();
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        format!(
            "lxd: {{project: {}}}\nscheduler: {{interval: 1s}}\ntrash: {{retention: 0s}}\n",
            lxd.project.name
        ),
    )
    .unwrap();
    let mut berth = Berth::start_with(&[], &["--config", config.path().to_str().unwrap()]);
    let name = crate::harness::unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    berth.wait_ready(&name);

    // The container's own networking: busybox ifupdown with a static loopback address.
    let address = format!(
        "127.77.{}.{}",
        rand::random::<u8>(),
        rand::random::<u8>().max(1)
    );
    let setup = format!(
        "mkdir -p /etc/network/if-pre-up.d /etc/network/if-up.d /etc/network/if-down.d \
           /etc/network/if-post-down.d && \
         {{ [ -e /var/run ] || ln -s /run /var/run; }} && \
         printf 'auto eth0\\niface eth0 inet static\\n  address {address}\\n  netmask 255.255.255.255\\n' \
           > /etc/network/interfaces && ifup eth0"
    );
    berth.cli_ok(&["exec", &name, "--", "sh", "-c", &setup]);
    assert_eq!(lxd.ipv4(&name), std::slice::from_ref(&address));
    let mac = lxd.eth0(&name)["hwaddr"].as_str().unwrap().to_string();
    let with_prefix = format!("{address}/32");
    wait(&berth, "the address recorded", || {
        berth.get_project(&name).unwrap()["status"]["network"]
            == json!({"ipv4": {"eth0": [with_prefix]}})
    });

    // describe and the console's figures show each interface's address, MAC and MTU.
    let described = berth.cli_ok(&["describe", "project", &name]);
    let line = format!("eth0 {address}");
    assert!(
        described.contains(&line) && described.contains(&format!("(mac {mac}, mtu 1500)")),
        "{described}"
    );
    let figures = berth
        .client()
        .get(&format!("{}/{name}/runtime", crate::harness::PROJECTS))
        .json();
    assert_eq!(figures["network"]["eth0"]["mac"], mac.as_str());
    assert_eq!(figures["network"]["eth0"]["mtu"], 1500);

    // Lost: the scheduler's next round repairs it, once, keeping the MAC address.
    berth.cli_ok(&["exec", &name, "--", "ip", "addr", "flush", "dev", "eth0"]);
    wait(&berth, "NetworkRepaired", || {
        !berth.events_of(&name, "NetworkRepaired").is_empty()
    });
    assert_eq!(
        lxd.ipv4(&name),
        std::slice::from_ref(&address),
        "back, as LXD reads it"
    );
    assert_eq!(
        lxd.eth0(&name)["hwaddr"],
        mac.as_str(),
        "the same MAC address"
    );

    // Lost where nothing can bring it back: one repair, one Warning, then quiet.
    let nothing_restores = "mv /etc/network/interfaces /etc/network/interfaces.off && \
                            ip addr flush dev eth0";
    berth.cli_ok(&["exec", &name, "--", "sh", "-c", nothing_restores]);
    wait(&berth, "NetworkRepairFailed", || {
        !berth.events_of(&name, "NetworkRepairFailed").is_empty()
    });
    let project = berth.get_project(&name).unwrap();
    assert!(
        project["status"]["network"]["repairFailedAt"].is_string(),
        "{}",
        project["status"]
    );
    berth.wait_passes("network", 3);
    let failed = berth.events_of(&name, "NetworkRepairFailed");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["type"], "Warning");
    assert_eq!(failed[0]["count"], 1, "no repair every round: {failed:?}");
    assert_eq!(berth.events_of(&name, "NetworkRepaired")[0]["count"], 1);
    assert!(lxd.ipv4(&name).is_empty());

    // On request: the configuration back in place, `berth repair-network` restores it.
    berth.cli_ok(&[
        "exec",
        &name,
        "--",
        "mv",
        "/etc/network/interfaces.off",
        "/etc/network/interfaces",
    ]);
    let said = berth.cli_ok(&["repair-network", &name]);
    assert!(
        said.contains(&format!("project/{name} network repaired")),
        "{said}"
    );
    let row = said
        .lines()
        .find(|l| l.starts_with("eth0 "))
        .unwrap_or_else(|| panic!("no eth0 row: {said}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[..3], ["eth0", mac.as_str(), "1500"], "{said}");
    assert!(cells.contains(&address.as_str()), "{said}");
    assert_eq!(
        lxd.ipv4(&name),
        std::slice::from_ref(&address),
        "back, as LXD reads it"
    );
    assert_eq!(lxd.eth0(&name)["hwaddr"], mac.as_str());
    let requested = berth.events_of(&name, "NetworkRepaired");
    assert!(
        requested.iter().any(|e| e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("at the request of")),
        "{requested:?}"
    );
    wait(
        &berth,
        "the failure cleared once the address returned",
        || {
            berth.get_project(&name).unwrap()["status"]["network"]
                == json!({"ipv4": {"eth0": [with_prefix]}})
        },
    );

    berth.delete_project(&name);
    drop(berth);
    drop(lxd);
}
