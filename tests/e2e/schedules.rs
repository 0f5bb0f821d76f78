//! Scheduled briefs against a real LXD with the offline `shell` agent and a daemon whose clock
//! the test moves: a due schedule hands its brief over once however many of its times were
//! missed, `get -o wide` shows the next run, a changed `spec.brief` wins over an older run, a
//! stopped project's run is skipped and said so, an idled project is woken for its run, and
//! an agent with the `schedules` capability adds its own project's schedules, and nothing else.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::harness::{Berth, exec, unique_name};
use crate::pipeline_agent::{apply_profile, delete_profile};

/// A daemon running a scheduler round every second, whose clock reads `shift`'s seconds ahead.
struct Clocked {
    berth: Berth,
    shift: tempfile::NamedTempFile,
    _config: tempfile::NamedTempFile,
    profile: String,
}

impl Clocked {
    fn start() -> Clocked {
        let config = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(config.path(), "scheduler: {interval: 1s}\n").unwrap();
        let shift = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(shift.path(), "0").unwrap();
        let berth = Berth::start_with(
            &[(
                "BERTH_TESTING_CLOCK_SHIFT_FILE",
                shift.path().to_str().unwrap(),
            )],
            &["--config", config.path().to_str().unwrap()],
        );
        let profile = format!("shell-{}", &unique_name()[5..]);
        apply_profile(&berth, &profile);
        Clocked {
            berth,
            shift,
            _config: config,
            profile,
        }
    }

    /// Moves the daemon's clock so that it reads `at` plus `past`.
    fn set_clock(&self, at: DateTime<Utc>, past: Duration) {
        let seconds = (at - Utc::now()).num_seconds() + past.as_secs() as i64;
        std::fs::write(self.shift.path(), seconds.to_string()).unwrap();
    }

    /// Waits until the project is Ready, its agent finished `spec.brief` and its first schedule
    /// is planned: that brief's id and the schedule's next run.
    fn briefed_and_planned(&self, name: &str) -> (String, DateTime<Utc>) {
        self.berth.wait_ready(name);
        let first = self.wait_brief_done(name, None);
        let brief = first["status"]["briefId"].as_str().unwrap().to_string();
        let planned = self.berth.wait_for(name, "planned", |p| {
            p["status"]["schedules"][0]["nextRun"].is_string()
        });
        (brief, time(&planned["status"]["schedules"][0]["nextRun"]))
    }

    /// Waits until the agent finished the brief status names as current, other than `not`.
    fn wait_brief_done(&self, name: &str, not: Option<&str>) -> Value {
        self.berth.wait_for(name, "done with a new brief", |p| {
            let status = &p["status"];
            status["agent"]["state"] == "done"
                && status["agent"]["briefId"] == status["briefId"]
                && status["briefId"].as_str() != not
        })
    }
}

impl Drop for Clocked {
    fn drop(&mut self) {
        delete_profile(&self.berth, &self.profile);
    }
}

fn time(value: &Value) -> DateTime<Utc> {
    value
        .as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| panic!("not a time: {value}"))
}

