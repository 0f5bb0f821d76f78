//! A project on an LXD cluster: the member it is placed on, recorded in `status.location`
//! before anything is created there; waiting, without touching or moving the container, while
//! that member is offline or evacuated; and `cluster.evacuate=stop` on its container, so an
//! evacuation stops it by its volumes.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_api::{Kind, Phase, reasons};

use super::{Concern, Next, Project};
use crate::layout::uid_label;
use crate::reconcile::status::Draft;
use crate::reconcile::{Action, ReconcileError, placement};
use crate::runtime::{Instance, InstancePatch, InstanceStatus};
use crate::store::StoredObject;

/// How often a project waiting for its cluster member (offline, evacuated, none available)
/// looks again; the member's return is not an event of the project's.
const MEMBER_POLL: Duration = Duration::from_secs(10);

/// The LXD key that makes evacuating a cluster member stop the container where it is, by its
/// volumes, instead of moving it away from them.
pub(super) const EVACUATE_KEY: &str = "cluster.evacuate";

/// What [`Project::place`] decided.
pub(super) enum Placed {
    /// Create on this member (`None`: a single LXD server).
    On(Option<String>),
    /// No member can take it now: end the reconcile with this action.
    Wait(Action),
}

impl Project<'_> {
    /// The member to create the volumes and the container on: the one recorded in
    /// `status.location`; else, on a cluster, the one the project's workspace volume already
    /// lives on (a project from before placement was recorded), else the least loaded eligible
    /// member. A new decision is recorded before anything is created there, so a crash in
    /// between cannot place the project twice. `None` on a single LXD server.
    pub(super) async fn place(&self, draft: &mut Draft) -> Result<Placed, ReconcileError> {
        if let Some(member) = draft.status.location.clone() {
            return Ok(Placed::On(Some(member)));
        }
        let runtime = &*self.ctx.runtime;
        let settings = &self.ctx.settings;
        let server = runtime.server_info().await?;
        if !server.clustered {
            return Ok(Placed::On(None));
        }
        let store = &self.ctx.store;
        let mut load = self
            .ctx
            .placement
            .load(|| {
                let placed: Vec<Option<String>> = store
                    .list(Kind::Project)
                    .iter()
                    .map(|p| recorded_location(p))
                    .collect();
                placement::load_by_member(placed.iter().map(Option::as_deref))
            })
            .await;
        let workspace = crate::layout::DurableLayout::workspace_volume(self.uid());
        let existing = runtime
            .get_volume(&settings.storage_pool, &workspace, None)
            .await?
            .filter(|v| uid_label(&v.config) == Some(self.uid()))
            .and_then(|v| member_name(&v.location));
        let member = match existing {
            Some(member) => member,
            None => match placement::choose_member(
                settings.target.as_deref(),
                &server.members,
                load.get(),
            ) {
                Ok(member) => member,
                Err(why) => {
                    drop(load);
                    draft.set_not_ready(
                        Phase::Pending,
                        reasons::NO_MEMBER_AVAILABLE,
                        &why.to_string(),
                    );
                    self.commit(draft).await?;
                    return Ok(Placed::Wait(Action::Requeue(MEMBER_POLL)));
                }
            },
        };
        load.placed(&member);
        tracing::info!(member = member.as_str(), "placed on a cluster member");
        draft.status.location = Some(member.clone());
        self.commit(draft).await?;
        Ok(Placed::On(Some(member)))
    }

    /// A container on a cluster member that is offline or evacuated is neither touched nor
    /// recreated elsewhere: its volumes live on that member. A running one is on a member that
    /// answers.
    pub(super) async fn wait_for_member(&self, draft: &mut Draft, instance: &Instance) -> Concern {
        if instance.status == InstanceStatus::Running {
            return Ok(Next::Continue);
        }
        match member_name(&instance.location) {
            Some(member) => self.wait_for_member_named(draft, &member).await,
            None => Ok(Next::Continue),
        }
    }

    /// [`Self::wait_for_member`] for a container that could not be read or listed: judged by
    /// the member the project is placed on.
    pub(super) async fn wait_for_recorded_member(&self, draft: &mut Draft) -> Concern {
        let status = &draft.status;
        let container = status
            .container
            .as_ref()
            .and_then(|c| c.location.as_deref());
        let recorded = placement::placed_member(status.location.as_deref(), container);
        match recorded.map(str::to_string) {
            Some(member) => self.wait_for_member_named(draft, &member).await,
            None => Ok(Next::Continue),
        }
    }

    /// Waits while `member` is evacuated (phase Stopped, reason `MemberEvacuated`) or otherwise
    /// not online (reason `MemberOffline`), looking again every [`MEMBER_POLL`].
    async fn wait_for_member_named(&self, draft: &mut Draft, member: &str) -> Concern {
        let server = self.ctx.runtime.server_info().await?;
        let Some(found) = server
            .members
            .iter()
            .find(|m| m.name == member)
            .filter(|m| server.clustered && !m.is_online())
        else {
            return Ok(Next::Continue);
        };
        if found.is_evacuated() {
            draft.set_not_ready(
                Phase::Stopped,
                reasons::MEMBER_EVACUATED,
                &format!(
                    "cluster member {member:?} holding the project is evacuated; its container stays stopped there, by its volumes, until the member is restored"
                ),
            );
        } else {
            draft.set_not_ready(
                Phase::Error,
                reasons::MEMBER_OFFLINE,
                &format!(
                    "cluster member {member:?} holding the project is {}; berth waits for it",
                    found.status
                ),
            );
        }
        self.commit(draft).await?;
        Ok(Next::Return(Action::Requeue(MEMBER_POLL)))
    }

    /// A container on a cluster member carries `cluster.evacuate=stop`: evacuating the member
    /// stops it there rather than moving it away from its volumes (containers created before
    /// berth set the key get it here).
    pub(super) async fn stay_on_evacuation(
        &self,
        draft: &mut Draft,
        instance: &Instance,
    ) -> Concern {
        if member_name(&instance.location).is_none()
            || instance.config.get(EVACUATE_KEY).map(String::as_str) == Some("stop")
        {
            return Ok(Next::Continue);
        }
        let patch = InstancePatch {
            config: [(EVACUATE_KEY.to_string(), "stop".to_string())].into(),
            devices: BTreeMap::new(),
        };
        self.ctx.runtime.patch_instance(self.name(), &patch).await?;
        self.commit_and_go_on(draft).await
    }
}

/// A cluster member's name from an instance's or volume's `location` ("none" or empty on a
/// single server).
pub(super) fn member_name(location: &str) -> Option<String> {
    Some(location.to_string()).filter(|l| !l.is_empty() && l != "none")
}

/// The member a stored project is placed on: `status.location`, else (placed before it was
/// recorded) where its container was last seen.
fn recorded_location(project: &StoredObject) -> Option<String> {
    let status = &project.status;
    let location = status.get_str("location");
    let container = status.pointer("/container/location");
    placement::placed_member(
        location.as_deref(),
        container.as_ref().and_then(|l| l.as_str()),
    )
    .map(str::to_string)
}
