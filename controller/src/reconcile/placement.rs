//! Where a new project lives on an LXD cluster.
//!
//! A project is placed once, before its volumes and first container are created: on the least
//! loaded eligible member by berth's own count of projects per member (ties to the first name),
//! among the members `lxd.target` allows (every member, an `@group`'s members, or exactly the
//! named one) that are online. The member is recorded in `status.location` before anything is
//! created there and never changes: the volumes live on it, so the container always goes back
//! to it. On a single LXD server nothing is placed.

use std::collections::BTreeMap;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::{Mutex, MutexGuard};
use tokio::time::Instant;

use crate::runtime::ClusterMember;

/// Why no member may take a new project; the message names the member or group.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Unplaceable {
    #[error("lxd.target names cluster member {0:?}, which the cluster does not have")]
    NoSuchMember(String),
    #[error("lxd.target names cluster group {0:?}, which has no members")]
    EmptyGroup(String),
    #[error("no cluster member {scope} is online ({states})")]
    NoneOnline { scope: String, states: String },
}

/// Chooses the member for a new project: `target` is `lxd.target` (`None`: any member),
/// `load` the number of projects berth placed on each member so far.
pub fn choose_member(
    target: Option<&str>,
    members: &[ClusterMember],
    load: &BTreeMap<String, usize>,
) -> Result<String, Unplaceable> {
    let (eligible, scope): (Vec<&ClusterMember>, String) = match target {
        None => (members.iter().collect(), "of the cluster".to_string()),
        Some(group) if group.starts_with('@') => {
            let name = &group[1..];
            let eligible: Vec<_> = members
                .iter()
                .filter(|m| m.groups.iter().any(|g| g == name))
                .collect();
            if eligible.is_empty() {
                return Err(Unplaceable::EmptyGroup(name.to_string()));
            }
            (eligible, format!("of group {name:?}"))
        }
        Some(member) => {
            let eligible: Vec<_> = members.iter().filter(|m| m.name == member).collect();
            if eligible.is_empty() {
                return Err(Unplaceable::NoSuchMember(member.to_string()));
            }
            (eligible, format!("{member:?}"))
        }
    };
    eligible
        .iter()
        .filter(|m| m.is_online())
        .min_by_key(|m| (load.get(&m.name).copied().unwrap_or(0), m.name.as_str()))
        .map(|m| m.name.clone())
        .ok_or_else(|| Unplaceable::NoneOnline {
            scope,
            states: eligible
                .iter()
                .map(|m| format!("{}: {}", m.name, m.status))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The member a project is placed on: its recorded `status.location`, else where its container
/// was last seen (a project from before placement was recorded). An empty name is none.
pub fn placed_member<'a>(
    location: Option<&'a str>,
    container_location: Option<&'a str>,
) -> Option<&'a str> {
    location
        .filter(|l| !l.is_empty())
        .or(container_location)
        .filter(|l| !l.is_empty())
}

/// Projects per member, from where each project is placed (`None`: not placed yet).
pub fn load_by_member<'a>(
    locations: impl IntoIterator<Item = Option<&'a str>>,
) -> BTreeMap<String, usize> {
    let mut load = BTreeMap::new();
    for member in locations.into_iter().flatten() {
        *load.entry(member.to_string()).or_insert(0) += 1;
    }
    load
}

/// How long a count of projects per member answers for the placements that follow it, so a
/// batch of new projects costs one count of the store rather than one each.
const LOAD_REUSE: Duration = Duration::from_secs(2);

/// Makes placements one at a time: each decision sees the ones made before it, so a batch of
/// new projects spreads instead of all choosing the member that was least loaded at once.
#[derive(Debug, Default)]
pub struct Placer {
    load: Mutex<Option<(Instant, BTreeMap<String, usize>)>>,
}

impl Placer {
    /// The projects per member, counted by `count` unless a count younger than [`LOAD_REUSE`]
    /// (with the placements made since) answers. Placements wait for the guard to drop.
    pub async fn load(&self, count: impl FnOnce() -> BTreeMap<String, usize>) -> LoadGuard<'_> {
        let mut guard = self.load.lock().await;
        if guard
            .as_ref()
            .is_none_or(|(at, _)| at.elapsed() > LOAD_REUSE)
        {
            *guard = Some((Instant::now(), count()));
        }
        LoadGuard { guard }
    }
}

/// The load while one placement is being decided and recorded.
pub struct LoadGuard<'a> {
    guard: MutexGuard<'a, Option<(Instant, BTreeMap<String, usize>)>>,
}

