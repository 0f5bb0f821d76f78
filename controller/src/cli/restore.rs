//! `berth restore NAME|UID [--as NEW]`: brings a deleted project back from the trash, with its
//! workspace as it was (`POST /apis/berth.dev/v1alpha1/trash/UID/restore`, admins). A name takes
//! its newest entry; `--as` restores it under another name (and a new uid) alongside.

use std::process::ExitCode;

use clap::Args;
use reqwest::Method;
use serde_json::json;

use super::Context;
use crate::client::{API_PREFIX, encode_segment};

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The project's name (its newest trash entry) or the entry's uid (`berth trash list`).
    entry: String,
    /// Restore under this name, with a new uid, alongside a project that holds the old one.
    #[arg(long = "as", value_name = "NEW")]
    as_name: Option<String>,
}

pub async fn run(context: &Context, args: RestoreArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    let body = args.as_name.as_ref().map(|name| {
        (
            "application/json",
            json!({"name": name}).to_string().into_bytes(),
        )
    });
    let object = client
        .request_json(
            Method::POST,
            &format!("{API_PREFIX}/trash/{}/restore", encode_segment(&args.entry)),
            body,
        )
        .await?;
    let name = object
        .pointer("/metadata/name")
        .and_then(|v| v.as_str())
        .unwrap_or(&args.entry);
    println!("project/{name} restored");
    Ok(ExitCode::SUCCESS)
}
