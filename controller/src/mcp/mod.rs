//! `berth mcp`: the Model Context Protocol server a local agent spawns over stdio. It offers
//! the workspace tools (Read, Glob, Grep, Write, Edit, Bash) of one project, or of any project
//! the caller is a member of, and the project's root instruction files as a resource. The
//! agent, its model, credentials and transcripts stay where it runs; only tools run remotely.
//!
//! Every call fails closed: it is sent once, with a fresh execution id and the project's uid
//! as resolved when the session first named the project, and never retried. A failed,
//! disconnected, cancelled or timed-out call is a tool error that says which; a mutation
//! whose reply was lost is `REMOTE_MUTATION_OUTCOME_UNKNOWN`, with what to inspect. Nothing
//! ever falls back to running locally.

mod outcome;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_api::Kind;
use reqwest::Method;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    Resource, ResourceContents, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{Map, Value, json};

use crate::client::{API_PREFIX, Client, ClientError, encode_segment};
use crate::tools::Tool;
use berth_api::wire::ToolCallBody;
pub use outcome::{Failure, OUTCOME_UNKNOWN, success_text};

/// A call's HTTP deadline: the longest tool timeout the API takes, and time for its answer.
/// The API bounds the call itself; this only ends a wait for a server that went silent.
const CALL_DEADLINE: Duration = Duration::from_secs(crate::tools::MAX_TIMEOUT.as_secs() + 60);
/// A cancel, a uid look-up or an instructions read: short calls.
const SIDE_DEADLINE: Duration = Duration::from_secs(30);
/// How often a running call reports progress to a client that asked for it.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// The URI scheme of the instruction resources: `berth://projects/NAME/instructions`.
const RESOURCE_PREFIX: &str = "berth://projects/";
const RESOURCE_SUFFIX: &str = "/instructions";

/// The bridge: one berth server, one project or any the caller is a member of.
pub struct Bridge {
    client: Client,
    /// The project given on the command line; without one every tool takes `project`.
    project: Option<String>,
    /// Each project's uid as first resolved in this session: a project deleted and created
    /// again under its name is then refused (409 `ProjectReplaced`), never silently swapped.
    uids: Mutex<HashMap<String, String>>,
}

impl Bridge {
    /// A bridge for `project`, whose uid is resolved now (so a wrong name fails at start), or
    /// for every project the caller is a member of.
    pub async fn new(client: Client, project: Option<String>) -> anyhow::Result<Bridge> {
        let bridge = Bridge {
            client,
            project,
            uids: Mutex::new(HashMap::new()),
        };
        if let Some(name) = &bridge.project {
            bridge
                .uid(name)
                .await
                .map_err(|failure| anyhow::anyhow!("project {name:?}: {}", failure.text()))?;
        }
        Ok(bridge)
    }

