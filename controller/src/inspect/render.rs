//! The "Runtime:" section `berth describe project` prints from `GET .../runtime`.

use std::fmt::Write as _;

use serde_json::Value;

/// The section for a running container's figures; `None` when it is not running, which
/// `describe` skips silently.
pub fn runtime_section(figures: &Value) -> Option<String> {
    if figures["status"].as_str() != Some("Running") {
        return None;
    }
    let mut out = String::from("Runtime:\n");
    let mut line = |label: &str, value: String| {
        if !value.is_empty() {
            let _ = writeln!(out, "  {:<18}{value}", format!("{label}:"));
        }
    };
    let c = &figures["container"];
    let fingerprint: String = text(&c["imageFingerprint"]).chars().take(12).collect();
    // A standalone LXD reports its location as "none": only a cluster member is worth naming.
    let location = Some(text(&c["location"]))
        .filter(|l| !l.is_empty() && l != "none")
        .map(|l| format!(", on {l}"))
        .unwrap_or_default();
    line(
        "Container",
        format!(
            "{} image {fingerprint} ({}), pid {}{location}",
            text(&c["type"]),
            text(&c["architecture"]),
            int(&c["pid"]),
        ),
    );
    line(
        "Created",
        format!(
            "{} (last used {})",
            text(&c["createdAt"]),
            text(&c["lastUsedAt"])
        ),
    );
    line("Processes", int(&figures["processes"]).to_string());
    line(
        "CPU Time",
        format!(
            "{:.2}s",
            figures["cpu"]["usageSeconds"].as_f64().unwrap_or(0.0)
        ),
    );
    let m = &figures["memory"];
    line(
        "Memory",
        format!(
            "{} (peak {}, swap {})",
            bytes(&m["usageBytes"]),
            bytes(&m["peakBytes"]),
            bytes(&m["swapBytes"])
        ),
    );
    let disks: Vec<String> = figures["disk"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(device, used)| format!("{device} {}", bytes(used)))
        .collect();
    if disks.is_empty() {
        // LXD has no usage figures for some pool drivers (dir among them).
        line("Disk", "not reported by this storage pool".to_string());
    } else {
        line("Disk", disks.join(", "));
    }
    let interfaces: Vec<String> = figures["network"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, n)| {
            let mac = n["mac"]
                .as_str()
                .filter(|m| !m.is_empty())
                .unwrap_or("none");
            let addresses: String = n["addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(|a| format!(" {a}"))
                .collect();
            format!(
                "{name}{addresses} (mac {mac}, mtu {}) {} in / {} out",
                n["mtu"],
                bytes(&n["bytesReceived"]),
                bytes(&n["bytesSent"])
            )
        })
        .collect();
    line("Network", interfaces.join(", "));
    let os = &figures["os"];
    if os.is_object() {
        line(
            "OS",
            format!(
                "{}, kernel {}, {} CPUs, up {}, hostname {}",
                text(&os["distribution"]),
                text(&os["kernel"]),
                int(&os["cpuCount"]),
                duration(os["uptimeSeconds"].as_f64().unwrap_or(0.0)),
                text(&os["hostname"]),
            ),
        );
    }
    let agents: Vec<String> = figures["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let installed = match a["version"].as_str() {
                Some(version) => version.to_string(),
                None if a["installed"] == true => "installed".to_string(),
                None => "not installed".to_string(),
            };
            let instructions = match (a["instructions"].as_str(), a["instructionsPresent"] == true)
            {
                (Some(path), true) => format!(", {path} present"),
                (Some(path), false) => format!(", {path} missing"),
                (None, _) => String::new(),
            };
            format!("{}: {installed}{instructions}", text(&a["profile"]))
        })
        .collect();
    line("Agents", agents.join("; "));
    line("Credentials", text(&figures["credentialsUpdatedAt"]));
    let activity = &figures["lastActivity"];
    if activity.is_object() {
        line(
            "Last Activity",
            format!("{} ({})", text(&activity["at"]), text(&activity["source"])),
        );
    }
    Some(out)
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

fn int(value: &Value) -> i64 {
    value.as_i64().unwrap_or_default()
}

fn bytes(value: &Value) -> String {
    let n = value.as_u64().unwrap_or_default() as f64;
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut size = n;
    let mut unit = 0;
    while size >= 1024.0 && unit < UNITS.len() - 1 {
        size /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{size:.1} {}", UNITS[unit])
    }
}

fn duration(seconds: f64) -> String {
    let s = seconds as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_running_container_gets_a_section_and_a_stopped_one_none() {
        let figures = json!({
            "status": "Running",
            "container": {"type": "container", "imageFingerprint": "bae8efb2e52c0123", "architecture": "x86_64",
                          "pid": 4242, "location": "none", "createdAt": "2026-01-01T00:00:00Z"},
            "processes": 7,
            "cpu": {"usageSeconds": 1.5},
            "memory": {"usageBytes": 10485760, "peakBytes": 20971520, "swapBytes": 0},
            "disk": {"root": 2048},
            "network": {"lo": {"mac": "", "mtu": 65536, "bytesReceived": 100, "bytesSent": 100},
                        "eth0": {"addresses": ["10.0.0.5", "fe80::1"], "mac": "00:16:3e:00:00:01",
                                 "mtu": 1450, "bytesReceived": 2048, "bytesSent": 0}},
            "os": {"distribution": "Debian GNU/Linux 12 (bookworm)", "kernel": "6.1.0", "cpuCount": 2,
                   "uptimeSeconds": 3725.0, "hostname": "payments"},
            "agents": [{"profile": "shell", "installed": true, "version": "GNU bash 5.2",
                        "instructions": "/workspace/AGENTS.md", "instructionsPresent": true}],
        });
        let section = runtime_section(&figures).unwrap();
        for expected in [
            "Runtime:",
            "container image bae8efb2e52c (x86_64), pid 4242\n",
            "Processes:        7",
            "CPU Time:         1.50s",
            "Memory:           10.0 MiB (peak 20.0 MiB, swap 0 B)",
            "root 2.0 KiB",
            "eth0 10.0.0.5 fe80::1 (mac 00:16:3e:00:00:01, mtu 1450) 2.0 KiB in / 0 B out, \
             lo (mac none, mtu 65536) 100 B in / 100 B out",
            "Debian GNU/Linux 12 (bookworm), kernel 6.1.0, 2 CPUs, up 1h2m, hostname payments",
            "shell: GNU bash 5.2, /workspace/AGENTS.md present",
        ] {
            assert!(
                section.contains(expected),
                "{expected:?} not in:\n{section}"
            );
        }
        assert_eq!(runtime_section(&json!({"status": "Stopped"})), None);

        // A cluster member is named; a pool without usage figures says so.
        let mut clustered = figures.clone();
        clustered["container"]["location"] = json!("m2");
        clustered["disk"] = json!({});
        let section = runtime_section(&clustered).unwrap();
        assert!(section.contains("pid 4242, on m2\n"), "{section}");
        assert!(
            section.contains("Disk:             not reported by this storage pool"),
            "{section}"
        );
    }
}
