//! What the store keeps about access: sealed secrets and their per-project revision, users (by
//! token hash only) and project membership. The store never sees a secret in plain text; the
//! secrets module seals and opens values.
//!
//! Rows name projects by uid. A secret or a member is written only while the project exists,
//! checked under the store lock, and removed in the transaction that removes the project. A
//! GitSource's credentials are secrets of the same kind, named by the GitSource's uid.

use std::collections::{BTreeSet, HashMap};

use berth_api::Kind;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::cache::Names;
use super::{Store, StoreError};

/// One secret as a listing shows it: the key and when it last changed, never the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretEntry {
    pub key: String,
    pub updated: DateTime<Utc>,
}

/// The secrets of a project changed: the controller propagates them again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretsChange {
    pub project_uid: String,
    pub project: String,
    /// The project's secrets revision after the change; it only grows.
    pub revision: u64,
}

/// A user of the TCP listener. The token itself is never stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub admin: bool,
    pub created: DateTime<Utc>,
    /// Which user this is, beyond the name: a name removed and added again is another user,
    /// with another id (derived from the user's token hash, never equal to it). Sessions and
    /// streams bind to it, so they do not pass to whoever gets the name next.
    pub id: String,
}

/// A user's id from its token hash: tokens are random, so no two users share one.
fn user_id(token_hash: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(format!("berth-user-id:{token_hash}").as_bytes())[..16])
}

pub(super) fn load_members(conn: &Connection) -> Result<HashMap<String, Names>, StoreError> {
    let mut stmt = conn.prepare("SELECT project_uid, user FROM members")?;
    let rows = stmt.query_map([], |row| Ok((row.get::<_, String>(0)?, row.get(1)?)))?;
    let mut members: HashMap<String, Names> = HashMap::new();
    for row in rows {
        let (uid, user) = row?;
        members.entry(uid).or_default().insert(user);
    }
    Ok(members)
}

/// Deletes everything held for a project (or a GitSource's credentials): part of the
/// transaction that removes it. Its tool execution records and their outputs go with it.
pub(super) fn forget_project(tx: &Transaction<'_>, uid: &str) -> Result<(), StoreError> {
    tx.execute("DELETE FROM secrets WHERE project_uid = ?1", [uid])?;
    tx.execute("DELETE FROM secret_revisions WHERE project_uid = ?1", [uid])?;
    tx.execute("DELETE FROM members WHERE project_uid = ?1", [uid])?;
    tx.execute("DELETE FROM executions WHERE project_uid = ?1", [uid])?;
    Ok(())
}

pub(super) fn insert_member(tx: &Transaction<'_>, uid: &str, user: &str) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO members (project_uid, user, added) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
        params![uid, user, now().to_rfc3339()],
    )?;
    Ok(())
}

fn now() -> DateTime<Utc> {
    super::now()
}

impl Store {
    /// The project's name, if `uid` is a live project: secrets and members attach only to one.
    fn project_name(inner: &super::Inner, uid: &str) -> Result<String, StoreError> {
        match inner.uids.get(uid) {
            Some((Kind::Project, name)) => Ok(name.clone()),
            _ => Err(StoreError::not_found(Kind::Project, uid)),
        }
    }

    /// What a secret attaches to: a live project (`Some(name)`, its changes are published for
    /// propagation) or a live GitSource (`None`: git reads its credentials at each sync).
    fn secret_owner(inner: &super::Inner, uid: &str) -> Result<Option<String>, StoreError> {
        match inner.uids.get(uid) {
            Some((Kind::Project, name)) => Ok(Some(name.clone())),
            Some((Kind::GitSource, _)) => Ok(None),
            _ => Err(StoreError::not_found(Kind::Project, uid)),
        }
    }

    /// Writes (or overwrites) one sealed secret and bumps the project's secrets revision.
    pub fn put_secret(
        &self,
        project_uid: &str,
        key: &str,
        sealed: &[u8],
    ) -> Result<u64, StoreError> {
        let mut inner = self.lock();
        let project = Self::secret_owner(&inner, project_uid)?;
        let result = (|| {
            let tx = inner.conn.transaction()?;
            tx.execute(
                "INSERT INTO secrets (project_uid, key, sealed, updated) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (project_uid, key) DO UPDATE SET sealed = ?3, updated = ?4",
                params![project_uid, key, sealed, now().to_rfc3339()],
            )?;
            let revision = bump_revision(&tx, project_uid)?;
            tx.commit()?;
            Ok(revision)
        })();
        inner.note_write(&result);
        let revision = result?;
        if let Some(project) = project {
            let _ = self.secret_changes.send(SecretsChange {
                project_uid: project_uid.to_string(),
                project,
                revision,
            });
        }
        Ok(revision)
    }

