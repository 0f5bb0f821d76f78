use super::*;

#[test]
fn the_start_says_whether_it_started_or_found_code_server_running() {
    assert_eq!(
        parse("started 42\n").unwrap(),
        IdeOutcome::Started { pid: 42 }
    );
    assert_eq!(
        parse("noise\nrunning 7").unwrap(),
        IdeOutcome::Running { pid: 7 }
    );
    assert!(parse("").is_err());
    assert!(parse("started x").is_err());
}

#[test]
fn the_state_lies_in_the_workspace_and_its_pattern_names_it() {
    assert!(STATE_DIR.starts_with("/workspace/"));
    assert_eq!(
        format!("/{}/", STATE_DIR.strip_prefix("/workspace/").unwrap()),
        EXCLUDE_PATTERN
    );
}
