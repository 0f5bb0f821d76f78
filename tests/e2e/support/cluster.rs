//! The two-member LXD cluster `scripts/lxd-cluster` builds on loopback addresses: brought up
//! once per test binary, its coordinates read from the script's `env`, and a lock that lets the
//! tests which stop or evacuate a member run alone.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::OnceLock;

use berth::lxd::{Endpoint, HttpsEndpoint, LxdConfig};

use super::lxd::OP_TIMEOUT;

/// What `scripts/lxd-cluster env` prints.
pub struct Cluster {
    env: BTreeMap<String, String>,
}

impl Cluster {
    pub fn get(&self, key: &str) -> String {
        self.env
            .get(key)
            .cloned()
            .unwrap_or_else(|| panic!("scripts/lxd-cluster env did not print {key}"))
    }

    pub fn members(&self) -> Vec<String> {
        self.get("BERTH_LXD_CLUSTER_MEMBERS")
            .split(',')
            .map(str::to_string)
            .collect()
    }

    pub fn https(&self, endpoint_key: &str, fingerprint: &str) -> HttpsEndpoint {
        HttpsEndpoint {
            url: self.get(endpoint_key),
            client_cert: PathBuf::from(self.get("BERTH_LXD_CLUSTER_CLIENT_CERT")),
            client_key: PathBuf::from(self.get("BERTH_LXD_CLUSTER_CLIENT_KEY")),
            server_fingerprint: fingerprint.to_string(),
        }
    }

    pub fn config(&self, endpoint_key: &str) -> LxdConfig {
        let mut config = LxdConfig::new(Endpoint::Https(
            self.https(endpoint_key, &self.get("BERTH_LXD_CLUSTER_FINGERPRINT")),
        ));
        config.request_timeout = OP_TIMEOUT;
        config
    }
}

/// The script, `BERTH_LXD_CLUSTER_SCRIPT` or this checkout's.
fn script() -> String {
    std::env::var("BERTH_LXD_CLUSTER_SCRIPT").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/lxd-cluster").to_string()
    })
}

/// Runs `scripts/lxd-cluster ARGS`; fails the test with the script's own message when it fails.
pub fn run_script(args: &[&str]) -> String {
    let script = script();
    let out = std::process::Command::new("bash")
        .arg(&script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {script} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{script} {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Brings the cluster up once per test binary (quick when it already is) and reads its
/// coordinates; fails the test with the script's own message when it cannot.
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        run_script(&["up"]);
        let env = run_script(&["env"])
            .lines()
            .filter_map(|line| line.strip_prefix("export "))
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| {
                (
                    k.to_string(),
                    v.trim_matches('\'').trim_matches('"').to_string(),
                )
            })
            .collect();
        Cluster { env }
    })
}

/// A hold on the cluster, across test processes: shared by tests that only use it, exclusive
/// for a test that stops or evacuates a member (which would fail the others' calls).
pub struct ClusterHold(#[allow(dead_code)] File);

impl ClusterHold {
    fn file() -> File {
        let path = std::env::temp_dir().join("berth-lxd-cluster-tests.lock");
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
    }

    pub fn shared() -> ClusterHold {
        let file = Self::file();
        file.lock_shared().expect("a shared lock on the cluster");
        ClusterHold(file)
    }

    pub fn exclusive() -> ClusterHold {
        let file = Self::file();
        file.lock().expect("an exclusive lock on the cluster");
        ClusterHold(file)
    }
}
