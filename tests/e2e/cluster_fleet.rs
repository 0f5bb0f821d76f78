//! A fleet on a real two-member LXD cluster (`scripts/lxd-cluster`), driven through the real
//! `berth` binary configured against it over pinned HTTPS: projects spread over both members
//! with their volumes on their container's member; a member whose LXD stops leaves its projects
//! `MemberOffline`, never recreated elsewhere, and they recover by themselves when it returns;
//! an evacuated member's projects are Stopped (`MemberEvacuated`) by their volumes and come back
//! after a restore. Nothing is lost, nothing duplicated. The first member holds the cluster
//! database, so only the second one is ever stopped or evacuated.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::support::cluster::{Cluster, ClusterHold, cluster, run_script};
use crate::support::daemon::Daemon;
use serde_json::Value;

const PROJECTS: &str = "/apis/berth.dev/v1alpha1/projects";
/// Generous: a busy 2-core machine, two LXD daemons and a member coming back through a
/// heartbeat round.
const DEADLINE: Duration = Duration::from_secs(300);
/// The member that is stopped and evacuated; the first holds the cluster database.
const SECOND: &str = "m2";

/// `lxc ARGS` against the cluster (through the first member's socket); stdout, or the failure.
fn lxc(cluster: &Cluster, args: &[&str]) -> Result<String, String> {
    crate::support::lxd::lxc_in(Some(&cluster.get("BERTH_LXD_CLUSTER_M1_DIR")), args)
}

