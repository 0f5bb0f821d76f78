//! `POST .../projects/NAME/ide` (members; `berth ide`, the console's Open IDE): code-server
//! started in the project's container if it is not running ([`crate::agent::ide`]), and a
//! one-time ticket for the IDE host (`<name>--ide.<previewDomain>`), which the preview
//! listener serves to members as it serves a port. An idled project is woken first, as a
//! preview request wakes it; the call counts as activity (source `ide`).

use std::time::Duration;

use hyper::StatusCode;
use serde_json::json;

use super::error::ApiError;
use super::preview::{served, ticket};
use super::routes::{Outcome, serialized};
use super::{ApiState, Caller, access};
use crate::agent::ide::{self, IdeError};
use crate::inspect::InspectError;
use crate::preview::Target;
use crate::store::EventType;

/// How long the call waits for an idled project it woke.
const WAKE_DEADLINE: Duration = Duration::from_secs(120);

pub(super) async fn open(state: &ApiState, caller: &Caller, name: &str) -> Outcome {
    let project = access::member_project(state, caller, name)?;
    let previews = served(state)?;
    let deadline = tokio::time::Instant::now() + WAKE_DEADLINE;
    let cancel = state.shutdown.child_token();
    crate::tools::wake::ensure_awake(
        &state.store,
        &project,
        deadline,
        &cancel,
        "ide",
        crate::tools::wake::Waker {
            by: "berth ide",
            retry: "open the IDE again",
        },
    )
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!("project {name} cannot open the IDE: {e}"),
        )
    })?;
    let (runtime, instance) = state.inspector.reach(&project).await?;
    if !instance.is_running() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "project {name}: the container is {}, not running",
                instance.status.as_str()
            ),
        ));
    }
    let has_repo = project.spec.get("repo").is_some_and(|r| !r.is_null());
    let outcome = ide::ensure(runtime.as_ref(), &instance.name, has_repo)
        .await
        .map_err(|e| match e {
            IdeError::NoCodeServer | IdeError::NotCheckedOut => {
                ApiError::new(StatusCode::CONFLICT, "Conflict", format!("{name}: {e}"))
            }
            IdeError::Failed(_) => {
                ApiError::new(StatusCode::BAD_GATEWAY, "IdeFailed", format!("{name}: {e}"))
            }
            IdeError::Runtime(source) => InspectError::runtime(&instance.name, source).into(),
        })?;
    state.inspector.activity.record(project.uid(), "ide");
    if outcome.started() {
        tracing::info!(project = name, caller = %caller.identity, pid = outcome.pid(), "IDE started");
        let message = format!(
            "code-server started (pid {}) at the request of {}",
            outcome.pid(),
            caller.identity
        );
        state
            .store
            .publish_event(&project, EventType::Normal, "IdeStarted", &message)
            .await;
    }
    let issued = ticket(previews, caller, &project, Target::Ide)?;
    Ok(serialized(
        StatusCode::OK,
        &json!({
            "apiVersion": berth_api::API_VERSION,
            "kind": "Ide",
            "project": name,
            "started": outcome.started(),
            "pid": outcome.pid(),
            "address": previews.site.target_url(name, Target::Ide),
            "url": issued.url,
            "expiresAt": issued.expires_at,
        }),
    ))
}
