//! The HTTP API of a real `berth serve --paused`, over its unix socket.

use crate::harness::project;
use crate::support::daemon::Daemon;
use serde_json::{Value, json};

const PROJECTS: &str = "/apis/berth.dev/v1alpha1/projects";
const APPLY: &str = "/apis/berth.dev/v1alpha1/apply";

fn rv(object: &Value) -> String {
    object["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .to_string()
}

fn causes(reply: &Value) -> Vec<String> {
    reply["details"]["causes"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| c["field"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn create_get_replace_delete_with_conflicts() {
    let daemon = Daemon::start();
    let api = daemon.client();

    let created = api.post_json(PROJECTS, &project("alpha", json!({"displayName": "Alpha"})));
    assert_eq!(created.status, 201, "{}", created.text());
    let created = created.json();
    assert_eq!(created["metadata"]["generation"], 1);
    assert_eq!(created["spec"]["displayName"], "Alpha");

    let again = api.post_json(PROJECTS, &project("alpha", json!({})));
    assert_eq!(again.status, 409);
    assert_eq!(again.json()["reason"], "AlreadyExists");
    assert_eq!(again.json()["kind"], "Status");

    let got = api.get(&format!("{PROJECTS}/alpha")).json();
    assert_eq!(got, created);

    // Replace with the current resourceVersion: generation moves.
    let mut next = project("alpha", json!({"displayName": "Alpha", "state": "Stopped"}));
    next["metadata"]["resourceVersion"] = json!(rv(&created));
    let replaced = api.put_json(&format!("{PROJECTS}/alpha"), &next);
    assert_eq!(replaced.status, 200, "{}", replaced.text());
    let replaced = replaced.json();
    assert_eq!(replaced["metadata"]["generation"], 2);

    // The same write again names a stale resourceVersion now.
    let stale = api.put_json(&format!("{PROJECTS}/alpha"), &next);
    assert_eq!(stale.status, 409);
    assert_eq!(stale.json()["reason"], "Conflict");

    // A write that changes nothing keeps the resourceVersion.
    next["metadata"]["resourceVersion"] = json!(rv(&replaced));
    let same = api.put_json(&format!("{PROJECTS}/alpha"), &next).json();
    assert_eq!(rv(&same), rv(&replaced));

    // A name in the body that differs from the URL is refused.
    let wrong = api.put_json(&format!("{PROJECTS}/other"), &next);
    assert_eq!(wrong.status, 400);

    let deleted = api.delete(&format!("{PROJECTS}/alpha"));
    assert_eq!(deleted.status, 200);
    let gone = api.get(&format!("{PROJECTS}/alpha"));
    assert_eq!(gone.status, 404);
    assert_eq!(gone.json()["reason"], "NotFound");
    assert_eq!(gone.json()["details"]["name"], "alpha");
    assert_eq!(api.delete(&format!("{PROJECTS}/alpha")).status, 404);
}

#[test]
fn list_filters_by_label_selector() {
    let daemon = Daemon::start();
    let api = daemon.client();
    for (name, team) in [("a", Some("pay")), ("b", Some("web")), ("c", None)] {
        let mut object = project(name, json!({}));
        if let Some(team) = team {
            object["metadata"]["labels"] = json!({"team": team});
        }
        assert_eq!(api.post_json(PROJECTS, &object).status, 201);
    }
    let names = |selector: &str| -> Vec<String> {
        let list = api
            .get(&format!("{PROJECTS}?labelSelector={selector}"))
            .json();
        assert_eq!(list["kind"], "ProjectList");
        assert_eq!(list["apiVersion"], "berth.dev/v1alpha1");
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(""), ["a", "b", "c"]);
    assert_eq!(names("team=pay"), ["a"]);
    assert_eq!(names("team!=pay"), ["b", "c"]);
    assert_eq!(names("team"), ["a", "b"]);
    assert_eq!(names("!team"), ["c"]);
    assert_eq!(
        api.get(&format!("{PROJECTS}?labelSelector=a%20b")).status,
        400
    );
    let empty = api.get("/apis/berth.dev/v1alpha1/gitsources").json();
    assert_eq!(empty["kind"], "GitSourceList");
    assert_eq!(empty["items"], json!([]));
}

#[test]
fn invalid_objects_get_422_naming_every_field() {
    let daemon = Daemon::start();
    let api = daemon.client();
    let bad = json!({
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "Project",
        "metadata": {"name": "Not_A_Name"},
        "spec": {},
        "extra": true,
    });
    let reply = api.post_json(PROJECTS, &bad);
    assert_eq!(reply.status, 422, "{}", reply.text());
    let status = reply.json();
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(status["code"], 422);
    let fields = causes(&status);
    assert!(fields.contains(&"metadata.name".to_string()), "{fields:?}");
    assert!(fields.contains(&"extra".to_string()), "{fields:?}");

    let yaml = api.request(
        "POST",
        PROJECTS,
        Some("application/yaml"),
        b"kind: [unclosed",
    );
    assert_eq!(yaml.status, 400);
    assert!(
        yaml.json()["message"].as_str().unwrap().contains("line"),
        "{}",
        yaml.text()
    );
}

#[test]
fn oversized_bodies_get_413_naming_what_and_the_limit() {
    let daemon = Daemon::start();
    let api = daemon.client();
    let big = project("big", json!({"brief": "x".repeat((3 << 20) + 16)}));
    let list = |items: Vec<Value>| json!({"apiVersion": "v1", "kind": "List", "items": items});
    let two_mib = |name: &str| project(name, json!({"brief": "y".repeat(2 << 20)}));
    // (case, method, path, body, status, details wanted, message start)
    let cases: Vec<(&str, &str, String, Value, u16, Value, &str)> = vec![
        (
            "one object over 3 MiB",
            "POST",
            PROJECTS.to_string(),
            big.clone(),
            413,
            json!({"kind": "Project", "limitBytes": 3 << 20}),
            "the request body exceeds the limit of 3 MiB",
        ),
        (
            "a replace names the object",
            "PUT",
            format!("{PROJECTS}/big"),
            big.clone(),
            413,
            json!({"kind": "Project", "name": "big", "limitBytes": 3 << 20}),
            "the request body exceeds",
        ),
        (
            "inside a batch, the object is still one object",
            "POST",
            APPLY.to_string(),
            list(vec![project("small", json!({})), big.clone()]),
            413,
            json!({"kind": "Project", "name": "big", "limitBytes": 3 << 20}),
            "items[1]: Project \"big\" is 3.0 MiB, over the limit of 3 MiB for one object",
        ),
        (
            "a batch over 64 MiB",
            "POST",
            APPLY.to_string(),
            list(vec![project(
                "huge",
                json!({"brief": "y".repeat(65 << 20)}),
            )]),
            413,
            json!({"kind": "List", "limitBytes": 64 << 20}),
            "the request body exceeds the limit of 64 MiB",
        ),
        (
            "objects under the limit fill a batch",
            "POST",
            APPLY.to_string(),
            list(vec![two_mib("two-a"), two_mib("two-b")]),
            200,
            Value::Null,
            "",
        ),
    ];
    for (case, method, path, body, status, details, message) in cases {
        let bytes = serde_json::to_vec(&body).unwrap();
        let reply = api.request(method, &path, Some("application/json"), &bytes);
        assert_eq!(
            reply.status,
            status,
            "{case}: {}",
            &reply.text()[..200.min(reply.text().len())]
        );
        if status != 413 {
            continue;
        }
        let reply = reply.json();
        assert_eq!(reply["reason"], "RequestEntityTooLarge", "{case}");
        assert_eq!(reply["details"], details, "{case}");
        assert!(
            reply["message"].as_str().unwrap().starts_with(message),
            "{case}: {}",
            reply["message"]
        );
    }
    for (name, present) in [
        ("big", false),
        ("small", false),
        ("huge", false),
        ("two-a", true),
    ] {
        assert_eq!(
            api.get(&format!("{PROJECTS}/{name}")).status == 200,
            present,
            "{name}"
        );
    }
}

#[test]
fn conflicts_name_the_object_in_their_details() {
    let daemon = Daemon::start();
    let api = daemon.client();
    let created = api
        .post_json(PROJECTS, &project("alpha", json!({"displayName": "Alpha"})))
        .json();
    api.post_json(PROJECTS, &project("beta", json!({"displayName": "Beta"})));
    let mut stale = project("alpha", json!({"brief": "x"}));
    stale["metadata"]["resourceVersion"] = json!("1");
    let touched = api.put_json(
        &format!("{PROJECTS}/alpha"),
        &project("alpha", json!({"displayName": "Alpha", "brief": "y"})),
    );
    assert_eq!(touched.status, 200);
    assert_ne!(rv(&touched.json()), rv(&created));
    // (case, method, path, body, reason, details wanted)
    let cases = [
        (
            "exists already",
            "POST",
            PROJECTS.to_string(),
            project("alpha", json!({})),
            "AlreadyExists",
            json!({"kind": "Project", "name": "alpha"}),
        ),
        (
            "stale resourceVersion",
            "PUT",
            format!("{PROJECTS}/alpha"),
            stale,
            "Conflict",
            json!({"kind": "Project", "name": "alpha"}),
        ),
        (
            "display name taken",
            "POST",
            PROJECTS.to_string(),
            project("gamma", json!({"displayName": " beta"})),
            "Conflict",
            json!({"kind": "Project", "name": "gamma"}),
        ),
        (
            "display name taken in a batch",
            "POST",
            APPLY.to_string(),
            json!({"kind": "List", "apiVersion": "v1", "items": [
                project("delta", json!({})), project("alpha", json!({"displayName": "BETA"}))]}),
            "Conflict",
            json!({"kind": "Project", "name": "alpha", "causes": [{"field": "items[1]",
                "message": "spec.displayName: \"BETA\" is already the display name of another project"}]}),
        ),
    ];
    for (case, method, path, body, reason, details) in cases {
        let bytes = serde_json::to_vec(&body).unwrap();
        let reply = api.request(method, &path, Some("application/json"), &bytes);
        assert_eq!(reply.status, 409, "{case}: {}", reply.text());
        let reply = reply.json();
        assert_eq!(reply["reason"], reason, "{case}");
        assert_eq!(reply["details"], details, "{case}");
    }
}

#[test]
fn a_batch_may_swap_display_names() {
    let daemon = Daemon::start();
    let api = daemon.client();
    let named = |a: &str, b: &str| {
        json!({"kind": "List", "apiVersion": "v1", "items": [
            project("one", json!({"displayName": a})), project("two", json!({"displayName": b}))]})
    };
    assert_eq!(api.post_json(APPLY, &named("First", "Second")).status, 200);
    let swapped = api.post_json(APPLY, &named("Second", "First"));
    assert_eq!(swapped.status, 200, "{}", swapped.text());
    assert_eq!(
        api.get(&format!("{PROJECTS}/one")).json()["spec"]["displayName"],
        "Second"
    );
    assert_eq!(
        api.get(&format!("{PROJECTS}/two")).json()["spec"]["displayName"],
        "First"
    );
    // Both taking one name is still a clash, and writes nothing.
    let clash = api.post_json(APPLY, &named("Same", "same"));
    assert_eq!(clash.status, 409, "{}", clash.text());
    assert_eq!(
        api.get(&format!("{PROJECTS}/one")).json()["spec"]["displayName"],
        "Second"
    );
}

#[test]
fn an_object_sent_to_another_kind_s_endpoint_is_a_bad_request_whatever_it_holds() {
    let daemon = Daemon::start();
    let api = daemon.client();
    let profile = |spec: Value| json!({"apiVersion": "berth.dev/v1alpha1", "kind": "AgentProfile", "metadata": {"name": "x"}, "spec": spec});
    let valid = profile(
        json!({"home": "/root/.x", "runner": {"command": ["x"]}, "install": {"check": "true"}}),
    );
    let invalid = profile(json!({"home": "relative"}));
    for (case, method, path, body) in [
        (
            "valid, created",
            "POST",
            PROJECTS.to_string(),
            valid.clone(),
        ),
        (
            "invalid, created",
            "POST",
            PROJECTS.to_string(),
            invalid.clone(),
        ),
        (
            "invalid, replaced",
            "PUT",
            format!("{PROJECTS}/x"),
            invalid.clone(),
        ),
        (
            "unknown kind",
            "POST",
            PROJECTS.to_string(),
            json!({"kind": "Widget", "metadata": {"name": "x"}}),
        ),
    ] {
        let bytes = serde_json::to_vec(&body).unwrap();
        let reply = api.request(method, &path, Some("application/json"), &bytes);
        assert_eq!(reply.status, 400, "{case}: {}", reply.text());
        let sent = body["kind"].as_str().unwrap();
        assert_eq!(
            reply.json()["message"],
            format!("kind {sent:?} was sent to the projects endpoint"),
            "{case}"
        );
    }
    let mismatch = api.put_json(
        &format!("{PROJECTS}/y"),
        &project("x", json!({"displayName": " "})),
    );
    assert_eq!(mismatch.status, 400, "{}", mismatch.text());
    assert_eq!(mismatch.json()["details"]["name"], "y");
}

#[test]
fn a_chunked_body_is_cut_off_at_the_limit() {
    use std::io::{Read, Write};
    let daemon = Daemon::start();
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    write!(
        stream,
        "POST {PROJECTS} HTTP/1.1\r\nHost: berth\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .unwrap();
    // No Content-Length: the limit must hold while reading, so stop once the server answers.
    let chunk = vec![b' '; 64 << 10];
    for _ in 0..((4 << 20) / chunk.len()) {
        let sent = write!(stream, "{:x}\r\n", chunk.len())
            .and_then(|_| stream.write_all(&chunk))
            .and_then(|_| stream.write_all(b"\r\n"));
        if sent.is_err() {
            break;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n");
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    assert!(
        reply.starts_with("HTTP/1.1 413"),
        "{}",
        &reply[..reply.len().min(300)]
    );
}

#[test]
fn dry_run_validates_and_writes_nothing() {
    let daemon = Daemon::start();
    let api = daemon.client();
    let would = api.post_json(
        &format!("{PROJECTS}?dryRun=All"),
        &project("dry", json!({})),
    );
    assert_eq!(would.status, 201, "{}", would.text());
    assert_eq!(would.json()["spec"]["displayName"], "dry");
    assert_eq!(api.get(&format!("{PROJECTS}/dry")).status, 404);

    let invalid = api.post_json(
        &format!("{PROJECTS}?dryRun=All"),
        &project("Bad", json!({})),
    );
    assert_eq!(invalid.status, 422);

    assert_eq!(
        api.post_json(PROJECTS, &project("real", json!({}))).status,
        201
    );
    let before = api.get(&format!("{PROJECTS}/real")).json();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        project("real", json!({"state": "Stopped"})), project("new", json!({}))]});
    let result = api.post_json(&format!("{APPLY}?dryRun=All"), &list).json();
    let actions: Vec<_> = result["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["action"].clone())
        .collect();
    assert_eq!(actions, [json!("configured"), json!("created")]);
    assert_eq!(api.get(&format!("{PROJECTS}/real")).json(), before);
    assert_eq!(api.get(&format!("{PROJECTS}/new")).status, 404);

    assert_eq!(
        api.delete(&format!("{PROJECTS}/real?dryRun=All")).status,
        200
    );
    assert_eq!(api.get(&format!("{PROJECTS}/real")).json(), before);
    assert_eq!(
        api.post_json(&format!("{PROJECTS}?dryRun=Some"), &project("x", json!({})))
            .status,
        400
    );
}

#[test]
fn apply_is_all_or_nothing_and_idempotent() {
    let daemon = Daemon::start();
    let api = daemon.client();
    assert_eq!(
        api.post_json(PROJECTS, &project("taken", json!({"displayName": "Taken"})))
            .status,
        201
    );

    // Two bad objects: both reported, nothing written.
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        project("one", json!({})),
        project("Two", json!({})),
        {"apiVersion": "berth.dev/v1alpha1", "kind": "Nope", "metadata": {"name": "three"}},
        project("one", json!({})),
    ]});
    let reply = api.post_json(APPLY, &list);
    assert_eq!(reply.status, 422, "{}", reply.text());
    let fields = causes(&reply.json());
    assert_eq!(
        fields,
        [
            "items[1].metadata.name",
            "items[2].kind",
            "items[3].metadata.name"
        ]
    );
    assert_eq!(api.get(&format!("{PROJECTS}/one")).status, 404);

    // A store conflict in the middle of the batch also leaves nothing behind.
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        project("one", json!({})),
        project("two", json!({"displayName": " TAKEN "})),
    ]});
    let reply = api.post_json(APPLY, &list);
    assert_eq!(reply.status, 409, "{}", reply.text());
    assert!(
        reply.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("items[1]")
    );
    assert_eq!(api.get(&format!("{PROJECTS}/one")).status, 404);

    let profile = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "AgentProfile",
        "metadata": {"name": "shell"}, "spec": {"home": "/root", "runner": {"command": ["sh"]}, "install": {"check": "true"}}});
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        project("one", json!({"agent": "shell"})), project("two", json!({})), profile]});
    let first = api.post_json(APPLY, &list);
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    assert_eq!(first["kind"], "ApplyResult");
    let summary = |result: &Value| -> Vec<(String, String, String)> {
        result["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                (
                    i["kind"].as_str().unwrap().to_string(),
                    i["name"].as_str().unwrap().to_string(),
                    i["action"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    assert_eq!(
        summary(&first),
        [
            ("Project".into(), "one".into(), "created".into()),
            ("Project".into(), "two".into(), "created".into()),
            ("AgentProfile".into(), "shell".into(), "created".into()),
        ]
    );
    let second = api.post_json(APPLY, &list).json();
    assert!(
        summary(&second)
            .iter()
            .all(|(_, _, action)| action == "unchanged")
    );
    for (a, b) in first["items"]
        .as_array()
        .unwrap()
        .iter()
        .zip(second["items"].as_array().unwrap())
    {
        assert_eq!(a["object"]["metadata"], b["object"]["metadata"]);
    }
    // YAML is accepted too.
    let yaml = serde_yaml::to_string(&list).unwrap();
    let reply = api.request("POST", APPLY, Some("application/yaml"), yaml.as_bytes());
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        api.post_json(&format!("{APPLY}?prune=true"), &list).status,
        400
    );
    assert_eq!(api.post_json(APPLY, &project("x", json!({}))).status, 400);
}

#[test]
fn patches_apply_and_merge() {
    let daemon = Daemon::start();
    let api = daemon.client();
    let path = format!("{PROJECTS}/pat");
    let manifest = "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: pat\n  labels: {team: a}\nspec:\n  displayName: Pat\n";
    let created = api.request(
        "PATCH",
        &path,
        Some("application/apply-patch+yaml"),
        manifest.as_bytes(),
    );
    assert_eq!(created.status, 201, "{}", created.text());
    let again = api.request(
        "PATCH",
        &path,
        Some("application/apply-patch+yaml"),
        manifest.as_bytes(),
    );
    assert_eq!(again.status, 200);
    assert_eq!(rv(&again.json()), rv(&created.json()));

    let merged = api.request(
        "PATCH",
        &path,
        Some("application/merge-patch+json"),
        br#"{"metadata": {"labels": {"team": null, "tier": "1"}}, "spec": {"state": "Stopped"}}"#,
    );
    assert_eq!(merged.status, 200, "{}", merged.text());
    let merged = merged.json();
    assert_eq!(merged["metadata"]["labels"], json!({"tier": "1"}));
    assert_eq!(merged["spec"]["state"], "Stopped");
    assert_eq!(merged["spec"]["displayName"], "Pat");
    assert_eq!(merged["metadata"]["generation"], 2);

    let stale = format!(
        r#"{{"metadata": {{"resourceVersion": "{}"}}, "spec": {{"state": "Running"}}}}"#,
        rv(&created.json())
    );
    let reply = api.request(
        "PATCH",
        &path,
        Some("application/merge-patch+json"),
        stale.as_bytes(),
    );
    assert_eq!(reply.status, 409);

    let reply = api.request(
        "PATCH",
        &path,
        Some("application/merge-patch+json"),
        br#"{"metadata": {"uid": "x"}}"#,
    );
    assert_eq!(reply.status, 422);
    let reply = api.request("PATCH", &path, Some("application/json"), b"{}");
    assert_eq!(reply.status, 415);
    let reply = api.request(
        "PATCH",
        &format!("{PROJECTS}/nope"),
        Some("application/merge-patch+json"),
        b"{}",
    );
    assert_eq!(reply.status, 404);
}

#[test]
fn a_merge_patch_without_resource_version_is_not_lost_to_status_writes() {
    let daemon = Daemon::start();
    let api = daemon.client();
    assert_eq!(
        api.post_json(PROJECTS, &project("busy", json!({}))).status,
        201
    );
    let path = format!("{PROJECTS}/busy");
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        // A status writer like the controller's, moving the resourceVersion all along.
        let writer = scope.spawn(|| {
            let api = daemon.client();
            let mut writes = 0u32;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let status = json!({"status": {"message": format!("write {writes}")}});
                let reply = api.put_json(&format!("{path}/status"), &status);
                assert_eq!(reply.status, 200, "{}", reply.text());
                writes += 1;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            writes
        });
        // Stops the writer however this thread leaves the scope, a failed assertion included.
        struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let stop = StopOnDrop(&done);
        for round in 0..100 {
            let patch = json!({"metadata": {"labels": {"round": round.to_string()}}});
            let reply = api.request(
                "PATCH",
                &path,
                Some("application/merge-patch+json"),
                patch.to_string().as_bytes(),
            );
            assert_eq!(reply.status, 200, "round {round}: {}", reply.text());
        }
        drop(stop);
        assert!(writer.join().unwrap() > 0);
    });
    let object = api.get(&path).json();
    assert_eq!(object["metadata"]["labels"]["round"], "99");
    assert!(
        object["status"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("write ")),
        "{object}"
    );
}