    /// Serves MCP on stdin and stdout until the client closes them.
    pub async fn serve_stdio(self) -> anyhow::Result<()> {
        let service = self
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|err| anyhow::anyhow!("starting the MCP session: {err}"))?;
        service
            .waiting()
            .await
            .map_err(|err| anyhow::anyhow!("the MCP session ended: {err}"))?;
        Ok(())
    }

    /// The six tools, with the API's argument schemas (and `project` when no PROJECT was given).
    pub fn tools(&self) -> Vec<rmcp::model::Tool> {
        Tool::ALL
            .iter()
            .map(|tool| {
                let schema = input_schema(*tool, self.project.is_none());
                rmcp::model::Tool::new(tool.as_str(), description(*tool), Arc::new(schema))
            })
            .collect()
    }

    /// The project's uid, resolved once per session.
    async fn uid(&self, project: &str) -> Result<String, Failure> {
        if let Some(uid) = self.lock().get(project) {
            return Ok(uid.clone());
        }
        let path = Client::object_path(Kind::Project, Some(project));
        let object = self
            .client
            .request_json_within(Method::GET, &path, &[], None, SIDE_DEADLINE)
            .await
            .map_err(|err| Failure::before_dispatch(&err))?;
        let uid = object
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .filter(|uid| !uid.is_empty())
            .ok_or_else(|| Failure::new("BadResponse", "the project has no metadata.uid"))?
            .to_string();
        Ok(self
            .lock()
            .entry(project.to_string())
            .or_insert(uid)
            .clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.uids
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// One tool call: sent once, cancelled remotely when the client cancels it.
    async fn call(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let tool = match Tool::parse(name) {
            Ok(tool) => tool,
            Err(err) => return error(&Failure::new("Unsupported", err.message)),
        };
        let mut arguments = arguments.unwrap_or_default();
        let project = match (&self.project, arguments.remove("project")) {
            (Some(fixed), None) => fixed.clone(),
            (Some(_), Some(_)) => {
                return error(&Failure::new(
                    "BadRequest",
                    "project: this session serves one project; leave the argument out",
                ));
            }
            (None, Some(Value::String(name))) if !name.is_empty() => name,
            (None, _) => {
                return error(&Failure::new(
                    "BadRequest",
                    "project: required, the name of a berth project you are a member of",
                ));
            }
        };
        let execution_id = uuid::Uuid::new_v4().to_string();
        let ct = &context.ct;
        let uid = tokio::select! {
            biased;
            () = ct.cancelled() => None,
            uid = self.uid(&project) => Some(uid),
        };
        let uid = match uid {
            Some(Ok(uid)) => uid,
            Some(Err(failure)) => return error(&failure),
            None => {
                let note = self.cancel_remote(&project, None, &execution_id).await;
                return error(&Failure::cancelled(tool, &execution_id, &note, false));
            }
        };
        if ct.is_cancelled() {
            let note = self
                .cancel_remote(&project, Some(&uid), &execution_id)
                .await;
            return error(&Failure::cancelled(tool, &execution_id, &note, false));
        }
        let body = ToolCallBody {
            execution_id: execution_id.clone(),
            arguments: Some(arguments.clone()),
            // Bash's own `timeout` may be longer than the API's default for a call.
            timeout_ms: arguments
                .get("timeout")
                .and_then(Value::as_u64)
                .filter(|_| tool == Tool::Bash)
                .map(|ms| ms.clamp(1, crate::tools::MAX_TIMEOUT.as_millis() as u64)),
            ..ToolCallBody::default()
        };
        let path = format!(
            "{API_PREFIX}/projects/{}/tools/{}",
            encode_segment(&project),
            tool.as_str()
        );
        let query = [("uid", uid.as_str())];
        let bytes = match serde_json::to_vec(&body) {
            Ok(bytes) => bytes,
            Err(err) => return error(&Failure::new("BadRequest", err.to_string())),
        };
        let post = self.client.request_json_within(
            Method::POST,
            &path,
            &query,
            Some(("application/json", bytes)),
            CALL_DEADLINE,
        );
        let progress = report_progress(context, tool, &project, &execution_id);
        let reply = tokio::select! {
            biased;
            () = ct.cancelled() => {
                // Cancelled while the call may be running: the server kills what it started.
                let note = self.cancel_remote(&project, Some(&uid), &execution_id).await;
                return error(&Failure::cancelled(tool, &execution_id, &note, true));
            }
            reply = post => reply,
            () = progress => unreachable!("progress reporting never ends"),
        };
        match reply {
            Ok(value) => CallToolResult::success(vec![ContentBlock::text(success_text(&value))]),
            Err(err @ ClientError::Api(_)) => {
                error(&Failure::answered(tool, &execution_id, &arguments, &err))
            }
            Err(err @ ClientError::Unreachable { .. }) => error(&Failure::before_dispatch(&err)),
            Err(err) => {
                // The reply was lost: ask the server to stop whatever still runs, and say
                // what it answered, which tells whether the call had finished.
                let note = self
                    .cancel_remote(&project, Some(&uid), &execution_id)
                    .await;
                error(&Failure::lost(tool, &execution_id, &arguments, &err, &note))
            }
        }
    }

    /// `DELETE .../tools/executions/ID`: stops a running call, or makes one the server has not
    /// seen yet answer `Cancelled` when it arrives. Returns what the server said.
    async fn cancel_remote(&self, project: &str, uid: Option<&str>, id: &str) -> String {
        let path = format!(
            "{API_PREFIX}/projects/{}/tools/executions/{}",
            encode_segment(project),
            encode_segment(id)
        );
        let query: Vec<(&str, &str)> = uid.map(|uid| ("uid", uid)).into_iter().collect();
        match self
            .client
            .request_json_within(Method::DELETE, &path, &query, None, SIDE_DEADLINE)
            .await
        {
            Ok(value) => value
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("the server took the cancel")
                .to_string(),
            Err(err) => format!("the cancel could not be delivered: {err}"),
        }
    }

    /// The projects whose instructions are offered.
    async fn projects(&self) -> Result<Vec<String>, McpError> {
        if let Some(name) = &self.project {
            return Ok(vec![name.clone()]);
        }
        let list = self
            .client
            .list(Kind::Project, None)
            .await
            .map_err(|err| McpError::internal_error(err.to_string(), None))?;
        Ok(list
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|item| item.pointer("/metadata/name")?.as_str().map(String::from))
            .collect())
    }

    /// The instruction files at the root of the project's workspace.
    async fn instructions(&self, uri: &str) -> Result<ReadResourceResult, McpError> {
        let project = uri
            .strip_prefix(RESOURCE_PREFIX)
            .and_then(|rest| rest.strip_suffix(RESOURCE_SUFFIX))
            .filter(|name| !name.is_empty() && !name.contains('/'))
            .ok_or_else(|| McpError::resource_not_found(format!("no resource {uri:?}"), None))?;
        if self
            .project
            .as_deref()
            .is_some_and(|fixed| fixed != project)
        {
            return Err(McpError::resource_not_found(
                format!(
                    "this session serves only {RESOURCE_PREFIX}{}{RESOURCE_SUFFIX}",
                    self.project.as_deref().unwrap_or_default()
                ),
                None,
            ));
        }
        let uid = self
            .uid(project)
            .await
            .map_err(|failure| McpError::resource_not_found(failure.text(), None))?;
        let path = format!(
            "{API_PREFIX}/projects/{}/tools/instructions",
            encode_segment(project)
        );
        let value = self
            .client
            .request_json_within(
                Method::GET,
                &path,
                &[("uid", uid.as_str())],
                None,
                SIDE_DEADLINE,
            )
            .await
            .map_err(|err| McpError::internal_error(err.to_string(), None))?;
        let contents = value
            .get("files")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|file| {
                let path = file.get("path")?.as_str()?;
                let content = file.get("content")?.as_str()?;
                let name = path.rsplit('/').next().unwrap_or(path);
                Some(
                    ResourceContents::text(content, format!("{uri}/{name}"))
                        .with_mime_type("text/markdown"),
                )
            })
            .collect();
        Ok(ReadResourceResult::new(contents))
    }
}

