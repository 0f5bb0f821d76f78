use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::*;

fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("berth.db")).unwrap();
    (dir, store)
}

fn project(name: &str, spec: Value) -> Desired {
    Desired::project(name, spec)
}

#[test]
fn create_assigns_server_metadata_and_reopens_identical() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    let created = {
        let store = Store::open(&path).unwrap();
        let created = store
            .create(project("a", json!({"state": "Running"})), Commit::Persist)
            .unwrap();
        assert_eq!(created.generation(), 1);
        assert_eq!(created.resource_version(), 1);
        assert!(created.uid().len() >= 32);
        assert!(created.metadata.creation_timestamp.is_some());
        created
    };
    let store = Store::open(&path).unwrap();
    assert_eq!(store.get(Kind::Project, "a").unwrap(), created);
    assert_eq!(store.get_by_uid(created.uid()).unwrap(), created);
    assert_eq!(store.resource_version(), 1);
    store
        .delete(Kind::Project, "a", None, BTreeMap::new(), Commit::Persist)
        .unwrap();
    assert!(store.get_by_uid(created.uid()).is_none());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn generation_moves_only_with_spec_and_rv_on_every_write() {
    let (_dir, store) = open();
    let a = store
        .create(project("a", json!({"image": "x"})), Commit::Persist)
        .unwrap();
    let mut labelled = project("a", json!({"image": "x"}));
    labelled.labels.insert("team".into(), "pay".into());
    let (b, action) = store
        .replace(labelled.clone(), None, Commit::Persist)
        .unwrap();
    assert_eq!(action, Action::Configured);
    assert_eq!(b.generation(), a.generation());
    assert!(b.resource_version() > a.resource_version());

    // Nothing changed: nothing written, same resourceVersion.
    let (same, action) = store.apply(labelled.clone(), Commit::Persist).unwrap();
    assert_eq!(action, Action::Unchanged);
    assert_eq!(same.resource_version(), b.resource_version());
    assert_eq!(store.resource_version(), b.resource_version());

    labelled.spec = json!({"image": "y"});
    let (c, _) = store.apply(labelled, Commit::Persist).unwrap();
    assert_eq!(c.generation(), 2);
    assert!(c.resource_version() > b.resource_version());
    assert_eq!(c.uid(), a.uid());

    // The counter is global: another object's write takes the next number.
    let other = store
        .create(project("b", json!({})), Commit::Persist)
        .unwrap();
    assert_eq!(other.resource_version(), c.resource_version() + 1);
}

