//! Who may do what. The unix socket is the local administrator; on TCP a bearer token names a
//! user, and a user who is not an admin sees and changes only the projects it is a member of;
//! of the others it hears 404, as of names that do not exist.
//! Deleting a project, changing its resource limits and writing AgentProfiles, GitSources and
//! users are for admins; `file://` repositories outside `allowedFileRoots` too. A GitSource
//! names a repository and how it is reached: a non-admin sees only those that manage a project
//! it is a member of.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use berth_api::Kind;
use hyper::StatusCode;
use hyper::header::{AUTHORIZATION, HeaderMap};
use serde_json::Value;

use super::error::ApiError;
use super::{ApiState, Caller, Transport};
use crate::store::{Desired, Store, StoredObject};

/// Paths the TCP listener serves without a token: they hold no secrets and no project names
/// (the routes [`super::authority::ROUTES`] marks public).
pub fn is_public(path: &str) -> bool {
    super::authority::is_public(&hyper::Method::GET, path)
}

pub fn unauthorized(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized", message)
}

/// The caller of a TCP request, from its `Authorization: Bearer` header.
pub fn authenticate_tcp(state: &ApiState, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let header = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok());
    let Some(token) = crate::auth::bearer(header) else {
        return Err(unauthorized(
            "this listener needs Authorization: Bearer <token> (berth user add NAME)",
        ));
    };
    match crate::auth::authenticate(&state.store, token)? {
        Some(user) => Ok(Caller {
            identity: user.name,
            transport: Transport::Tcp,
            admin: user.admin,
        }),
        None => Err(unauthorized("the bearer token is not valid")),
    }
}

pub fn require_admin(caller: &Caller, what: &str) -> Result<(), ApiError> {
    if caller.admin {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "user {:?} may not {what}: admins only",
            caller.identity
        )))
    }
}

/// What a caller who is not a member hears of a project: exactly what it would hear of a name
/// that does not exist, so outsiders cannot tell which names are taken. 403 is for members
/// lacking a right.
fn not_a_member(project: &str) -> ApiError {
    ApiError::not_found(format!("Project {project:?} not found"))
        .with_object(Kind::Project, project)
}

/// The project `name`, if it exists and the caller is a member or an admin; 404 otherwise.
pub fn member_project(
    state: &ApiState,
    caller: &Caller,
    name: &str,
) -> Result<Arc<StoredObject>, ApiError> {
    let project = state
        .store
        .get(Kind::Project, name)
        .ok_or_else(|| not_a_member(name))?;
    if caller.admin || state.store.is_member(project.uid(), &caller.identity) {
        Ok(project)
    } else {
        Err(not_a_member(name))
    }
}

/// Which objects a caller may see in lists and watches: everything for an admin; for a user,
/// the projects it is a member of, the GitSources that manage one of those, and every object of
/// the other kinds.
pub enum Visibility {
    All,
    Some {
        projects: BTreeSet<String>,
        gitsources: BTreeSet<String>,
    },
}

impl Visibility {
    /// A snapshot of the caller's memberships, for one list.
    pub fn of(state: &ApiState, caller: &Caller) -> Visibility {
        if caller.admin {
            Visibility::All
        } else {
            Visibility::of_user(&state.store, &caller.identity)
        }
    }

    pub fn of_user(store: &Store, user: &str) -> Visibility {
        let projects = store.projects_of(user);
        let gitsources = store
            .list(Kind::GitSource)
            .iter()
            .filter(|g| manages_one_of(store, g.name(), &projects))
            .map(|g| g.uid().to_string())
            .collect();
        Visibility::Some {
            projects,
            gitsources,
        }
    }

    pub fn shows(&self, kind: Kind, uid: &str) -> bool {
        match self {
            Visibility::All => true,
            Visibility::Some {
                projects,
                gitsources,
            } => match kind {
                Kind::Project => projects.contains(uid),
                Kind::GitSource => gitsources.contains(uid),
                Kind::AgentProfile => true,
            },
        }
    }
}

