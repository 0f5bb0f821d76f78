//! Durable brief state: which brief the agent acknowledged and which it finished, kept in the
//! project's status in berth's store (not only on the container's `/run` tmpfs), so a reboot, a
//! wake or a replaced container never runs a finished brief again, and a brief interrupted
//! mid-work resumes the CLI's own session instead of starting over.

use std::collections::BTreeMap;

use berth_api::{AgentState, ProjectSpec, ProjectStatus, ScheduledBrief};
use chrono::SecondsFormat;

use super::{RESUME_SESSION_ENV, TITLE_KNOWN_ENV};

/// The id of a brief: the same for the same project and text, so recording it again after a
/// crash names the same brief, and a spec change that leaves the brief alone (a new generation
/// all the same) hands nothing over again.
pub fn brief_id(uid: &str, brief: &str) -> String {
    let digest = super::sha256_hex(format!("{uid}\0{brief}").as_bytes());
    format!("b-{}", &digest[..16])
}

/// The brief a scheduled run hands over: a new id for each run, even of the same text.
pub fn scheduled_brief_id(uid: &str, run: &ScheduledBrief) -> String {
    let at = run.at.to_rfc3339_opts(SecondsFormat::Secs, true);
    let digest = super::sha256_hex(format!("{uid}\0{}\0{at}", run.brief).as_bytes());
    format!("b-{}", &digest[..16])
}

/// The brief the agent is to work, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentBrief<'a> {
    pub id: String,
    pub text: &'a str,
    /// The schedule whose run handed it over; `None` for `spec.brief`.
    pub schedule: Option<&'a ScheduledBrief>,
}

/// The one answer to "which brief now": the last scheduled run's, unless `spec.brief` changed
/// since that run (the newer of the two wins), else `spec.brief`.
pub fn current_brief<'a>(
    uid: &str,
    spec: &'a ProjectSpec,
    status: &'a ProjectStatus,
) -> CurrentBrief<'a> {
    let own = brief_id(uid, &spec.brief);
    match &status.scheduled_brief {
        Some(run) if run.over == own => CurrentBrief {
            id: scheduled_brief_id(uid, run),
            text: &run.brief,
            schedule: Some(run),
        },
        _ => CurrentBrief {
            id: own,
            text: &spec.brief,
            schedule: None,
        },
    }
}

/// Whether brief `id` is finished (`done` or `failed`), by the store's record or the agent's
/// last report: it is never handed over again.
pub fn brief_finished(status: &ProjectStatus, id: &str) -> bool {
    status.brief_finished.as_deref() == Some(id)
        || status.agent.as_ref().is_some_and(|a| {
            matches!(a.state, AgentState::Done | AgentState::Failed)
                && a.brief_id.as_deref() == Some(id)
        })
}

/// Records in `status` what the agent's report (already in `status.agent`) says about the
/// current brief: acknowledged once it carries the brief's id, finished once it is `done` or
/// `failed`. Only ever moves forward for the current brief.
pub fn record_brief_progress(status: &mut ProjectStatus) {
    let (Some(current), Some(agent)) = (status.brief_id.clone(), status.agent.as_ref()) else {
        return;
    };
    if agent.brief_id.as_deref() != Some(current.as_str()) {
        return;
    }
    let finished = matches!(agent.state, AgentState::Done | AgentState::Failed);
    status.brief_acknowledged = Some(current.clone());
    if finished {
        status.brief_finished = Some(current);
    }
}

/// The runner's environment for brief `id`: the project's `env`, plus the session to resume
/// when the agent had acknowledged this brief and reported its session (an interrupted brief),
/// and whether a title is recorded already (the adapter does not ask for one again).
pub fn runner_env(
    env: &BTreeMap<String, String>,
    status: &ProjectStatus,
    id: &str,
) -> BTreeMap<String, String> {
    let mut env = env.clone();
    let session = status
        .agent
        .as_ref()
        .filter(|a| a.brief_id.as_deref() == Some(id))
        .and_then(|a| a.session_id.clone());
    if status.brief_acknowledged.as_deref() == Some(id)
        && let Some(session) = session
    {
        env.insert(RESUME_SESSION_ENV.to_string(), session);
    }
    if status.title.as_deref().is_some_and(|t| !t.is_empty()) {
        env.insert(TITLE_KNOWN_ENV.to_string(), "1".to_string());
    }
    env
}

#[cfg(test)]
mod tests {
    use berth_api::AgentStatus;

    use super::*;

    fn status(brief: &str, reported: Option<(&str, AgentState, Option<&str>)>) -> ProjectStatus {
        ProjectStatus {
            brief_id: Some(brief.to_string()),
            agent: reported.map(|(id, state, session)| AgentStatus {
                state,
                brief_id: Some(id.to_string()),
                session_id: session.map(str::to_string),
                ..AgentStatus::default()
            }),
            ..ProjectStatus::default()
        }
    }

    #[test]
    fn progress_moves_forward_for_the_current_brief_only() {
        // (reported brief, state, acknowledged, finished)
        let cases = [
            ("b1", AgentState::Working, true, false),
            ("b1", AgentState::Blocked, true, false),
            ("b1", AgentState::Done, true, true),
            ("b1", AgentState::Failed, true, true),
            ("b0", AgentState::Done, false, false),
        ];
        for (reported, state, acked, finished) in cases {
            let mut s = status("b1", Some((reported, state, None)));
            record_brief_progress(&mut s);
            assert_eq!(
                s.brief_acknowledged.is_some(),
                acked,
                "{reported} {state:?}"
            );
            assert_eq!(s.brief_finished.is_some(), finished, "{reported} {state:?}");
            assert_eq!(brief_finished(&s, "b1"), finished, "{reported} {state:?}");
        }
        // A fresh boot's report (no file yet, or working again) never unfinishes a brief.
        let mut s = status("b1", Some(("b1", AgentState::Done, None)));
        record_brief_progress(&mut s);
        s.agent = None;
        record_brief_progress(&mut s);
        assert!(brief_finished(&s, "b1"));
        assert!(!brief_finished(&s, "b2"));
    }

    #[test]
    fn an_interrupted_brief_resumes_its_session() {
        let project_env = BTreeMap::from([("A".to_string(), "1".to_string())]);
        let mut s = status("b1", Some(("b1", AgentState::Working, Some("sess-1"))));
        // Not acknowledged in the store yet: a fresh start.
        let env = runner_env(&project_env, &s, "b1");
        assert!(!env.contains_key(RESUME_SESSION_ENV));
        record_brief_progress(&mut s);
        let env = runner_env(&project_env, &s, "b1");
        assert_eq!(env[RESUME_SESSION_ENV], "sess-1");
        assert_eq!(env["A"], "1");
        assert!(!env.contains_key(TITLE_KNOWN_ENV));
        // Another brief never resumes this one's session.
        assert!(!runner_env(&project_env, &s, "b2").contains_key(RESUME_SESSION_ENV));
        s.title = Some("Fix the build".into());
        assert_eq!(runner_env(&project_env, &s, "b1")[TITLE_KNOWN_ENV], "1");
    }
}