#[test]
fn two_writers_with_the_same_resource_version_one_gets_conflict() {
    let (_dir, store) = open();
    let store = Arc::new(store);
    let a = store
        .create(project("a", json!({"n": 0})), Commit::Persist)
        .unwrap();
    let rv = a.resource_version();
    let handles: Vec<_> = (1..=2)
        .map(|n| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                store.replace(project("a", json!({"n": n})), Some(rv), Commit::Persist)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let conflicts = results
        .iter()
        .filter(|r| matches!(r, Err(StoreError::Conflict { .. })))
        .count();
    assert_eq!((ok, conflicts), (1, 1), "{results:?}");
    assert_eq!(store.get(Kind::Project, "a").unwrap().generation(), 2);
}

#[test]
fn create_twice_is_already_exists_and_replace_missing_is_not_found() {
    let (_dir, store) = open();
    store
        .create(project("a", json!({})), Commit::Persist)
        .unwrap();
    assert!(matches!(
        store.create(project("a", json!({})), Commit::Persist),
        Err(StoreError::AlreadyExists { .. })
    ));
    assert!(matches!(
        store.replace(project("zz", json!({})), None, Commit::Persist),
        Err(StoreError::NotFound { .. })
    ));
}

#[test]
fn status_and_spec_paths_are_separate() {
    let (_dir, store) = open();
    let a = store
        .create(project("a", json!({"image": "x"})), Commit::Persist)
        .unwrap();
    let with_status = store
        .update_status(
            Kind::Project,
            "a",
            None,
            json!({"phase": "Ready"}),
            Commit::Persist,
        )
        .unwrap();
    assert_eq!(with_status.generation(), a.generation());
    assert!(with_status.resource_version() > a.resource_version());
    assert_eq!(with_status.spec, a.spec);

    // Same status again: nothing written.
    let again = store
        .update_status(
            Kind::Project,
            "a",
            None,
            json!({"phase": "Ready"}),
            Commit::Persist,
        )
        .unwrap();
    assert_eq!(again.resource_version(), with_status.resource_version());

    // A spec write keeps the status.
    let (b, _) = store
        .apply(project("a", json!({"image": "y"})), Commit::Persist)
        .unwrap();
    assert_eq!(b.status, json!({"phase": "Ready"}));
    assert_eq!(b.generation(), 2);

    // A stale status write conflicts.
    assert!(matches!(
        store.update_status(
            Kind::Project,
            "a",
            Some(a.resource_version()),
            json!({}),
            Commit::Persist
        ),
        Err(StoreError::Conflict { .. })
    ));
}

#[test]
fn finalizers_hold_a_deletion_until_the_last_is_removed() {
    let (_dir, store) = open();
    store
        .create(project("a", json!({})), Commit::Persist)
        .unwrap();
    store
        .set_finalizers(Kind::Project, "a", None, vec!["berth.dev/workspace".into()])
        .unwrap();
    let mut force = BTreeMap::new();
    force.insert("berth.dev/forceDelete".to_string(), "true".to_string());
    let Deletion::Deleting(held) = store
        .delete(Kind::Project, "a", None, force, Commit::Persist)
        .unwrap()
    else {
        panic!("a finalizer must hold the deletion");
    };
    assert!(held.is_deleting());
    assert_eq!(held.metadata.annotations["berth.dev/forceDelete"], "true");

    // Applying the manifest again neither revives it nor drops the finalizer.
    let (still, _) = store
        .apply(project("a", json!({})), Commit::Persist)
        .unwrap();
    assert_eq!(
        still.metadata.finalizers,
        vec!["berth.dev/workspace".to_string()]
    );
    assert!(still.is_deleting());

    assert_eq!(
        store
            .set_finalizers(Kind::Project, "a", None, vec![])
            .unwrap(),
        None
    );
    assert!(store.get(Kind::Project, "a").is_none());

    store
        .create(project("b", json!({})), Commit::Persist)
        .unwrap();
    assert!(matches!(
        store
            .delete(Kind::Project, "b", None, BTreeMap::new(), Commit::Persist)
            .unwrap(),
        Deletion::Deleted(_)
    ));
    assert!(store.get(Kind::Project, "b").is_none());
    assert!(matches!(
        store.delete(Kind::Project, "b", None, BTreeMap::new(), Commit::Persist),
        Err(StoreError::NotFound { .. })
    ));
}

#[test]
fn writes_keep_what_the_delete_request_recorded_and_never_add_it() {
    use berth_api::annotations::{DELETED_BY, FORCE_DELETE, REAPED_BY};
    let (_dir, store) = open();
    let with = |name: &str, pairs: &[(&str, &str)]| {
        let mut desired = project(name, json!({}));
        desired.annotations = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        desired
    };
    // Whatever reaches the store (admission refuses it first), a write never arms a force.
    let (created, _) = store
        .apply(
            with("a", &[(FORCE_DELETE, "true"), ("team", "x")]),
            Commit::Persist,
        )
        .unwrap();
    assert_eq!(created.metadata.annotations.get(FORCE_DELETE), None);
    assert_eq!(created.metadata.annotations["team"], "x");
    let (armed, _) = store
        .apply(with("a", &[(REAPED_BY, "reaper")]), Commit::Persist)
        .unwrap();
    assert_eq!(armed.metadata.annotations.get(REAPED_BY), None);

    store
        .set_finalizers(Kind::Project, "a", None, vec!["berth.dev/workspace".into()])
        .unwrap();
    let recorded = BTreeMap::from([
        (FORCE_DELETE.to_string(), "true".to_string()),
        (DELETED_BY.to_string(), "unix:ann".to_string()),
    ]);
    store
        .delete(Kind::Project, "a", None, recorded, Commit::Persist)
        .unwrap();

    // A re-apply of the manifest (without them, or changing them) neither drops nor moves them.
    for pairs in [&[][..], &[(DELETED_BY, "mallory"), ("team", "y")][..]] {
        let (after, _) = store.apply(with("a", pairs), Commit::Persist).unwrap();
        assert_eq!(after.metadata.annotations[FORCE_DELETE], "true");
        assert_eq!(after.metadata.annotations[DELETED_BY], "unix:ann");
        assert!(after.is_deleting());
    }
    let current = store.get(Kind::Project, "a").unwrap();
    let (replaced, _) = store
        .replace(
            with("a", &[]),
            Some(current.resource_version()),
            Commit::Persist,
        )
        .unwrap();
    assert_eq!(replaced.metadata.annotations[FORCE_DELETE], "true");
    assert_eq!(replaced.metadata.annotations.get("team"), None);
}

#[test]
fn display_names_are_unique_case_insensitively_after_trimming() {
    let (_dir, store) = open();
    store
        .create(
            project("payments-api", json!({"displayName": "Payments API"})),
            Commit::Persist,
        )
        .unwrap();
    let clash = store.create(
        project("other", json!({"displayName": "  payments api "})),
        Commit::Persist,
    );
    assert!(
        matches!(clash, Err(StoreError::Conflict { .. })),
        "{clash:?}"
    );
    // A name used as the default display name clashes too.
    let clash = store.create(
        project("x", json!({"displayName": "PAYMENTS-API2"})),
        Commit::Persist,
    );
    assert!(clash.is_ok());
    let clash = store.create(project("payments-api2", json!({})), Commit::Persist);
    assert!(
        matches!(clash, Err(StoreError::Conflict { .. })),
        "{clash:?}"
    );

    // Renaming into a taken display name conflicts; renaming away frees the old one.
    let other = store
        .create(
            project("other", json!({"displayName": "Other"})),
            Commit::Persist,
        )
        .unwrap();
    assert!(matches!(
        store.apply(
            project("other", json!({"displayName": "payments API"})),
            Commit::Persist
        ),
        Err(StoreError::Conflict { .. })
    ));
    store
        .apply(
            project("payments-api", json!({"displayName": "Payments"})),
            Commit::Persist,
        )
        .unwrap();
    store
        .apply(
            project("other", json!({"displayName": "payments API"})),
            Commit::Persist,
        )
        .unwrap();
    assert_eq!(
        store.project_with_display_name("Payments Api").as_deref(),
        Some("other")
    );
    assert_eq!(
        store.get(Kind::Project, "other").unwrap().uid(),
        other.uid()
    );
}

#[test]
fn display_names_are_unique_in_a_batch_end_state() {
    let (_dir, store) = open();
    store
        .apply_batch(
            vec![
                project("a", json!({"displayName": "Alpha"})),
                project("b", json!({"displayName": "Beta"})),
            ],
            Commit::Persist,
        )
        .unwrap();
    // (batch of (name, displayName), failing index wanted)
    type Batch = &'static [(&'static str, &'static str)];
    let cases: &[(Batch, Option<usize>)] = &[
        (&[("a", "Beta"), ("b", "Alpha")], None),
        (&[("a", "Alpha"), ("b", "Beta")], None),
        (&[("c", "Gamma"), ("d", "gamma ")], Some(1)),
        (&[("c", "Gamma"), ("a", "beta ")], Some(1)),
        (&[("c", "BETA")], Some(0)),
        (&[("a", "Beta")], Some(0)),
    ];
    for (batch, wanted) in cases {
        let before = store.resource_version();
        let desired = batch
            .iter()
            .map(|(name, display)| project(name, json!({"displayName": display})))
            .collect();
        let result = store.apply_batch(desired, Commit::Persist);
        match wanted {
            None => {
                result.unwrap_or_else(|f| panic!("{batch:?}: {f}"));
            }
            Some(index) => {
                let failure = result.expect_err("a clash");
                assert_eq!(failure.index, Some(*index), "{batch:?}");
                assert!(
                    matches!(&failure.error, StoreError::Conflict { name, .. } if name == batch[*index].0),
                    "{batch:?}: {failure}"
                );
                assert_eq!(store.resource_version(), before, "{batch:?} wrote");
            }
        }
    }
    assert_eq!(
        store.project_with_display_name("alpha").as_deref(),
        Some("a")
    );
    assert!(store.get(Kind::Project, "c").is_none());
}

#[test]
fn a_failing_batch_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    let store = Store::open(&path).unwrap();
    store
        .create(
            project("taken", json!({"displayName": "Taken"})),
            Commit::Persist,
        )
        .unwrap();
    let rv = store.resource_version();
    let mut feed = store.subscribe();
    let batch = vec![
        project("a", json!({})),
        project("b", json!({})),
        project("c", json!({"displayName": "taken"})),
    ];
    let failure = store.apply_batch(batch, Commit::Persist).unwrap_err();
    assert_eq!(failure.index, Some(2));
    assert!(matches!(failure.error, StoreError::Conflict { .. }));
    assert!(store.get(Kind::Project, "a").is_none());
    assert_eq!(store.resource_version(), rv);
    assert!(feed.try_recv().is_err());
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.list(Kind::Project).len(), 1);
    assert_eq!(store.resource_version(), rv);
}

