//! What the console shows, rendered from the API's own JSON answers (so a page holds exactly
//! what the API lets its reader see): the fleet's rows and the project page's sections. Pure
//! functions of their inputs and the time; every value goes through `esc`.

use std::fmt::Write as _;

use berth_api::{
    AgentProfileSpec, AgentState, ConditionStatus, ObjectMeta, ProjectStatus, ProtectionReason,
    ReapAction, condition_types, find_condition,
};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

use super::super::selector::LabelSelector;
use super::html::{esc, seg};
use crate::workspace::protection::{self, Evidence};

/// The fleet's filters, from the page's query (`?labelSelector=...&state=...&sort=...`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// A Kubernetes label selector, as the API takes it.
    pub selector: String,
    /// A phase (`Ready`, ...), or `protected`, `blocked`, `held`; empty for every state.
    pub state: String,
    /// The column rows are sorted by; empty for the name.
    pub sort: String,
    pub descending: bool,
}

/// The states the filter offers besides the phases.
const STATES: [(&str, &str); 3] = [
    ("protected", "Protected from reaping"),
    ("blocked", "Agent waiting for an answer"),
    ("held", "Deletion held"),
];

/// The columns rows sort by: key, heading.
pub const COLUMNS: [(&str, &str); 9] = [
    ("name", "Project"),
    ("phase", "Phase"),
    ("step", "Step"),
    ("agent", "Agent"),
    ("age", "Age"),
    ("activity", "Last activity"),
    ("ports", "Ports"),
    ("next", "Next reap action"),
    ("protected", "Protected because"),
];

impl Filter {
    pub fn from_query(query: &super::super::routes::Query) -> Filter {
        Filter {
            selector: query
                .get("labelSelector")
                .unwrap_or_default()
                .trim()
                .to_string(),
            state: query.get("state").unwrap_or_default().to_string(),
            sort: query
                .get("sort")
                .filter(|s| COLUMNS.iter().any(|(k, _)| k == s))
                .unwrap_or_default()
                .to_string(),
            descending: query.get("dir") == Some("desc"),
        }
    }

    /// The label selector, or the one-line error naming the field.
    pub fn label_selector(&self) -> Result<LabelSelector, String> {
        LabelSelector::parse(&self.selector).map_err(|e| format!("labelSelector: {e}"))
    }

    /// Whether `project` is in the chosen state (labels are the selector's business).
    pub fn shows_state(&self, project: &Project) -> bool {
        match self.state.as_str() {
            "" => true,
            "protected" => !project.protected_by.is_empty(),
            "blocked" => project.agent_state() == Some(AgentState::Blocked),
            "held" => project.held().is_some(),
            phase => project.status.phase.as_str() == phase,
        }
    }
}

/// One project as the API answered it, decoded once for rendering.
pub struct Project {
    pub raw: Value,
    pub meta: ObjectMeta,
    pub status: ProjectStatus,
    /// `workspace::protection::recorded` of the status: the one reading of what protects it.
    pub protected_by: Vec<ProtectionReason>,
}

impl Project {
    pub fn decode(raw: Value) -> Project {
        let meta: ObjectMeta = raw
            .get("metadata")
            .and_then(|m| serde_json::from_value(m.clone()).ok())
            .unwrap_or_default();
        let status: ProjectStatus = raw
            .get("status")
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .unwrap_or_default();
        let protected_by = protection::recorded(&status);
        Project {
            raw,
            meta,
            status,
            protected_by,
        }
    }

    pub fn name(&self) -> &str {
        &self.meta.name
    }

    pub fn uid(&self) -> &str {
        self.meta.uid.as_deref().unwrap_or_default()
    }

    /// The agent's title, else the name.
    pub fn title(&self) -> &str {
        self.status
            .title
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .unwrap_or(&self.meta.name)
    }

    pub fn agent_state(&self) -> Option<AgentState> {
        self.status.agent.as_ref().map(|a| a.state)
    }

    /// The agent's question, while it is blocked.
    pub fn question(&self) -> Option<&str> {
        self.status
            .agent
            .as_ref()
            .filter(|a| a.state == AgentState::Blocked)
            .map(|a| a.message.as_str())
    }