/// `lxc query PATH`, parsed.
fn query(cluster: &Cluster, path: &str) -> Value {
    let text = lxc(cluster, &["query", path]).unwrap_or_else(|e| panic!("lxc query {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("lxc query {path}: {e}: {text}"))
}

fn ready(project: &Value) -> (String, String) {
    project["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .unwrap_or_default()
}

/// One berth daemon on the cluster and the projects it was given; on drop (also when a test
/// fails) the projects are deleted through berth, and whatever is left of them in LXD by hand.
struct Fleet {
    cluster: &'static Cluster,
    daemon: Daemon,
    names: Vec<String>,
    uids: BTreeMap<String, String>,
}

impl Fleet {
    fn start(cluster: &'static Cluster) -> Fleet {
        let config = format!(
            "lxd:\n  endpoint: {}\n  clientCert: {}\n  clientKey: {}\n  serverFingerprint: {}\n\
             defaults:\n  image: berth-tiny\n\
             scheduler:\n  interval: 10s\n\
             trash:\n  retention: 0s\n\
             listen:\n  preview: \"\"\n",
            cluster.get("BERTH_LXD_CLUSTER_ENDPOINT"),
            cluster.get("BERTH_LXD_CLUSTER_CLIENT_CERT"),
            cluster.get("BERTH_LXD_CLUSTER_CLIENT_KEY"),
            cluster.get("BERTH_LXD_CLUSTER_FINGERPRINT"),
        );
        Fleet {
            cluster,
            daemon: Daemon::running().config(&config).start(),
            names: Vec::new(),
            uids: BTreeMap::new(),
        }
    }

    /// Applies `count` tiny projects in one `berth apply` and waits until every one is Ready.
    fn apply(&mut self, count: usize) {
        let prefix = format!("berth-t-cf-{:06x}", rand::random::<u32>() & 0xff_ffff);
        let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
        let manifest: String = names
            .iter()
            .map(|name| {
                format!(
                    "---\napiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: {name}\nspec:\n  image: berth-tiny\n"
                )
            })
            .collect();
        let file = self.daemon.dir.path().join(format!("{prefix}.yaml"));
        std::fs::write(&file, manifest).unwrap();
        self.names.extend(names);
        self.daemon.cli_ok(&["apply", "-f", file.to_str().unwrap()]);
        for name in self.names.clone() {
            let project = self
                .daemon
                .wait_for_within(&name, "Ready", DEADLINE, |p| ready(p).0 == "True");
            let uid = project["metadata"]["uid"].as_str().unwrap().to_string();
            self.uids.insert(name, uid);
        }
    }

    fn get(&self, name: &str) -> Value {
        self.daemon
            .get_project(name)
            .unwrap_or_else(|| panic!("{name} is gone"))
    }

    /// Where berth placed each project (`status.location`).
    fn placement(&self) -> BTreeMap<String, String> {
        self.names
            .iter()
            .map(|name| {
                let member = self.get(name)["status"]["location"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name} has no status.location"))
                    .to_string();
                (name.clone(), member)
            })
            .collect()
    }

    /// This fleet's containers as the cluster lists them: name → (member, volatile.uuid,
    /// status). The uuid is new for every container LXD creates, so an unchanged one means the
    /// container was never replaced.
    fn containers(&self) -> BTreeMap<String, (String, String, String)> {
        let listed = query(self.cluster, "/1.0/instances?recursion=1");
        let mut found = BTreeMap::new();
        for instance in listed.as_array().unwrap() {
            let name = instance["name"].as_str().unwrap_or_default();
            if !self.names.iter().any(|n| n == name) {
                continue;
            }
            let previous = found.insert(
                name.to_string(),
                (
                    instance["location"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    instance["config"]["volatile.uuid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    instance["status"].as_str().unwrap_or_default().to_string(),
                ),
            );
            assert!(previous.is_none(), "two containers named {name}");
        }
        found
    }

    /// The custom volumes of this fleet's projects: (volume name, member).
    fn volumes(&self) -> Vec<(String, String)> {
        let listed = query(
            self.cluster,
            "/1.0/storage-pools/default/volumes/custom?recursion=1",
        );
        listed
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["name"].as_str().unwrap_or_default().to_string(),
                    v["location"].as_str().unwrap_or_default().to_string(),
                )
            })
            .filter(|(name, _)| self.uids.values().any(|uid| name.contains(uid.as_str())))
            .collect()
    }

    /// Every project has exactly one container and one volume, both on its recorded member;
    /// returns the containers' uuids.
    fn assert_one_of_everything(&self) -> BTreeMap<String, String> {
        let placement = self.placement();
        let containers = self.containers();
        assert_eq!(
            containers.len(),
            self.names.len(),
            "one container per project: {containers:?}"
        );
        let volumes = self.volumes();
        assert_eq!(
            volumes.len(),
            self.names.len(),
            "one volume per project: {volumes:?}"
        );
        for name in &self.names {
            let member = &placement[name];
            assert_eq!(
                &containers[name].0, member,
                "{name}: container on its member"
            );
            let uid = &self.uids[name];
            let on: Vec<&String> = volumes
                .iter()
                .filter(|(v, _)| v.contains(uid.as_str()))
                .map(|(_, m)| m)
                .collect();
            assert_eq!(on, [member], "{name}: its volume on its container's member");
        }
        containers
            .into_iter()
            .map(|(name, (_, uuid, _))| (name, uuid))
            .collect()
    }

    fn exec(&self, name: &str, script: &str) -> String {
        lxc(self.cluster, &["exec", name, "--", "sh", "-c", script])
            .unwrap_or_else(|e| panic!("exec in {name}: {e}"))
    }

    /// Writes a file only this workspace holds.
    fn write_note(&self, name: &str) {
        self.exec(name, &format!("echo kept-{name} > /workspace/note && sync"));
    }

    fn assert_note(&self, name: &str) {
        assert_eq!(
            self.exec(name, "cat /workspace/note"),
            format!("kept-{name}\n"),
            "{name}: the workspace file survived"
        );
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let client = self.daemon.client();
        for name in &self.names {
            let _ = client.try_request(
                "DELETE",
                &format!("{PROJECTS}/{name}?force=true"),
                None,
                &[],
            );
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while std::time::Instant::now() < deadline
            && self.names.iter().any(|n| {
                client
                    .try_request("GET", &format!("{PROJECTS}/{n}"), None, &[])
                    .is_ok_and(|r| r.status == 200)
            })
        {
            std::thread::sleep(Duration::from_millis(200));
        }
        self.daemon.kill();
        // Whatever berth could not delete (a failed test), by hand.
        for name in self.containers().keys() {
            let _ = lxc(self.cluster, &["delete", "--force", name]);
        }
        for (volume, member) in self.volumes() {
            let _ = lxc(
                self.cluster,
                &[
                    "storage", "volume", "delete", "default", &volume, "--target", &member,
                ],
            );
        }
    }
}

/// Brings the second member back however a test ends: started again, or restored.
struct MemberBack(&'static str);

impl Drop for MemberBack {
    fn drop(&mut self) {
        match self.0 {
            "restore" => {
                let _ = lxc(cluster(), &["cluster", "restore", SECOND, "--force"]);
            }
            _ => {
                run_script(&["up"]);
            }
        }
    }
}

/// Per member, the names berth placed there.
fn by_member(placement: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut members: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, member) in placement {
        members
            .entry(member.clone())
            .or_default()
            .insert(name.clone());
    }
    members
}

#[test]
fn a_fleet_spreads_over_the_members_and_rides_out_a_member_outage() {
    let _alone = ClusterHold::exclusive();
    let cluster = cluster();
    let mut fleet = Fleet::start(cluster);
    fleet.apply(10);

    // Spread: both members hold some, each project's container and volume on its member.
    let placement = fleet.placement();
    let members = by_member(&placement);
    assert_eq!(
        members.keys().cloned().collect::<Vec<_>>(),
        cluster.members(),
        "every member holds projects: {members:?}"
    );
    let uuids = fleet.assert_one_of_everything();

    // The CLI shows the member: a MEMBER column in `get -o wide`, a line in `describe`.
    let wide = fleet.daemon.cli_ok(&["get", "projects", "-o", "wide"]);
    let header = wide.lines().next().unwrap();
    let column = header.find("MEMBER").expect("a MEMBER column");
    for name in &fleet.names {
        let row = wide
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("{name} in {wide}"));
        assert_eq!(
            row.get(column..).and_then(|r| r.split_whitespace().next()),
            Some(placement[name].as_str()),
            "{header}\n{row}"
        );
    }
    let first = &fleet.names[0];
    let described = fleet.daemon.cli_ok(&["describe", "project", first]);
    let member_line = described
        .lines()
        .find(|l| l.trim_start().starts_with("Member:"))
        .unwrap_or_else(|| panic!("no Member line in\n{described}"));
    assert_eq!(
        member_line.split_whitespace().nth(1),
        Some(placement[first].as_str())
    );

    // Work in a workspace on each member.
    let on_second: Vec<String> = members[SECOND].iter().cloned().collect();
    let on_first: Vec<String> = placement
        .iter()
        .filter(|(_, m)| *m != SECOND)
        .map(|(n, _)| n.clone())
        .collect();
    fleet.write_note(&on_second[0]);
    fleet.write_note(&on_first[0]);

    // The second member's LXD stops: its projects wait as MemberOffline; the others stay Ready.
    let _back = MemberBack("up");
    run_script(&["kill-member", SECOND]);
    for name in &on_second {
        fleet
            .daemon
            .wait_for_within(name, "MemberOffline", DEADLINE, |p| {
                ready(p).1 == "MemberOffline" && p["status"]["location"] == SECOND
            });
    }
    for name in &on_first {
        let project = fleet.get(name);
        assert_eq!(ready(&project).0, "True", "{name} untouched: {project}");
    }
    let during = fleet.containers();
    assert_eq!(during.len(), 10, "nothing recreated elsewhere: {during:?}");
    for name in &on_second {
        assert_eq!(during[name].0, SECOND, "{name} stays listed on its member");
    }

    // It comes back: every project is Ready again by itself, the same containers, the same
    // volumes, the work still there.
    run_script(&["up"]);
    for name in &fleet.names {
        fleet
            .daemon
            .wait_for_within(name, "Ready again", DEADLINE, |p| ready(p).0 == "True");
    }
    assert_eq!(
        fleet.assert_one_of_everything(),
        uuids,
        "no container replaced"
    );
    assert_eq!(fleet.placement(), placement, "no project moved");
    fleet.assert_note(&on_second[0]);
    fleet.assert_note(&on_first[0]);

    // A restarted berth keeps every project where it is.
    fleet.daemon.terminate();
    fleet.daemon.restart();
    for name in &fleet.names {
        fleet
            .daemon
            .wait_for_within(name, "Ready after a restart", DEADLINE, |p| {
                ready(p).0 == "True"
            });
    }
    assert_eq!(fleet.placement(), placement);
    assert_eq!(fleet.assert_one_of_everything(), uuids);
}

#[test]
fn an_evacuated_member_stops_its_projects_until_it_is_restored() {
    let _alone = ClusterHold::exclusive();
    let cluster = cluster();
    let mut fleet = Fleet::start(cluster);
    fleet.apply(4);
    let placement = fleet.placement();
    let members = by_member(&placement);
    let on_second: Vec<String> = members
        .get(SECOND)
        .unwrap_or_else(|| panic!("nothing placed on {SECOND}: {placement:?}"))
        .iter()
        .cloned()
        .collect();
    let uuids = fleet.assert_one_of_everything();
    for name in &fleet.names {
        let config = query(cluster, &format!("/1.0/instances/{name}"))["config"].clone();
        assert_eq!(config["cluster.evacuate"], "stop", "{name}: {config}");
    }
    fleet.write_note(&on_second[0]);

    let _back = MemberBack("restore");
    lxc(cluster, &["cluster", "evacuate", SECOND, "--force"]).expect("evacuate");
    for name in &on_second {
        fleet
            .daemon
            .wait_for_within(name, "Stopped by the evacuation", DEADLINE, |p| {
                p["status"]["phase"] == "Stopped" && ready(p).1 == "MemberEvacuated"
            });
    }
    let during = fleet.containers();
    assert_eq!(during.len(), fleet.names.len(), "{during:?}");
    for (name, member) in &placement {
        let (location, _, status) = &during[name];
        assert_eq!(location, member, "{name} not moved");
        if member == SECOND {
            assert_eq!(status, "Stopped", "{name}");
        } else {
            assert_eq!(status, "Running", "{name}");
            assert_eq!(ready(&fleet.get(name)).0, "True", "{name} untouched");
        }
    }
    lxc(cluster, &["cluster", "restore", SECOND, "--force"]).expect("restore");
    for name in &fleet.names {
        fleet
            .daemon
            .wait_for_within(name, "Ready after the restore", DEADLINE, |p| {
                ready(p).0 == "True"
            });
    }
    assert_eq!(
        fleet.assert_one_of_everything(),
        uuids,
        "no container replaced"
    );
    assert_eq!(fleet.placement(), placement);
    fleet.assert_note(&on_second[0]);
}