#[test]
fn a_batch_is_one_transaction_and_reports_actions() {
    let (_dir, store) = open();
    store
        .create(project("a", json!({"n": 1})), Commit::Persist)
        .unwrap();
    let results = store
        .apply_batch(
            vec![
                project("a", json!({"n": 1})),
                project("b", json!({})),
                project("a-2", json!({})),
            ],
            Commit::Persist,
        )
        .unwrap();
    let actions: Vec<_> = results.iter().map(|(_, a)| *a).collect();
    assert_eq!(
        actions,
        [Action::Unchanged, Action::Created, Action::Created]
    );
    let names: Vec<_> = store
        .list(Kind::Project)
        .iter()
        .map(|o| o.name().to_string())
        .collect();
    assert_eq!(names, ["a", "a-2", "b"]);
}

#[test]
fn dry_run_writes_nothing() {
    let (_dir, store) = open();
    let would = store
        .create(project("a", json!({})), Commit::DryRun)
        .unwrap();
    assert_eq!(would.name(), "a");
    assert!(store.get(Kind::Project, "a").is_none());
    assert_eq!(store.resource_version(), 0);
    store
        .create(project("a", json!({})), Commit::Persist)
        .unwrap();
    store
        .delete(Kind::Project, "a", None, BTreeMap::new(), Commit::DryRun)
        .unwrap();
    assert!(store.get(Kind::Project, "a").is_some());
}

