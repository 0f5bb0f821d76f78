//! `berth answer NAME TEXT`: answers a project's blocked agent (its question is in
//! `status.agent.message`).

use std::process::ExitCode;

use clap::Args;
use reqwest::Method;
use serde_json::json;

use super::Context;
use crate::client::{API_PREFIX, encode_segment};

#[derive(Debug, Args)]
pub struct AnswerArgs {
    /// The project whose agent asked.
    project: String,
    /// The answer; several words are joined with spaces.
    #[arg(required = true, num_args = 1..)]
    text: Vec<String>,
}

pub async fn run(context: &Context, args: AnswerArgs) -> anyhow::Result<ExitCode> {
    let text = args.text.join(" ");
    if text.trim().is_empty() {
        anyhow::bail!("TEXT: the answer is empty");
    }
    let client = context.client()?;
    let path = format!(
        "{API_PREFIX}/projects/{}/answer",
        encode_segment(&args.project)
    );
    let body = serde_json::to_vec(&json!({ "text": text }))?;
    client
        .request_json(Method::POST, &path, Some(("application/json", body)))
        .await?;
    println!("project/{} answered", args.project);
    Ok(ExitCode::SUCCESS)
}
