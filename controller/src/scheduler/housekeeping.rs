//! The housekeeping pass's finding: containers berth labelled whose project object is gone. They
//! are reported (an event and a metric), never deleted here: the
//! object may be mid-restore, and a container is the one place its workspace may still live.

use std::collections::BTreeSet;

use crate::layout::{CONTROLLER_LABEL, uid_label};
use crate::runtime::Instance;

/// A container that carries berth's project label but whose project is not in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub instance: String,
    /// The project uid on its label.
    pub uid: String,
    pub location: String,
}

/// The instances with berth's uid label whose uid is not among `known_uids`, of those the
/// controller `controller` created. Instances without the label are not berth's, and those
/// another controller's label names are that berth's (several may share one LXD): neither is
/// ever reported. An instance labelled before controllers were named counts as this one's.
/// Sorted by instance name.
pub fn orphans(
    instances: &[Instance],
    known_uids: &BTreeSet<String>,
    controller: &str,
) -> Vec<Orphan> {
    let mut found: Vec<Orphan> = instances
        .iter()
        .filter_map(|instance| {
            let uid = uid_label(&instance.config)?;
            let ours = instance
                .config
                .get(CONTROLLER_LABEL)
                .is_none_or(|c| c == controller);
            (ours && !uid.is_empty() && !known_uids.contains(uid)).then(|| Orphan {
                instance: instance.name.clone(),
                uid: uid.to_string(),
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
    use crate::layout::UID_LABEL;

    #[test]
    fn only_labelled_containers_without_an_object_are_reported() {
        const KEY: &str = UID_LABEL;
        const BY: &str = CONTROLLER_LABEL;
        let instances = vec![
            Instance::labelled("web", &[(KEY, "u1"), (BY, "c1")]),
            Instance::labelled("gone-b", &[(KEY, "u9"), (BY, "c1")]),
            Instance::labelled("gone-a", &[(KEY, "u8")]),
            Instance::labelled("someone-elses", &[("user.other", "x")]),
            Instance::labelled("blank", &[(KEY, "")]),
            Instance::labelled("another-berths", &[(KEY, "u7"), (BY, "c2")]),
            // An inspection instance looking at a workspace volume is no project's container.
            Instance::labelled(
                "berth-inspect-u6",
                &[
                    (crate::workspace::inspection_instance::INSPECTS_LABEL, "u6"),
                    (BY, "c1"),
                ],
            ),
        ];
        let known: BTreeSet<String> = ["u1".to_string()].into();
        let got: Vec<(String, String)> = orphans(&instances, &known, "c1")
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
