//! Looking into a project's container on behalf of a person: its live figures
//! ([`figures`]), running a command in it ([`exec`]), and whether LXD answers at all, for
//! `/readyz`. Every path that reaches into a container first checks that it is the project's
//! ([`reach`]).
//!
//! The API reaches LXD through an [`Inspector`], over the daemon's one runtime handle once the
//! controller has connected it; until then (and always in a paused daemon, which is given no
//! handle) inspection answers 503 instead of waiting.

mod error;
pub mod exec;
pub mod figures;
pub mod reach;
pub mod render;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use error::InspectError;

use crate::activity_log::{ActivityLog, OpenSession};
use crate::runtime::{ExecRequest, Instance, InteractiveExec, Runtime, RuntimeError, TerminalSize};
use crate::runtime_handle::RuntimeHandle;
use crate::store::StoredObject;
use exec::ExecResult;
use figures::{AgentProbe, LastActivity, RuntimeFigures};

/// How often the LXD reachability probe runs, and how long one probe may take.
const PROBE_INTERVAL: Duration = Duration::from_secs(5);
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// The probe reads one instance by name: a missing instance is the cheapest answer LXD gives,
/// and an existing one of that name is only read.
const PROBE_INSTANCE: &str = "berth-readiness-probe";

/// The runtime the API inspects through, LXD's reachability as last probed, and the activity
/// people caused through berth.
pub struct Inspector {
    endpoint: String,
    /// This store's id: a container is a project's only when this controller made it.
    controller: String,
    /// The daemon's LXD connection; none in a paused daemon.
    lxd: Option<Arc<RuntimeHandle>>,
    /// What the last probe found; none before the first.
    probed: Mutex<Option<Result<(), String>>>,
    pub activity: Arc<ActivityLog>,
}

impl std::fmt::Debug for Inspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspector")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Inspector {
    /// An inspector for the LXD at `endpoint` (shown in readiness reasons) over `lxd`,
    /// reaching only into containers the controller `controller` made, and keeping `activity`.
    pub fn new(
        endpoint: impl Into<String>,
        controller: impl Into<String>,
        lxd: Option<Arc<RuntimeHandle>>,
        activity: Arc<ActivityLog>,
    ) -> Inspector {
        Inspector {
            endpoint: endpoint.into(),
            controller: controller.into(),
            lxd,
            probed: Mutex::new(None),
            activity,
        }
    }

    /// The connected runtime, or `None` before the controller connected (or when paused).
    pub fn runtime(&self) -> Option<Arc<dyn Runtime>> {
        self.lxd.as_ref().and_then(|lxd| lxd.get())
    }

    /// The connected runtime and the project's own container in it (409 `NameConflict` for
    /// any other): every path that reaches into a container asks this first.
    pub async fn reach(
        &self,
        project: &StoredObject,
    ) -> Result<(Arc<dyn Runtime>, Instance), InspectError> {
        let runtime = self.runtime().ok_or(InspectError::NotConnected)?;
        let instance = reach::owned_container(
            runtime.as_ref(),
            project.name(),
            project.uid(),
            &self.controller,
        )
        .await?;
        Ok((runtime, instance))
    }

    /// The live figures of the project's container, with the last activity people caused.
    pub async fn figures(
        &self,
        project: &StoredObject,
        agents: &[AgentProbe],
    ) -> Result<RuntimeFigures, InspectError> {
        let (runtime, instance) = self.reach(project).await?;
        let mut figures = figures::inspect(runtime.as_ref(), &instance, agents)
            .await
            .map_err(|e| InspectError::runtime(project.name(), e))?;
        figures.last_activity = self.activity.last(project.uid()).map(|a| LastActivity {
            at: a.at,
            source: a.source,
        });
        Ok(figures)
    }

    /// Runs a person's command in the project's container to its end; the project counts
    /// active while it runs, whatever its outcome.
    pub async fn exec(
        &self,
        project: &StoredObject,
        request: &ExecRequest,
    ) -> Result<ExecResult, InspectError> {
        let (runtime, _) = self.reach(project).await?;
        let _running = self.activity.open(project.uid(), "exec");
        match runtime.exec(project.name(), request).await {
            Ok(output) => Ok(ExecResult::from(output)),
            // Cut, and said so: the caller gets what came before the cap.
            Err(RuntimeError::TooLarge {
                limit,
                partial: Some(partial),
                ..
            }) => Ok(exec::cut(&partial, limit)),
            Err(e) => Err(InspectError::runtime(project.name(), e)),
        }
    }

    /// Starts a person's command with its streams connected. The session counts as activity
    /// until the returned [`OpenSession`] is dropped (the caller holds it while it relays).
    pub async fn exec_interactive(
        &self,
        project: &StoredObject,
        request: &ExecRequest,
        terminal: Option<TerminalSize>,
    ) -> Result<(InteractiveExec, OpenSession), InspectError> {
        let (runtime, _) = self.reach(project).await?;
        let open = self.activity.open(project.uid(), "exec");
        let session = runtime
            .exec_interactive(project.name(), request, terminal)
            .await
            .map_err(|e| InspectError::runtime(project.name(), e))?;
        Ok((session, open))
    }

    /// Whether LXD answered the last probe, and why not: cheap, for `/readyz`.
    /// Connected and not yet probed counts as reachable: it has just answered.
    pub fn reachability(&self) -> Result<(), String> {
        let probed = self
            .probed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match (probed, self.runtime()) {
            (Some(result), _) => result,
            (None, Some(_)) => Ok(()),
            (None, None) => Err(format!("not connected to {} yet", self.endpoint)),
        }
    }

    fn set_reachability(&self, result: Result<(), String>) {
        *self.probed.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
    }

    /// Probes LXD every few seconds until `shutdown`, so `/readyz` answers from the last result
    /// without making a request of its own.
    pub fn spawn_probe(
        self: &Arc<Self>,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let inspector = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(PROBE_INTERVAL) => {}
                }
                if let Some(runtime) = inspector.runtime() {
                    let result = inspector.probe(runtime.as_ref()).await;
                    if let Err(reason) = &result {
                        tracing::warn!(reason = %reason, "LXD did not answer the readiness probe");
                    }
                    inspector.set_reachability(result);
                }
            }
        })
    }

    async fn probe(&self, runtime: &dyn Runtime) -> Result<(), String> {
        match tokio::time::timeout(PROBE_TIMEOUT, runtime.get_instance(PROBE_INSTANCE)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("{} did not answer: {e}", self.endpoint)),
            Err(_) => Err(format!(
                "{} did not answer within {PROBE_TIMEOUT:?}",
                self.endpoint
            )),
        }
    }
}

/// `'...'` for `sh`: the one quoting that needs no escaping rules inside.
pub(crate) fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests;