impl ServerHandler for Bridge {
    fn get_info(&self) -> ServerConfig {
        let scope = match &self.project {
            Some(name) => format!("the berth project {name:?}"),
            None => "a berth project you are a member of (the `project` argument)".to_string(),
        };
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("berth", env!("CARGO_PKG_VERSION")))
        .with_instructions(format!(
            "Read, Glob, Grep, Write, Edit and Bash run in the remote workspace (/workspace) of \
             {scope}, never on this machine. A call is never retried: a tool error saying \
             REMOTE_MUTATION_OUTCOME_UNKNOWN means the change may or may not have happened; \
             inspect before running it again. The root instruction files are the resource \
             {RESOURCE_PREFIX}NAME{RESOURCE_SUFFIX}."
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        self.tools().into_iter().find(|tool| tool.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        Ok(self
            .call(&request.name, request.arguments, &context)
            .await
            .into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let resources = self
            .projects()
            .await?
            .into_iter()
            .map(|name| {
                Resource::new(
                    format!("{RESOURCE_PREFIX}{name}{RESOURCE_SUFFIX}"),
                    format!("{name} instructions"),
                )
                .with_description(format!(
                    "The instruction files (AGENTS.md, CLAUDE.md, ...) at the root of {name}'s /workspace"
                ))
                .with_mime_type("text/markdown")
            })
            .collect();
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        Ok(self.instructions(&request.uri).await?.into())
    }
}

fn error(failure: &Failure) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(failure.text())])
}