    /// Deletes one secret; `Ok(false)` when there was none.
    pub fn delete_secret(&self, project_uid: &str, key: &str) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        let project = Self::secret_owner(&inner, project_uid)?;
        let result = (|| {
            let tx = inner.conn.transaction()?;
            let deleted = tx.execute(
                "DELETE FROM secrets WHERE project_uid = ?1 AND key = ?2",
                params![project_uid, key],
            )?;
            if deleted == 0 {
                return Ok(None);
            }
            let revision = bump_revision(&tx, project_uid)?;
            tx.commit()?;
            Ok(Some(revision))
        })();
        inner.note_write(&result);
        let Some(revision) = result? else {
            return Ok(false);
        };
        if let Some(project) = project {
            let _ = self.secret_changes.send(SecretsChange {
                project_uid: project_uid.to_string(),
                project,
                revision,
            });
        }
        Ok(true)
    }

    /// Keys and update times of a project's secrets, by key.
    pub fn secret_entries(&self, project_uid: &str) -> Result<Vec<SecretEntry>, StoreError> {
        let inner = self.lock();
        let mut stmt = inner.conn.prepare_cached(
            "SELECT key, updated FROM secrets WHERE project_uid = ?1 ORDER BY key",
        )?;
        let rows = stmt.query_map([project_uid], |row| {
            Ok(SecretEntry {
                key: row.get(0)?,
                updated: super::events::timestamp(row, 1)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// One sealed secret.
    pub fn sealed_secret(
        &self,
        project_uid: &str,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .conn
            .query_row(
                "SELECT sealed FROM secrets WHERE project_uid = ?1 AND key = ?2",
                params![project_uid, key],
                |row| row.get(0),
            )
            .optional()?)
    }

    /// Every sealed secret of a project, by key.
    pub fn sealed_secrets(&self, project_uid: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let inner = self.lock();
        let mut stmt = inner.conn.prepare_cached(
            "SELECT key, sealed FROM secrets WHERE project_uid = ?1 ORDER BY key",
        )?;
        let rows = stmt.query_map([project_uid], |row| Ok((row.get(0)?, row.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The project's secrets revision: 0 before any secret was set, then one more per change.
    pub fn secrets_revision(&self, project_uid: &str) -> Result<u64, StoreError> {
        let inner = self.lock();
        let revision: Option<i64> = inner
            .conn
            .query_row(
                "SELECT revision FROM secret_revisions WHERE project_uid = ?1",
                [project_uid],
                |row| row.get(0),
            )
            .optional()?;
        Ok(revision.unwrap_or(0) as u64)
    }

    /// Every secrets change from now on.
    pub fn subscribe_secrets(&self) -> tokio::sync::broadcast::Receiver<SecretsChange> {
        self.secret_changes.subscribe()
    }

    /// Adds a user with the sha256 of its token.
    pub fn add_user(&self, name: &str, token_hash: &str, admin: bool) -> Result<User, StoreError> {
        let mut inner = self.lock();
        let user = User {
            name: name.to_string(),
            admin,
            created: now(),
            id: user_id(token_hash),
        };
        let result = inner.conn.execute(
            "INSERT INTO users (name, token_hash, admin, created) VALUES (?1, ?2, ?3, ?4)",
            params![name, token_hash, admin, user.created.to_rfc3339()],
        );
        let result = match result {
            Err(rusqlite::Error::SqliteFailure(err, _))
                if err.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(StoreError::AlreadyExists {
                    kind: "User".to_string(),
                    name: name.to_string(),
                })
            }
            other => other.map_err(StoreError::from),
        };
        inner.note_write(&result);
        result.map(|_| user)
    }

    /// Removes a user and its memberships.
    pub fn remove_user(&self, name: &str) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let result = (|| {
            let tx = inner.conn.transaction()?;
            let removed = tx.execute("DELETE FROM users WHERE name = ?1", [name])?;
            if removed == 0 {
                return Err(StoreError::not_found("User", name));
            }
            tx.execute("DELETE FROM members WHERE user = ?1", [name])?;
            tx.commit()?;
            Ok(())
        })();
        inner.note_write(&result);
        result?;
        for members in inner.members.values_mut() {
            members.remove(name);
        }
        inner.members.retain(|_, members| !members.is_empty());
        Ok(())
    }

    pub fn users(&self) -> Result<Vec<User>, StoreError> {
        let inner = self.lock();
        let mut stmt = inner
            .conn
            .prepare_cached("SELECT name, admin, created, token_hash FROM users ORDER BY name")?;
        let rows = stmt.query_map([], user_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn user(&self, name: &str) -> Result<Option<User>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .conn
            .query_row(
                "SELECT name, admin, created, token_hash FROM users WHERE name = ?1",
                [name],
                user_row,
            )
            .optional()?)
    }

    /// The user whose token hashes to `token_hash`.
    pub fn user_by_token_hash(&self, token_hash: &str) -> Result<Option<User>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .conn
            .query_row(
                "SELECT name, admin, created, token_hash FROM users WHERE token_hash = ?1",
                [token_hash],
                user_row,
            )
            .optional()?)
    }

    /// The members of a project, by name.
    pub fn members(&self, project_uid: &str) -> Vec<String> {
        self.lock()
            .members
            .get(project_uid)
            .map(|m| m.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn is_member(&self, project_uid: &str, user: &str) -> bool {
        self.lock()
            .members
            .get(project_uid)
            .is_some_and(|m| m.contains(user))
    }

    /// The uids of the projects `user` is a member of.
    pub fn projects_of(&self, user: &str) -> BTreeSet<String> {
        self.lock()
            .members
            .iter()
            .filter(|(_, members)| members.contains(user))
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// Adds a member; `Ok(false)` when it already was one.
    pub fn add_member(&self, project_uid: &str, user: &str) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        Self::project_name(&inner, project_uid)?;
        if inner
            .members
            .get(project_uid)
            .is_some_and(|m| m.contains(user))
        {
            return Ok(false);
        }
        let result = inner.conn.execute(
            "INSERT INTO members (project_uid, user, added) VALUES (?1, ?2, ?3) \
             ON CONFLICT DO NOTHING",
            params![project_uid, user, now().to_rfc3339()],
        );
        let result = result.map_err(StoreError::from);
        inner.note_write(&result);
        result?;
        inner
            .members
            .entry(project_uid.to_string())
            .or_default()
            .insert(user.to_string());
        Ok(true)
    }

    /// Removes a member. With `keep_one`, refuses (Conflict) to remove the last one, checked
    /// under the lock so two concurrent removals cannot both pass.
    pub fn remove_member(
        &self,
        project_uid: &str,
        user: &str,
        keep_one: bool,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let project = Self::project_name(&inner, project_uid)?;
        let members = inner.members.get(project_uid).cloned().unwrap_or_default();
        if !members.contains(user) {
            return Err(StoreError::not_found("Member", user));
        }
        if keep_one && members.len() == 1 {
            return Err(StoreError::conflict(
                Kind::Project,
                &project,
                format!(
                    "{user:?} is the last member of project {project:?}; only an admin may remove it"
                ),
            ));
        }
        let result = inner
            .conn
            .execute(
                "DELETE FROM members WHERE project_uid = ?1 AND user = ?2",
                params![project_uid, user],
            )
            .map_err(StoreError::from);
        inner.note_write(&result);
        result?;
        if let Some(members) = inner.members.get_mut(project_uid) {
            members.remove(user);
            if members.is_empty() {
                inner.members.remove(project_uid);
            }
        }
        Ok(())
    }
}

fn bump_revision(tx: &Transaction<'_>, project_uid: &str) -> Result<u64, StoreError> {
    let revision: i64 = tx.query_row(
        "INSERT INTO secret_revisions (project_uid, revision) VALUES (?1, 1) \
         ON CONFLICT (project_uid) DO UPDATE SET revision = revision + 1 RETURNING revision",
        [project_uid],
        |row| row.get(0),
    )?;
    Ok(revision as u64)
}

fn user_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<User> {
    Ok(User {
        name: row.get(0)?,
        admin: row.get(1)?,
        created: super::events::timestamp(row, 2)?,
        id: user_id(&row.get::<_, String>(3)?),
    })
}

#[cfg(test)]
mod tests {
    use super::super::Desired;
    use super::*;
    use crate::store::{ApplyParams, Commit, PostParams};

    fn project(name: &str, display: &str) -> Desired {
        Desired::project(name, serde_json::json!({"displayName": display}))
    }

    #[test]
    fn the_creator_joins_with_the_write_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("berth.db");
        let store = Store::open(&path).unwrap();
        let dry = store
            .create(project("dry", "Dry"), PostParams::by("ana", Commit::DryRun))
            .unwrap();
        assert!(store.members(dry.uid()).is_empty());
        let made = store
            .create(
                project("pay", "Pay"),
                PostParams::by("ana", Commit::Persist),
            )
            .unwrap();
        assert_eq!(store.members(made.uid()), ["ana"]);
        // A batch that fails leaves no membership behind.
        let failed = store.apply_batch(
            vec![project("one", "One"), project("two", "Pay")],
            ApplyParams::by("bob", Commit::Persist),
        );
        assert!(failed.is_err());
        assert!(store.projects_of("bob").is_empty());
        // Applying over an existing project adds nobody.
        store
            .apply(
                project("pay", "Pay"),
                ApplyParams::by("bob", Commit::Persist),
            )
            .unwrap();
        assert_eq!(store.members(made.uid()), ["ana"]);

        assert!(matches!(
            store.remove_member(made.uid(), "ana", true),
            Err(StoreError::Conflict { .. })
        ));
        store.add_user("bob", "hash", false).unwrap();
        store.add_member(made.uid(), "bob").unwrap();
        drop(store);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.members(made.uid()), ["ana", "bob"]);
        store.remove_user("bob").unwrap();
        assert_eq!(store.members(made.uid()), ["ana"]);
        crate::testing::fixtures::delete_project(&store, "pay", Default::default());
        assert!(store.projects_of("ana").is_empty());
        drop(store);
        assert!(Store::open(&path).unwrap().projects_of("ana").is_empty());
    }

    /// An apply allowed as a create (the name was free when access was checked) must not land
    /// on the project another user made in the gap, nor one allowed against one version on a
    /// later one; nothing is written and nobody joins.
    #[test]
    fn an_apply_checked_against_what_it_read_never_lands_on_something_else() {
        use super::super::Expected;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("berth.db")).unwrap();
        let seen = store.get(Kind::Project, "pay");
        assert!(seen.is_none());
        // Ana creates it between Bob's check and Bob's write.
        let anas = store
            .create(
                project("pay", "Ana's"),
                PostParams::by("ana", Commit::Persist),
            )
            .unwrap();
        let moved = store.apply(
            (project("pay", "Bob's"), Expected::of(seen.as_deref())),
            ApplyParams::by("bob", Commit::Persist),
        );
        assert!(matches!(moved, Err(StoreError::Moved { .. })), "{moved:?}");
        let now = store.get(Kind::Project, "pay").unwrap();
        assert_eq!(now.spec.get("displayName").unwrap(), "Ana's");
        assert_eq!(store.members(anas.uid()), ["ana"]);
        // The same inside a batch: all or nothing.
        let failed = store.apply_batch(
            vec![
                (project("other", "Other"), Expected::Absent),
                (project("pay", "Bob's"), Expected::Absent),
            ],
            ApplyParams::by("bob", Commit::Persist),
        );
        assert!(matches!(
            failed,
            Err(super::super::BatchFailure {
                index: Some(1),
                error: StoreError::Moved { .. }
            })
        ));
        assert!(store.get(Kind::Project, "other").is_none());
        // Against the version read, it is written; against a stale one, it is not.
        let read = Expected::of(Some(&now));
        store
            .apply(
                (project("pay", "Ana's too"), read),
                ApplyParams::by("ana", Commit::Persist),
            )
            .unwrap();
        assert!(matches!(
            store.apply(
                (project("pay", "stale"), read),
                ApplyParams::by("ana", Commit::Persist)
            ),
            Err(StoreError::Moved { .. })
        ));
        // Absent and still absent: created.
        store
            .apply(
                (project("free", "Free"), Expected::Absent),
                ApplyParams::by("bob", Commit::Persist),
            )
            .unwrap();
        assert_eq!(
            store.members(store.get(Kind::Project, "free").unwrap().uid()),
            ["bob"]
        );
    }
}