/// Whether GitSource `name` applied a project one of `project_uids`.
fn manages_one_of(store: &Store, name: &str, project_uids: &BTreeSet<String>) -> bool {
    store
        .applyset_inventory(&berth_api::GitSource::applyset_name(name))
        .iter()
        .filter_map(|entry| entry.strip_prefix("Project/"))
        .filter_map(|project| store.get(Kind::Project, project))
        .any(|project| project_uids.contains(project.uid()))
}

/// Whether `user` (not an admin) may see GitSource `name`: it manages a project of theirs.
pub fn gitsource_visible(store: &Store, name: &str, user: &str) -> bool {
    store.get(Kind::GitSource, name).is_some()
        && manages_one_of(store, name, &store.projects_of(user))
}

/// Whether `caller` may write `desired` over `current` (absent when it would be created).
pub fn check_write(
    state: &ApiState,
    caller: &Caller,
    desired: &Desired,
    current: Option<&StoredObject>,
) -> Result<(), ApiError> {
    if desired.kind == Kind::Project {
        check_forwards(state, caller, desired, current)?;
    }
    if caller.admin {
        return Ok(());
    }
    if desired.kind != Kind::Project {
        // Re-applying what is already there changes nothing, so a member's GitOps directory
        // may carry the admin's profiles.
        if current.is_some_and(|c| unchanged(desired, c)) {
            return Ok(());
        }
        return require_admin(caller, &format!("write {} objects", desired.kind));
    }
    if let Some(current) = current
        && !state.store.is_member(current.uid(), &caller.identity)
    {
        return Err(not_a_member(current.name()));
    }
    let resources = desired.spec.get("resources").unwrap_or(&Value::Null);
    let allowed_resources = match current {
        Some(current) => current.spec.get("resources").unwrap_or(Value::Null),
        None => state.admission.default_resources(),
    };
    if *resources != allowed_resources {
        return Err(ApiError::forbidden(format!(
            "user {:?} may not set spec.resources of project {:?}: resource limits are changed by admins only",
            caller.identity, desired.name
        ))
        .with_object(Kind::Project, &desired.name));
    }
    let url = repo_url(&desired.spec);
    let current_spec = current.map(|c| c.spec.value()).unwrap_or_default();
    if url != repo_url(&current_spec) {
        check_file_url(state, caller, "spec.repo.url", url)?;
    }
    Ok(())
}

/// `spec.forwards` open a path from the container to the host: only an admin sets or changes
/// them, and only towards loopback or the config's `allowedForwardTargets`.
fn check_forwards(
    state: &ApiState,
    caller: &Caller,
    desired: &Desired,
    current: Option<&StoredObject>,
) -> Result<(), ApiError> {
    let wanted = desired.spec.get("forwards").unwrap_or(&Value::Null);
    let had = current
        .and_then(|c| c.spec.get("forwards"))
        .unwrap_or(Value::Null);
    if *wanted == had {
        return Ok(());
    }
    if !caller.admin {
        return Err(ApiError::forbidden(format!(
            "user {:?} may not set spec.forwards of project {:?}: host forwards are set by admins only",
            caller.identity, desired.name
        ))
        .with_object(Kind::Project, &desired.name));
    }
    for (i, forward) in wanted.as_array().into_iter().flatten().enumerate() {
        let to = forward.get("to").and_then(Value::as_str).unwrap_or("");
        let field = format!("spec.forwards[{i}].to");
        if let Err(message) =
            crate::agent::forwards::check_target(to, &state.allowed_forward_targets)
        {
            return Err(ApiError::invalid(
                Some(Kind::Project.as_str()),
                Some(&desired.name),
                vec![super::error::Cause::new(field, message)],
            ));
        }
    }
    Ok(())
}