#[test]
fn the_change_feed_reports_every_write_in_order() {
    let (_dir, store) = open();
    let mut feed = store.subscribe();
    store
        .create(project("a", json!({})), Commit::Persist)
        .unwrap();
    store
        .update_status(
            Kind::Project,
            "a",
            None,
            json!({"phase": "Ready"}),
            Commit::Persist,
        )
        .unwrap();
    store
        .apply(project("a", json!({"x": 1})), Commit::Persist)
        .unwrap();
    store
        .delete(Kind::Project, "a", None, BTreeMap::new(), Commit::Persist)
        .unwrap();
    let got: Vec<_> = std::iter::from_fn(|| feed.try_recv().ok())
        .map(|c| (c.type_, c.resource_version, c.generation, c.desired_changed))
        .collect();
    assert_eq!(
        got,
        [
            (ChangeType::Added, 1, 1, true),
            (ChangeType::Modified, 2, 1, false),
            (ChangeType::Modified, 3, 2, true),
            (ChangeType::Deleted, 4, 2, true),
        ]
    );
}

#[test]
fn a_finalizer_write_is_bookkeeping_and_an_annotation_a_change() {
    let (_dir, store) = open();
    store
        .create(project("a", json!({})), Commit::Persist)
        .unwrap();
    let mut feed = store.subscribe();
    store
        .set_finalizers(Kind::Project, "a", None, vec!["berth.dev/test".into()])
        .unwrap();
    let mut annotated = project("a", json!({}));
    annotated
        .annotations
        .insert("berth.dev/restartedAt".into(), "t1".into());
    store.apply(annotated, Commit::Persist).unwrap();
    let got: Vec<_> = std::iter::from_fn(|| feed.try_recv().ok())
        .map(|c| (c.type_, c.generation, c.desired_changed))
        .collect();
    assert_eq!(
        got,
        [
            (ChangeType::Modified, 1, false),
            (ChangeType::Modified, 1, true),
        ]
    );
}

