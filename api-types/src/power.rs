//! The merge patches that start, stop and restart a project: `berth start|stop|restart` and
//! the console send these same ones.

use serde_json::{Value, json};

use crate::annotations::{RECREATE_REQUESTED_AT, RESTARTED_AT, WOKEN_AT};

/// Restart the container (or replace it, `recreate`), asked at `at`.
pub fn restart_patch(recreate: bool, at: &str) -> Value {
    let key = if recreate {
        RECREATE_REQUESTED_AT
    } else {
        RESTARTED_AT
    };
    json!({"metadata": {"annotations": {key: at}}})
}

/// Keep the container stopped.
pub fn stop_patch() -> Value {
    json!({"spec": {"state": "Stopped"}})
}

/// Run the container, waking an idled project, asked at `at`.
pub fn start_patch(at: &str) -> Value {
    json!({"spec": {"state": "Running"}, "metadata": {"annotations": {WOKEN_AT: at}}})
}