/// Progress notifications while a call runs, for a client that sent a progress token; never
/// ends (the call's own branch ends the wait).
async fn report_progress(
    context: &RequestContext<RoleServer>,
    tool: Tool,
    project: &str,
    execution_id: &str,
) {
    let Some(token) = context.meta.get_progress_token() else {
        return std::future::pending().await;
    };
    let started = tokio::time::Instant::now();
    let mut message = format!(
        "{} sent to {project} as execution {execution_id}",
        tool.as_str()
    );
    loop {
        let elapsed = started.elapsed().as_secs_f64();
        let param = ProgressNotificationParam::new(token.clone(), elapsed).with_message(message);
        // A client that stopped listening to progress does not stop the call.
        let _ = context.peer.notify_progress(param).await;
        tokio::time::sleep(PROGRESS_EVERY).await;
        message = format!(
            "{} running in {project} for {} s",
            tool.as_str(),
            started.elapsed().as_secs()
        );
    }
}

/// The API's argument schema with each argument described, and `project` when every call
/// names its project.
pub fn input_schema(tool: Tool, with_project: bool) -> JsonObject {
    let mut schema = match tool.schema() {
        Value::Object(schema) => schema,
        _ => Map::new(),
    };
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        for (name, property) in properties.iter_mut() {
            if let (Some(text), Value::Object(property)) =
                (argument_description(tool, name), property)
            {
                property.insert("description".into(), json!(text));
            }
        }
        if with_project {
            properties.insert(
                "project".into(),
                json!({"type": "string", "description": "The berth project whose workspace the tool runs in (you must be a member)"}),
            );
        }
    }
    if with_project && let Some(Value::Array(required)) = schema.get_mut("required") {
        required.insert(0, json!("project"));
    }
    schema
}

fn description(tool: Tool) -> &'static str {
    match tool {
        Tool::Read => {
            "Reads a file of the remote workspace, with line numbers (`offset`: first line, 1-based; `limit`: how many lines)."
        }
        Tool::Glob => {
            "Lists the files of the remote workspace matching a glob pattern such as `**/*.rs`."
        }
        Tool::Grep => {
            "Searches file contents of the remote workspace with a regular expression (ripgrep syntax)."
        }
        Tool::Write => "Writes a file of the remote workspace, replacing what it held.",
        Tool::Edit => {
            "Replaces exact text in a file of the remote workspace; `old_string` must occur once unless `replace_all`."
        }
        Tool::Bash => {
            "Runs a bash command in the remote workspace (/workspace is the working directory); `timeout` in milliseconds."
        }
    }
}

fn argument_description(tool: Tool, name: &str) -> Option<&'static str> {
    Some(match (tool, name) {
        (_, "file_path") => "An absolute path inside /workspace, or one relative to it",
        (_, "path") => "The directory to search (default /workspace), inside /workspace",
        (Tool::Read, "offset") => "The first line to read, 1-based",
        (Tool::Read, "limit") => "How many lines to read",
        (Tool::Glob, "pattern") => "The glob, e.g. `src/**/*.ts`",
        (Tool::Grep, "pattern") => "The regular expression",
        (Tool::Grep, "glob") => "Only files matching this glob",
        (Tool::Grep, "output_mode") => "`files_with_matches` (default), `content` or `count`",
        (Tool::Write, "content") => "The file's whole new content",
        (Tool::Edit, "old_string") => "The exact text to replace",
        (Tool::Edit, "new_string") => "The text to put in its place",
        (Tool::Edit, "replace_all") => "Replace every occurrence",
        (Tool::Bash, "command") => "The command, run by bash in /workspace",
        (Tool::Bash, "timeout") => "Milliseconds before the command is killed",
        (Tool::Bash, "description") => "What the command does, in a few words",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_carry_the_api_arguments_and_project_only_when_asked() {
        for tool in Tool::ALL {
            let fixed = input_schema(tool, false);
            let api = tool.schema();
            let names = |schema: &Map<String, Value>| {
                let mut names: Vec<String> = schema["properties"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .cloned()
                    .collect();
                names.sort();
                names
            };
            assert_eq!(names(&fixed), names(api.as_object().unwrap()), "{tool:?}");
            assert_eq!(fixed["required"], api["required"], "{tool:?}");
            let open = input_schema(tool, true);
            assert!(open["properties"]["project"].is_object(), "{tool:?}");
            assert_eq!(open["required"][0], "project", "{tool:?}");
            assert!(!names(&fixed).contains(&"project".to_string()));
            for (name, _) in fixed["properties"].as_object().unwrap() {
                assert!(
                    fixed["properties"][name]["description"].is_string(),
                    "{tool:?} {name} has no description"
                );
            }
        }
    }
}
