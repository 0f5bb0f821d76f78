//! The network pass: the IPv4 check of every running project this round's activity pass
//! inspected (the inspection reports the container's addresses, so the check costs no LXD
//! call of its own). What it sees is recorded in `status.network`; a project whose addresses
//! are all gone is repaired once, under its slot in the work queue, with a `NetworkRepaired`
//! event, or a `NetworkRepairFailed` Warning when no address came back (and no other repair
//! until one does).

use std::sync::Arc;

use berth_api::{NetworkStatus, ProjectStatus};

use super::{DaemonPasses, paused, running};
use crate::network::check::{self, Check};
use crate::store::{EventType, StoredObject};

impl DaemonPasses {
    pub(super) async fn network(&self) {
        let round = self.round.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for object in self.projects() {
            if object.is_deleting() || paused(&object) || !running(&object) {
                continue;
            }
            let Some(Ok(inspection)) = round.get(object.uid()) else {
                continue;
            };
            let status: ProjectStatus = object.status.decode().unwrap_or_default();
            match check::check(status.network.as_ref(), inspection.ipv4.as_ref()) {
                Check::Steady => {}
                Check::Record(network) => self.record_network(&object, network).await,
                Check::Repair => {
                    let had = status.network.unwrap_or_default();
                    self.repair_network(&object, &had).await;
                }
            }
        }
    }

    async fn record_network(&self, object: &StoredObject, network: NetworkStatus) {
        let write = self
            .update_status(object.name(), move |status, _| {
                status.network = Some(network.clone());
            })
            .await;
        if let Err(e) = write {
            tracing::warn!(project = object.name(), error = %e, "recording the network failed");
        }
    }

    async fn repair_network(&self, object: &Arc<StoredObject>, had: &NetworkStatus) {
        let name = object.name();
        let lost = had
            .ipv4
            .iter()
            .map(|(interface, addresses)| format!("{interface} {}", addresses.join(" ")))
            .collect::<Vec<_>>()
            .join(", ");
        let outcome = {
            let _slot = self.slot(name).await;
            let current = self.store.get(berth_api::Kind::Project, name);
            if !current.is_some_and(|c| c.uid() == object.uid() && running(&c) && !c.is_deleting())
            {
                return;
            }
            tracing::info!(project = name, lost = %lost, "every IPv4 address is gone: repairing the network");
            crate::network::repair(self.runtime.as_ref(), name).await
        };
        let repaired = match outcome {
            Ok(repair) if !repair.ipv4().is_empty() => {
                let message = format!(
                    "the IPv4 address was lost ({lost}); the network was repaired: {}",
                    repair.summary()
                );
                self.event(object, EventType::Normal, "NetworkRepaired", &message)
                    .await;
                return;
            }
            Ok(repair) => {
                let mut message = format!(
                    "the IPv4 address was lost ({lost}) and a repair did not bring one back: {}",
                    repair.summary()
                );
                if !repair.notes.is_empty() {
                    message.push_str(&format!("; {}", repair.notes.join("; ")));
                }
                message
            }
            Err(e) => format!("the IPv4 address was lost ({lost}) and the repair failed: {e}"),
        };
        tracing::warn!(project = name, "{repaired}");
        self.event(object, EventType::Warning, "NetworkRepairFailed", &repaired)
            .await;
        let failed = check::repair_failed(had, self.now());
        self.record_network(object, failed).await;
    }
}
