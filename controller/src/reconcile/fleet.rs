//! Keeping the fleet safe when containers vanish.
//!
//! A project is judged `Missing` only when a list of berth's instances that succeeded lacks its
//! container. When more than a tenth of the containers berth expects (and at least three) are
//! gone at once, something bigger than one project went wrong (a wiped storage pool, the wrong
//! LXD project, a restore): berth recreates none of them, says so, and waits for a person, who
//! releases a project with `berth restart --recreate`.

use std::collections::HashSet;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::layout::{LABEL_PREFIX, uid_label};
use crate::runtime::{Runtime, RuntimeError};

/// A list younger than this answers for every project judged meanwhile whose container was
/// found absent before the list began, so many projects found missing at once cost one list
/// call. A list that began before the absence was seen may still show the container: it does
/// not answer for that project.
const LIST_REUSE: Duration = Duration::from_secs(2);
/// Fewer vanished containers than this are always recreated.
const MASS_VANISH_MIN: usize = 3;

/// What the fleet guard concluded about one project's container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The list has it after all (it came back between the two reads): look again.
    Present,
    /// Gone, and recreating it is safe.
    Recreate,
    /// Gone together with too many others: recreate nothing.
    Hold { vanished: usize, expected: usize },
}

#[derive(Debug, Default)]
struct GuardState {
    /// When the last list call began, and the uids it showed.
    last_list: Option<(Instant, HashSet<String>)>,
    /// The vanished set last reported, so one episode raises one event and one metric.
    reported: HashSet<String>,
}

#[derive(Debug, Default)]
pub struct FleetGuard {
    state: Mutex<GuardState>,
}

/// Whether so many of the expected containers vanished that none may be recreated.
pub fn is_mass_vanish(vanished: usize, expected: usize) -> bool {
    vanished >= MASS_VANISH_MIN && vanished * 10 > expected
}

impl FleetGuard {
    /// Judges the project with `uid`, whose container a read that began at `absent_since` found
    /// absent. `expected` is the uids of every project whose status says it has a container.
    ///
    /// Returns the verdict and, the first time a mass vanish is seen (or it grows), the number
    /// of vanished containers to report.
    pub async fn judge(
        &self,
        runtime: &dyn Runtime,
        uid: &str,
        absent_since: Instant,
        expected: &HashSet<String>,
    ) -> Result<(Verdict, Option<usize>), RuntimeError> {
        let mut state = self.state.lock().await;
        let fresh = state
            .last_list
            .as_ref()
            .is_some_and(|(at, _)| *at >= absent_since && at.elapsed() < LIST_REUSE);
        if !fresh {
            let listed_at = Instant::now();
            let instances = runtime.list_instances(Some(LABEL_PREFIX), false).await?;
            let present = instances
                .iter()
                .filter_map(|i| uid_label(&i.config).map(str::to_string))
                .collect();
            state.last_list = Some((listed_at, present));
        }
        let present = &state.last_list.as_ref().expect("listed above").1;
        if present.contains(uid) {
            return Ok((Verdict::Present, None));
        }
        let vanished: HashSet<String> = expected
            .iter()
            .filter(|u| !present.contains(*u))
            .cloned()
            .collect();
        // The project itself counts even when its status no longer lists it as expected.
        let count = vanished.len().max(1);
        if !is_mass_vanish(count, expected.len()) {
            return Ok((Verdict::Recreate, None));
        }
        let report = if vanished.is_subset(&state.reported) {
            None
        } else {
            state.reported = vanished;
            Some(count)
        };
        Ok((
            Verdict::Hold {
                vanished: count,
                expected: expected.len(),
            },
            report,
        ))
    }

    /// Takes a list made elsewhere (the resync pass), whose call began at `listed_at`, as the
    /// latest one.
    pub async fn seed(&self, instances: &[crate::runtime::Instance], listed_at: Instant) {
        let present = instances
            .iter()
            .filter_map(|i| uid_label(&i.config).map(str::to_string))
            .collect();
        self.state.lock().await.last_list = Some((listed_at, present));
    }

    /// Forgets the last list: the next judgement lists again.
    pub async fn invalidate(&self) {
        self.state.lock().await.last_list = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mass_vanish_needs_three_and_a_tenth() {
        let cases = [
            (1, 1, false),
            (2, 2, false),
            (3, 3, true),
            (3, 30, false),
            (3, 29, true),
            (4, 100, false),
            (11, 100, true),
            (10, 100, false),
        ];
        for (vanished, expected, mass) in cases {
            assert_eq!(
                is_mass_vanish(vanished, expected),
                mass,
                "{vanished} of {expected}"
            );
        }
    }
}
