//! A restore is refused like an apply, with the real `berth` binary, real LXD and real SQLite:
//! when another project now holds the recorded display name the refusal names no project, the
//! same words the store gives any writer, and nothing is restored.

use crate::harness::{Berth, unique_name, volumes_of};
use serde_json::json;

#[test]
fn a_restore_refused_for_a_taken_display_name_names_no_project() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    let display = format!("Shown {name}");
    let project = berth.create_project(
        &name,
        json!({"image": "berth-tiny", "displayName": display}),
    );
    let uid = crate::harness::uid_of(&project);
    berth.wait_ready(&name);
    let deleted = berth.cli(&["delete", "project", &name, "--force"]);
    assert!(deleted.status.success(), "{deleted:?}");

    let holder = format!("{name}-holder");
    berth.create_project(
        &holder,
        json!({"image": "berth-tiny", "displayName": display}),
    );

    let reply = berth.client().post_json(
        &format!("/apis/berth.dev/v1alpha1/trash/{uid}/restore"),
        &json!({}),
    );
    let text = reply.text();
    assert_eq!(reply.status, 409, "{text}");
    assert!(text.contains("spec.displayName"), "names the field: {text}");
    assert!(!text.contains(&holder), "names the holder: {text}");
    assert!(berth.get_project(&name).is_none(), "nothing restored");
    let trash = berth.client().get("/apis/berth.dev/v1alpha1/trash").text();
    assert!(
        trash.contains(&uid),
        "the entry stays in the trash: {trash}"
    );
    assert!(!volumes_of(&uid).is_empty(), "its volumes are kept");

    // Under another name the recorded display name, being taken, gives way to the new name.
    let reply = berth.client().post_json(
        &format!("/apis/berth.dev/v1alpha1/trash/{uid}/restore"),
        &json!({"name": format!("{name}-back")}),
    );
    assert!(reply.status < 300, "{}", reply.text());
    let back = berth.wait_ready(&format!("{name}-back"));
    berth.track(&back);
}
