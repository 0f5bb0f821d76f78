//! The housekeeping pass: the trash's expired entries purged, the events of objects long gone
//! pruned, and containers labelled for projects the store does not know reported (never
//! deleted), from the resync's list when it made one.
use std::collections::BTreeSet;
use std::sync::Arc;

use berth_api::{Kind, ObjectMeta};

use super::*;
use crate::layout::LABEL_PREFIX;
use crate::scheduler::housekeeping::{self, Orphan};
use crate::store::{Doc, EventType, StoredObject};

impl DaemonPasses {
    /// Purges the trash entries that outlived `trash.retention` (a `TrashPurged` event each)
    /// and recounts the trash's metrics, when the trash is due a sweep ([`Trash::sweep`]).
    pub(super) async fn purge_trash(&self) {
        let Some(trash) = &self.trash else { return };
        // Background work: reading the trash costs LXD a scan of the pool's volumes, so not while
        // the reconciler is saturated, nor in the first settle period, when a daemon just
        // started may be taking an apply; the sweep stays due.
        let settling = (self.started.checked_add_signed(self.settle))
            .is_some_and(|settled| self.now() < settled);
        if settling || self.queue.saturated() {
            return;
        }
        if let Some(Err(e)) = trash.sweep(&*self.runtime, self.now()).await {
            tracing::warn!(error = %e, "housekeeping could not read the trash");
        }
    }

    /// Reports containers berth labelled whose project is gone, once per orphan episode (an
    /// event and the `orphan_containers` gauge); never deletes them.
    /// Drops the events of objects that went longer than `events.retention` ago; none while the
    /// trash finds the wall clock jumped (their history, the pause's own warning included, would
    /// go on the clock's word alone).
    pub(super) async fn prune_events(&self) {
        if self
            .trash
            .as_ref()
            .is_some_and(|t| t.purge_paused().is_some())
        {
            return;
        }
        let retention =
            chrono::Duration::from_std(self.event_retention).unwrap_or(chrono::Duration::MAX);
        let Some(before) = self.now().checked_sub_signed(retention) else {
            return;
        };
        match self.store.call(move |s| s.prune_gone_events(before)).await {
            Ok(0) => {}
            Ok(pruned) => tracing::debug!(pruned, "pruned the events of objects gone"),
            Err(e) => tracing::warn!(error = %e, "pruning the events of objects gone failed"),
        }
    }

    pub(super) async fn housekeeping(&self) {
        self.purge_trash().await;
        self.prune_events().await;
        let Some(strays) = self.strays().await else {
            return;
        };
        // A stray's project may have come back since the list (a restore).
        let orphans =
            housekeeping::orphans(&strays.instances, &self.uids(), self.store.controller_id());
        self.metrics
            .orphan_containers
            .set(i64::try_from(orphans.len()).unwrap_or(i64::MAX));
        let new: Vec<Orphan> = {
            let mut reported = self
                .reported_orphans
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let now: BTreeSet<(String, String)> = orphans
                .iter()
                .map(|o| (o.instance.clone(), o.uid.clone()))
                .collect();
            let new = orphans
                .into_iter()
                .filter(|o| !reported.contains(&(o.instance.clone(), o.uid.clone())))
                .collect();
            *reported = now;
            new
        };
        for orphan in new {
            tracing::warn!(
                instance = orphan.instance.as_str(),
                uid = orphan.uid.as_str(),
                location = orphan.location.as_str(),
                "orphaned container: labelled by berth, its project is gone; left in place"
            );
            self.orphan_event(&orphan).await;
        }
    }

    /// The containers labelled for projects the store did not know: from this round's resync
    /// when it listed the fleet (or found a fresh list), else from a list of housekeeping's own.
    pub(super) async fn strays(&self) -> Option<Arc<crate::reconcile::Strays>> {
        let listed = self.strays.lock().unwrap_or_else(|e| e.into_inner()).take();
        if listed.is_some() {
            return listed;
        }
        // Projects read on both sides of the list: one created or deleted meanwhile has its
        // uid in one of them, so its container is not taken for an orphan.
        let mut uids = self.uids();
        let listed_at = tokio::time::Instant::now();
        match self.runtime.list_instances(Some(LABEL_PREFIX), false).await {
            Ok(instances) => {
                uids.extend(self.uids());
                Some(Arc::new(crate::reconcile::Strays::of(
                    &instances,
                    |uid| uids.contains(uid),
                    listed_at,
                )))
            }
            Err(e) => {
                tracing::warn!(error = %e, "housekeeping could not list the containers");
                None
            }
        }
    }

    /// A Warning event about the project the orphan belonged to (by its name and the uid on its
    /// label), so `berth events` shows it to administrators; a member of a later project of the
    /// same name does not see it.
    pub(super) async fn orphan_event(&self, orphan: &Orphan) {
        let gone = Arc::new(StoredObject {
            kind: Kind::Project,
            metadata: ObjectMeta {
                name: orphan.instance.clone(),
                uid: Some(orphan.uid.clone()),
                ..ObjectMeta::default()
            },
            spec: Doc::null(),
            status: Doc::null(),
        });
        let place = match orphan.location.as_str() {
            "" | "none" => String::new(),
            member => format!(" on {member}"),
        };
        let message = format!(
            "container {}{place} carries berth's label for project uid {}, which no project has: \
             left in place with its volumes; remove it with lxc once nothing in it is needed",
            orphan.instance, orphan.uid
        );
        self.event(&gone, EventType::Warning, "OrphanedContainer", &message)
            .await;
    }
}
