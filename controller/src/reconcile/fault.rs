//! Fault points for crash tests (feature `testing` only): `BERTH_FAULT=after-step:Created` exits
//! the process right after that step was committed, `BERTH_FAULT=after-call:create_instance`
//! right after LXD accepted that call and before berth recorded it. A release build has neither.

/// The process exit code of a fault point, so a test can tell it from a crash.
pub const FAULT_EXIT_CODE: i32 = 86;

/// Exits the process when `BERTH_FAULT` names this point.
#[cfg(feature = "testing")]
pub fn point(kind: &str, name: &str) {
    static FAULT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let wanted = FAULT.get_or_init(|| std::env::var("BERTH_FAULT").ok());
    if let Some(wanted) = wanted
        && wanted.split_once(':') == Some((kind, name))
    {
        eprintln!("berth: fault point {kind}:{name} reached, exiting");
        std::process::exit(FAULT_EXIT_CODE);
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub fn point(_kind: &str, _name: &str) {}

/// Right after a step was committed to the store.
pub fn after_step(step: berth_api::Step) {
    point("after-step", step.as_str());
}

/// Right after the runtime accepted a call, before its outcome is recorded.
pub fn after_call(call: &str) {
    point("after-call", call);
}
