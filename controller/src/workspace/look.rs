//! Looking at a workspace where it is: in its running container, or by booting its stopped
//! container without the runner (and stopping it again), and what a look tells the decision
//! whether the workspace may be destroyed.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_api::AgentState;
use tokio::time::Instant;

use super::protection::Evidence;
use crate::runtime::{ExecRequest, InstanceStatus, Runtime, StopOptions};
use crate::workspace::inspect::{self, Expected, InspectError, Inspection};

/// What the policy learns from an inspection: the evidence, and the agent's state. A workspace
/// that could not be inspected is [`Evidence::Failed`]. The agent status file lives on a tmpfs,
/// so when the inspection found none (a rebooted container) the last recorded state stands.
pub fn evidence_of(
    result: &Result<Inspection, InspectError>,
    recorded_agent: AgentState,
) -> (Evidence, AgentState) {
    match result {
        Ok(inspection) => (
            Evidence::Inspected(inspection.unsaved.clone()),
            inspection
                .agent
                .as_ref()
                .map_or(recorded_agent, |report| report.state),
        ),
        Err(_) => (Evidence::Failed, recorded_agent),
    }
}

/// Inspects `instance` as it is: by exec when it runs, by booting it (and stopping it again)
/// when it is stopped. Any other state (frozen, starting, in error) is left alone and is an
/// inspection failure. Returns whether it was booted.
pub async fn inspect_in_place(
    runtime: &dyn Runtime,
    instance: &str,
    expected: &Expected,
    timeout: Duration,
) -> (Result<Inspection, InspectError>, bool) {
    let status = match runtime.get_instance(instance).await {
        Ok(Some(found)) => found.status,
        Ok(None) => {
            return (
                Err(InspectError::Exited {
                    code: -1,
                    detail: format!("{instance} does not exist"),
                }),
                false,
            );
        }
        Err(e) => return (Err(InspectError::Exec(e)), false),
    };
    inspect_as_found(runtime, instance, status, expected, timeout).await
}

/// [`inspect_in_place`] of an instance the caller has just read as `status`.
pub async fn inspect_as_found(
    runtime: &dyn Runtime,
    instance: &str,
    status: InstanceStatus,
    expected: &Expected,
    timeout: Duration,
) -> (Result<Inspection, InspectError>, bool) {
    match status {
        InstanceStatus::Running => (
            inspect::inspect(runtime, instance, expected, timeout).await,
            false,
        ),
        InstanceStatus::Stopped => (
            inspect_stopped(runtime, instance, expected, timeout).await,
            true,
        ),
        other => (
            Err(InspectError::Exited {
                code: -1,
                detail: format!("{instance} is {other:?}, neither running nor stopped"),
            }),
            false,
        ),
    }
}

/// [`quiesce`]'s shell script, `$1` the grace in tenths of a second. It notes every process but
/// init and itself, sends SIGTERM to all but init (`kill -1`), waits until the noted ones have
/// exited (a zombie has) or the grace is over, and then stops whatever runs with SIGSTOP: also
/// what started meanwhile, such as a shell init's own wait helper, which is not waited for. The
/// same words run under dash and busybox ash.
pub const QUIESCE_SCRIPT: &str = r#"pids=
for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = 1 ] || [ "$p" = $$ ] || pids="$pids $p"
done
kill -TERM -1 2>/dev/null
i=0
while [ -n "$pids" ] && [ "$i" -lt "$1" ]; do
    left=
    for p in $pids; do
        stat=
        read -r stat 2>/dev/null </proc/$p/stat || continue
        rest=${stat##*) }
        [ "${rest%% *}" = Z ] || left="$left $p"
    done
    pids=$left
    [ -n "$pids" ] || break
    sleep 0.1
    i=$((i + 1))
done
kill -STOP -1 2>/dev/null
exit 0"#;

/// Ends the work of every process in the running container `instance` but its init, as a clean
/// stop would, without stopping the container: each gets SIGTERM and `grace` to exit (a process
/// that saves its state on SIGTERM does so here, as it would on a stop), then whatever is left,
/// and anything started meanwhile, is stopped with SIGSTOP. A look after this sees all that the
/// processes wrote on their way out, and nothing but init runs between that look and the
/// container's end.
pub async fn quiesce(
    runtime: &dyn Runtime,
    instance: &str,
    grace: Duration,
    timeout: Duration,
) -> Result<(), InspectError> {
    let tenths = grace.as_millis().div_ceil(100).to_string();
    let mut request = ExecRequest::new(
        ["sh", "-c", QUIESCE_SCRIPT, "berth-quiesce", tenths.as_str()],
        timeout.max(grace * 2),
    );
    request.cwd = Some("/".into());
    request.env = BTreeMap::from([(
        "PATH".to_string(),
        "/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
    )]);
    request.discard_output = true;
    let output = runtime
        .exec(instance, &request)
        .await
        .map_err(InspectError::Exec)?;
    if !output.success() {
        return Err(InspectError::Exited {
            code: output.exit_code,
            detail: "ending the container's processes before the last look failed".into(),
        });
    }
    Ok(())
}

/// Whether `request` is [`quiesce`]'s.
#[cfg(test)]
pub fn is_quiesce(request: &ExecRequest) -> bool {
    request
        .command
        .get(3)
        .is_some_and(|arg| arg == "berth-quiesce")
}

/// Why a stopped container could not be booted for its inspection.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("starting {instance} to inspect it: {source}")]
    Start {
        instance: String,
        #[source]
        source: crate::runtime::RuntimeError,
    },
    #[error("{instance} did not finish booting within {timeout:?}")]
    NotReady { instance: String, timeout: Duration },
}

/// Inspects a stopped container: boots it (init only; the runner is started by the reconciler,
/// not by booting), inspects, and stops it again whatever was found, so the caller can delete it
/// or leave it as it was. Any failure is an inspection failure for the policy.
pub async fn inspect_stopped(
    runtime: &dyn Runtime,
    instance: &str,
    expected: &Expected,
    timeout: Duration,
) -> Result<Inspection, InspectError> {
    let booted = boot(runtime, instance, timeout).await;
    let result = match booted {
        Ok(()) => inspect::inspect(runtime, instance, expected, timeout).await,
        Err(e) => Err(InspectError::Exited {
            code: -1,
            detail: e.to_string(),
        }),
    };
    if let Err(e) = runtime
        .stop_instance(instance, StopOptions::clean_then_force(timeout))
        .await
    {
        tracing::warn!(instance, error = %e, "stopping after inspection failed");
    }
    result
}

/// Starts a stopped instance and waits until berth's init says it is ready (no runner: the
/// reconciler starts that, not a boot).
pub async fn boot(
    runtime: &dyn Runtime,
    instance: &str,
    timeout: Duration,
) -> Result<(), BootError> {
    let until = Instant::now() + timeout;
    // LXD refuses a start while an earlier operation (a stop that just returned) still holds
    // the instance; that clears within moments.
    loop {
        match runtime.start_instance(instance, timeout).await {
            Ok(()) => break,
            Err(e) if e.is_busy() && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(source) => {
                return Err(BootError::Start {
                    instance: instance.to_string(),
                    source,
                });
            }
        }
    }
    // berth's init writes /run/init.ready once /run and /workspace are in place.
    loop {
        let mut ready = ExecRequest::new(["test", "-f", "/run/init.ready"], timeout);
        ready.cwd = Some("/".into());
        ready.env = BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
        if runtime
            .exec(instance, &ready)
            .await
            .is_ok_and(|o| o.success())
        {
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(BootError::NotReady {
                instance: instance.to_string(),
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
