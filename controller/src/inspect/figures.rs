//! A project's live figures, read from LXD in one instance call (state included) and one exec:
//! what `GET .../projects/NAME/runtime` returns and `berth describe` shows.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;
use serde_json::Value;

use super::shell_quote;
use crate::runtime::{ExecRequest, Instance, Runtime, RuntimeError};

/// How long the inspection exec may take: agent version checks start programs.
const INSPECT_TIMEOUT: Duration = Duration::from_secs(30);
/// The managed env file that holds the project's secrets; its age is the credentials' age.
const CREDENTIALS_FILE: &str = "/workspace/.env";
/// A version line longer than this is cut: it is untrusted output from inside the container.
const MAX_VERSION_CHARS: usize = 120;
/// Starts a section of the inspection script's output.
const MARK: &str = "@@berth ";

/// What an agent profile asks of the container, as far as inspection is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentProbe {
    pub profile: String,
    /// `install.check`: exits 0 when the CLI is installed, usually printing its version.
    pub check: String,
    /// `instructions.target`, when the profile has instructions.
    pub instructions: Option<String>,
}

impl AgentProbe {
    /// Reads the probe out of an AgentProfile's spec.
    pub fn from_spec(profile: &str, spec: &Value) -> AgentProbe {
        AgentProbe {
            profile: profile.to_string(),
            check: spec["install"]["check"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            // Targets may be relative to /workspace; the probe runs elsewhere, so resolve them.
            instructions: spec["instructions"]["target"]
                .as_str()
                .and_then(|t| berth_api::workspace_file_path(t).ok()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeFigures {
    pub status: String,
    pub container: Identity,
    pub processes: i64,
    pub cpu: Cpu,
    pub memory: Memory,
    /// Bytes used per disk device (not every storage driver reports it).
    pub disk: BTreeMap<String, u64>,
    pub network: BTreeMap<String, Interface>,
    /// Absent when the container is not running: there is nothing to exec in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub os: Option<OperatingSystem>,
    pub agents: Vec<AgentState>,
    /// When the file holding the project's secrets was last written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials_updated_at: Option<DateTime<Utc>>,
    /// The last time a person ran something through berth (since the daemon started).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_activity: Option<LastActivity>,
    pub inspected_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastActivity {
    pub at: DateTime<Utc>,
    pub source: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub image_fingerprint: Option<String>,
    pub architecture: Option<String>,
    pub pid: i64,
    pub created_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub location: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cpu {
    pub usage_seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    pub usage_bytes: u64,
    pub peak_bytes: u64,
    pub swap_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    pub addresses: Vec<String>,
    /// Hardware address; empty when the interface has none (loopback).
    pub mac: String,
    pub mtu: u32,
    pub bytes_received: u64,
    pub bytes_sent: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatingSystem {
    pub distribution: String,
    pub kernel: String,
    pub architecture: String,
    pub uptime_seconds: f64,
    pub cpu_count: u32,
    pub hostname: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentState {
    pub profile: String,
    pub installed: bool,
    /// The first line the install check printed, usually the version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    pub instructions_present: bool,
}

/// Reads the figures of the container `instance` (as read with its state, and checked to be the
/// project's): when it runs, one exec for what only the inside knows.
pub async fn inspect(
    runtime: &dyn Runtime,
    instance: &Instance,
    agents: &[AgentProbe],
) -> Result<RuntimeFigures, RuntimeError> {
    let name = instance.name.as_str();
    let mut figures = from_instance(instance);
    if instance.is_running() {
        let request = ExecRequest::new(["sh", "-c", &script(agents)], INSPECT_TIMEOUT);
        let output = runtime.exec(name, &request).await?;
        let inside = Inside::parse(&output.stdout_str());
        apply_inside(&mut figures, inside, agents);
    } else {
        figures.agents = agents
            .iter()
            .map(|a| AgentState {
                profile: a.profile.clone(),
                installed: false,
                version: None,
                instructions: a.instructions.clone(),
                instructions_present: false,
            })
            .collect();
    }
    Ok(figures)
}

fn from_instance(instance: &Instance) -> RuntimeFigures {
    let state = instance.state.clone().unwrap_or_default();
    RuntimeFigures {
        status: format!("{:?}", instance.status),
        container: Identity {
            name: instance.name.clone(),
            // berth creates containers only.
            kind: "container",
            image_fingerprint: instance.base_image().map(str::to_string),
            architecture: instance.config.get("image.architecture").cloned(),
            pid: state.pid,
            created_at: instance.created_at,
            last_used_at: instance.last_used_at,
            location: instance.location.clone(),
        },
        processes: state.processes,
        cpu: Cpu {
            usage_seconds: state.cpu_usage_ns as f64 / 1e9,
        },
        memory: Memory {
            usage_bytes: state.memory_usage_bytes,
            peak_bytes: state.memory_peak_bytes,
            swap_bytes: state.swap_usage_bytes,
        },
        disk: state.disk_usage_bytes.clone(),
        network: state
            .network
            .iter()
            .map(|(name, n)| {
                (
                    name.clone(),
                    Interface {
                        addresses: n.addresses.clone(),
                        mac: n.mac.clone(),
                        mtu: n.mtu,
                        bytes_received: n.bytes_received,
                        bytes_sent: n.bytes_sent,
                    },
                )
            })
            .collect(),
        os: None,
        agents: Vec::new(),
        credentials_updated_at: None,
        last_activity: None,
        inspected_at: Utc::now(),
    }
}

/// The inspection script: POSIX sh (busybox images have no bash), one marked section per fact.
/// Nothing in it writes, so inspecting never looks like activity.
fn script(agents: &[AgentProbe]) -> String {
    let mut s = String::from(
        "mark() { printf '@@berth %s\\n' \"$*\"; }\n\
         mark os-release; cat /etc/os-release 2>/dev/null\n\
         mark kernel; uname -r\n\
         mark arch; uname -m\n\
         mark uptime; cut -d' ' -f1 /proc/uptime\n\
         mark init-stat; cat /proc/1/stat\n\
         mark clock-ticks; getconf CLK_TCK 2>/dev/null || echo 100\n\
         mark cpus; nproc 2>/dev/null || grep -c ^processor /proc/cpuinfo\n\
         mark hostname; cat /proc/sys/kernel/hostname\n",
    );
    s.push_str(&format!(
        "mark credentials; stat -c %Y {} 2>/dev/null\n",
        shell_quote(CREDENTIALS_FILE)
    ));
    for (i, agent) in agents.iter().enumerate() {
        if !agent.check.is_empty() {
            s.push_str(&format!(
                "mark agent {i}; out=$(sh -c {} </dev/null 2>&1); rc=$?; \
                 printf '%s\\n' \"$out\" | head -n 1; mark agent-exit {i} $rc\n",
                shell_quote(&agent.check)
            ));
        }
        if let Some(target) = &agent.instructions {
            s.push_str(&format!(
                "mark instructions {i}; test -f {} && echo present\n",
                shell_quote(target)
            ));
        }
    }
    s
}

/// The script's output, by section.
#[derive(Debug, Default, PartialEq)]
struct Inside {
    sections: BTreeMap<String, String>,
}

impl Inside {
    fn parse(output: &str) -> Inside {
        let mut sections = BTreeMap::new();
        let mut current: Option<String> = None;
        for line in output.lines() {
            if let Some(key) = line.strip_prefix(MARK) {
                current = Some(key.trim().to_string());
                sections
                    .entry(key.trim().to_string())
                    .or_insert_with(String::new);
            } else if let Some(key) = &current {
                let section = sections.entry(key.clone()).or_insert_with(String::new);
                section.push_str(line);
                section.push('\n');
            }
        }
        Inside { sections }
    }

    fn first_line(&self, key: &str) -> String {
        self.sections
            .get(key)
            .and_then(|s| s.lines().next())
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// The key of an `agent-exit I CODE` marker, whose value sits in the key itself.
    fn exit_code(&self, index: usize) -> Option<i32> {
        let prefix = format!("agent-exit {index} ");
        self.sections
            .keys()
            .find_map(|k| k.strip_prefix(&prefix))
            .and_then(|code| code.trim().parse().ok())
    }
}

fn apply_inside(figures: &mut RuntimeFigures, inside: Inside, agents: &[AgentProbe]) {
    let os = OperatingSystem {
        distribution: distribution(inside.sections.get("os-release").map(String::as_str)),
        kernel: inside.first_line("kernel"),
        architecture: inside.first_line("arch"),
        uptime_seconds: uptime(&inside),
        cpu_count: inside.first_line("cpus").parse().unwrap_or_default(),
        hostname: inside.first_line("hostname"),
    };
    if figures.container.architecture.is_none() && !os.architecture.is_empty() {
        figures.container.architecture = Some(os.architecture.clone());
    }
    figures.os = Some(os);
    figures.credentials_updated_at = inside
        .first_line("credentials")
        .parse::<i64>()
        .ok()
        .and_then(|secs| Utc.timestamp_opt(secs, 0).single());
    figures.agents = agents
        .iter()
        .enumerate()
        .map(|(i, agent)| {
            let installed = inside.exit_code(i) == Some(0);
            let version = Some(inside.first_line(&format!("agent {i}")))
                .filter(|v| installed && !v.is_empty())
                .map(|v| clean(&v));
            AgentState {
                profile: agent.profile.clone(),
                installed,
                version,
                instructions: agent.instructions.clone(),
                instructions_present: inside.first_line(&format!("instructions {i}")) == "present",
            }
        })
        .collect();
}

/// Seconds since the container's init started. Without lxcfs `/proc/uptime` is the host's, so
/// the init's start (in clock ticks since host boot) is taken off it; with lxcfs it is already
/// the container's and the subtraction would go negative, so it is used as it is.
fn uptime(inside: &Inside) -> f64 {
    let proc_uptime: f64 = inside.first_line("uptime").parse().unwrap_or_default();
    let ticks: f64 = inside.first_line("clock-ticks").parse().unwrap_or(100.0);
    let init_start = inside
        .first_line("init-stat")
        .rsplit_once(')')
        .and_then(|(_, fields)| fields.split_whitespace().nth(19)?.parse::<f64>().ok());
    match init_start {
        Some(start) if ticks > 0.0 && proc_uptime - start / ticks > 0.0 => {
            proc_uptime - start / ticks
        }
        _ => proc_uptime,
    }
}

/// `PRETTY_NAME` from os-release, else `NAME VERSION_ID`, else "unknown".
fn distribution(os_release: Option<&str>) -> String {
    let fields: BTreeMap<&str, String> = os_release
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim().trim_matches('"').to_string()))
        .collect();
    if let Some(pretty) = fields.get("PRETTY_NAME").filter(|p| !p.is_empty()) {
        return clean(pretty);
    }
    match (fields.get("NAME"), fields.get("VERSION_ID")) {
        (Some(name), Some(version)) => clean(&format!("{name} {version}")),
        (Some(name), None) => clean(name),
        _ => "unknown".to_string(),
    }
}

/// Untrusted text from inside the container: no control characters, bounded length.
fn clean(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_control())
        .take(MAX_VERSION_CHARS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probes() -> Vec<AgentProbe> {
        vec![
            AgentProbe {
                profile: "shell".to_string(),
                check: "bash --version".to_string(),
                instructions: Some("/workspace/AGENTS.md".to_string()),
            },
            AgentProbe {
                profile: "claude".to_string(),
                check: "claude --version".to_string(),
                instructions: Some("/workspace/CLAUDE.md".to_string()),
            },
        ]
    }

    const OUTPUT: &str = "@@berth os-release\n\
        PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\n\
        @@berth kernel\n6.1.0-18-amd64\n@@berth arch\nx86_64\n@@berth uptime\n123.45\n\
        @@berth init-stat\n1 (init (odd)) S 0 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 10000 1000 10\n\
        @@berth clock-ticks\n100\n\
        @@berth cpus\n2\n@@berth hostname\npayments\n@@berth credentials\n1700000000\n\
        @@berth agent 0\nGNU bash, version 5.2.15(1)-release\n@@berth agent-exit 0 0\n\
        @@berth instructions 0\npresent\n\
        @@berth agent 1\nsh: 1: claude: not found\n@@berth agent-exit 1 127\n\
        @@berth instructions 1\n";

    #[test]
    fn the_script_output_becomes_figures() {
        let mut figures = from_instance(&Instance::running("payments", BTreeMap::new()));
        apply_inside(&mut figures, Inside::parse(OUTPUT), &probes());
        let os = figures.os.as_ref().unwrap();
        assert_eq!(os.distribution, "Debian GNU/Linux 12 (bookworm)");
        assert_eq!(os.kernel, "6.1.0-18-amd64");
        assert_eq!(os.cpu_count, 2);
        // Host uptime 123.45 s, init started 100 s after the host booted.
        assert!(
            (os.uptime_seconds - 23.45).abs() < 1e-9,
            "{}",
            os.uptime_seconds
        );
        assert_eq!(os.hostname, "payments");
        assert_eq!(figures.container.architecture.as_deref(), Some("x86_64"));
        assert_eq!(
            figures.credentials_updated_at,
            Utc.timestamp_opt(1_700_000_000, 0).single()
        );
        assert_eq!(
            figures.agents,
            vec![
                AgentState {
                    profile: "shell".to_string(),
                    installed: true,
                    version: Some("GNU bash, version 5.2.15(1)-release".to_string()),
                    instructions: Some("/workspace/AGENTS.md".to_string()),
                    instructions_present: true,
                },
                AgentState {
                    profile: "claude".to_string(),
                    installed: false,
                    version: None,
                    instructions: Some("/workspace/CLAUDE.md".to_string()),
                    instructions_present: false,
                },
            ]
        );
    }

    #[test]
    fn uptime_under_lxcfs_is_taken_as_it_is() {
        let inside = Inside::parse(
            "@@berth uptime\n5.00\n@@berth init-stat\n1 (init) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 900000 0 0\n",
        );
        assert_eq!(uptime(&inside), 5.0);
    }

    #[test]
    fn distribution_falls_back_to_name_and_version() {
        assert_eq!(
            distribution(Some("NAME=Alpine\nVERSION_ID=3.19\n")),
            "Alpine 3.19"
        );
        assert_eq!(distribution(None), "unknown");
    }

    #[test]
    fn script_quotes_profile_commands() {
        let script = script(&[AgentProbe {
            profile: "odd".to_string(),
            check: "echo 'x'".to_string(),
            instructions: None,
        }]);
        assert!(script.contains(r"sh -c 'echo '\''x'\'''"), "{script}");
    }
}