#[test]
fn events_repeat_by_counting() {
    let (_dir, store) = open();
    let a = store
        .create(project("a", json!({})), Commit::Persist)
        .unwrap();
    store
        .record_event(&a, EventType::Normal, "Created", "container created")
        .unwrap();
    store
        .record_event(&a, EventType::Warning, "BootTimeout", "no agent after 60s")
        .unwrap();
    let e = store
        .record_event(&a, EventType::Warning, "BootTimeout", "no agent after 60s")
        .unwrap();
    assert_eq!(e.count, 2);
    let listed = store.events_for(Kind::Project, "a").unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[1].count, 2);
    assert_eq!(listed[1].type_, EventType::Warning);
    assert!(listed[1].last_timestamp >= listed[1].first_timestamp);
    // A repeat after something else happened still counts on the earlier row, which becomes
    // the latest.
    store
        .record_event(&a, EventType::Normal, "Created", "container created")
        .unwrap();
    let listed = store.events_for(Kind::Project, "a").unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!((listed[1].reason.as_str(), listed[1].count), ("Created", 2));
    assert_eq!(store.recent_events(1).unwrap()[0].reason, "Created");
    // Only the latest distinct events of an object are kept.
    for n in 0..events::KEPT_PER_OBJECT + 5 {
        store
            .record_event(&a, EventType::Normal, "Tick", &n.to_string())
            .unwrap();
    }
    let listed = store.events_for(Kind::Project, "a").unwrap();
    assert_eq!(listed.len() as i64, events::KEPT_PER_OBJECT);
    let last = (events::KEPT_PER_OBJECT + 4).to_string();
    assert_eq!(listed.last().unwrap().message, last);
    assert!(store.events_for(Kind::Project, "zz").unwrap().is_empty());
}

#[test]
fn a_removed_objects_events_stay_until_pruned() {
    let (_dir, store) = open();
    let a = store
        .create(project("a", json!({})), Commit::Persist)
        .unwrap();
    let b = store
        .create(project("b", json!({})), Commit::Persist)
        .unwrap();
    for object in [&a, &b] {
        store
            .record_event(object, EventType::Normal, "Created", "container created")
            .unwrap();
    }
    let before_delete = chrono::Utc::now();
    store
        .delete(Kind::Project, "a", None, BTreeMap::new(), Commit::Persist)
        .unwrap();
    let after_delete = chrono::Utc::now();
    // Still listed under its name once it is gone.
    let kept = store.events_for(Kind::Project, "a").unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].involved_object.uid, a.uid());
    // A project re-created under the same name starts without the old one's history.
    store
        .create(project("a", json!({})), Commit::Persist)
        .unwrap();
    assert!(store.events_for(Kind::Project, "a").unwrap().is_empty());
    // Nothing went before the object did; once the cutoff passes it, its events go.
    assert_eq!(store.prune_gone_events(before_delete).unwrap(), 0);
    assert_eq!(
        store
            .prune_gone_events(after_delete + chrono::Duration::seconds(1))
            .unwrap(),
        1
    );
    assert_eq!(
        store.events_for(Kind::Project, "b").unwrap().len(),
        1,
        "b is alive"
    );
    assert!(
        store
            .recent_events(10)
            .unwrap()
            .iter()
            .all(|e| e.involved_object.uid != a.uid())
    );
}

#[test]
fn migrations_start_from_an_empty_file_and_back_up_an_older_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    std::fs::write(&path, b"").unwrap();
    drop(Store::open(&path).unwrap());
    assert!(!schema::backup_path(&path, 1).exists());

    // An older database: only the first migration ran.
    let old = dir.path().join("old.db");
    {
        let mut conn = Connection::open(&old).unwrap();
        schema::migrate_to(&mut conn, 1).unwrap();
        conn.execute(
            "INSERT INTO objects VALUES ('Project', 'kept', 'u-1', 1, 1, '{}', '{}', '[]', \
             '2026-01-01T00:00:00+00:00', NULL, '{}', NULL)",
            [],
        )
        .unwrap();
    }
    let store = Store::open(&old).unwrap();
    assert_eq!(store.get(Kind::Project, "kept").unwrap().uid(), "u-1");
    let a = store.get(Kind::Project, "kept").unwrap();
    store
        .record_event(&a, EventType::Normal, "Migrated", "")
        .unwrap();
    let backup = schema::backup_path(&old, 1);
    let conn = Connection::open(&backup).unwrap();
    assert_eq!(schema::version(&conn).unwrap(), 1);
    let count: i64 = conn
        .query_row("SELECT count(*) FROM objects", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, 1);
}

