//! A fleet applied in one call, end to end against a real `berth serve --paused`: more items
//! than one apply used to take are admitted and written at once, and the bounds that remain
//! still refuse the whole batch, persisting nothing.

use serde_json::{Value, json};

use crate::support::daemon::{Client, Daemon};

const API: &str = "/apis/berth.dev/v1alpha1";

/// More than the 10,000 items an apply once took at most.
const FLEET: usize = 20_000;

/// A `List` of `count` Project manifests named `{prefix}-NNNNNN`, as `berth apply` sends them.
fn fleet(prefix: &str, count: usize) -> Vec<Value> {
    (0..count)
        .map(|i| {
            json!({
                "apiVersion": "berth.dev/v1alpha1",
                "kind": "Project",
                "metadata": {"name": format!("{prefix}-{i:06}"), "labels": {"fleet": prefix}},
                "spec": {"displayName": format!("{prefix} {i:06}"), "state": "Stopped",
                         "agent": "shell", "brief": format!("Project number {i}")},
            })
        })
        .collect()
}

fn apply(api: &Client, items: Vec<Value>) -> crate::support::daemon::Reply {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    api.post_json(&format!("{API}/apply"), &list)
}

fn projects(api: &Client) -> Vec<Value> {
    let reply = api.get(&format!("{API}/projects"));
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn more_than_ten_thousand_projects_are_applied_in_one_call() {
    let daemon = Daemon::start();
    let api = daemon.client();

    let reply = apply(&api, fleet("fleet", FLEET));
    assert_eq!(reply.status, 200, "{}", reply.text());
    let answer = reply.json();
    assert_eq!(answer["kind"], "ApplyResult");
    let items = answer["items"].as_array().unwrap();
    assert_eq!(items.len(), FLEET);
    for (i, item) in items.iter().enumerate() {
        let name = format!("fleet-{i:06}");
        assert_eq!(
            (&item["kind"], &item["name"], &item["action"]),
            (&json!("Project"), &json!(name), &json!("created")),
        );
        assert_eq!(item["object"]["metadata"]["name"], name);
        assert_eq!(
            item["object"]["spec"]["brief"],
            format!("Project number {i}")
        );
    }
    let listed = projects(&api);
    assert_eq!(listed.len(), FLEET);

    // The same List again: one call, nothing changed.
    let reply = apply(&api, fleet("fleet", FLEET));
    assert_eq!(reply.status, 200, "{}", reply.text());
    let answer = reply.json();
    let unchanged = answer["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["action"] == "unchanged")
        .count();
    assert_eq!(unchanged, FLEET);
}

#[test]
fn a_fleet_with_one_bad_item_or_one_too_many_persists_nothing() {
    let daemon = Daemon::start();
    let api = daemon.client();

    // The last of many items invalid: refused by its index, after every other was admitted.
    let mut items = fleet("bad", FLEET);
    items[FLEET - 1]["spec"]["state"] = json!("Sideways");
    let reply = apply(&api, items);
    assert_eq!(reply.status, 422, "{}", reply.text());
    let text = reply.text();
    assert!(
        text.contains(&format!("items[{}].spec.state", FLEET - 1)),
        "{text}"
    );

    // A name given twice, far apart.
    let mut items = fleet("twice", FLEET);
    items[FLEET - 1]["metadata"]["name"] = json!("twice-000003");
    let reply = apply(&api, items);
    assert_eq!(reply.status, 422, "{}", reply.text());
    let text = reply.text();
    assert!(
        text.contains(&format!("items[{}].metadata.name", FLEET - 1)) && text.contains("items[3]"),
        "{text}"
    );

    // One item more than an apply takes: refused while decoding, naming the bound.
    let items = vec![json!({"kind": "Project"}); berth_api::wire::APPLY_ITEMS + 1];
    let reply = apply(&api, items);
    assert_eq!(reply.status, 413, "{}", reply.text());
    assert!(
        reply.text().contains("items: the List holds more than"),
        "{}",
        reply.text()
    );

    assert!(
        projects(&api).is_empty(),
        "a refused apply persisted something"
    );
}

#[test]
fn a_fleet_over_the_host_is_warned_of_in_a_bounded_answer() {
    // Running, so the daemon reads the host's capacity from LXD; a dry run creates nothing.
    let daemon = Daemon::running().start();
    let api = daemon.client();
    let items: Vec<Value> = fleet("over", 30)
        .into_iter()
        .map(|mut item| {
            item["spec"]["resources"] = json!({"memory": "1024GiB", "cpu": "4096"});
            item
        })
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    let body = list.to_string();
    let warnings = daemon.eventually(
        std::time::Duration::from_secs(60),
        "warnings about the host's capacity",
        || {
            let reply = api.request(
                "POST",
                &format!("{API}/apply?dryRun=All"),
                Some("application/json"),
                body.as_bytes(),
            );
            assert_eq!(reply.status, 200, "{}", reply.text());
            let warnings: Vec<String> = reply
                .headers
                .iter()
                .filter(|(name, _)| name.eq_ignore_ascii_case("warning"))
                .map(|(_, value)| value.clone())
                .collect();
            (!warnings.is_empty()).then_some(warnings)
        },
    );
    // Two warnings a project, sixty in all: the first twenty, and how many more.
    assert_eq!(warnings.len(), 21, "{warnings:#?}");
    assert!(
        warnings[0].contains("Project/over-000000: spec.resources."),
        "{warnings:#?}"
    );
    assert!(
        warnings[20].contains("and 40 more warnings"),
        "{warnings:#?}"
    );
    assert!(projects(&api).is_empty(), "a dry run");
}