    /// Why the deletion is held, when it is.
    pub fn held(&self) -> Option<String> {
        self.meta.deletion_timestamp?;
        find_condition(&self.status.conditions, condition_types::DELETION_BLOCKED)
            .filter(|c| c.status == ConditionStatus::True)
            .map(|c| {
                if c.message.is_empty() {
                    c.reason.clone()
                } else {
                    c.message.clone()
                }
            })
    }

    /// What protects the workspace, in words: the files and commits, the agent's question, why
    /// inspection failed (`workspace::protection::cause` over the recorded status).
    pub fn protection_words(&self) -> String {
        if self.protected_by.is_empty() {
            return String::new();
        }
        let unsaved = self.status.unsaved_work.clone().unwrap_or_default();
        let evidence = if self
            .protected_by
            .contains(&ProtectionReason::InspectionFailed)
            && !unsaved.any()
        {
            Evidence::Failed
        } else {
            Evidence::Inspected(unsaved)
        };
        let failure = find_condition(&self.status.conditions, condition_types::REAP_PROTECTED)
            .map(|c| c.message.as_str())
            .filter(|m| !m.is_empty());
        let words = protection::cause(&self.protected_by, &evidence, failure, self.question());
        if words.is_empty() {
            protection::reasons_text(&self.protected_by)
        } else {
            words
        }
    }

    fn step(&self) -> &'static str {
        self.status.step.map(|s| s.as_str()).unwrap_or("")
    }

    fn next_reap(&self) -> Option<(ReapAction, Option<DateTime<Utc>>)> {
        let reap = self.status.reap.as_ref()?;
        reap.next_action.map(|a| (a, reap.next_action_at))
    }
}

/// `3d`, `5h`, `12m`, `40s` (as `kubectl` writes ages); `in 5m` for a time to come.
pub fn ago(now: DateTime<Utc>, then: DateTime<Utc>) -> String {
    let seconds = (now - then).num_seconds();
    let (future, s) = (seconds < 0, seconds.unsigned_abs());
    let text = match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    };
    if future { format!("in {text}") } else { text }
}

fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `<time>` with the exact instant as its title.
fn time(now: DateTime<Utc>, t: DateTime<Utc>, suffix: &str) -> String {
    format!(
        "<time datetime=\"{s}\" title=\"{s}\">{}{suffix}</time>",
        esc(&ago(now, t)),
        s = stamp(t)
    )
}

/// The link that opens a port's preview: the console asks for a one-time ticket, then sends
/// the browser to the preview host with it.
pub fn preview_href(name: &str, port: u16) -> String {
    format!("/ui/projects/{}/preview/{port}", seg(name))
}

