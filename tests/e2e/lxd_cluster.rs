//! The LXD client against a real two-member LXD cluster on loopback addresses over HTTPS:
//! pinned server certificate, client certificate trust, and instances and volumes placed on
//! each member with `target`. The cluster is brought up by `scripts/lxd-cluster up`.

use std::sync::OnceLock;
use std::time::Duration;

use crate::support::cluster::{Cluster, ClusterHold};
use crate::support::lxd::{Cleanup, OP_TIMEOUT, POOL, TINY, create, request, unique_name};
use berth::lxd::{Endpoint, LxdClient, LxdConfig};
use berth::runtime::{CreateVolume, EventKind, ExecRequest, Runtime, RuntimeError, StopOptions};
use futures::StreamExt;

/// The cluster, used alongside the other tests that only use it (never while a test stops or
/// evacuates a member).
fn cluster() -> &'static Cluster {
    static HOLD: OnceLock<ClusterHold> = OnceLock::new();
    HOLD.get_or_init(ClusterHold::shared);
    crate::support::cluster::cluster()
}

async fn connect(endpoint_key: &str) -> LxdClient {
    let cluster = tokio::task::spawn_blocking(cluster).await.unwrap();
    LxdClient::connect(cluster.config(endpoint_key))
        .await
        .expect("connect to the cluster over HTTPS")
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_is_reached_over_pinned_https() {
    let lxd = connect("BERTH_LXD_CLUSTER_ENDPOINT").await;
    assert!(lxd.is_trusted(), "the client certificate should be trusted");
    let info = lxd.server_info().await.unwrap();
    assert!(info.clustered);
    let mut names: Vec<String> = info.members.iter().map(|m| m.name.clone()).collect();
    names.sort();
    assert_eq!(names, cluster().members());
    assert!(
        info.members.iter().all(|m| m.is_online()),
        "{:?}",
        info.members
    );

    // A certificate that does not match the pin is refused before any request is sent.
    let wrong = cluster().https("BERTH_LXD_CLUSTER_ENDPOINT", &"0".repeat(64));
    match LxdClient::connect(LxdConfig::new(Endpoint::Https(wrong))).await {
        Err(RuntimeError::Transport { message, .. }) => {
            assert!(message.contains("fingerprint"), "{message}")
        }
        other => panic!("wrong pin: {other:?}"),
    }
    // And no https client exists without a pin at all.
    let unpinned = Endpoint::parse(
        &cluster().get("BERTH_LXD_CLUSTER_ENDPOINT"),
        Some(cluster().get("BERTH_LXD_CLUSTER_CLIENT_CERT").into()),
        Some(cluster().get("BERTH_LXD_CLUSTER_CLIENT_KEY").into()),
        None,
    );
    assert!(matches!(unpinned, Err(RuntimeError::Config(_))));
}

#[tokio::test(flavor = "multi_thread")]
async fn instances_and_volumes_are_placed_on_each_member() {
    let lxd = connect("BERTH_LXD_CLUSTER_ENDPOINT").await;
    let m2_view = connect("BERTH_LXD_CLUSTER_ENDPOINT_M2").await;
    let mut cleanup = Cleanup::on(cluster().config("BERTH_LXD_CLUSTER_ENDPOINT"));
    for member in cluster().members() {
        let volume = format!("{}-workspace", unique_name());
        let (first, second) = (unique_name(), unique_name());
        cleanup.instance(&first);
        cleanup.instance(&second);
        cleanup.volume_on(POOL, &volume, &member);

        let created = lxd
            .create_volume(&CreateVolume {
                pool: POOL.into(),
                name: volume.clone(),
                size: None,
                config: [("user.berth.uid".to_string(), volume.clone())].into(),
                target: Some(member.clone()),
            })
            .await
            .unwrap();
        assert_eq!(created.location, member);

        let placed = |name: &str| {
            let mut req = request(name, TINY);
            req.target = Some(member.clone());
            req.devices.insert(
                "workspace".into(),
                [
                    ("type", "disk"),
                    ("pool", POOL),
                    ("source", volume.as_str()),
                    ("path", "/workspace"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            );
            req
        };
        create(&lxd, &placed(&first)).await;
        lxd.start_instance(&first, OP_TIMEOUT).await.unwrap();
        let instance = lxd.get_instance(&first).await.unwrap().unwrap();
        assert_eq!(instance.location, member);
        // Every member answers for every instance.
        let seen_from_m2 = m2_view.get_instance(&first).await.unwrap().unwrap();
        assert_eq!(seen_from_m2.location, member);

        let write = ExecRequest::new(
            ["sh", "-c", "echo kept > /workspace/note"],
            Duration::from_secs(60),
        );
        assert!(lxd.exec(&first, &write).await.unwrap().success());
        lxd.stop_instance(
            &first,
            StopOptions::clean_then_force(Duration::from_secs(30)),
        )
        .await
        .unwrap();
        lxd.delete_instance(&first, OP_TIMEOUT).await.unwrap();

        create(&lxd, &placed(&second)).await;
        lxd.start_instance(&second, OP_TIMEOUT).await.unwrap();
        let read = ExecRequest::new(["cat", "/workspace/note"], Duration::from_secs(60));
        assert_eq!(
            lxd.exec(&second, &read).await.unwrap().stdout_str(),
            "kept\n"
        );
        lxd.stop_instance(
            &second,
            StopOptions::clean_then_force(Duration::from_secs(30)),
        )
        .await
        .unwrap();
        lxd.delete_instance(&second, OP_TIMEOUT).await.unwrap();
        lxd.delete_volume(POOL, &volume, Some(&member))
            .await
            .unwrap();
        assert!(
            lxd.get_volume(POOL, &volume, Some(&member))
                .await
                .unwrap()
                .is_none()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn events_arrive_over_tls() {
    let lxd = connect("BERTH_LXD_CLUSTER_ENDPOINT").await;
    let name = unique_name();
    let mut cleanup = Cleanup::on(cluster().config("BERTH_LXD_CLUSTER_ENDPOINT"));
    cleanup.instance(&name);
    let mut events = lxd.events().await.unwrap();
    let mut req = request(&name, TINY);
    req.target = cluster().members().last().cloned();
    create(&lxd, &req).await;
    lxd.start_instance(&name, OP_TIMEOUT).await.unwrap();
    tokio::time::timeout(OP_TIMEOUT, async {
        while let Some(event) = events.next().await {
            let event = event.unwrap();
            if event.kind == EventKind::Lifecycle
                && event.action == "instance-started"
                && event.instance.as_deref() == Some(name.as_str())
            {
                return;
            }
        }
        panic!("event stream ended");
    })
    .await
    .expect("instance-started event over TLS");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_client_certificate_is_trusted_with_the_password() {
    let cluster = tokio::task::spawn_blocking(cluster).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("client.crt"), dir.path().join("client.key"));
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=berth-test"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("run openssl");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let fingerprint = berth::lxd::pem_file_fingerprint(&cert).unwrap();
    // Whatever happens below, the server forgets this certificate again.
    struct Untrust(String, String);
    impl Drop for Untrust {
        fn drop(&mut self) {
            let _ = std::process::Command::new("lxc")
                .env("LXD_DIR", &self.1)
                .args(["config", "trust", "remove", &self.0])
                .output();
        }
    }
    let _untrust = Untrust(fingerprint, cluster.get("BERTH_LXD_CLUSTER_M1_DIR"));

    let mut endpoint = cluster.https(
        "BERTH_LXD_CLUSTER_ENDPOINT",
        &cluster.get("BERTH_LXD_CLUSTER_FINGERPRINT"),
    );
    endpoint.client_cert = cert;
    endpoint.client_key = key;
    let lxd = LxdClient::connect(LxdConfig::new(Endpoint::Https(endpoint)))
        .await
        .unwrap();
    assert!(!lxd.is_trusted());
    match lxd.list_instances(None, false).await {
        Err(RuntimeError::Rejected { status: 403, .. }) => {}
        other => panic!("untrusted list: {other:?}"),
    }
    match lxd
        .trust_with_password("berth-test", "wrong-password")
        .await
    {
        Err(RuntimeError::Rejected { status: 403, .. }) => {}
        other => panic!("wrong password: {other:?}"),
    }
    lxd.trust_with_password(
        "berth-test",
        &cluster.get("BERTH_LXD_CLUSTER_TRUST_PASSWORD"),
    )
    .await
    .unwrap();
    assert!(lxd.is_trusted());
    lxd.list_instances(None, false).await.unwrap();
}
