//! The daemon's wall clock. A release build reads the system clock. A `testing` build lets an
//! end-to-end test move it: `BERTH_TESTING_CLOCK_SHIFT_FILE` names a file holding a number of
//! seconds added to every reading (read at each reading, so a test can jump the clock of a
//! running daemon the way an operator's `date -s` or a bad NTP server would). Unit tests shift
//! their own thread's clock ([`shift_this_thread`]).

use chrono::{DateTime, Utc};

/// Now, by the daemon's wall clock.
pub fn now() -> DateTime<Utc> {
    Utc::now() + shift()
}

fn shift() -> chrono::Duration {
    #[cfg(test)]
    if let Some(shift) = THREAD_SHIFT.with(std::cell::Cell::get) {
        return shift;
    }
    file_shift()
}

#[cfg(feature = "testing")]
fn file_shift() -> chrono::Duration {
    let Some(file) = std::env::var_os("BERTH_TESTING_CLOCK_SHIFT_FILE") else {
        return chrono::Duration::zero();
    };
    std::fs::read_to_string(file)
        .ok()
        .and_then(|text| text.trim().parse::<i64>().ok())
        .and_then(chrono::Duration::try_seconds)
        .unwrap_or_else(chrono::Duration::zero)
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
fn file_shift() -> chrono::Duration {
    chrono::Duration::zero()
}

#[cfg(test)]
thread_local! {
    static THREAD_SHIFT: std::cell::Cell<Option<chrono::Duration>> =
        const { std::cell::Cell::new(None) };
}

/// Moves this thread's wall clock by `by` (a unit test on a current-thread runtime); `None`
/// gives it back the system's.
#[cfg(test)]
pub fn shift_this_thread(by: Option<chrono::Duration>) {
    THREAD_SHIFT.with(|shift| shift.set(by));
}