#[test]
fn the_controller_id_is_made_once_per_database() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let first = Store::open(&a).unwrap().controller_id().to_string();
    assert_eq!(first.len(), 16);
    assert!(first.chars().all(|c| c.is_ascii_hexdigit()), "{first}");
    assert_eq!(Store::open(&a).unwrap().controller_id(), first);
    assert_ne!(Store::open(&b).unwrap().controller_id(), first);
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    drop(Store::open(&path).unwrap());
    Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", schema::SCHEMA_VERSION + 1)
        .unwrap();
    let err = Store::open(&path).err().unwrap();
    assert!(matches!(err, StoreError::SchemaTooNew { .. }), "{err}");
}

#[test]
fn a_file_that_is_not_a_database_is_reported_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    std::fs::write(&path, vec![b'x'; 8192]).unwrap();
    let err = Store::open(&path).err().unwrap();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("berth.db"), "{err}");
}

#[test]
fn readiness_probe_passes_on_a_healthy_store() {
    let (_dir, store) = open();
    store.check_writable().unwrap();
}

#[test]
fn applysets_prune_only_their_previous_inventory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    let store = Store::open(&path).unwrap();
    store
        .create(project("outside", json!({})), Commit::Persist)
        .unwrap();
    let applied = store
        .apply_set(
            "s",
            vec![project("a", json!({})), project("b", json!({}))],
            SetParams::from(Commit::Persist).pruning(true),
        )
        .unwrap();
    assert_eq!(applied.applied.len(), 2);
    assert!(applied.pruned.is_empty());
    assert_eq!(store.applyset_inventory("s"), ["Project/a", "Project/b"]);

    // b is held by a finalizer: pruning marks it deleting.
    store
        .set_finalizers(Kind::Project, "b", None, vec!["berth.dev/workspace".into()])
        .unwrap();
    let applied = store
        .apply_set(
            "s",
            vec![project("a", json!({}))],
            SetParams::from(Commit::Persist).pruning(true),
        )
        .unwrap();
    assert!(matches!(applied.pruned.as_slice(), [Deletion::Deleting(o)] if o.name() == "b"));
    assert_eq!(
        store.get(Kind::Project, "b").unwrap().metadata.annotations
            [berth_api::annotations::REAPED_BY],
        "prune",
        "a prune says so, for the trash's reason"
    );
    assert_eq!(store.applyset_inventory("s"), ["Project/a"]);
    assert!(store.get(Kind::Project, "outside").is_some());

    // The inventory survives a restart; a failing set changes neither objects nor inventory.
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.applyset_inventory("s"), ["Project/a"]);
    store
        .create(
            project("taken", json!({"displayName": "Taken"})),
            Commit::Persist,
        )
        .unwrap();
    let failure = store
        .apply_set(
            "s",
            vec![
                project("c", json!({})),
                project("d", json!({"displayName": "taken"})),
            ],
            SetParams::from(Commit::Persist).pruning(true),
        )
        .unwrap_err();
    assert_eq!(failure.index, Some(1));
    assert!(store.get(Kind::Project, "a").is_some());
    assert!(store.get(Kind::Project, "c").is_none());
    assert_eq!(store.applyset_inventory("s"), ["Project/a"]);
}

