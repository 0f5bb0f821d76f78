//! The controller's error policy (kube-runtime's `error_policy`): what the work queue does after
//! a reconcile failed, decided from the typed error.

use std::time::Duration;

use super::{Action, ReconcileError};

/// The longest a key waits after LXD answered that the instance is busy with another operation.
pub const BUSY_RETRY: Duration = Duration::from_secs(2);

/// After a failed reconcile of `_name`, given the key's backoff: LXD busy with another operation
/// on the instance is retried soon (that operation lets go shortly); a spec LXD refuses waits
/// for the spec to change (a spec write requests the key, and the resync looks again); anything
/// else is retried after the backoff.
pub fn error_policy(_name: &str, error: &ReconcileError, backoff: Duration) -> Action {
    match error {
        ReconcileError::Runtime(e) | ReconcileError::StepCall { source: e, .. } if e.is_busy() => {
            Action::Requeue(backoff.min(BUSY_RETRY))
        }
        ReconcileError::Spec(_) => Action::Done,
        _ => Action::Requeue(backoff),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::RuntimeError;
    use crate::store::StoreError;

    #[test]
    fn the_error_decides_when_the_project_is_reconciled_again() {
        let busy = || {
            ReconcileError::Runtime(RuntimeError::Busy {
                what: "instance p".into(),
                message: "instance is busy running a start operation".into(),
            })
        };
        let long = Duration::from_secs(60);
        let short = Duration::from_millis(500);
        // (error, the key's backoff, what follows)
        let cases: Vec<(ReconcileError, Duration, Action)> = vec![
            (busy(), long, Action::Requeue(BUSY_RETRY)),
            (busy(), short, Action::Requeue(short)),
            (
                ReconcileError::StepCall {
                    step: berth_api::Step::Started,
                    source: RuntimeError::Busy {
                        what: "instance p".into(),
                        message: "busy".into(),
                    },
                },
                long,
                Action::Requeue(BUSY_RETRY),
            ),
            (
                ReconcileError::Spec("LXD refused the limits".into()),
                long,
                Action::Done,
            ),
            (
                ReconcileError::Runtime(RuntimeError::Transport {
                    what: "GET /1.0".into(),
                    message: "connection refused".into(),
                }),
                long,
                Action::Requeue(long),
            ),
            (
                ReconcileError::Store(StoreError::Unwritable("disk full".into())),
                long,
                Action::Requeue(long),
            ),
            (
                ReconcileError::Failed("the container is not there".into()),
                short,
                Action::Requeue(short),
            ),
        ];
        for (error, backoff, expected) in cases {
            assert_eq!(error_policy("p", &error, backoff), expected, "{error}");
        }
    }
}
