//! `berth repair-network NAME`: re-applies the network configuration of a project's container
//! (LXD restarts each NIC, the MAC address kept) and restarts its networking inside, then
//! prints every interface as LXD reports it (`POST .../projects/NAME/repairnetwork`, members).

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use super::Context;
use super::render::{self, OutputFormat};
use super::table::Table;

#[derive(Debug, Args)]
pub struct RepairNetworkArgs {
    /// The project.
    name: String,
    /// Output format (yaml or json print the answer as the server gave it).
    #[arg(short = 'o', long = "output", value_enum)]
    output: Option<OutputFormat>,
}

pub async fn run(context: &Context, args: RepairNetworkArgs) -> anyhow::Result<ExitCode> {
    let repair = context.client()?.repair_network(&args.name).await?;
    match args.output {
        Some(OutputFormat::Yaml) => print!("{}", render::to_yaml(&repair)),
        Some(OutputFormat::Json) => print!("{}", render::to_json(&repair)),
        _ => {
            println!("project/{} network repaired", args.name);
            print!("{}", interfaces_table(&repair));
            for note in repair["notes"].as_array().into_iter().flatten() {
                eprintln!("note: {}", note.as_str().unwrap_or_default());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// INTERFACE, MAC, MTU, ADDRESSES: each NIC as LXD reported it after the repair.
fn interfaces_table(repair: &Value) -> String {
    let mut table = Table::new(["INTERFACE", "MAC", "MTU", "ADDRESSES"]);
    for interface in repair["interfaces"].as_array().into_iter().flatten() {
        let mac = interface["mac"].as_str().unwrap_or_default();
        let addresses: Vec<&str> = interface["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        table.row(vec![
            interface["name"].as_str().unwrap_or_default().to_string(),
            if mac.is_empty() { "(gone)" } else { mac }.to_string(),
            interface["mtu"].to_string(),
            if addresses.is_empty() {
                "none".to_string()
            } else {
                addresses.join(" ")
            },
        ]);
    }
    table.render()
}

#[cfg(test)]
#[path = "repair_network_tests.rs"]
mod tests;