#[test]
fn a_set_refusing_takeover_leaves_other_sets_objects_alone() {
    let (_dir, store) = open();
    let in_set = |set: &str, name: &str, spec: Value| {
        let mut desired = project(name, spec);
        desired
            .annotations
            .insert(berth_api::annotations::APPLYSET.into(), set.into());
        desired
    };
    store
        .apply_set(
            "cli",
            vec![in_set("cli", "shared", json!({"displayName": "CLI"}))],
            SetParams::from(Commit::Persist).pruning(true),
        )
        .unwrap();
    store
        .create(project("unowned", json!({})), Commit::Persist)
        .unwrap();

    let batch = vec![
        in_set("git", "mine", json!({})),
        in_set("git", "shared", json!({"displayName": "Git"})),
        in_set("git", "unowned", json!({})),
    ];
    let applied = store
        .apply_set(
            "git",
            batch,
            SetParams {
                prune: true,
                takeover: Takeover::Refuse,
                ..SetParams::from(Commit::Persist)
            },
        )
        .unwrap();
    assert_eq!(
        applied.conflicts,
        [SetConflict {
            kind: Kind::Project,
            name: "shared".into(),
            owner: "cli".into(),
        }]
    );
    let names: Vec<_> = applied.applied.iter().map(|(o, _)| o.name()).collect();
    assert_eq!(
        names,
        ["mine", "unowned"],
        "an object of no set is taken in"
    );
    let shared = store.get(Kind::Project, "shared").unwrap();
    assert_eq!(
        shared.spec.value()["displayName"],
        "CLI",
        "left as its owner wrote it"
    );
    assert_eq!(
        shared.metadata.annotations[berth_api::annotations::APPLYSET],
        "cli"
    );
    assert_eq!(
        store.applyset_inventory("git"),
        ["Project/mine", "Project/unowned"]
    );
    assert_eq!(store.applyset_inventory("cli"), ["Project/shared"]);

    // A set that adopts (the CLI's) still takes it over, and then the other set's inventory
    // no longer lists it, pruned or not.
    store
        .apply_set(
            "git",
            vec![in_set("git", "shared", json!({}))],
            Commit::Persist,
        )
        .unwrap();
    store
        .apply_set("cli", Vec::<Desired>::new(), Commit::Persist)
        .unwrap();
    assert_eq!(store.applyset_inventory("cli"), Vec::<String>::new());
}

#[test]
fn status_batches_commit_together_and_fail_per_update() {
    let (_dir, store) = open();
    let a = store
        .create(project("a", json!({})), Commit::Persist)
        .unwrap();
    store
        .create(project("b", json!({})), Commit::Persist)
        .unwrap();
    let mut feed = store.subscribe();
    let update = |name: &str, rv: Option<u64>, phase: &str| StatusUpdate {
        kind: Kind::Project,
        name: name.into(),
        expected_rv: rv,
        status: json!({"phase": phase}),
    };
    let results = store
        .update_statuses(vec![
            update("a", Some(a.resource_version()), "Ready"),
            update("b", None, "Stopped"),
            update("gone", None, "Ready"),
            update("a", Some(a.resource_version()), "Error"),
        ])
        .unwrap();
    assert!(results[0].is_ok() && results[1].is_ok());
    assert!(matches!(results[2], Err(StoreError::NotFound { .. })));
    assert!(matches!(results[3], Err(StoreError::Conflict { .. })));
    assert_eq!(
        store.get(Kind::Project, "a").unwrap().status.value()["phase"],
        "Ready"
    );
    assert_eq!(
        store.get(Kind::Project, "b").unwrap().status.value()["phase"],
        "Stopped"
    );
    let changes: Vec<_> = std::iter::from_fn(|| feed.try_recv().ok()).collect();
    assert_eq!(changes.len(), 2);
    assert!(changes.iter().all(|c| !c.desired_changed));

    // Unchanged statuses write nothing.
    let rv = store.resource_version();
    store
        .update_statuses(vec![update("b", None, "Stopped")])
        .unwrap();
    assert_eq!(store.resource_version(), rv);
}

