//! Secrets propagation: a provisioned workspace gets its project's secrets (the `.env` block,
//! every profile's credentials and, when configured, LXD `environment.KEY`) again whenever
//! their revision moves; `SecretsSynced` says how that went.

use std::collections::BTreeMap;

use berth_api::{ConditionStatus, ProjectSpec};
use chrono::Utc;

use super::{AgentSteps, SECRETS_SYNCED, decode_status};
use crate::agent::{self, WrittenFiles};
use crate::runtime::{InstancePatch, RuntimeError};
use crate::store::{EventType, StoredObject};
use berth_api::Kind;

/// Prefix of the LXD config keys that put a value into every process's environment.
const LXD_ENV_PREFIX: &str = "environment.";

impl AgentSteps {
    pub(super) fn synced_revision(&self, uid: &str) -> Option<u64> {
        self.synced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .copied()
    }

    /// Propagates the project's secrets into the workspace: the `.env` block, every profile's
    /// credentials, and (when configured) LXD `environment.KEY`. Sets `SecretsSynced`.
    pub(super) async fn sync_secrets(
        &self,
        name: &str,
        spec: &ProjectSpec,
        revision: u64,
    ) -> Result<(), String> {
        let Some(object) = self.store.get(Kind::Project, name) else {
            return Ok(());
        };
        let uid = object.uid().to_string();
        let outcome = self.propagate(name, &object, spec).await;
        if let Err(message) = &outcome
            && !self.is_running(name).await
        {
            // Stopped meanwhile: nothing failed to reach it. The revision stays stale, so it
            // is synced once the container runs again.
            tracing::debug!(project = name, error = %message, "secrets not synced into a stopped container");
            return Ok(());
        }
        let (status, reason, message) = match &outcome {
            Ok(()) => (ConditionStatus::True, "Synced", String::new()),
            Err(message) => (ConditionStatus::False, "SyncFailed", message.clone()),
        };
        let previous = decode_status(&object);
        let was = berth_api::find_condition(&previous.conditions, SECRETS_SYNCED)
            .map(|c| c.status == status && c.message == message)
            .unwrap_or(false);
        if !was {
            let event = match outcome {
                Ok(()) => (
                    EventType::Normal,
                    "SecretsSynced",
                    "secrets propagated".to_string(),
                ),
                Err(ref m) => (EventType::Warning, "SecretsSyncFailed", m.clone()),
            };
            self.record(name, |s| {
                berth_api::set_condition(
                    &mut s.conditions,
                    SECRETS_SYNCED,
                    status,
                    reason,
                    &message,
                    object.generation(),
                    Utc::now(),
                );
            })
            .map_err(|e| e.to_string())?;
            self.event(name, event.0, event.1, &event.2);
        }
        if outcome.is_ok() {
            self.synced
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uid, revision);
        }
        outcome
    }

    /// Whether the container runs; an LXD that cannot tell counts as running, so a failure
    /// while LXD is unreachable is still reported.
    async fn is_running(&self, name: &str) -> bool {
        match self.runtime.get_instance(name).await {
            Ok(instance) => instance.is_some_and(|i| i.is_running()),
            Err(_) => true,
        }
    }

    async fn propagate(
        &self,
        name: &str,
        object: &StoredObject,
        spec: &ProjectSpec,
    ) -> Result<(), String> {
        let values = self
            .secrets
            .values(object.uid())
            .map_err(|e| format!("reading the project's secrets: {e}"))?;
        let status = decode_status(object);
        let previous = WrittenFiles {
            files: status.seeded_files.clone(),
        };
        let (written, _) = agent::sync_env(&*self.runtime, name, &spec.env, &values, &previous)
            .await
            .map_err(|e| e.to_string())?;
        if written != previous {
            self.record(name, |s| s.seeded_files = written.files.clone())
                .map_err(|e| e.to_string())?;
        }
        let profiles = self.profiles(spec).map_err(|missing| {
            format!("agent profile {missing} is not in the store; credentials not placed")
        })?;
        let named: Vec<agent::NamedProfile<'_>> =
            profiles.iter().map(|(n, p)| (n.as_str(), p)).collect();
        let missing = agent::sync_credentials(&*self.runtime, name, &named, &values)
            .await
            .map_err(|e| e.to_string())?;
        if !missing.is_empty() {
            self.event(
                name,
                EventType::Warning,
                "CredentialMissing",
                &format!("secrets not set: {}", missing.join(", ")),
            );
        }
        // Not mirrored: what an earlier mirroring left in LXD's database is cleared.
        let mirrored = if self.settings.mirror_secrets_to_lxd {
            values
        } else {
            BTreeMap::new()
        };
        self.mirror_to_lxd(name, &mirrored)
            .await
            .map_err(|e| format!("LXD environment: {e}"))?;
        Ok(())
    }

    /// Sets `environment.KEY` for every single-line secret and clears the keys of secrets that
    /// are gone (or became multi-line). Keys of `spec.env` are not berth's secrets and are left.
    async fn mirror_to_lxd(
        &self,
        name: &str,
        values: &BTreeMap<String, String>,
    ) -> Result<(), RuntimeError> {
        let instance = self.runtime.get_instance(name).await?;
        let Some(instance) = instance else {
            return Ok(());
        };
        let mirrored_key = format!("{LXD_ENV_PREFIX}BERTH_SECRET_KEYS");
        let before: Vec<String> = instance
            .config
            .get(&mirrored_key)
            .map(|v| {
                v.split(',')
                    .filter(|k| !k.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        let mut patch = InstancePatch::default();
        let mut now = Vec::new();
        for (key, value) in values {
            if value.contains('\n') || value.contains('\r') {
                continue;
            }
            patch
                .config
                .insert(format!("{LXD_ENV_PREFIX}{key}"), value.clone());
            now.push(key.clone());
        }
        for key in before {
            if !now.contains(&key) {
                patch
                    .config
                    .insert(format!("{LXD_ENV_PREFIX}{key}"), String::new());
            }
        }
        patch.config.insert(mirrored_key, now.join(","));
        let unchanged = patch
            .config
            .iter()
            .all(|(k, v)| instance.config.get(k).map(String::as_str).unwrap_or("") == v);
        if unchanged {
            return Ok(());
        }
        self.runtime.patch_instance(name, &patch).await
    }
}
