use super::*;

#[test]
fn shell_versions_match_by_components() {
    assert!(version_matches("5.2", "5.2.15(1)-release"));
    assert!(version_matches("5", "5.2.15(1)-release"));
    assert!(version_matches("", "5.2.15(1)-release"));
    assert!(!version_matches("5.1", "5.2.15(1)-release"));
    assert!(!version_matches("5.21", "5.2.15(1)-release"));
}

#[test]
fn the_exit_marker_is_split_from_stderr() {
    let stderr = b"oops\n\n\x1eberth-exit 3\n";
    let (rest, code) = split_exit(stderr).unwrap();
    assert_eq!((rest, code), (&b"oops\n"[..], 3));
    assert!(split_exit(b"no marker").is_none());
}

#[test]
fn edits_replace_exact_bytes_and_count_every_occurrence() {
    let cases: [(&str, &str, &str, bool, &str, usize); 5] = [
        ("a-b-a", "a", "x", false, "x-b-a", 2),
        ("a-b-a", "a", "x", true, "x-b-x", 2),
        ("aaa", "aa", "b", true, "ba", 1),
        ("one\ntwo\n", "two\n", "", false, "one\n", 1),
        ("x.*y", ".*", "+", false, "x+y", 1),
    ];
    for (text, old, new, all, want, count) in cases {
        let (out, n) = replace(text.as_bytes(), old.as_bytes(), new.as_bytes(), all);
        assert_eq!(
            (String::from_utf8(out).unwrap(), n),
            (want.to_string(), count),
            "{text}"
        );
    }
}

/// Only the exec that changes the workspace leaves an outcome unknown when LXD's answer is
/// lost; a lost read, a lost staging write or LXD's refusal is "unreachable": nothing ran.
#[tokio::test(start_paused = true)]
async fn a_lost_answer_is_outcome_unknown_only_once_a_mutation_was_sent() {
    use crate::runtime::Instance;
    use crate::testing::fake_runtime::{FakeRuntime, Fault};

    let fake = Arc::new(FakeRuntime::new());
    fake.insert_instance(Instance::running("p", BTreeMap::new()));
    let runtime: Arc<dyn Runtime> = fake.clone();
    let refused = || {
        Fault::Fail(RuntimeError::Rejected {
            what: "exec".into(),
            status: 400,
            message: "Instance is not running".into(),
        })
    };
    let broken = || {
        Fault::Fail(RuntimeError::Transport {
            what: "file_write".into(),
            message: "connection reset".into(),
        })
    };
    let write = json!({"file_path": "a.txt", "content": "x"});
    let edit = json!({"file_path": "a.txt", "old_string": "a", "new_string": "b"});
    let bash = json!({"command": "touch /workspace/x"});
    // (tool, arguments, faulted method, fault, the answer's reason)
    let cases = [
        (
            Tool::Bash,
            bash.clone(),
            "exec",
            Fault::LoseReply,
            Reason::OutcomeUnknown,
        ),
        (
            Tool::Write,
            write.clone(),
            "exec",
            Fault::LoseReply,
            Reason::OutcomeUnknown,
        ),
        (
            Tool::Write,
            write.clone(),
            "file_write",
            broken(),
            Reason::Unreachable,
        ),
        (
            Tool::Edit,
            edit.clone(),
            "exec",
            Fault::LoseReply,
            Reason::Unreachable,
        ),
        (
            Tool::Bash,
            bash.clone(),
            "exec",
            refused(),
            Reason::Unreachable,
        ),
        (
            Tool::Read,
            json!({"file_path": "a.txt"}),
            "exec",
            Fault::LoseReply,
            Reason::Unreachable,
        ),
    ];
    for (tool, arguments, method, fault, want) in cases {
        fake.clear_faults();
        fake.fault_method(method, fault);
        let body = json!({"executionId": "e1", "arguments": arguments});
        let call = ToolCall::parse(tool, body.to_string().as_bytes()).unwrap();
        let run = Run {
            runtime: &runtime,
            instance: "p",
            call: &call,
            pidfile: "/run/berth-tool-test.pid",
            env: BTreeMap::new(),
        };
        let err = run.tool().await.expect_err("the call fails");
        assert_eq!(
            err.reason, want,
            "{tool:?} with {method} faulted: {}",
            err.message
        );
    }
}

#[test]
fn the_probe_tells_what_a_workspace_lacks() {
    let base = Offer::parse("bash 5.2.15(1)-release\ngrep pcre\nsetsid yes\n");
    assert_eq!(base.bash.as_deref(), Some("5.2.15(1)-release"));
    assert!(base.pcre && base.lacks(Tool::Bash).is_none());
    let tiny = Offer::parse("bash -\ngrep ere\nsetsid yes\n");
    assert_eq!((tiny.bash.clone(), tiny.pcre), (None, false));
    assert!(tiny.lacks(Tool::Bash).unwrap().contains("no bash"));
    assert!(tiny.lacks(Tool::Read).is_none());
    let bare = Offer::parse("bash -\ngrep ere\nsetsid -\n");
    assert!(bare.lacks(Tool::Read).unwrap().contains("setsid"));
}