/// The brief lines the shell agent worked since the container booted, in order (it logs every
/// line it works to /run/berth/shell.log).
fn worked(name: &str) -> Vec<String> {
    exec(name, "cat /run/berth/shell.log")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("mark-"))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_due_schedule_hands_its_brief_over_once_however_many_times_were_missed() {
    let mut clocked = Clocked::start();
    let name = unique_name();
    clocked.berth.create_project(
        &name,
        json!({
            "agent": clocked.profile,
            "brief": "mark-spec\n",
            "schedules": [{"cron": "0 * * * *", "brief": "mark-scheduled\n"}],
            "reap": {"idleAfter": "100d", "maxAge": "never"},
        }),
    );
    let (first_brief, due) = clocked.briefed_and_planned(&name);
    assert!(due > Utc::now(), "{due}");
    let wide = clocked
        .berth
        .cli_ok(&["get", "project", &name, "-o", "wide"]);
    assert!(wide.contains("NEXT RUN"), "{wide}");
    assert!(
        wide.lines().nth(1).is_some_and(|l| l.contains(" in ")),
        "{wide}"
    );

    // berth is "down" over three more of its times: the run happens once, for the first.
    clocked.set_clock(due, Duration::from_secs(3 * 3600 + 60));
    let ran = clocked.wait_brief_done(&name, Some(&first_brief));
    let status = &ran["status"];
    assert_eq!(time(&status["scheduledBrief"]["at"]), due, "{status}");
    assert_eq!(time(&status["schedules"][0]["lastRun"]), due);
    assert_eq!(
        time(&status["schedules"][0]["nextRun"]),
        due + chrono::Duration::hours(4)
    );
    assert_eq!(worked(&name), ["mark-spec", "mark-scheduled"]);
    clocked.berth.wait_passes("schedules", 3);
    assert_eq!(worked(&name), ["mark-spec", "mark-scheduled"]);
    let ran_events = clocked.berth.events_of(&name, "ScheduleRan");
    assert_eq!(ran_events.len(), 1, "{ran_events:?}");
    assert!(
        ran_events[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("0 * * * *")),
        "{ran_events:?}"
    );
    let scheduled_brief = status["briefId"].as_str().unwrap().to_string();

    // A spec.brief written after the run is newer: it goes to the agent.
    clocked
        .berth
        .patch_project(&name, json!({"spec": {"brief": "mark-again\n"}}));
    clocked.wait_brief_done(&name, Some(&scheduled_brief));
    assert_eq!(worked(&name), ["mark-spec", "mark-scheduled", "mark-again"]);

    // A project stopped by its spec stays stopped: the run is skipped, and said so.
    clocked.berth.cli_ok(&["stop", &name]);
    clocked
        .berth
        .wait_for(&name, "stopped", |p| p["status"]["phase"] == "Stopped");
    clocked.set_clock(due, Duration::from_secs(4 * 3600 + 60));
    let skipped = clocked.berth.wait_for(&name, "past its next run", |p| {
        p["status"]["schedules"][0]["lastRun"]
            .as_str()
            .is_some_and(|t| time(&json!(t)) == due + chrono::Duration::hours(4))
    });
    assert_eq!(time(&skipped["status"]["scheduledBrief"]["at"]), due);
    let said = clocked.berth.events_of(&name, "ScheduleSkipped");
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.state: Stopped")),
        "{said:?}"
    );
}

