use super::*;

#[test]
fn a_brief_id_names_project_and_text() {
    let a = brief_id("u", "do it");
    assert_eq!(a, brief_id("u", "do it"));
    assert_ne!(a, brief_id("v", "do it"));
    assert_ne!(a, brief_id("u", "do it again"));
    assert!(a.len() <= 128 && a.chars().all(|c| c.is_ascii_graphic()));
}

#[test]
fn provisioned_names_each_profile_with_its_version() {
    let profile = |name: &str, reported: Option<&str>, version: Option<&str>, install| {
        agent::ProfileBootstrap {
            profile: name.into(),
            install,
            version: version.map(String::from),
            reported: reported.map(String::from),
            assets: Vec::new(),
            credentials: Vec::new(),
        }
    };
    let report = agent::BootstrapReport {
        profiles: vec![
            profile(
                "claude",
                Some("2.1.90 (Claude Code)"),
                Some("2.1.90"),
                agent::InstallOutcome::Installed,
            ),
            profile("codex", None, Some("0.1"), agent::InstallOutcome::Present),
            profile("shell", None, None, agent::InstallOutcome::Present),
        ],
        warnings: Vec::new(),
        failed: Vec::new(),
    };
    assert_eq!(
        provisioned_message(&report),
        "verified claude: 2.1.90 (Claude Code), installed now; \
         codex: 0.1 (declared; the check printed none); \
         shell: check passed, no version printed"
    );
}

#[test]
fn the_title_is_taken_once() {
    let mut status = ProjectStatus::default();
    let report = agent::AgentReport {
        status: berth_api::AgentStatus::default(),
        title: Some("first".into()),
    };
    assert!(agent_changed(&status, &report));
    apply_report(&mut status, &report);
    let later = agent::AgentReport {
        status: berth_api::AgentStatus::default(),
        title: Some("second".into()),
    };
    assert!(!agent_changed(&status, &later));
    apply_report(&mut status, &later);
    assert_eq!(status.title.as_deref(), Some("first"));
}
