//! `berth ports NAME`: the ports a project's container listens on beyond loopback (a server bound
//! to 127.0.0.1 is not listed: nothing outside could reach it) and their preview URLs, as the
//! scheduler's last inspection recorded them in `status.ports`.

use std::process::ExitCode;

use berth_api::{Kind, PortStatus};
use clap::Args;
use serde_json::Value;

use super::Context;
use super::render::{self, OutputFormat};
use super::table::Table;

#[derive(Debug, Args)]
pub struct PortsArgs {
    /// The project.
    name: String,
    /// Output format (yaml or json print the list of ports).
    #[arg(short = 'o', long = "output", value_enum)]
    output: Option<OutputFormat>,
}

pub async fn run(context: &Context, args: PortsArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    let project = client.get(Kind::Project, &args.name).await?;
    let ports = ports_of(&project)?;
    match args.output {
        Some(OutputFormat::Yaml) => print!("{}", render::to_yaml(&serde_json::to_value(&ports)?)),
        Some(OutputFormat::Json) => print!("{}", render::to_json(&serde_json::to_value(&ports)?)),
        _ if ports.is_empty() => eprintln!("{}", nothing_listening(&args.name)),
        _ => print!("{}", ports_table(&ports)),
    }
    Ok(ExitCode::SUCCESS)
}

fn ports_of(project: &Value) -> anyhow::Result<Vec<PortStatus>> {
    match project.pointer("/status/ports") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(ports) => serde_json::from_value(ports.clone())
            .map_err(|e| anyhow::anyhow!("status.ports: unreadable: {e}")),
    }
}

/// What an empty answer means: only servers reachable from outside the container are listed.
fn nothing_listening(name: &str) -> String {
    format!(
        "No ports listening beyond loopback in project {name}. Servers bound to 127.0.0.1 or ::1 \
         are not listed (nothing outside the container could reach them); bind 0.0.0.0 to get a \
         preview URL."
    )
}

/// PORT, URL.
fn ports_table(ports: &[PortStatus]) -> String {
    let mut table = Table::new(["port", "url"]);
    for port in ports {
        table.row(vec![port.port.to_string(), port.url.clone()]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ports_print_with_their_urls() {
        let project = json!({"status": {"ports": [
            {"port": 3000, "url": "http://web--3000.localhost"}
        ]}});
        let ports = ports_of(&project).unwrap();
        let text = ports_table(&ports);
        assert_eq!(
            text, "PORT   URL\n3000   http://web--3000.localhost\n",
            "{text}"
        );
        assert!(ports_of(&json!({"status": {}})).unwrap().is_empty());
        let empty = nothing_listening("web");
        assert!(empty.contains("beyond loopback in project web"), "{empty}");
        assert!(empty.contains("127.0.0.1"), "{empty}");
    }
}