/// The fleet table's row for `project`.
/// The fleet table's row for `project`; `csrf` goes into its forms (the preview buttons).
pub fn fleet_row(project: &Project, now: DateTime<Utc>, csrf: &str) -> String {
    let name = project.name();
    let phase = project.status.phase.as_str();
    let agent = project
        .status
        .agent
        .as_ref()
        .map(|a| a.state.as_str())
        .unwrap_or("");
    let created = project.meta.creation_timestamp;
    let activity = project.status.activity.as_ref();
    let active_at = activity.and_then(|a| a.last_active_at);
    let next = project.next_reap();
    let labels = project
        .meta
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let epoch = |t: Option<DateTime<Utc>>| t.map(|t| t.timestamp()).unwrap_or(0);
    let mut row = String::new();
    let _ = write!(
        row,
        "<tr id=\"p-{uid}\" data-uid=\"{uid}\" data-name=\"{n}\" data-phase=\"{phase}\" \
         data-step=\"{step}\" data-agent=\"{agent}\" data-age=\"{age}\" data-activity=\"{act}\" \
         data-ports=\"{ports}\" data-next=\"{next_at}\" data-protected=\"{prot}\" data-labels=\"{labels}\">",
        uid = esc(project.uid()),
        n = esc(name),
        step = project.step(),
        age = -epoch(created),
        act = epoch(active_at),
        ports = project.status.ports.len(),
        next_at = next
            .and_then(|(_, at)| at)
            .map(|t| t.timestamp())
            .unwrap_or(i64::MAX),
        prot = project.protected_by.len(),
        labels = esc(&labels),
    );
    let _ = write!(
        row,
        "<th scope=\"row\"><a href=\"/ui/projects/{}\">{}</a>",
        seg(name),
        esc(project.title())
    );
    if project.title() != name {
        let _ = write!(row, "<div class=\"sub\">{}</div>", esc(name));
    }
    if !labels.is_empty() {
        let _ = write!(row, "<div class=\"sub labels\">{}</div>", esc(&labels));
    }
    let _ = write!(
        row,
        "</th><td><span class=\"phase phase-{p}\">{p}</span></td><td>{}</td>",
        project.step(),
        p = phase
    );
    let _ = write!(row, "<td>{}</td>", agent_cell(project));
    let _ = write!(
        row,
        "<td>{}</td>",
        created.map(|t| time(now, t, "")).unwrap_or_default()
    );
    let _ = write!(row, "<td>");
    if let Some(at) = active_at {
        let _ = write!(row, "{}", time(now, at, " ago"));
        if let Some(source) = activity.and_then(|a| a.source) {
            let _ = write!(
                row,
                " <span class=\"sub\">({})</span>",
                esc(source.as_str())
            );
        }
    }
    let _ = write!(row, "</td><td>{}</td>", ports_cell(project, csrf));
    let _ = write!(row, "<td>");
    if let Some((action, at)) = next {
        let verb = match action {
            ReapAction::Stop => "stop",
            ReapAction::Delete => "delete",
        };
        let _ = write!(row, "{verb}");
        if let Some(at) = at {
            let _ = write!(row, " {}", time(now, at, ""));
        }
    }
    let _ = write!(row, "</td><td>{}</td></tr>", protection_cell(project));
    row
}

fn agent_cell(project: &Project) -> String {
    match &project.status.agent {
        Some(agent) if agent.state == AgentState::Blocked => format!(
            "<span class=\"flag blocked\">blocked</span> <a href=\"/ui/projects/{}#answer\">answer</a>",
            seg(project.name())
        ),
        Some(agent) => esc(agent.state.as_str()),
        None => String::new(),
    }
}

