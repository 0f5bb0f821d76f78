//! The daemon's logs against a real LXD: `--log-format json` gives one JSON object per line,
//! every reconcile runs in a span that names the project and the step it starts from, a bad
//! `BERTH_LOG` is said, and no secret value reaches a log line even at debug level.

use crate::harness::{Berth, unique_name};
use serde_json::{Value, json};

#[test]
fn json_logs_carry_the_reconcile_span_and_never_a_secret() {
    let canary = format!("canary-{:016x}", rand::random::<u64>());
    let mut berth = Berth::start_with(
        &[("BERTH_LOG", "debug,hyper=info,h2=info,rustls=info")],
        &["--log-format", "json"],
    );
    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    berth.set_secret(&name, "API_TOKEN", &canary);
    berth.wait_ready(&name);
    // The secret reaches the workspace, so it passed through every layer that might log it.
    berth.wait_for(&name, "SecretsSynced", |p| {
        p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "SecretsSynced" && c["status"] == "True")
        })
    });

    let log = berth.log_text();
    let lines: Vec<Value> = log
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"))
        })
        .collect();
    assert!(
        lines
            .iter()
            .all(|l| l["level"].is_string() && l["timestamp"].is_string())
    );
    let committed: Vec<&Value> = lines
        .iter()
        .filter(|l| {
            l["fields"]["message"] == "step committed" && l["span"]["project"] == name.as_str()
        })
        .collect();
    assert!(
        committed.iter().any(|l| l["fields"]["step"] == "Created"),
        "no step committed line for Created:\n{log}"
    );
    for line in &committed {
        assert_eq!(line["span"]["name"], "reconcile", "{line}");
        assert!(
            line["span"]["step"].is_string(),
            "the span has no step: {line}"
        );
    }
    assert!(
        !log.contains(&canary),
        "the secret's value reached the daemon log"
    );

    berth.delete_project(&name);
}

#[test]
fn a_log_filter_that_does_not_parse_is_said_and_info_is_used() {
    let berth = Berth::start_with(&[("BERTH_LOG", "bogus===")], &[]);
    let log = berth.log_text();
    assert!(
        log.contains("BERTH_LOG=\"bogus===\" is not a log filter")
            && log.contains("logging at info"),
        "{log}"
    );
}