#[test]
fn display_names_conflict_on_create_and_rename() {
    let daemon = Daemon::start();
    let api = daemon.client();
    assert_eq!(
        api.post_json(
            PROJECTS,
            &project("pay", json!({"displayName": "Payments API"}))
        )
        .status,
        201
    );
    let clash = api.post_json(
        PROJECTS,
        &project("pay2", json!({"displayName": "  payments api"})),
    );
    assert_eq!(clash.status, 409);
    assert_eq!(clash.json()["reason"], "Conflict");
    assert_eq!(
        api.post_json(PROJECTS, &project("web", json!({"displayName": "Web"})))
            .status,
        201
    );
    let rename = api.request(
        "PATCH",
        &format!("{PROJECTS}/web"),
        Some("application/merge-patch+json"),
        br#"{"spec": {"displayName": "PAYMENTS API"}}"#,
    );
    assert_eq!(rename.status, 409);
    assert_eq!(
        api.get(&format!("{PROJECTS}/web")).json()["spec"]["displayName"],
        "Web"
    );
}

#[test]
fn status_is_written_only_through_its_own_path() {
    let daemon = Daemon::start();
    let api = daemon.client();
    let created = api.post_json(PROJECTS, &project("st", json!({}))).json();
    let status_path = format!("{PROJECTS}/st/status");
    let reply = api.put_json(
        &status_path,
        &json!({"status": {"phase": "Ready", "observedGeneration": 1}}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let with_status = reply.json();
    assert_eq!(with_status["metadata"]["generation"], 1);
    assert_ne!(rv(&with_status), rv(&created));

    // Status in a spec write is ignored, and the stored status survives it.
    let mut next = project("st", json!({"state": "Stopped"}));
    next["status"] = json!({"phase": "Error"});
    let replaced = api.put_json(&format!("{PROJECTS}/st"), &next).json();
    assert_eq!(replaced["status"]["phase"], "Ready");
    assert_eq!(replaced["metadata"]["generation"], 2);
    assert_eq!(api.get(&status_path).json()["status"]["phase"], "Ready");

    let stale = api.put_json(
        &status_path,
        &json!({"metadata": {"resourceVersion": rv(&created)}, "status": {}}),
    );
    assert_eq!(stale.status, 409);
    assert_eq!(api.put_json(&status_path, &json!({"spec": {}})).status, 422);
    // Status the controller could not read back is refused.
    let garbage = api.put_json(&status_path, &json!({"status": {"phase": "Exploded"}}));
    assert_eq!(garbage.status, 422, "{}", garbage.text());
    assert_eq!(api.get(&status_path).json()["status"]["phase"], "Ready");
}

#[test]
fn watch_streams_existing_objects_then_changes() {
    let daemon = Daemon::start();
    let api = daemon.client();
    assert_eq!(
        api.post_json(PROJECTS, &project("first", json!({}))).status,
        201
    );
    let mut watch = api.watch(&format!("{PROJECTS}?watch=true"));
    let event = watch.next_event().unwrap();
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["metadata"]["name"], "first");

    assert_eq!(
        api.post_json(PROJECTS, &project("second", json!({})))
            .status,
        201
    );
    let event = watch.next_event().unwrap();
    assert_eq!(
        (
            event["type"].as_str(),
            event["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("second"))
    );

    api.put_json(
        &format!("{PROJECTS}/first/status"),
        &json!({"status": {"phase": "Ready"}}),
    );
    let event = watch.next_event().unwrap();
    assert_eq!(event["type"], "MODIFIED");
    assert_eq!(event["object"]["status"]["phase"], "Ready");

    assert_eq!(api.delete(&format!("{PROJECTS}/second")).status, 200);
    let event = watch.next_event().unwrap();
    assert_eq!(event["type"], "DELETED");
    assert_eq!(event["object"]["metadata"]["name"], "second");

    // Other kinds do not show up on a projects watch; a watch on one name sees only it.
    let mut one = api.watch(&format!("{PROJECTS}/first?watch=true"));
    assert_eq!(
        one.next_event().unwrap()["object"]["metadata"]["name"],
        "first"
    );
    let profile = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "AgentProfile",
        "metadata": {"name": "p"}, "spec": {"home": "/root", "runner": {"command": ["sh"]}, "install": {"check": "true"}}});
    assert_eq!(
        api.post_json("/apis/berth.dev/v1alpha1/agentprofiles", &profile)
            .status,
        201
    );
    assert_eq!(
        api.post_json(PROJECTS, &project("third", json!({}))).status,
        201
    );
    api.put_json(
        &format!("{PROJECTS}/first/status"),
        &json!({"status": {"phase": "Stopped"}}),
    );
    let event = watch.next_event().unwrap();
    assert_eq!(event["object"]["metadata"]["name"], "third");
    let event = one.next_event().unwrap();
    assert_eq!(event["object"]["status"]["phase"], "Stopped");
}

#[test]
fn service_endpoints_and_unknown_routes() {
    let daemon = Daemon::start();
    let api = daemon.client();
    assert_eq!(api.get("/healthz").text(), "ok\n");
    let ready = api.get("/readyz");
    assert_eq!(ready.status, 200, "{}", ready.text());
    assert_eq!(
        api.get("/version").json()["version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(api.get("/apis/berth.dev/v1alpha1/widgets").status, 404);
    assert_eq!(api.get("/nowhere").status, 404);
    let reply = api.request("DELETE", PROJECTS, None, &[]);
    assert_eq!(reply.status, 405);
    assert_eq!(reply.json()["reason"], "MethodNotAllowed");
    let events = api.get("/apis/berth.dev/v1alpha1/events").json();
    assert_eq!(events["kind"], "EventList");
    let events = api.get(&format!("{PROJECTS}/anything/events")).json();
    assert_eq!(events["items"], json!([]));
}

#[test]
fn apply_with_an_applyset_prunes_only_what_the_set_applied_before() {
    let daemon = Daemon::start();
    let api = daemon.client();
    // Not in the set: never pruned, whatever it looks like.
    assert_eq!(
        api.post_json(PROJECTS, &project("bystander", json!({})))
            .status,
        201
    );
    let list = |names: &[&str]| {
        json!({"apiVersion": "v1", "kind": "List",
            "items": names.iter().map(|n| project(n, json!({}))).collect::<Vec<_>>()})
    };
    let first = api.post_json(
        &format!("{APPLY}?applyset=team&prune=true"),
        &list(&["a", "b", "c"]),
    );
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    assert_eq!(
        first["items"][0]["object"]["metadata"]["annotations"]["berth.dev/applyset"],
        "team"
    );

    // c opts out of pruning.
    let opt_out = api.request(
        "PATCH",
        &format!("{PROJECTS}/c"),
        Some("application/merge-patch+json"),
        br#"{"metadata": {"annotations": {"berth.dev/prune": "disabled"}}}"#,
    );
    assert_eq!(opt_out.status, 200, "{}", opt_out.text());

    // A dry run reports the pruning and does nothing.
    let dry = api
        .post_json(
            &format!("{APPLY}?applyset=team&prune=true&dryRun=All"),
            &list(&["a"]),
        )
        .json();
    let actions: Vec<_> = dry["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{}:{}",
                i["name"].as_str().unwrap(),
                i["action"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(actions, ["a:unchanged", "b:pruned"]);
    assert_eq!(api.get(&format!("{PROJECTS}/b")).status, 200);

    // Without prune the inventory is recorded but nothing is deleted.
    let kept = api
        .post_json(&format!("{APPLY}?applyset=team"), &list(&["a", "b"]))
        .json();
    assert_eq!(kept["items"].as_array().unwrap().len(), 2);
    assert_eq!(api.get(&format!("{PROJECTS}/c")).status, 200);

    let pruned = api
        .post_json(&format!("{APPLY}?applyset=team&prune=true"), &list(&["a"]))
        .json();
    let actions: Vec<_> = pruned["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{}:{}",
                i["name"].as_str().unwrap(),
                i["action"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(actions, ["a:unchanged", "b:pruned"]);
    assert_eq!(api.get(&format!("{PROJECTS}/b")).status, 404);
    assert_eq!(api.get(&format!("{PROJECTS}/c")).status, 200);
    assert_eq!(api.get(&format!("{PROJECTS}/bystander")).status, 200);
    assert_eq!(
        api.post_json(&format!("{APPLY}?applyset=Bad_Name"), &list(&["a"]))
            .status,
        400
    );
}

#[test]
fn only_a_delete_request_forces_a_deletion() {
    const FORCE: &str = "berth.dev/forceDelete";
    const FIELD: &str = "metadata.annotations[berth.dev/forceDelete]";
    const MESSAGE: &str = "set only by a delete request (berth delete --force)";
    let daemon = Daemon::start();
    let api = daemon.client();
    let armed = |name: &str| {
        let mut manifest = project(name, json!({}));
        manifest["metadata"]["annotations"] = json!({FORCE: "true"});
        manifest
    };
    let refused = |reply: crate::support::daemon::Reply, what: &str| {
        assert_eq!(reply.status, 400, "{what}: {}", reply.text());
        let body = reply.json();
        assert_eq!(body["reason"], "BadRequest", "{what}");
        assert!(
            body["message"].as_str().unwrap().contains(MESSAGE),
            "{what}: {body}"
        );
        causes(&body)
    };
    let apply_yaml = |name: &str, body: &Value| {
        api.request(
            "PATCH",
            &format!("{PROJECTS}/{name}"),
            Some("application/apply-patch+yaml"),
            serde_json::to_string(body).unwrap().as_bytes(),
        )
    };

    // Every write path refuses to arm a force: create, apply of one object, a batch.
    assert_eq!(
        refused(api.post_json(PROJECTS, &armed("pre")), "create"),
        [FIELD]
    );
    assert_eq!(refused(apply_yaml("pre", &armed("pre")), "apply"), [FIELD]);
    let list = json!({"apiVersion": "v1", "kind": "List",
        "items": [project("calm", json!({})), armed("pre")]});
    assert_eq!(
        refused(api.post_json(APPLY, &list), "batch apply"),
        [format!("items[1].{FIELD}")]
    );
    assert_eq!(
        api.get(&format!("{PROJECTS}/calm")).status,
        404,
        "all or nothing"
    );
    assert_eq!(api.get(&format!("{PROJECTS}/pre")).status, 404);

    // A project held by a finalizer, so its deletion stays visible.
    let mut held = project("held", json!({}));
    held["metadata"]["finalizers"] = json!(["berth.dev/test-hold"]);
    assert_eq!(api.post_json(PROJECTS, &held).status, 201);
    let path = format!("{PROJECTS}/held");
    let current = api.get(&path).json();
    let mut put = armed("held");
    put["metadata"]["resourceVersion"] = json!(rv(&current));
    put["metadata"]["finalizers"] = json!(["berth.dev/test-hold"]);
    assert_eq!(refused(api.put_json(&path, &put), "replace"), [FIELD]);
    let patch = json!({"metadata": {"annotations": {FORCE: "true"}}}).to_string();
    let merge = |body: &str| {
        api.request(
            "PATCH",
            &path,
            Some("application/merge-patch+json"),
            body.as_bytes(),
        )
    };
    assert_eq!(refused(merge(&patch), "merge patch"), [FIELD]);

    // A plain delete, then a re-apply that tries to force it: refused, and still unforced.
    assert_eq!(api.delete(&path).status, 202);
    assert_eq!(
        refused(apply_yaml("held", &armed("held")), "re-apply"),
        [FIELD]
    );
    assert_eq!(
        refused(merge(&patch), "merge patch while deleting"),
        [FIELD]
    );
    let deleting = api.get(&path).json();
    assert!(deleting["metadata"]["deletionTimestamp"].is_string());
    assert!(deleting["metadata"]["annotations"].get(FORCE).is_none());

    // A forced delete records it; no later write drops it.
    assert_eq!(api.delete(&format!("{path}?force=true")).status, 202);
    assert_eq!(
        api.get(&path).json()["metadata"]["annotations"][FORCE],
        "true"
    );
    let reply = apply_yaml("held", &project("held", json!({})));
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["metadata"]["annotations"][FORCE], "true");
    let shown = api.get(&path).json();
    let reply = apply_yaml("held", &shown);
    assert_eq!(
        reply.status,
        200,
        "get output applies back: {}",
        reply.text()
    );
    assert_eq!(rv(&reply.json()), rv(&shown), "and changes nothing");
    let reply = merge(&json!({"metadata": {"annotations": {FORCE: null}}}).to_string());
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["metadata"]["annotations"][FORCE], "true");
}

#[test]
fn durations_past_the_cap_are_refused_at_admission() {
    let daemon = Daemon::start();
    let api = daemon.client();
    let reply = api.post_json(
        PROJECTS,
        &project(
            "forever",
            json!({"reap": {"idleAfter": "100000000d", "maxAge": "99999999999999999999d"}}),
        ),
    );
    assert_eq!(reply.status, 422, "{}", reply.text());
    let body = reply.json();
    assert_eq!(causes(&body), ["spec.reap.idleAfter", "spec.reap.maxAge"]);
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("spec.reap.idleAfter: \"100000000d\" is too long: at most 36500d"),
        "{message}"
    );
    assert_eq!(api.get(&format!("{PROJECTS}/forever")).status, 404);

    let source = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "GitSource",
        "metadata": {"name": "slow"},
        "spec": {"url": "https://git.example/fleet.git", "interval": "36501d"}});
    let reply = api.post_json("/apis/berth.dev/v1alpha1/gitsources", &source);
    assert_eq!(reply.status, 422, "{}", reply.text());
    assert_eq!(causes(&reply.json()), ["spec.interval"]);

    // The cap itself is accepted.
    let reply = api.post_json(
        PROJECTS,
        &project(
            "century",
            json!({"reap": {"idleAfter": "36500d", "maxAge": "36500d"}}),
        ),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
}