/// A button per reported port that opens its preview: a form, since opening one mints a
/// ticket (a write), so it carries the session's CSRF token like every other form.
fn ports_cell(project: &Project, csrf: &str) -> String {
    project
        .status
        .ports
        .iter()
        .map(|p| {
            format!(
                "<form method=\"post\" action=\"{}\" class=\"inline port\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                 <button type=\"submit\" class=\"link\" title=\"Open {} with a one-time preview ticket\">{}</button></form>",
                preview_href(project.name(), p.port),
                esc(csrf),
                esc(&p.url),
                p.port
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The protections and a held deletion, marked and said in words.
pub fn protection_cell(project: &Project) -> String {
    let mut cell = String::new();
    if !project.protected_by.is_empty() {
        let _ = write!(
            cell,
            "<span class=\"flag protected\">{}</span> <span class=\"why\">{}</span>",
            esc(&protection::reasons_text(&project.protected_by)),
            esc(&project.protection_words())
        );
    }
    if let Some(held) = project.held() {
        let _ = write!(
            cell,
            "<div><span class=\"flag held\">deletion held</span> <span class=\"why\">{}</span></div>",
            esc(&held)
        );
    }
    cell
}

/// The fleet page's body: the filters, then the table of `rows` (already filtered).
pub fn fleet(
    projects: &[Project],
    filter: &Filter,
    now: DateTime<Utc>,
    csrf: &str,
    error: Option<&str>,
) -> String {
    let mut html = String::from("<h1>Fleet</h1>");
    let _ = write!(
        html,
        "<form method=\"get\" action=\"/ui/\" class=\"filters\" role=\"search\">\
         <label for=\"labelSelector\">Labels</label>\
         <input id=\"labelSelector\" name=\"labelSelector\" value=\"{}\" placeholder=\"team=web,tier!=db\">\
         <label for=\"state\">State</label><select id=\"state\" name=\"state\">",
        esc(&filter.selector)
    );
    let _ = write!(html, "<option value=\"\">Any</option>");
    let phases = berth_api::Phase::ALL.map(|p| (p.as_str(), p.as_str()));
    for (value, text) in phases.iter().chain(STATES.iter()) {
        let selected = if filter.state == *value {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            html,
            "<option value=\"{value}\"{selected}>{}</option>",
            esc(text)
        );
    }
    let _ = write!(
        html,
        "</select><input type=\"hidden\" name=\"sort\" value=\"{}\">\
         <button type=\"submit\">Filter</button></form>",
        esc(&filter.sort)
    );
    if let Some(error) = error {
        let _ = write!(html, "<p class=\"error\" role=\"alert\">{}</p>", esc(error));
    }
    let _ = write!(
        html,
        "<p class=\"live\" aria-live=\"polite\" id=\"live-status\"></p>\
         <table id=\"fleet\" data-sort=\"{}\" data-dir=\"{}\"><caption class=\"visually-hidden\">Projects you may see</caption><thead><tr>",
        esc(&filter.sort),
        if filter.descending { "desc" } else { "asc" }
    );
    for (key, heading) in COLUMNS {
        let current = filter.sort == key || (filter.sort.is_empty() && key == "name");
        let aria = match (current, filter.descending) {
            (false, _) => "none",
            (true, false) => "ascending",
            (true, true) => "descending",
        };
        let dir = if current && !filter.descending {
            "desc"
        } else {
            "asc"
        };
        let query = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("labelSelector", &filter.selector)
            .append_pair("state", &filter.state)
            .append_pair("sort", key)
            .append_pair("dir", dir)
            .finish();
        let _ = write!(
            html,
            "<th scope=\"col\" aria-sort=\"{aria}\"><a class=\"sort\" data-key=\"{key}\" href=\"/ui/?{}\">{heading}</a></th>",
            esc(&query)
        );
    }
    let _ = write!(html, "</tr></thead><tbody>");
    for project in projects {
        html.push_str(&fleet_row(project, now, csrf));
    }
    let _ = write!(html, "</tbody></table>");
    if projects.is_empty() {
        let _ = write!(html, "<p id=\"empty\">No projects to show.</p>");
    }
    html
}

/// Sorts `projects` by the filter's column (the name breaks ties).
pub fn sort(projects: &mut [Project], filter: &Filter) {
    let key = |p: &Project| -> (String, i64) {
        match filter.sort.as_str() {
            "phase" => (p.status.phase.as_str().to_string(), 0),
            "step" => (String::new(), p.status.step.map(|s| s as i64).unwrap_or(-1)),
            "agent" => (
                p.agent_state()
                    .map(|a| a.as_str())
                    .unwrap_or("")
                    .to_string(),
                0,
            ),
            "age" => (
                String::new(),
                -p.meta
                    .creation_timestamp
                    .map(|t| t.timestamp())
                    .unwrap_or(0),
            ),
            "activity" => (
                String::new(),
                p.status
                    .activity
                    .as_ref()
                    .and_then(|a| a.last_active_at)
                    .map(|t| t.timestamp())
                    .unwrap_or(0),
            ),
            "ports" => (String::new(), p.status.ports.len() as i64),
            "next" => (
                String::new(),
                p.next_reap()
                    .and_then(|(_, at)| at)
                    .map(|t| t.timestamp())
                    .unwrap_or(i64::MAX),
            ),
            "protected" => (String::new(), p.protected_by.len() as i64),
            _ => (String::new(), 0),
        }
    };
    projects.sort_by(|a, b| {
        let order = key(a).cmp(&key(b));
        let order = if filter.descending {
            order.reverse()
        } else {
            order
        };
        order.then_with(|| a.name().cmp(b.name()))
    });
}

/// The project page's live part: what it is, where it stands, what protects it, its
/// conditions and its recent events. Replaced whole by each live update.
pub fn project_summary(
    project: &Project,
    events: &Value,
    now: DateTime<Utc>,
    csrf: &str,
) -> String {
    let mut html = String::new();
    let _ = write!(
        html,
        "<dl class=\"facts\"><dt>Name</dt><dd>{}</dd><dt>Phase</dt><dd><span class=\"phase phase-{p}\">{p}</span></dd>\
         <dt>Step</dt><dd>{}</dd><dt>Agent</dt><dd>{}</dd>",
        esc(project.name()),
        project.step(),
        agent_cell(project),
        p = project.status.phase.as_str()
    );
    if let Some(t) = project.meta.creation_timestamp {
        let _ = write!(html, "<dt>Age</dt><dd>{}</dd>", time(now, t, ""));
    }
    if let Some(activity) = &project.status.activity
        && let Some(at) = activity.last_active_at
    {
        let source = activity.source.map(|s| s.as_str()).unwrap_or("unknown");
        let _ = write!(
            html,
            "<dt>Last activity</dt><dd>{} ({})</dd>",
            time(now, at, " ago"),
            esc(source)
        );
    }
    if let Some((action, at)) = project.next_reap() {
        let _ = write!(
            html,
            "<dt>Next reap action</dt><dd>{}",
            esc(action.metric_label())
        );
        if let Some(at) = at {
            let _ = write!(html, " {}", time(now, at, ""));
        }
        let _ = write!(html, "</dd>");
    }
    if !project.status.ports.is_empty() {
        let _ = write!(html, "<dt>Ports</dt><dd>{}</dd>", ports_cell(project, csrf));
    }
    if !project.status.message.is_empty() {
        let _ = write!(
            html,
            "<dt>Message</dt><dd>{}</dd>",
            esc(&project.status.message)
        );
    }
    let _ = write!(html, "</dl>");
    let protection = protection_cell(project);
    if !protection.is_empty() {
        let _ = write!(
            html,
            "<section aria-labelledby=\"h-protected\"><h2 id=\"h-protected\">Kept alive</h2><p class=\"protection\">{protection}</p></section>"
        );
    }
    if let Some(question) = project.question() {
        let _ = write!(
            html,
            "<section aria-labelledby=\"h-question\"><h2 id=\"h-question\">The agent asks</h2><blockquote class=\"question\">{}</blockquote></section>",
            esc(question)
        );
    }
    html.push_str(&schedules_section(project, now));
    let _ = write!(
        html,
        "<section aria-labelledby=\"h-conditions\"><h2 id=\"h-conditions\">Conditions</h2><table><thead><tr>\
         <th scope=\"col\">Type</th><th scope=\"col\">Status</th><th scope=\"col\">Reason</th><th scope=\"col\">Message</th><th scope=\"col\">Since</th></tr></thead><tbody>"
    );
    for c in &project.status.conditions {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&c.type_),
            esc(match c.status {
                ConditionStatus::True => "True",
                ConditionStatus::False => "False",
                ConditionStatus::Unknown => "Unknown",
            }),
            esc(&c.reason),
            esc(&c.message),
            time(now, c.last_transition_time, " ago")
        );
    }
    let _ = write!(html, "</tbody></table></section>");
    let _ = write!(
        html,
        "<section aria-labelledby=\"h-events\"><h2 id=\"h-events\">Recent events</h2><table><thead><tr>\
         <th scope=\"col\">Last seen</th><th scope=\"col\">Type</th><th scope=\"col\">Reason</th><th scope=\"col\">Message</th><th scope=\"col\">Count</th></tr></thead><tbody>"
    );
    let items = events["items"].as_array().cloned().unwrap_or_default();
    for event in items.iter().rev().take(50) {
        let last = event["lastTimestamp"]
            .as_str()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| time(now, t.with_timezone(&Utc), " ago"))
            .unwrap_or_default();
        let _ = write!(
            html,
            "<tr><td>{last}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(event["type"].as_str().unwrap_or_default()),
            esc(event["reason"].as_str().unwrap_or_default()),
            esc(event["message"].as_str().unwrap_or_default()),
            event["count"].as_i64().unwrap_or(1)
        );
    }
    let _ = write!(html, "</tbody></table></section>");
    html
}

/// The project's schedules with their next and last runs; empty without any.
fn schedules_section(project: &Project, now: DateTime<Utc>) -> String {
    let Some(specs) = project.raw["spec"]["schedules"]
        .as_array()
        .filter(|s| !s.is_empty())
    else {
        return String::new();
    };
    let mut html = String::from(
        "<section aria-labelledby=\"h-schedules\"><h2 id=\"h-schedules\">Schedules</h2><table><thead><tr>\
         <th scope=\"col\">Cron</th><th scope=\"col\">Timezone</th><th scope=\"col\">Next run</th><th scope=\"col\">Last run</th><th scope=\"col\">Brief</th></tr></thead><tbody>",
    );
    for (n, spec) in specs.iter().enumerate() {
        let cron = spec["cron"].as_str().unwrap_or_default();
        let recorded = project.status.recorded_schedule(n, cron);
        let at = |t: Option<DateTime<Utc>>, suffix: &str| {
            t.map(|t| time(now, t, suffix)).unwrap_or_default()
        };
        let _ = write!(
            html,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(cron),
            esc(spec["timezone"]
                .as_str()
                .filter(|z| !z.is_empty())
                .unwrap_or("UTC")),
            at(recorded.and_then(|r| r.next_run), ""),
            at(recorded.and_then(|r| r.last_run), " ago"),
            esc(spec["brief"].as_str().unwrap_or_default())
        );
    }
    html.push_str("</tbody></table></section>");
    html
}

/// The project's skills: for each profile it lists, the skills the profile places, where they
/// come from, where they go and how many files berth placed there (`status.seededFiles`).
/// `profiles` are the API's answers for each profile, or why one could not be read.
pub fn skills(project: &Project, profiles: &[(String, Result<Value, String>)]) -> String {
    let mut rows = String::new();
    let mut unread = String::new();
    for (name, answer) in profiles {
        let spec = match answer {
            Ok(profile) => profile
                .get("spec")
                .and_then(|s| serde_json::from_value::<AgentProfileSpec>(s.clone()).ok())
                .unwrap_or_default(),
            Err(why) => {
                let _ = write!(
                    unread,
                    "<p class=\"sub\">Profile {}: {}</p>",
                    esc(name),
                    esc(why)
                );
                continue;
            }
        };
        for skill in &spec.skills {
            let at = skill.placed_at().unwrap_or_default();
            let inside = format!("{at}/");
            let files = project
                .status
                .seeded_files
                .keys()
                .filter(|p| p.starts_with(&inside))
                .count();
            let _ = write!(
                rows,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{files}</td></tr>",
                esc(name),
                esc(skill.name().unwrap_or_default()),
                esc(&skill.source()),
                esc(&at),
            );
        }
    }
    let body = if rows.is_empty() {
        "<p class=\"sub\">None of the project's agent profiles places skills.</p>".to_string()
    } else {
        format!(
            "<table><thead><tr><th scope=\"col\">Profile</th><th scope=\"col\">Skill</th>\
             <th scope=\"col\">From</th><th scope=\"col\">Placed at</th><th scope=\"col\">Files placed</th>\
             </tr></thead><tbody>{rows}</tbody></table>"
        )
    };
    format!(
        "<section aria-labelledby=\"h-skills\"><h2 id=\"h-skills\">Skills</h2>{body}{unread}</section>"
    )
}

/// The live runtime figures, as the API's `runtime` route answered them (or why not).
pub fn runtime_figures(answer: Result<&Value, &str>) -> String {
    match answer {
        Ok(figures) => format!(
            "<pre class=\"figures\" tabindex=\"0\" aria-label=\"Runtime figures\">{}</pre>",
            esc(&serde_json::to_string_pretty(figures).unwrap_or_default())
        ),
        Err(why) => format!("<p class=\"sub\">{}</p>", esc(why)),
    }
}

/// The spec, as YAML-like pretty JSON.
pub fn spec(project: &Project) -> String {
    format!(
        "<pre class=\"spec\" tabindex=\"0\" aria-label=\"Spec\">{}</pre>",
        esc(&serde_json::to_string_pretty(&project.raw["spec"]).unwrap_or_default())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        "2026-12-02T12:00:00Z".parse().unwrap()
    }

    fn project(status: Value) -> Project {
        Project::decode(json!({
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "Project",
            "metadata": {"name": "web", "uid": "u-1", "creationTimestamp": "2026-12-01T12:00:00Z",
                         "labels": {"team": "<b>"}},
            "spec": {"image": "berth-tiny"},
            "status": status,
        }))
    }

    #[test]
    fn the_page_lists_schedules_with_their_runs() {
        let mut project = project(json!({"schedules": [
            {"id": "s-1", "cron": "0 * * * *", "nextRun": "2026-12-02T13:00:00Z",
             "lastRun": "2026-12-02T11:00:00Z"}]}));
        project.raw["spec"] = json!({"schedules": [
            {"cron": "0 * * * *", "brief": "Check <the> build"}]});
        let html = schedules_section(&project, now());
        assert!(
            html.contains("<h2 id=\"h-schedules\">Schedules</h2>"),
            "{html}"
        );
        assert!(
            html.contains("<code>0 * * * *</code></td><td>UTC</td>"),
            "{html}"
        );
        assert!(
            html.contains(">in 60m</time>") && html.contains(">60m ago</time>"),
            "{html}"
        );
        assert!(html.contains("Check &lt;the&gt; build"), "{html}");
        project.raw["spec"] = json!({});
        assert_eq!(schedules_section(&project, now()), "");
    }

    #[test]
    fn skills_show_each_profiles_skills_with_their_files_placed() {
        let project = project(json!({"seededFiles": {
            "/workspace/.claude/skills/pdf/SKILL.md": "a",
            "/workspace/.claude/skills/pdf/x.sh": "b",
            "/workspace/.claude/skills/pdfx/SKILL.md": "c",
        }}));
        let claude = json!({"spec": {"home": "/root/.claude", "install": {"check": "true"},
            "runner": {"command": ["claude"]},
            "skills": [{"path": "/srv/skills/pdf", "target": ".claude/skills"},
                       {"repo": {"url": "https://u:t@git.example/<review>.git", "branch": "main"},
                        "target": ".claude/skills"}]}});
        let html = skills(
            &project,
            &[
                ("claude".into(), Ok(claude)),
                (
                    "gone".into(),
                    Err("agent profile \"gone\" not found".into()),
                ),
            ],
        );
        assert!(html.contains("<td>claude</td><td>pdf</td><td>/srv/skills/pdf</td><td><code>/workspace/.claude/skills/pdf</code></td><td>2</td>"), "{html}");
        // Escaped, and without the URL's credentials.
        assert!(
            html.contains("https://***@git.example/&lt;review&gt;.git (main)"),
            "{html}"
        );
        assert!(!html.contains("u:t@"), "{html}");
        assert!(
            html.contains("Profile gone: agent profile &quot;gone&quot; not found"),
            "{html}"
        );
        let none = skills(&project, &[]);
        assert!(none.contains("None of the project's agent profiles places skills."));
    }

    #[test]
    fn ages_read_like_kubectl() {
        let table = [
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (7199, "119m"),
            (7200, "2h"),
            (172_800, "2d"),
            (-300, "in 5m"),
        ];
        for (seconds, want) in table {
            let then = now() - chrono::Duration::seconds(seconds);
            assert_eq!(ago(now(), then), want, "{seconds}");
        }
    }

    #[test]
    fn a_row_marks_unsaved_work_and_names_the_file() {
        let p = project(json!({
            "phase": "Ready", "step": "Briefed",
            "title": "Fix <the> bug",
            "agent": {"state": "idle", "message": ""},
            "unsavedWork": {"untracked": 1, "files": ["notes <1>.txt"]},
            "reap": {"protectedBy": ["UnsavedWork"], "nextAction": "Stop", "nextActionAt": "2026-12-02T13:00:00Z"},
            "activity": {"lastActiveAt": "2026-12-02T11:55:00Z", "source": "files"},
            "ports": [{"port": 8000, "url": "http://web--8000.localhost:7481"}],
        }));
        let row = fleet_row(&p, now(), "tok<en>");
        assert!(row.contains("Fix &lt;the&gt; bug"), "{row}");
        assert!(row.contains("UnsavedWork"), "{row}");
        assert!(row.contains("notes &lt;1&gt;.txt"), "{row}");
        assert!(row.contains("1 untracked files"), "{row}");
        assert!(row.contains("5m ago"), "{row}");
        assert!(row.contains("(files)"), "{row}");
        assert!(
            row.contains("<form method=\"post\" action=\"/ui/projects/web/preview/8000\""),
            "{row}"
        );
        assert!(
            row.contains("name=\"csrf\" value=\"tok&lt;en&gt;\""),
            "{row}"
        );
        assert!(row.contains("stop <time"), "{row}");
        assert!(row.contains("in 60m"), "{row}");
        assert!(row.contains("team=&lt;b&gt;"), "{row}");
        assert!(!row.contains("<b>"), "{row}");
    }

    #[test]
    fn a_blocked_agent_is_a_protection_with_its_question() {
        let p = project(json!({
            "phase": "Ready",
            "agent": {"state": "blocked", "message": "which <colour>?"},
        }));
        assert_eq!(p.protected_by, vec![ProtectionReason::AgentBlocked]);
        assert_eq!(p.protection_words(), "the agent asks: which <colour>?");
        let row = fleet_row(&p, now(), "");
        assert!(
            row.contains("the agent asks: which &lt;colour&gt;?"),
            "{row}"
        );
        assert_eq!(p.title(), "web", "falls back to the name");
        let summary = project_summary(&p, &json!({"items": []}), now(), "");
        assert!(
            summary.contains("<blockquote class=\"question\">which &lt;colour&gt;?</blockquote>")
        );
    }

    #[test]
    fn a_held_deletion_is_marked_with_its_reason() {
        let p = Project::decode(json!({
            "metadata": {"name": "web", "uid": "u-1", "deletionTimestamp": "2026-12-02T11:00:00Z"},
            "status": {"phase": "Deleting", "conditions": [{
                "type": "DeletionBlocked", "status": "True", "reason": "UnsavedWork",
                "message": "deletion held: 2 commits on no remote", "lastTransitionTime": "2026-12-02T11:00:00Z"}]},
        }));
        assert_eq!(
            p.held().as_deref(),
            Some("deletion held: 2 commits on no remote")
        );
        let cell = protection_cell(&p);
        assert!(cell.contains("deletion held"), "{cell}");
        assert!(cell.contains("2 commits on no remote"), "{cell}");
    }

    #[test]
    fn filters_by_state_and_sorts_by_column() {
        let mut projects = vec![
            Project::decode(
                json!({"metadata": {"name": "b", "creationTimestamp": "2026-12-01T00:00:00Z"},
                "status": {"phase": "Ready", "agent": {"state": "blocked", "message": "?"}}}),
            ),
            Project::decode(
                json!({"metadata": {"name": "a", "creationTimestamp": "2026-12-02T00:00:00Z"},
                "status": {"phase": "Stopped"}}),
            ),
        ];
        let table = [
            ("", 2),
            ("Ready", 1),
            ("Stopped", 1),
            ("blocked", 1),
            ("protected", 1),
            ("held", 0),
        ];
        for (state, shown) in table {
            let filter = Filter {
                state: state.into(),
                ..Filter::default()
            };
            assert_eq!(
                projects.iter().filter(|p| filter.shows_state(p)).count(),
                shown,
                "{state}"
            );
        }
        let names = |ps: &[Project]| ps.iter().map(|p| p.name().to_string()).collect::<Vec<_>>();
        sort(&mut projects, &Filter::default());
        assert_eq!(names(&projects), ["a", "b"]);
        let by_age = Filter {
            sort: "age".into(),
            ..Filter::default()
        };
        sort(&mut projects, &by_age);
        assert_eq!(names(&projects), ["a", "b"], "youngest first");
        sort(
            &mut projects,
            &Filter {
                descending: true,
                ..by_age
            },
        );
        assert_eq!(names(&projects), ["b", "a"]);
    }
}