fn unchanged(desired: &Desired, current: &StoredObject) -> bool {
    desired.spec == current.spec
        && desired.labels == current.metadata.labels
        && desired.annotations == current.metadata.annotations
        && desired
            .finalizers
            .as_ref()
            .is_none_or(|f| *f == current.metadata.finalizers)
}

fn repo_url(spec: &Value) -> &str {
    spec.pointer("/repo/url")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// A `file://` URL reads the daemon's host: a non-admin may name only paths under the
/// configured roots.
pub fn check_file_url(
    state: &ApiState,
    caller: &Caller,
    field: &str,
    url: &str,
) -> Result<(), ApiError> {
    let Some(path) = berth_api::file_url_path(url) else {
        return Ok(());
    };
    if caller.admin {
        return Ok(());
    }
    let path = Path::new(path);
    let roots = crate::file_roots::FileRoots::new(state.allowed_file_roots.clone());
    if !roots.names(path) {
        return Err(ApiError::forbidden(format!(
            "{field}: {url:?} is not under allowedFileRoots; only an admin may name this host path"
        )));
    }
    // Where git would read, links, `gitdir:` and alternates followed. A repository that does
    // not exist yet cannot be judged now; the checkout judges it when it runs.
    match roots.confine(path) {
        Err(crate::file_roots::ConfineError::Outside(why)) => Err(ApiError::forbidden(format!(
            "{field}: {url:?} leads outside allowedFileRoots ({why}); only an admin may name it"
        ))),
        Ok(_) | Err(crate::file_roots::ConfineError::Unresolved(_)) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Commit;

    #[test]
    fn a_user_sees_its_projects_and_the_gitsources_that_manage_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("berth.db")).unwrap();
        let project = |name: &str| {
            store
                .create(
                    Desired::project(name, serde_json::json!({})),
                    Commit::Persist,
                )
                .unwrap()
        };
        let mine = project("mine");
        let theirs = project("theirs");
        store.add_member(mine.uid(), "alice").unwrap();
        store.add_member(theirs.uid(), "bob").unwrap();
        let gitsource = |name: &str, manages: &str| {
            let url = format!("https://git.example/{name}.git");
            let source = store
                .create(
                    Desired::of(Kind::GitSource, name, serde_json::json!({"url": url})),
                    Commit::Persist,
                )
                .unwrap();
            let batch = vec![Desired::project(manages, serde_json::json!({}))];
            store
                .apply_set(
                    &berth_api::GitSource::applyset_name(name),
                    batch,
                    false,
                    Commit::Persist,
                )
                .unwrap();
            source
        };
        let fleet = gitsource("fleet", "mine");
        let other = gitsource("other", "theirs");
        let profile = store
            .create(
                Desired::of(Kind::AgentProfile, "p", serde_json::json!({})),
                Commit::Persist,
            )
            .unwrap();

        let alice = Visibility::of_user(&store, "alice");
        let table = [
            (Kind::Project, mine.uid(), true),
            (Kind::Project, theirs.uid(), false),
            (Kind::GitSource, fleet.uid(), true),
            (Kind::GitSource, other.uid(), false),
            (Kind::AgentProfile, profile.uid(), true),
        ];
        for (kind, uid, shown) in table {
            assert_eq!(alice.shows(kind, uid), shown, "{kind} {uid}");
            assert!(Visibility::All.shows(kind, uid));
        }
        assert!(gitsource_visible(&store, "fleet", "alice"));
        assert!(!gitsource_visible(&store, "other", "alice"));
        assert!(!gitsource_visible(&store, "fleet", "carol"));
        assert!(!gitsource_visible(&store, "missing", "alice"));
    }

    #[test]
    fn public_paths() {
        for path in ["/healthz", "/readyz", "/metrics"] {
            assert!(is_public(path));
        }
        for path in ["/version", "/apis/berth.dev/v1alpha1/projects", "/"] {
            assert!(!is_public(path));
        }
    }
}