#[test]
fn a_schedule_wakes_an_idled_project_for_its_brief() {
    let mut clocked = Clocked::start();
    let name = unique_name();
    // Once a year, far enough ahead that idling the project does not reach it.
    clocked.berth.create_project(
        &name,
        json!({
            "agent": clocked.profile,
            "brief": "mark-spec\n",
            "schedules": [{"cron": "0 0 1 1 *", "brief": "mark-woken\n",
                           "timezone": "Europe/Paris"}],
            "reap": {"idleAfter": "5s", "idleAction": "Stop", "maxAge": "never"},
        }),
    );
    let (first_brief, due) = clocked.briefed_and_planned(&name);
    // Midnight in Paris is 23:00 or 22:00 UTC.
    assert!(
        matches!(due.format("%H:%M").to_string().as_str(), "23:00" | "22:00"),
        "{due}"
    );
    // Five seconds without activity: the reaper idles it.
    clocked.berth.wait_for(&name, "idled", |p| {
        p["status"]["reap"]["idledAt"].is_string() && p["status"]["phase"] == "Stopped"
    });

    clocked.set_clock(due, Duration::from_secs(30));
    let ran = clocked.wait_brief_done(&name, Some(&first_brief));
    assert_eq!(time(&ran["status"]["scheduledBrief"]["at"]), due);
    let woke = clocked.berth.events_of(&name, "WakeRequested");
    assert!(
        woke.iter().any(|e| e["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("a scheduled brief woke"))),
        "{woke:?}"
    );
    let stamp = due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let started = clocked.berth.events_of(&name, "RunnerStarted");
    assert!(
        started.iter().any(|e| e["message"]
            .as_str()
            .is_some_and(|m| m.ends_with(&format!("scheduled for {stamp}")))),
        "{started:?}"
    );
}

/// Runs `berth-schedule ARGS` in the project's container as its agent would, with `env` laid
/// over its environment.
fn berth_schedule(name: &str, env: &str, args: &str) -> Result<String, String> {
    exec(
        name,
        &format!("cd /workspace && {env} /workspace/.berth/bin/berth-schedule {args}"),
    )
}

#[test]
fn an_agent_adds_its_own_projects_schedules_and_nothing_else() {
    let mut clocked = Clocked::start();
    let (own, other) = (unique_name(), unique_name());
    for name in [&own, &other] {
        clocked.berth.create_project(
            name,
            json!({
                "agent": clocked.profile,
                "brief": "mark-spec\n",
                "capabilities": ["schedules"],
                "reap": {"idleAfter": "100d", "maxAge": "never"},
            }),
        );
    }
    clocked.berth.wait_ready(&own);
    clocked.berth.wait_ready(&other);
    let issued = clocked.berth.events_of(&own, "ProjectTokenIssued");
    assert_eq!(issued.len(), 1, "{issued:?}");
    let token = exec(&own, "sed -n 's/^BERTH_PROJECT_TOKEN=//p' /workspace/.env").unwrap();
    let token = token.trim().trim_matches(['"', '\'']);
    assert!(token.starts_with(&format!("berthp.{own}.")), "{token}");

    // The agent adds a schedule with the CLI berth published, and reads it back planned.
    let added = berth_schedule(&own, "", "add '30 6 * * *' 'Rebuild the index' Asia/Tokyo")
        .unwrap_or_else(|e| panic!("berth-schedule add: {e}"));
    assert!(added.contains("Rebuild the index"), "{added}");
    let planned = clocked.berth.wait_for(&own, "planned", |p| {
        p["status"]["schedules"][0]["nextRun"].is_string()
    });
    assert_eq!(
        planned["spec"]["schedules"],
        json!([{"cron": "30 6 * * *", "brief": "Rebuild the index", "timezone": "Asia/Tokyo"}])
    );
    let listed = berth_schedule(&own, "", "list").unwrap();
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["project"], own.as_str());
    assert!(listed["items"][0]["nextRun"].is_string(), "{listed}");
    assert_eq!(clocked.berth.events_of(&own, "ScheduleAdded").len(), 1);
    // A bad cron is refused naming its field, and nothing is written.
    let bad = berth_schedule(&own, "", "add '61 * * * *' 'never'").unwrap_err();
    assert!(bad.contains("spec.schedules[1].cron"), "{bad}");

    // Another project's name on this token, a token of no project, or none: the same refusal,
    // and the other project is untouched.
    let forged = token.replacen(&own, &other, 1);
    for env in [
        format!("BERTH_PROJECT_TOKEN={forged}"),
        format!("BERTH_PROJECT_TOKEN=berthp.{other}.{}", "0".repeat(64)),
        "BERTH_PROJECT_TOKEN=nobody BERTH_ENV_FILE=/dev/null".to_string(),
    ] {
        let refused = berth_schedule(&own, &env, "add '* * * * *' 'take over'").unwrap_err();
        assert!(
            refused.contains("no project for this token"),
            "{env}: {refused}"
        );
    }
    // The token opens the agent socket's schedules routes alone: any other path is 404.
    let secrets = exec(
        &own,
        &format!(
            "exec bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}; \
             printf \"GET /apis/berth.dev/v1alpha1/projects/{own}/secrets HTTP/1.1\\r\\nHost: b\\r\\n\
             Authorization: Bearer {token}\\r\\nConnection: close\\r\\n\\r\\n\" >&3; head -n 1 <&3'",
            port = berth_api::AGENT_API_PORT
        ),
    )
    .unwrap();
    assert!(secrets.starts_with("HTTP/1.1 404"), "{secrets}");
    let untouched = clocked.berth.get_project(&other).unwrap();
    assert!(untouched["spec"]["schedules"].is_null(), "{untouched}");
    assert_eq!(
        clocked.berth.get_project(&own).unwrap()["spec"]["schedules"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
}
