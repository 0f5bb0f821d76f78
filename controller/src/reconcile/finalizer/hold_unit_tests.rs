use super::*;
use berth_api::UnsavedWork;

/// The message for a project held for unsaved work, looked at again every five minutes.
fn unsaved_work_message(evidence: &policy::Evidence) -> String {
    blocked_message(
        &[ProtectionReason::UnsavedWork],
        evidence,
        None,
        None,
        Duration::from_secs(300),
    )
}

#[test]
fn the_message_names_the_protection_and_the_way_out() {
    let evidence = policy::Evidence::Inspected(UnsavedWork {
        unpushed: 2,
        ..UnsavedWork::default()
    });
    let message = unsaved_work_message(&evidence);
    assert!(message.contains("UnsavedWork"), "{message}");
    assert!(message.contains("2 commits on no remote"), "{message}");
    assert!(message.contains("--force"), "{message}");
    assert!(message.contains("stays Deleting"), "{message}");
    assert!(message.contains("looked at again every 5m"), "{message}");
}

#[test]
fn the_message_names_a_bounded_list_of_files_and_commits() {
    let files: Vec<String> = (0..12)
        .map(|i| format!("f{i}.txt"))
        .chain(["refs/heads/main".to_string()])
        .collect();
    let evidence = policy::Evidence::Inspected(UnsavedWork {
        untracked: 30,
        unpushed: 1,
        files,
        commits: vec!["1a2b3c4 on refs/heads/main".to_string()],
        ..UnsavedWork::default()
    });
    let message = unsaved_work_message(&evidence);
    assert!(
        message.contains(
            "files: f0.txt, f1.txt, f2.txt, f3.txt, f4.txt, f5.txt, f6.txt, \
                          f7.txt, f8.txt, f9.txt and 20 more;"
        ),
        "{message}"
    );
    assert!(
        message.contains("commits on no remote: 1a2b3c4 on refs/heads/main)"),
        "{message}"
    );
    assert!(!message.contains("f10.txt"), "{message}");
}