impl LoadGuard<'_> {
    pub fn get(&self) -> &BTreeMap<String, usize> {
        &self
            .guard
            .as_ref()
            .expect("counted when the guard was made")
            .1
    }

    /// A project was placed on `member`: the next decision counts it.
    pub fn placed(&mut self, member: &str) {
        if let Some((_, load)) = self.guard.as_mut() {
            *load.entry(member.to_string()).or_insert(0) += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lxd.target`, the load, and the member chosen (or why none is).
    type Case<'a> = (
        Option<&'a str>,
        BTreeMap<String, usize>,
        Result<&'a str, Unplaceable>,
    );

    fn member(name: &str, status: &str, groups: &[&str]) -> ClusterMember {
        ClusterMember {
            name: name.into(),
            status: status.into(),
            message: String::new(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn the_least_loaded_eligible_online_member_takes_a_new_project() {
        let members = vec![
            member("m1", "Online", &["default", "fast"]),
            member("m2", "Online", &["default"]),
            member("m3", "Offline", &["default", "fast"]),
            member("m4", "Evacuated", &["default", "fast"]),
        ];
        let load = |pairs: &[(&str, usize)]| -> BTreeMap<String, usize> {
            pairs.iter().map(|(m, n)| (m.to_string(), *n)).collect()
        };
        let cases: Vec<Case> = vec![
            // Ties go to the first name; an empty count is zero.
            (None, load(&[]), Ok("m1")),
            (None, load(&[("m1", 1)]), Ok("m2")),
            (None, load(&[("m1", 3), ("m2", 3)]), Ok("m1")),
            (None, load(&[("m1", 4), ("m2", 3)]), Ok("m2")),
            // Offline and evacuated members take nothing, however empty.
            (None, load(&[("m1", 9), ("m2", 9)]), Ok("m1")),
            // A group: only its members.
            (Some("@fast"), load(&[("m1", 50)]), Ok("m1")),
            (Some("@default"), load(&[("m1", 5), ("m2", 4)]), Ok("m2")),
            (
                Some("@slow"),
                load(&[]),
                Err(Unplaceable::EmptyGroup("slow".into())),
            ),
            // A member: exactly it, whatever the load elsewhere.
            (Some("m2"), load(&[("m2", 100)]), Ok("m2")),
            (
                Some("m9"),
                load(&[]),
                Err(Unplaceable::NoSuchMember("m9".into())),
            ),
            (
                Some("m3"),
                load(&[]),
                Err(Unplaceable::NoneOnline {
                    scope: "\"m3\"".into(),
                    states: "m3: Offline".into(),
                }),
            ),
        ];
        for (target, load, expected) in cases {
            assert_eq!(
                choose_member(target, &members, &load),
                expected.map(str::to_string),
                "target {target:?}, load {load:?}"
            );
        }
        let down = [
            member("m3", "Offline", &["fast"]),
            member("m4", "Evacuated", &["fast"]),
        ];
        let err = choose_member(Some("@fast"), &down, &BTreeMap::new()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no cluster member of group \"fast\" is online (m3: Offline, m4: Evacuated)"
        );
    }

    #[test]
    fn placing_one_project_after_another_spreads_them_evenly() {
        let members = vec![
            member("a", "Online", &["default"]),
            member("b", "Online", &["default"]),
            member("c", "Online", &["default"]),
        ];
        let mut placed: Vec<String> = vec!["a".into(), "a".into(), "a".into(), "a".into()];
        for _ in 0..26 {
            let load = load_by_member(placed.iter().map(|m| Some(m.as_str())));
            placed.push(choose_member(None, &members, &load).unwrap());
        }
        let load = load_by_member(placed.iter().map(|m| Some(m.as_str())));
        assert_eq!(
            load,
            [("a", 10), ("b", 10), ("c", 10)]
                .into_iter()
                .map(|(m, n)| (m.to_string(), n))
                .collect()
        );
        assert_eq!(load_by_member([None, Some("a"), None]).len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_recent_count_answers_with_the_placements_made_since() {
        let placer = Placer::default();
        let counts = std::sync::atomic::AtomicUsize::new(0);
        let count = || {
            counts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            load_by_member([Some("a")])
        };
        {
            let mut load = placer.load(count).await;
            assert_eq!(load.get().get("a"), Some(&1));
            load.placed("b");
        }
        let load = placer.load(count).await;
        assert_eq!(load.get().get("b"), Some(&1), "the placement since counts");
        drop(load);
        assert_eq!(counts.load(std::sync::atomic::Ordering::SeqCst), 1);
        tokio::time::advance(LOAD_REUSE + Duration::from_millis(1)).await;
        let load = placer.load(count).await;
        assert_eq!(load.get().get("b"), None, "counted afresh from the store");
        assert_eq!(counts.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