#[test]
fn an_execution_is_recorded_once_and_expires() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("berth.db")).unwrap();
    let t0 = chrono::Utc::now();
    assert_eq!(store.last_tool_call("p").unwrap(), None);
    assert!(
        store
            .begin_execution("p", "e1", "Bash", t0)
            .unwrap()
            .is_none()
    );
    let again = store
        .begin_execution("p", "e1", "Bash", t0)
        .unwrap()
        .unwrap();
    assert_eq!(again.state, super::ExecutionState::Started);
    // Another project may use the same id.
    assert!(
        store
            .begin_execution("q", "e1", "Read", t0)
            .unwrap()
            .is_none()
    );
    let outcome = serde_json::json!({"code": 200});
    store
        .finish_execution("p", "e1", "Bash", &outcome, t0)
        .unwrap();
    let done = store.execution("p", "e1").unwrap().unwrap();
    assert_eq!(
        (done.state, done.outcome),
        (super::ExecutionState::Finished, Some(outcome))
    );
    let later = t0 + chrono::Duration::seconds(5);
    store.begin_execution("p", "e2", "Read", later).unwrap();
    let last = store.last_tool_call("p").unwrap().unwrap();
    assert_eq!(last.timestamp_micros(), later.timestamp_micros());
    assert_eq!(store.expire_executions(later).unwrap(), 2);
    assert!(store.execution("p", "e1").unwrap().is_none());
    assert!(store.execution("p", "e2").unwrap().is_some());
}

#[test]
fn a_deleted_project_takes_its_tool_executions_with_it() {
    let (_dir, store) = open();
    let a = store
        .create(project("a", json!({})), Commit::Persist)
        .unwrap();
    let b = store
        .create(project("b", json!({})), Commit::Persist)
        .unwrap();
    let now = chrono::Utc::now();
    let outcome = json!({"output": "secret output"});
    for uid in [a.uid(), b.uid()] {
        store.begin_execution(uid, "e1", "Bash", now).unwrap();
        store
            .finish_execution(uid, "e1", "Bash", &outcome, now)
            .unwrap();
    }
    assert!(matches!(
        store
            .delete(Kind::Project, "a", None, BTreeMap::new(), Commit::Persist)
            .unwrap(),
        Deletion::Deleted(_)
    ));
    assert!(store.execution(a.uid(), "e1").unwrap().is_none());
    assert_eq!(store.last_tool_call(a.uid()).unwrap(), None);
    // Another project's records stay.
    assert!(store.execution(b.uid(), "e1").unwrap().is_some());
}

#[test]
fn a_restored_project_keeps_its_uid_and_first_status() {
    let (_dir, store) = open();
    let restored = store
        .create(
            project("back", json!({"displayName": "Back"})),
            PostParams {
                restore: Some(Restored {
                    uid: "0b6f3c1e-uid".to_string(),
                    status: json!({"firstReachableAt": "2026-01-01T00:00:00Z"}),
                }),
                ..PostParams::by("unix:ana", Commit::Persist)
            },
        )
        .unwrap();
    assert_eq!(restored.uid(), "0b6f3c1e-uid");
    assert_eq!(restored.generation(), 1);
    assert_eq!(
        restored.status.value()["firstReachableAt"],
        "2026-01-01T00:00:00Z"
    );
    assert!(store.is_member("0b6f3c1e-uid", "unix:ana"));
    assert_eq!(store.get_by_uid("0b6f3c1e-uid").unwrap().name(), "back");
    // Neither the name nor the uid may be taken.
    for (name, uid) in [("back", "other-uid"), ("elsewhere", "0b6f3c1e-uid")] {
        let err = store
            .create(
                project(name, json!({})),
                PostParams {
                    restore: Some(Restored {
                        uid: uid.to_string(),
                        status: json!({}),
                    }),
                    ..PostParams::by("unix:ana", Commit::Persist)
                },
            )
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::AlreadyExists { .. } | StoreError::Conflict { .. }
            ),
            "{name} {uid}: {err}"
        );
    }
    assert!(store.get(Kind::Project, "elsewhere").is_none());
}

#[test]
fn names_are_a_sorted_set() {
    let mut names = Names::default();
    assert!(names.insert("bob".to_string()));
    assert!(names.insert("ana".to_string()));
    assert!(!names.insert("bob".to_string()));
    assert!(names.insert("cy".to_string()));
    assert_eq!(names.iter().collect::<Vec<_>>(), ["ana", "bob", "cy"]);
    assert_eq!(names.first().map(String::as_str), Some("ana"));
    assert!(names.contains("bob") && !names.contains("dee"));
    assert!(names.remove("bob"));
    assert!(!names.remove("bob"));
    assert_eq!(names.len(), 2);
    assert!(names.remove("ana") && names.remove("cy"));
    assert!(names.is_empty());
}
