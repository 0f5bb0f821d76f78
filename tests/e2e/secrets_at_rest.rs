//! Secrets against a real daemon: sealed at rest (the value's bytes are nowhere under the data
//! directory), listed by key only, gone with their project, and a canary value that shows up in
//! no response but the explicit read of that one secret, and in no log line.

use crate::support::daemon::{Daemon, TcpClient, assert_nowhere_under};
use serde_json::{Value, json};

const P: &str = "/apis/berth.dev/v1alpha1";

fn project(name: &str) -> Value {
    json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
           "metadata": {"name": name}, "spec": {}})
}

/// A value no test run shares with another, so finding it means this run leaked it.
fn canary() -> String {
    format!("canary-{}", uuid::Uuid::new_v4().simple())
}

#[test]
fn values_are_sealed_at_rest_and_survive_a_restart() {
    let mut daemon = Daemon::start();
    let api = daemon.client();
    assert_eq!(
        api.post_json(&format!("{P}/projects"), &project("vault"))
            .status,
        201
    );
    let value = canary();
    let reply = api.request(
        "PUT",
        &format!("{P}/projects/vault/secrets/DB_PASSWORD"),
        Some("application/octet-stream"),
        value.as_bytes(),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(!reply.text().contains(&value));
    assert_eq!(reply.json()["revision"], "1");

    // While the daemon runs (database and its write-ahead log) and after it stopped.
    assert_nowhere_under(&daemon.data_dir, value.as_bytes());
    daemon.terminate();
    assert_nowhere_under(&daemon.data_dir, value.as_bytes());
    use std::os::unix::fs::PermissionsExt;
    let key = std::fs::metadata(daemon.data_dir.join("secrets.key")).unwrap();
    assert_eq!(key.permissions().mode() & 0o777, 0o600);
    assert_eq!(key.len(), 32);

    daemon.restart();
    let read = daemon
        .client()
        .get(&format!("{P}/projects/vault/secrets/DB_PASSWORD"));
    assert_eq!(read.status, 200, "{}", read.text());
    assert_eq!(read.json()["value"], value.as_str());
}

#[test]
fn keys_are_validated_and_secrets_go_with_their_project() {
    let daemon = Daemon::start();
    let api = daemon.client();
    assert_eq!(
        api.post_json(&format!("{P}/projects"), &project("gone"))
            .status,
        201
    );
    let table = [
        ("1STARTS_WITH_DIGIT", 422),
        ("HAS-DASH", 422),
        ("GOOD_KEY", 200),
        ("_UNDERSCORE", 200),
    ];
    for (key, code) in table {
        let reply = api.put_json(
            &format!("{P}/projects/gone/secrets/{key}"),
            &json!({"value": "x"}),
        );
        assert_eq!(reply.status, code, "{key}: {}", reply.text());
        if code == 422 {
            assert_eq!(reply.json()["details"]["causes"][0]["field"], "key");
        }
    }
    let missing = api.get(&format!("{P}/projects/gone/secrets/NOT_SET"));
    assert_eq!(missing.status, 404);
    let list = api.get(&format!("{P}/projects/gone/secrets")).json();
    assert_eq!(list["kind"], "SecretKeyList");
    let keys: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["GOOD_KEY", "_UNDERSCORE"]);
    assert!(list["items"][0]["updateTime"].is_string());
    assert!(list["items"][0].get("value").is_none());
    let no_project = api.put_json(
        &format!("{P}/projects/never/secrets/K"),
        &json!({"value": "x"}),
    );
    assert_eq!(no_project.status, 404);

    // Deleting the project deletes its secrets: a project of the same name starts empty.
    assert_eq!(api.delete(&format!("{P}/projects/gone")).status, 200);
    assert_eq!(
        api.post_json(&format!("{P}/projects"), &project("gone"))
            .status,
        201
    );
    let list = api.get(&format!("{P}/projects/gone/secrets")).json();
    assert_eq!(list["items"], json!([]), "{list}");
    assert_eq!(list["metadata"]["revision"], "0");
}

#[test]
fn a_canary_value_appears_only_in_the_read_of_its_secret() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let api = daemon.client();
    let token = daemon.add_user("canary-member", false);
    let tcp = TcpClient::new(&daemon.tcp_addr(), Some(&token), None);
    let created = tcp.json("POST", &format!("{P}/projects"), &project("canary"));
    assert_eq!(created.status, 201, "{}", created.text());

    let value = canary();
    let set = tcp.json(
        "PUT",
        &format!("{P}/projects/canary/secrets/CANARY_TOKEN"),
        &json!({"value": value}),
    );
    assert_eq!(set.status, 200, "{}", set.text());
    let secret = format!("{P}/projects/canary/secrets/CANARY_TOKEN");
    let read = tcp.get(&secret);
    assert_eq!(read.json()["value"], value.as_str());

    // Every other way to look at the project and the daemon, over both listeners.
    let looks = [
        format!("{P}/projects"),
        format!("{P}/projects/canary"),
        format!("{P}/projects/canary/status"),
        format!("{P}/projects/canary/events"),
        format!("{P}/projects/canary/secrets"),
        format!("{P}/projects/canary/members"),
        format!("{P}/events"),
        format!("{P}/users"),
        "/readyz".to_string(),
        "/healthz".to_string(),
        "/metrics".to_string(),
        "/version".to_string(),
    ];
    for path in &looks {
        for reply in [api.get(path), tcp.get(path)] {
            assert!(
                !reply.text().contains(&value),
                "{path} ({}) shows the secret value",
                reply.status
            );
        }
    }
    // Errors about the secret name it, never its value.
    let bad = tcp.json("PUT", &secret, &json!({"value": 7}));
    assert_eq!(bad.status, 422);
    let deleted = tcp.request("DELETE", &secret, None, b"");
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    assert!(!deleted.text().contains(&value));
    assert_eq!(tcp.get(&secret).status, 404);

    // Changes leave a trace on the project: the key and who, never the value.
    let events = tcp.get(&format!("{P}/projects/canary/events")).json();
    let reasons: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["SecretSet", "SecretDeleted"], "{events}");
    assert!(
        events
            .to_string()
            .contains("CANARY_TOKEN set by canary-member")
    );
    assert!(!events.to_string().contains(&value));

    let log = daemon.log_text();
    assert!(
        log.contains("CANARY_TOKEN"),
        "writes are logged by path:\n{log}"
    );
    assert!(
        !log.contains(&value),
        "the daemon log holds the value:\n{log}"
    );
    assert_nowhere_under(&daemon.data_dir, value.as_bytes());
}
