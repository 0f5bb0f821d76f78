//! Who may do what. The unix socket is the local administrator; on TCP a bearer token names a
//! user, and a user who is not an admin sees and changes only the projects it is a member of;
//! of the others it hears 404, as of names that do not exist.
//! Deleting a project, changing its resource limits and writing AgentProfiles, GitSources and
//! users are for admins; `file://` repositories outside `allowedFileRoots` too. A GitSource
//! names a repository and how it is reached: a non-admin sees only those that manage a project
//! it is a member of.
//!
//! A `Refusal` is answered as 400, 403, 404 or 422, with at most 20 causes and a count of the
//! rest.

use std::collections::BTreeSet;
use std::sync::Arc;

use berth_api::Kind;
use hyper::StatusCode;
use hyper::header::{AUTHORIZATION, HeaderMap};
use serde_json::Value;

use super::error::ApiError;
use super::{ApiState, Caller, Transport};
use crate::admission::{Admitter, Refusal};
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

/// Who `caller` is to admission.
pub fn admitter(caller: &Caller) -> Admitter<'_> {
    if caller.admin && caller.transport == super::Transport::Unix {
        Admitter::Local {
            name: &caller.identity,
        }
    } else if caller.admin {
        Admitter::Admin {
            name: &caller.identity,
        }
    } else {
        Admitter::User {
            name: &caller.identity,
        }
    }
}

/// What a user who is not an admin reads of a GitSource and of events: the names of projects it
/// may not get are taken out of a GitSource's inventory and shown as `Project/(hidden)` in
/// every message (conditions, events), so a GitSource managing one of its projects does not
/// name the others.
pub struct Redaction {
    /// The projects the reader may get: every other name is hidden, even of one gone.
    shown: BTreeSet<String>,
}

/// What stands for a project name the reader may not get.
const HIDDEN: &str = "(hidden)";

impl Redaction {
    /// `None` for an admin, who reads everything.
    pub fn of(state: &ApiState, caller: &Caller) -> Option<Redaction> {
        if caller.admin {
            return None;
        }
        let mine = state.store.projects_of(&caller.identity);
        let shown = state
            .store
            .list(Kind::Project)
            .iter()
            .filter(|p| mine.contains(p.uid()))
            .map(|p| p.name().to_string())
            .collect();
        Some(Redaction { shown })
    }

    /// `text` with each `Project/NAME` the reader may not get as `Project/(hidden)`.
    pub fn text(&self, text: &str) -> String {
        const PREFIX: &str = "Project/";
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find(PREFIX) {
            let (before, after) = rest.split_at(at + PREFIX.len());
            out.push_str(before);
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(after.len());
            let (name, tail) = after.split_at(end);
            out.push_str(if self.shown.contains(name) {
                name
            } else {
                HIDDEN
            });
            rest = tail;
        }
        out.push_str(rest);
        out
    }

    /// A serialised GitSource (or any object): hidden projects out of `status.inventory`, and
    /// out of every string of its status.
    pub fn object(&self, object: &mut Value) {
        let Some(status) = object.get_mut("status") else {
            return;
        };
        if let Some(Value::Array(inventory)) = status.get_mut("inventory") {
            inventory.retain(|entry| {
                entry
                    .as_str()
                    .and_then(|e| e.strip_prefix("Project/"))
                    .is_none_or(|name| self.shown.contains(name))
            });
        }
        self.strings(status);
    }

    /// A serialised event: its message (and any other text) redacted.
    pub fn event(&self, event: &mut Value) {
        self.strings(event);
    }

    fn strings(&self, value: &mut Value) {
        match value {
            Value::String(text) if text.contains("Project/") => *text = self.text(text),
            Value::Array(items) => items.iter_mut().for_each(|v| self.strings(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.strings(v)),
            _ => {}
        }
    }
}

/// Whether `caller` may write `desired` over `current` (absent when it would be created), as
/// admission judges it against the object as it is now.
pub fn check_write(
    state: &ApiState,
    caller: &Caller,
    desired: &Desired,
    current: Option<&StoredObject>,
) -> Result<(), ApiError> {
    state
        .admission
        .check(admitter(caller), desired, current, &state.store)
        .map_err(|refusal| refusal.into_api_error(Some(desired.kind.as_str()), Some(&desired.name)))
}

impl Refusal {
    /// The API's answer: 400 for server-owned metadata, 403 for what the caller may not write,
    /// 422 for an invalid object.
    pub fn into_api_error(self, kind: Option<&str>, name: Option<&str>) -> ApiError {
        let with_object = |error: ApiError| match kind {
            Some(kind) => error.with_object(kind, name.unwrap_or_default()),
            None => error,
        };
        match self {
            Refusal::Hidden(Kind::Project, project) => not_a_member(&project),
            Refusal::Hidden(kind, name) => {
                ApiError::not_found(format!("{kind} {name:?} not found")).with_object(kind, &name)
            }
            Refusal::Invalid(causes) => ApiError::invalid(kind, name, causes),
            Refusal::ServerOwned(causes) => {
                let causes = super::error::bounded(causes);
                let summary = super::error::summary(&causes);
                with_object(ApiError {
                    causes,
                    ..ApiError::bad_request(summary)
                })
            }
            Refusal::Forbidden(causes) => {
                let causes = super::error::bounded(causes);
                let summary = super::error::summary(&causes);
                with_object(ApiError {
                    causes,
                    ..ApiError::forbidden(summary)
                })
            }
        }
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
    fn a_redaction_hides_every_project_but_the_readers() {
        let redaction = Redaction {
            shown: ["mine".to_string()].into(),
        };
        assert_eq!(
            redaction.text(
                "revision abc: created Project/mine, Project/mine-too, Project/gone; \
                 configured AgentProfile/shell"
            ),
            "revision abc: created Project/mine, Project/(hidden), Project/(hidden); \
             configured AgentProfile/shell"
        );
        let mut source = serde_json::json!({"spec": {"url": "https://h/Project/x"},
            "status": {"inventory": ["AgentProfile/shell", "Project/mine", "Project/theirs"],
                       "conditions": [{"message": "applied Project/theirs"}]}});
        redaction.object(&mut source);
        assert_eq!(
            source["status"],
            serde_json::json!({"inventory": ["AgentProfile/shell", "Project/mine"],
                "conditions": [{"message": "applied Project/(hidden)"}]})
        );
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
