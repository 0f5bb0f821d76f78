//! The housekeeping pass's finding: containers berth labelled whose project object is gone. They
//! are reported (an event and a metric), never deleted here: the
//! object may be mid-restore, and a container is the one place its workspace may still live.

use std::collections::BTreeSet;

use crate::runtime::Instance;

/// A container that carries berth's project label but whose project is not in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub instance: String,
    /// The project uid on its label.
    pub uid: String,
    pub location: String,
}

/// The instances labelled `uid_key` (the config key where berth records the project's uid)
/// whose uid is not among `known_uids`. Instances without the label are not berth's and are
/// never reported. Sorted by instance name.
pub fn orphans(
    instances: &[Instance],
    uid_key: &str,
    known_uids: &BTreeSet<String>,
) -> Vec<Orphan> {
    let mut found: Vec<Orphan> = instances
        .iter()
        .filter_map(|instance| {
            let uid = instance.config.get(uid_key)?;
            (!uid.is_empty() && !known_uids.contains(uid)).then(|| Orphan {
                instance: instance.name.clone(),
                uid: uid.clone(),
                location: instance.location.clone(),
            })
        })
        .collect();
    found.sort_by(|a, b| a.instance.cmp(&b.instance));
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::InstanceStatus;

    fn instance(name: &str, labels: &[(&str, &str)]) -> Instance {
        Instance {
            name: name.to_string(),
            status: InstanceStatus::Running,
            status_code: 103,
            location: "none".into(),
            profiles: Vec::new(),
            config: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            devices: Default::default(),
            created_at: None,
            last_used_at: None,
            state: None,
        }
    }

    #[test]
    fn only_labelled_containers_without_an_object_are_reported() {
        const KEY: &str = "user.berth.uid";
        let instances = vec![
            instance("web", &[(KEY, "u1")]),
            instance("gone-b", &[(KEY, "u9")]),
            instance("gone-a", &[(KEY, "u8")]),
            instance("someone-elses", &[("user.other", "x")]),
            instance("blank", &[(KEY, "")]),
        ];
        let known: BTreeSet<String> = ["u1".to_string()].into();
        let got: Vec<(String, String)> = orphans(&instances, KEY, &known)
            .into_iter()
            .map(|o| (o.instance, o.uid))
            .collect();
        assert_eq!(
            got,
            vec![
                ("gone-a".to_string(), "u8".to_string()),
                ("gone-b".to_string(), "u9".to_string())
            ]
        );
    }
}
