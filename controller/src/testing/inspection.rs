//! Scripted workspace inspections: the report the inspection script would print for a
//! described workspace, answered by a `FakeRuntime` in place of running the script.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use chrono::{DateTime, Utc};

use crate::runtime::{ExecOutput, ExecRequest};
use crate::testing::fake_runtime::FakeRuntime;
use crate::workspace::inspect::HEADER;

/// What a scripted inspection reports (see [`script_inspection`]).
#[derive(Debug, Clone, Default)]
pub struct FakeWorkspace {
    pub unsaved: berth_api::UnsavedWork,
    /// The agent status file's JSON, if the agent wrote one.
    pub agent_json: Option<String>,
    pub ports: Vec<u16>,
    /// The newest file modification time under /workspace, if any.
    pub newest_mtime: Option<DateTime<Utc>>,
    /// IPv4 addresses with prefix by interface (loopback is always added); `None` reports
    /// that the container cannot tell.
    pub ipv4: Option<BTreeMap<String, Vec<String>>>,
}

impl FakeWorkspace {
    /// A workspace holding `unsaved` and nothing else of note.
    pub fn with_unsaved(unsaved: berth_api::UnsavedWork) -> Self {
        FakeWorkspace {
            unsaved,
            ..FakeWorkspace::default()
        }
    }
}

/// The report the inspection script prints for `workspace`, a git repository.
pub fn inspection_report(workspace: &FakeWorkspace) -> String {
    let b64 = |text: &str| B64.encode(text.as_bytes());
    let mut porcelain = String::new();
    for i in 0..workspace.unsaved.uncommitted {
        porcelain.push_str(&format!(" M changed-{i}\0"));
    }
    for i in 0..workspace.unsaved.untracked {
        porcelain.push_str(&format!("?? new-{i}\0"));
    }
    let mut tcp = String::from(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n",
    );
    for (i, port) in workspace.ports.iter().enumerate() {
        tcp.push_str(&format!(
            "   {i}: 00000000:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0\n"
        ));
    }
    let newest = workspace.newest_mtime.map_or("-".to_string(), |t| {
        format!("{}.{:09}", t.timestamp(), t.timestamp_subsec_nanos())
    });
    let list = |names: Vec<String>, separator: &str| {
        if names.is_empty() {
            "-".to_string()
        } else {
            b64(&names
                .iter()
                .map(|n| format!("{n}{separator}"))
                .collect::<String>())
        }
    };
    let unsaved = &workspace.unsaved;
    let unpushed = (unsaved.unpushed > 0)
        .then(|| format!("{} refs/heads/main", unsaved.unpushed))
        .into_iter()
        .collect();
    let ignored = (0..unsaved.ignored)
        .map(|i| format!("kept-{i}.db"))
        .collect();
    let mut repos = vec![format!(
        "repo main {} {} {} {} - {}",
        b64("."),
        list(vec![porcelain], ""),
        unsaved.stashes,
        list(unpushed, "\n"),
        list(ignored, "\0"),
    )];
    for i in 0..unsaved.worktrees {
        repos.push(format!(
            "repo outside {} - 0 - - -",
            b64(&format!("/tmp/wt-{i}"))
        ));
    }
    let ipv4 = workspace
        .ipv4
        .as_ref()
        .map_or("-".to_string(), |interfaces| {
            let mut lines = String::from("1: lo    inet 127.0.0.1/8 scope host lo\n");
            for (i, (interface, addresses)) in interfaces.iter().enumerate() {
                for address in addresses {
                    lines.push_str(&format!(
                        "{}: {interface}    inet {address} scope global {interface}\n",
                        i + 2
                    ));
                }
            }
            b64(&lines)
        });
    format!(
        "{}\nagent {}\nenv_mine 0\ngit repo\n{}\n\
         tcp {}\ntcp6 \ncpu_ticks 0\nclk_tck 100\nnewest_mtime {newest}\nipv4 {ipv4}\nend\n",
        HEADER,
        workspace.agent_json.as_deref().map_or("-".to_string(), b64),
        repos.join("\n"),
        b64(&tcp),
    )
}

/// Whether an exec request is the workspace inspection.
pub fn is_inspection(request: &ExecRequest) -> bool {
    request.command.iter().any(|arg| arg.contains(HEADER))
}

/// Makes every inspection of `instance` in the fake runtime answer with `workspace`, as the
/// inspection script would in a git workspace. Without it, the fake's empty exec output is an
/// unreadable report, which protects the workspace like any failed inspection.
pub fn script_inspection(fake: &FakeRuntime, instance: &str, workspace: FakeWorkspace) {
    let report = inspection_report(&workspace);
    let instance = instance.to_string();
    fake.on_exec(move |name, request| {
        (name == instance && is_inspection(request)).then(|| {
            Ok(ExecOutput {
                exit_code: 0,
                stdout: report.clone().into_bytes(),
                stderr: Vec::new(),
            })
        })
    });
}
