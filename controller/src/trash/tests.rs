//! The trash against the fake runtime, a real store and the real teardown: deletions move the
//! volumes aside and never lose one under injected crashes; restores bring them back under the
//! same or a new uid; housekeeping purges what expired.

use crate::store::Commit;
use berth_api::Kind;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use berth_api::annotations;
use serde_json::{Value, json};

use super::{Restore, Trash, TrashError, TrashSettings, is_trash_name};
use crate::layout::{DurableLayout, FINALIZER, UID_LABEL};
use crate::metrics::Metrics;
use crate::reconcile::{Action, Context, ControllerSettings, NoLaterSteps, WorkQueue, project};
use crate::runtime::{Runtime, RuntimeError};
use crate::store::{Desired, Store};
use crate::testing::fake_runtime::{FakeRuntime, Fault};

const POOL: &str = "default";
const DAY: Duration = Duration::from_secs(86_400);

struct Setup {
    _dir: tempfile::TempDir,
    store: Arc<Store>,
    fake: Arc<FakeRuntime>,
    metrics: Arc<Metrics>,
    ctx: Context,
    trash: Trash,
    admission: crate::admission::Admission,
}

fn setup(retention: Duration) -> Setup {
    setup_on(Arc::new(FakeRuntime::new()), retention)
}

/// A daemon's store, trash and reconciler over `fake`: a second one over the same fake is a
/// daemon that lost its store (a new controller id) in front of the same LXD.
fn setup_on(fake: Arc<FakeRuntime>, retention: Duration) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
    let metrics = Arc::new(Metrics::new());
    let settings = ControllerSettings {
        trash: TrashSettings { retention },
        ..ControllerSettings::default()
    };
    let trash =
        Trash::new(store.clone(), POOL, settings.trash.clone()).with_metrics(metrics.clone());
    let queue = WorkQueue::new(1, settings.backoff, metrics.clone());
    let ctx = Context::new(
        store.clone(),
        fake.clone(),
        metrics.clone(),
        settings,
        Arc::new(NoLaterSteps),
        queue,
    );
    Setup {
        admission: crate::admission::Admission::new(berth_api::Defaults::default()),
        _dir: dir,
        store,
        fake,
        metrics,
        ctx,
        trash,
    }
}

impl Setup {
    /// A project brought up on the fake (two volumes: the workspace and the shell home would
    /// need a profile; labels and a display name stand in for what a restore must keep).
    async fn project(&self, name: &str) -> String {
        self.store
            .apply(
                Desired::project(
                    name,
                    json!({"image": "berth-tiny", "displayName": format!("{name} display")}),
                )
                .with_labels(BTreeMap::from([("team".into(), "pay".into())])),
                Commit::Persist,
            )
            .unwrap();
        self.converge(name).await;
        let uid = self.uid(name);
        // A home volume as an agent profile would have, so entries hold more than one volume.
        self.fake
            .create_volume(&crate::runtime::CreateVolume {
                pool: POOL.into(),
                name: DurableLayout::home_volume(&uid, "shell"),
                size: None,
                config: BTreeMap::from([(UID_LABEL.to_string(), uid.clone())]),
                target: None,
            })
            .await
            .unwrap();
        uid
    }

    fn uid(&self, name: &str) -> String {
        self.store
            .get(Kind::Project, name)
            .unwrap()
            .uid()
            .to_string()
    }

    async fn converge(&self, name: &str) -> Vec<String> {
        let mut errors = Vec::new();
        for _ in 0..40 {
            match project::reconcile(&self.ctx, name).await {
                Ok(Action::Done) => return errors,
                Ok(Action::Requeue(_)) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
        panic!("{name} did not converge; errors {errors:?}");
    }

    fn delete(&self, name: &str, extra: &[(&str, &str)]) {
        let mut annotations = BTreeMap::from([
            (annotations::FORCE_DELETE.to_string(), "true".to_string()),
            (
                annotations::DELETED_BY.to_string(),
                "unix:alice".to_string(),
            ),
        ]);
        for (k, v) in extra {
            annotations.insert(k.to_string(), v.to_string());
        }
        self.store
            .delete(Kind::Project, name, None, annotations, Commit::Persist)
            .unwrap();
    }

    fn volumes(&self) -> Vec<String> {
        self.fake.volume_names(POOL)
    }

    fn restore(&self, key: &str, new_name: Option<&str>) -> Restore {
        Restore {
            key: key.to_string(),
            new_name: new_name.map(str::to_string),
            caller: "unix:bob".to_string(),
            finalizers: vec![FINALIZER.to_string()],
        }
    }
}

fn live_names(uid: &str) -> Vec<String> {
    let mut names = vec![
        DurableLayout::home_volume(uid, "shell"),
        DurableLayout::workspace_volume(uid),
    ];
    names.sort();
    names
}

#[tokio::test]
async fn a_deletion_moves_the_volumes_to_the_trash_with_its_record() {
    let s = setup(7 * DAY);
    let uid = s.project("p").await;
    s.delete("p", &[]);
    s.converge("p").await;
    assert!(s.store.get(Kind::Project, "p").is_none());
    assert_eq!(s.fake.count("delete_volume"), 0, "nothing is deleted");
    let volumes = s.volumes();
    assert_eq!(volumes.len(), 2, "{volumes:?}");
    assert!(volumes.iter().all(|v| is_trash_name(v)), "{volumes:?}");

    s.fake.set_volume_usage(POOL, &volumes[0], 1000);
    s.fake.set_volume_usage(POOL, &volumes[1], 24);
    let list = s.trash.list(&*s.fake, super::Scope::Own).await.unwrap();
    assert_eq!(list.kind, "TrashList");
    let [item] = list.items.as_slice() else {
        panic!("one entry: {list:?}")
    };
    assert_eq!(
        (
            item.uid.as_str(),
            item.name.as_str(),
            item.deleted_by.as_str(),
            item.reason.as_str(),
            item.bytes
        ),
        (uid.as_str(), "p", "unix:alice", "forced", 1024)
    );
    assert_eq!(
        item.expires_at,
        Some(item.trashed_at.unwrap() + chrono::Duration::days(7))
    );
    assert_eq!(s.metrics.trash_volumes.get(), 2);
    assert_eq!(s.metrics.trash_bytes.get(), 1024);
}

#[tokio::test]
async fn a_pool_that_cannot_size_volumes_counts_zero_bytes_and_is_asked_once() {
    let s = setup(7 * DAY);
    s.project("p").await;
    s.delete("p", &[]);
    s.converge("p").await;
    for _ in 0..3 {
        let list = s.trash.list(&*s.fake, super::Scope::Own).await.unwrap();
        assert_eq!(list.items.len(), 1);
        assert_eq!(list.items[0].bytes, 0);
    }
    assert_eq!(s.fake.count("volume_usage"), 1);
    assert_eq!(s.metrics.trash_volumes.get(), 2);
    assert_eq!(s.metrics.trash_bytes.get(), 0);
}

#[tokio::test]
async fn a_crash_between_labelling_and_renaming_loses_and_duplicates_nothing() {
    let s = setup(7 * DAY);
    let uid = s.project("p").await;
    s.delete("p", &[]);
    // The first rename fails after its volume was labelled (the daemon died in between); the
    // second one's reply is lost after it happened.
    s.fake.fault_method(
        "rename_volume",
        Fault::Fail(RuntimeError::Transport {
            what: "rename".into(),
            message: "killed".into(),
        }),
    );
    s.fake.fault_method("rename_volume", Fault::Pass);
    s.fake.fault_method("rename_volume", Fault::LoseReply);
    let errors = s.converge("p").await;
    assert!(!errors.is_empty(), "the injected faults surfaced");
    assert!(s.store.get(Kind::Project, "p").is_none());
    let mut expected: Vec<String> = live_names(&uid)
        .iter()
        .map(|n| super::trash_name(n))
        .collect();
    expected.sort();
    assert_eq!(s.volumes(), expected, "each volume once, in the trash");
    let entries = s.trash.entries(&*s.fake).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].volumes.len(), 2);
    assert_eq!(entries[0].name, "p");
}

#[tokio::test]
async fn a_volume_labelled_but_not_renamed_is_not_in_the_trash_while_its_project_lives() {
    let s = setup(7 * DAY);
    s.project("p").await;
    s.delete("p", &[]);
    s.fake.fault_method(
        "rename_volume",
        Fault::Fail(RuntimeError::Transport {
            what: "rename".into(),
            message: "killed".into(),
        }),
    );
    for _ in 0..10 {
        if s.fake.count("rename_volume") > 0 {
            break;
        }
        let _ = project::reconcile(&s.ctx, "p").await;
    }
    assert_eq!(s.fake.count("rename_volume"), 1);
    assert!(s.store.get(Kind::Project, "p").is_some(), "still deleting");
    assert!(
        s.volumes().iter().any(|v| s
            .fake
            .volume(POOL, v)
            .unwrap()
            .config
            .contains_key(super::names::TRASH_UID)),
        "labelled before the rename"
    );
    assert!(s.trash.entries(&*s.fake).await.unwrap().is_empty());
    // Nor can it be restored meanwhile.
    let err = s
        .trash
        .restore(&*s.fake, &s.admission, s.restore("p", None))
        .await
        .unwrap_err();
    assert!(matches!(err, TrashError::NotFound(_)), "{err}");
}

#[tokio::test]
async fn a_restore_keeps_the_uid_and_the_project_comes_back_up_on_its_volumes() {
    let s = setup(7 * DAY);
    let uid = s.project("p").await;
    s.delete("p", &[]);
    s.converge("p").await;

    let object = s
        .trash
        .restore(&*s.fake, &s.admission, s.restore("p", None))
        .await
        .unwrap();
    assert_eq!(object.uid(), uid);
    assert_eq!(object.name(), "p");
    assert_eq!(object.metadata.labels["team"], "pay");
    assert_eq!(object.spec.value()["displayName"], "p display");
    assert_eq!(object.metadata.finalizers, [FINALIZER]);
    let status: berth_api::ProjectStatus = serde_json::from_value(object.status.value()).unwrap();
    assert!(
        status.first_reachable_at.is_some(),
        "never taken for one that held nothing"
    );
    assert!(s.store.is_member(&uid, "unix:bob"));
    assert_eq!(s.volumes(), live_names(&uid));
    for name in live_names(&uid) {
        let config = s.fake.volume(POOL, &name).unwrap().config;
        assert_eq!(config[UID_LABEL], uid);
        assert!(
            !config
                .keys()
                .any(|k| k.starts_with(super::names::TRASH_LABEL_PREFIX)),
            "{config:?}"
        );
    }
    // The deleted project's container stays behind as an entry of its own.
    let left = s.trash.entries(&*s.fake).await.unwrap();
    let keys: Vec<(&str, &str)> = left
        .iter()
        .map(|e| (e.uid.as_str(), e.kind.as_str()))
        .collect();
    assert_eq!(keys, [(format!("{uid}-ct-1").as_str(), "container")]);
    let events = s.store.events_for(Kind::Project, "p").unwrap();
    let restored = events
        .iter()
        .find(|e| e.reason == "Restored")
        .expect("an event");
    assert!(
        restored.message.contains("unix:bob") && restored.message.contains("unix:alice"),
        "who restored and who deleted: {}",
        restored.message
    );

    // The reconciler brings it up on the restored volumes, creating none.
    let created = s.fake.count("create_volume");
    s.converge("p").await;
    assert_eq!(
        s.fake.count("create_volume") - created,
        1,
        "the existing workspace, taken as is"
    );
    assert_eq!(s.volumes(), live_names(&uid));
    assert!(s.fake.instance("p").is_some());
}

#[tokio::test]
async fn a_restore_as_a_new_name_takes_a_new_uid_and_renames_the_volumes() {
    let s = setup(7 * DAY);
    let old = s.project("p").await;
    s.delete("p", &[]);
    s.converge("p").await;
    // A new project took the name meanwhile (the trash never blocks it).
    let newer = s.project("p").await;
    assert_ne!(newer, old);

    let err = s
        .trash
        .restore(&*s.fake, &s.admission, s.restore(&old, None))
        .await
        .unwrap_err();
    assert!(matches!(err, TrashError::Conflict(_)), "name in use: {err}");

    // Interrupted on the second rename: the retry resumes to the same pinned uid.
    s.fake.fault_method("rename_volume", Fault::Pass);
    s.fake.fault_method(
        "rename_volume",
        Fault::Fail(RuntimeError::Transport {
            what: "rename".into(),
            message: "killed".into(),
        }),
    );
    s.trash
        .restore(&*s.fake, &s.admission, s.restore(&old, Some("p-restored")))
        .await
        .unwrap_err();
    let object = s
        .trash
        .restore(&*s.fake, &s.admission, s.restore(&old, Some("p-restored")))
        .await
        .unwrap();
    let uid = object.uid().to_string();
    assert_ne!(uid, old);
    assert_ne!(uid, newer);
    assert_eq!(
        object.spec.value()["displayName"],
        "p-restored",
        "the recorded display name is taken by the newer p"
    );
    let mut expected = live_names(&uid);
    expected.extend(live_names(&newer));
    expected.sort();
    assert_eq!(s.volumes(), expected);
    for name in live_names(&uid) {
        assert_eq!(s.fake.volume(POOL, &name).unwrap().config[UID_LABEL], uid);
    }
    s.converge("p-restored").await;
    assert!(s.fake.instance("p-restored").is_some());
    assert_eq!(s.volumes(), expected, "no volume made or lost");
}

#[tokio::test]
async fn a_name_takes_its_newest_entry_and_bad_names_are_refused() {
    let s = setup(7 * DAY);
    let first = s.project("p").await;
    s.delete("p", &[]);
    s.converge("p").await;
    // Deleted a day before the second (both deletions fall within one second here).
    let day_before = (chrono::Utc::now() - chrono::Duration::days(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    for volume in s.volumes() {
        s.fake
            .patch_volume(
                POOL,
                &volume,
                &BTreeMap::from([(
                    super::names::TRASH_DELETED_AT.to_string(),
                    day_before.clone(),
                )]),
                None,
            )
            .await
            .unwrap();
    }
    let second = s.project("p").await;
    s.delete("p", &[]);
    s.converge("p").await;
    assert_eq!(s.trash.entries(&*s.fake).await.unwrap().len(), 2);
    let object = s
        .trash
        .restore(&*s.fake, &s.admission, s.restore("p", None))
        .await
        .unwrap();
    assert_eq!(object.uid(), second);
    let err = s
        .trash
        .restore(
            &*s.fake,
            &s.admission,
            s.restore(&first, Some("Not A Name")),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().starts_with("name:"), "{err}");
    let err = s
        .trash
        .restore(&*s.fake, &s.admission, s.restore("nothing", None))
        .await
        .unwrap_err();
    assert!(matches!(err, TrashError::NotFound(_)), "{err}");
}

#[tokio::test]
async fn purged_deletions_and_a_disabled_trash_delete_the_volumes() {
    for (retention, extra) in [
        (7 * DAY, vec![(annotations::PURGE, "true")]),
        (Duration::ZERO, vec![]),
    ] {
        let s = setup(retention);
        s.project("p").await;
        s.delete("p", &extra);
        s.converge("p").await;
        assert!(s.store.get(Kind::Project, "p").is_none());
        assert!(
            s.volumes().is_empty(),
            "{retention:?} {extra:?}: {:?}",
            s.volumes()
        );
        assert_eq!(s.fake.count("rename_volume"), 0);
        assert!(
            s.trash
                .list(&*s.fake, super::Scope::Own)
                .await
                .unwrap()
                .items
                .is_empty()
        );
    }
}

#[tokio::test]
async fn housekeeping_purges_what_expired_with_an_event() {
    let s = setup(7 * DAY);
    let old = s.project("old").await;
    s.delete("old", &[(annotations::REAPED_BY, "reaper")]);
    s.converge("old").await;
    let fresh = s.project("fresh").await;
    s.delete("fresh", &[]);
    s.converge("fresh").await;
    let entries = s.trash.entries(&*s.fake).await.unwrap();
    assert_eq!(entries.len(), 2);
    let deleted_at = entries[0].deleted_at.unwrap();

    // Nothing expired yet.
    let purged = s
        .trash
        .purge_expired(&*s.fake, deleted_at + chrono::Duration::days(6))
        .await
        .unwrap();
    assert!(purged.is_empty());
    assert_eq!(s.volumes().len(), 4);

    // Re-date the first entry as received by the trash eight days ago.
    let eight_days_ago =
        (deleted_at - chrono::Duration::days(8)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    for volume in &entries.iter().find(|e| e.uid == old).unwrap().volumes {
        s.fake
            .patch_volume(
                POOL,
                &volume.name,
                &BTreeMap::from([(
                    super::names::TRASH_TRASHED_AT.to_string(),
                    eight_days_ago.clone(),
                )]),
                None,
            )
            .await
            .unwrap();
    }
    let purged = s.trash.purge_expired(&*s.fake, deleted_at).await.unwrap();
    assert_eq!(purged, std::slice::from_ref(&old));
    let left = s.trash.entries(&*s.fake).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].uid, fresh);
    assert_eq!(s.metrics.trash_volumes.get(), 2);
    let events = s.store.events_for(Kind::Project, "old").unwrap();
    let event = events
        .iter()
        .find(|e| e.reason == "TrashPurged")
        .expect("a TrashPurged event");
    assert_eq!(event.involved_object.uid, old);
    assert!(event.message.contains("old"), "{}", event.message);
}

#[tokio::test]
async fn housekeeping_sweeps_the_trash_once_a_tenth_of_its_retention() {
    let s = setup(7 * DAY);
    let now = chrono::Utc::now();
    // The monotonic clock advances as the wall clock does: no jump.
    let m0 = std::time::Instant::now();
    let mono = |at: chrono::DateTime<chrono::Utc>| m0 + (at - now).to_std().unwrap_or_default();
    assert!(
        s.trash.sweep_at(&*s.fake, now, mono(now)).await.is_some(),
        "the first sweep"
    );
    let lists = s.fake.count("list_volumes");
    let half_hour = chrono::Duration::minutes(30);
    let later = now + half_hour;
    assert!(
        s.trash
            .sweep_at(&*s.fake, later, mono(later))
            .await
            .is_none()
    );
    assert_eq!(s.fake.count("list_volumes"), lists, "the trash not read");
    // A seven-day retention is swept hourly (not every 16.8 hours).
    let hour = chrono::Duration::hours(1);
    let later = now + hour;
    assert!(
        s.trash
            .sweep_at(&*s.fake, later, mono(later))
            .await
            .is_some()
    );
    // Set back half an hour (less than a jump): swept at once.
    assert!(
        s.trash
            .sweep_at(&*s.fake, now + half_hour, mono(later))
            .await
            .is_some(),
        "a clock gone back"
    );

    let short = setup(Duration::from_secs(20));
    assert!(
        short
            .trash
            .sweep_at(&*short.fake, now, mono(now))
            .await
            .is_some()
    );
    let later = now + chrono::Duration::seconds(2);
    assert!(
        short
            .trash
            .sweep_at(&*short.fake, later, mono(later))
            .await
            .is_some()
    );

    // Disabled: not every round.
    let disabled = setup(Duration::ZERO);
    assert!(
        disabled
            .trash
            .sweep_at(&*disabled.fake, now, mono(now))
            .await
            .is_some()
    );
    let later = now + chrono::Duration::minutes(15);
    let swept = disabled.trash.sweep_at(&*disabled.fake, later, mono(later));
    assert!(swept.await.is_none());
    let later = now + hour;
    assert!(
        disabled
            .trash
            .sweep_at(&*disabled.fake, later, mono(later))
            .await
            .is_some()
    );
}

#[tokio::test]
async fn a_clock_jump_pauses_the_purge_until_an_admin_purges() {
    let s = setup(Duration::from_secs(3600));
    let now = chrono::Utc::now();
    let m0 = std::time::Instant::now();
    let uid = s.project("jumped").await;
    s.delete("jumped", &[]);
    s.converge("jumped").await;
    assert!(s.trash.sweep_at(&*s.fake, now, m0).await.is_some());
    // Three days forward by the wall clock, a minute by the monotonic one.
    let jumped = now + chrono::Duration::days(3);
    let minute = m0 + Duration::from_secs(60);
    assert!(s.trash.sweep_at(&*s.fake, jumped, minute).await.is_none());
    assert_eq!(s.metrics.trash_purge_paused.get(), 1);
    assert!(s.trash.purge_paused().is_some());
    let list = s.trash.list(&*s.fake, super::Scope::Own).await.unwrap();
    assert!(list.items.iter().any(|i| i.uid == uid), "kept: {list:?}");
    assert!(list.purge_paused.is_some());
    let events = s.store.events_for(Kind::Project, "jumped").unwrap();
    assert!(
        events.iter().any(|e| e.reason == "TrashPurgePaused"),
        "{events:?}"
    );
    // An administrator trusts the clock: what expired by it goes.
    let purged = s.trash.purge_now(&*s.fake, jumped).await.unwrap();
    assert_eq!(purged, vec![uid]);
    assert_eq!(s.metrics.trash_purge_paused.get(), 0);
    assert!(s.trash.purge_paused().is_none());
}

#[test]
fn the_reason_and_who_come_from_the_deletion_annotations() {
    let object = |pairs: &[(&str, &str)]| crate::store::StoredObject {
        kind: Kind::Project,
        metadata: berth_api::ObjectMeta {
            name: "p".into(),
            uid: Some("u".into()),
            annotations: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        },
        spec: crate::store::Doc::new(&Value::Null),
        status: crate::store::Doc::null(),
    };
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
    let table: [Case; 5] = [
        (&[], "deleted", "unknown"),
        (&[(annotations::DELETED_BY, "unix:a")], "deleted", "unix:a"),
        (
            &[
                (annotations::DELETED_BY, "bob"),
                (annotations::FORCE_DELETE, "true"),
            ],
            "forced",
            "bob",
        ),
        (&[(annotations::REAPED_BY, "reaper")], "reaper", "reaper"),
        (
            &[
                (annotations::REAPED_BY, "prune"),
                (annotations::DELETED_BY, "unix:ci"),
            ],
            "prune",
            "unix:ci",
        ),
    ];
    for (pairs, reason, by) in table {
        let o = object(pairs);
        assert_eq!(
            (
                super::names::reason(&o),
                super::names::deleted_by(&o).as_str()
            ),
            (reason, by),
            "{pairs:?}"
        );
    }
}

#[tokio::test]
async fn an_interrupted_restore_stays_in_the_trash_and_finishes_when_asked_again() {
    let s = setup(7 * DAY);
    let uid = s.project("p").await;
    s.delete("p", &[]);
    s.converge("p").await;
    s.fake.fault_method("rename_volume", Fault::Pass);
    s.fake.fault_method(
        "rename_volume",
        Fault::Fail(RuntimeError::Transport {
            what: "rename".into(),
            message: "killed".into(),
        }),
    );
    s.trash
        .restore(&*s.fake, &s.admission, s.restore(&uid, None))
        .await
        .unwrap_err();
    assert!(s.store.get(Kind::Project, "p").is_none());
    let volumes = s.volumes();
    assert_eq!(
        volumes.iter().filter(|v| is_trash_name(v)).count(),
        1,
        "half moved back: {volumes:?}"
    );
    let entries = s.trash.entries(&*s.fake).await.unwrap();
    assert_eq!(entries.len(), 1, "still restorable");
    assert_eq!(entries[0].volumes.len(), 2);

    let object = s
        .trash
        .restore(&*s.fake, &s.admission, s.restore("p", None))
        .await
        .unwrap();
    assert_eq!(object.uid(), uid);
    assert_eq!(s.volumes(), live_names(&uid));
}

#[tokio::test]
async fn a_replaced_container_is_an_entry_of_a_live_project_that_expires_and_is_not_restored() {
    let s = setup(7 * DAY);
    let uid = s.project("live").await;
    crate::testing::inspection::script_inspection(
        &s.fake,
        "live",
        crate::testing::inspection::FakeWorkspace::default(),
    );
    let object = s.store.get(Kind::Project, "live").unwrap();
    let mut annotated = object.metadata.annotations.clone();
    annotated.insert(annotations::RECREATE_REQUESTED_AT.into(), "t1".into());
    s.store
        .apply(
            Desired::project("live", object.spec.value()).with_annotations(annotated),
            Commit::Persist,
        )
        .unwrap();
    s.converge("live").await;
    let key = format!("{uid}-ct-1");
    let entries = s.trash.entries(&*s.fake).await.unwrap();
    let entry = entries
        .iter()
        .find(|e| e.uid == key)
        .expect("the replaced container is listed while its project lives");
    assert!(entry.is_container());
    assert_eq!(entry.name, "live");
    assert_eq!(entry.reason, "recreate");
    assert!(entry.volumes.is_empty());
    assert_eq!(
        entries.len(),
        1,
        "the live project's volumes are not in the trash"
    );

    // Restoring it as a project is refused, with the way to get its files.
    let refused = s
        .trash
        .restore(&*s.fake, &s.admission, s.restore(&key, None))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, TrashError::Conflict(m) if m.contains("berth trash cp")),
        "{refused:?}"
    );
    // A name names a deleted project's entry, never a container.
    let by_name = s
        .trash
        .restore(&*s.fake, &s.admission, s.restore("live", None))
        .await;
    assert!(
        matches!(by_name, Err(TrashError::NotFound(_))),
        "{by_name:?}"
    );

    // It expires with the trash: the instance is deleted, the live project untouched.
    let trashed_at = entry.deleted_at.unwrap();
    let purged = s
        .trash
        .purge_expired(&*s.fake, trashed_at + chrono::Duration::days(8))
        .await
        .unwrap();
    assert_eq!(purged, std::slice::from_ref(&key));
    assert!(
        s.fake
            .instance(&format!("berth-trash-{uid}-ct-1"))
            .is_none()
    );
    assert!(s.fake.instance("live").is_some());
    assert_eq!(live_names(&uid), {
        let mut v: Vec<String> = s
            .volumes()
            .into_iter()
            .filter(|n| n.contains(&uid))
            .collect();
        v.sort();
        v
    });
    let events = s.store.events_for(Kind::Project, "live").unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.reason == "TrashPurged" && e.involved_object.uid == uid)
    );
}

/// A deletion held far longer than the retention (asked for eight days ago, trashed now) keeps
/// its trash entry for the whole retention from when the trash received it.
#[tokio::test]
async fn the_retention_counts_from_when_the_trash_received_an_entry() {
    let s = setup(7 * DAY);
    let uid = s.project("held").await;
    s.delete("held", &[]);
    s.converge("held").await;
    let entries = s.trash.entries(&*s.fake).await.unwrap();
    let entry = entries.iter().find(|e| e.uid == uid).unwrap();
    let trashed_at = entry.trashed_at.expect("trashedAt recorded");
    let asked_long_ago =
        (trashed_at - chrono::Duration::days(8)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    for volume in &entry.volumes {
        s.fake
            .patch_volume(
                POOL,
                &volume.name,
                &BTreeMap::from([(
                    super::names::TRASH_DELETED_AT.to_string(),
                    asked_long_ago.clone(),
                )]),
                None,
            )
            .await
            .unwrap();
    }

    let entries = s.trash.entries(&*s.fake).await.unwrap();
    let entry = entries.iter().find(|e| e.uid == uid).unwrap();
    assert_eq!(
        s.trash.expires_at(entry),
        Some(trashed_at + chrono::Duration::days(7))
    );
    let purged = s
        .trash
        .purge_expired(&*s.fake, trashed_at + chrono::Duration::days(6))
        .await
        .unwrap();
    assert!(purged.is_empty(), "purged a day early: {purged:?}");
    let purged = s
        .trash
        .purge_expired(&*s.fake, trashed_at + chrono::Duration::days(7))
        .await
        .unwrap();
    assert_eq!(purged, vec![uid]);
}

#[test]
fn the_clock_watch_pauses_on_a_jump_and_trusts_a_clock_that_agrees_again() {
    let secs = chrono::Duration::seconds;
    let t0: chrono::DateTime<chrono::Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
    let m0 = std::time::Instant::now();
    let at = |s: u64| m0 + std::time::Duration::from_secs(s);
    let mut watch = super::ClockWatch::default();
    assert_eq!(
        watch.observe(t0, at(0)),
        None,
        "the first reading is trusted"
    );
    assert_eq!(watch.observe(t0 + secs(60), at(60)), None);
    // Two days forward in two minutes: paused, with the skew.
    assert_eq!(
        watch.observe(t0 + chrono::Duration::days(2), at(120)),
        Some(chrono::Duration::days(2) - secs(120))
    );
    // Still off a minute later; set right again, it agrees.
    assert!(
        watch
            .observe(t0 + chrono::Duration::days(2), at(180))
            .is_some()
    );
    assert_eq!(watch.observe(t0 + secs(240), at(240)), None);
    // Backwards by more than the limit pauses too, and an accepted clock is trusted from there.
    assert!(
        watch
            .observe(t0 - chrono::Duration::hours(5), at(300))
            .is_some()
    );
    watch.accept(t0 - chrono::Duration::hours(5), at(300));
    assert_eq!(
        watch.observe(t0 - chrono::Duration::hours(5) + secs(30), at(330)),
        None
    );
}

/// The tag the simulation puts on every volume and container it follows.
const SIM_ID: &str = "user.sim.id";
/// The simulation's seed: a failure names it, and the same seed walks the same way.
const SEED: u64 = 0x7472_6173_6800_0001;

/// Every tagged volume and container in the fake, by tag.
fn tagged(fake: &FakeRuntime) -> std::collections::BTreeSet<String> {
    let volumes = fake
        .volume_names(POOL)
        .into_iter()
        .filter_map(|n| fake.volume(POOL, &n)?.config.get(SIM_ID).cloned());
    let instances = fake
        .instance_names()
        .into_iter()
        .filter_map(|n| fake.instance(&n)?.config.get(SIM_ID).cloned());
    volumes.chain(instances).collect()
}

/// A long random life of a trash: projects created, replaced, deleted and restored, workspaces
/// copied before forced checkouts, time passing, the wall clock jumping forward and back, the
/// host suspended (real time the monotonic clock did not see, then an admin's purge), and the
/// store lost (a new controller in front of the same LXD, which restores the old store's
/// entries by uid). After every step, every volume and container a project ever had is still
/// in LXD (live or in the trash) unless it spent a full retention of real time in the trash.
#[tokio::test]
async fn randomized_life_of_the_trash_never_destroys_a_byte_before_its_retention() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    const RETENTION: Duration = Duration::from_secs(3600);
    let mut rng = StdRng::seed_from_u64(SEED);
    let fake = Arc::new(FakeRuntime::new());
    let mut s = setup_on(Arc::clone(&fake), RETENTION);
    let m0 = std::time::Instant::now();
    // Real time, what the monotonic clock saw of it, and the wall clock's shift from the
    // system's (this thread's `crate::clock`).
    let (mut real, mut mono, mut shift) =
        (Duration::ZERO, Duration::ZERO, chrono::Duration::zero());
    // Every thing followed: when (real time) it went into the trash, if it did.
    let mut things: BTreeMap<String, Option<Duration>> = BTreeMap::new();
    let mut next_id = 0_u32;
    let mut live: Vec<String> = Vec::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();

    async fn tag_container(fake: &FakeRuntime, name: &str, id: String) {
        let mut patch = crate::runtime::InstancePatch::default();
        patch.config.insert(SIM_ID.to_string(), id);
        fake.patch_instance(name, &patch).await.unwrap();
    }
    async fn tag_volume(fake: &FakeRuntime, name: &str, id: String) {
        let tag = BTreeMap::from([(SIM_ID.to_string(), id)]);
        fake.patch_volume(POOL, name, &tag, None).await.unwrap();
    }
    // The tag of the container `name` and of each volume of project `uid` not yet tagged.
    let tag_of_container = |name: &str| {
        fake.instance(name)
            .and_then(|i| i.config.get(SIM_ID).cloned())
    };

    for step in 0..400 {
        crate::clock::shift_this_thread(Some(shift));
        let op = rng.random_range(0..100);
        let what = match op {
            0..=19 if live.len() < 6 => {
                next_id += 1;
                let name = format!("p{next_id}");
                let uid = s.project(&name).await;
                for volume in live_names(&uid) {
                    next_id += 1;
                    tag_volume(&fake, &volume, format!("v{next_id}")).await;
                    things.insert(format!("v{next_id}"), None);
                }
                next_id += 1;
                tag_container(&fake, &name, format!("c{next_id}")).await;
                things.insert(format!("c{next_id}"), None);
                live.push(name);
                "create"
            }
            20..=34 if !live.is_empty() => {
                let name = live[rng.random_range(0..live.len())].clone();
                let old = tag_of_container(&name).expect("a tagged container");
                let stamp = format!("r{step}");
                s.store.request_forced_replace(&name, &stamp).unwrap();
                s.converge(&name).await;
                things.insert(old, Some(real));
                next_id += 1;
                tag_container(&fake, &name, format!("c{next_id}")).await;
                things.insert(format!("c{next_id}"), None);
                "replace"
            }
            35..=49 if !live.is_empty() => {
                let name = live.remove(rng.random_range(0..live.len()));
                let container = tag_of_container(&name);
                let uid = s.uid(&name);
                let volumes: Vec<String> = live_names(&uid)
                    .iter()
                    .filter_map(|v| fake.volume(POOL, v)?.config.get(SIM_ID).cloned())
                    .collect();
                s.delete(&name, &[]);
                s.converge(&name).await;
                for id in volumes.into_iter().chain(container) {
                    things.insert(id, Some(real));
                }
                "delete"
            }
            50..=57 if !live.is_empty() => {
                // A forced checkout's copy of the workspace, as the step makes it.
                let name = &live[rng.random_range(0..live.len())];
                let object = s.store.get(Kind::Project, name).unwrap();
                let workspace = DurableLayout::workspace_volume(object.uid());
                let asked = crate::clock::now() + chrono::Duration::seconds(i64::from(next_id));
                let (copy, mut labels) =
                    super::checkout_copy(&object, &workspace, asked, crate::clock::now());
                next_id += 1;
                labels.insert(SIM_ID.to_string(), format!("f{next_id}"));
                let request = crate::runtime::CreateVolume {
                    pool: POOL.into(),
                    name: copy,
                    size: None,
                    config: labels,
                    target: None,
                };
                fake.copy_volume(&workspace, &request).await.unwrap();
                things.insert(format!("f{next_id}"), Some(real));
                "checkout copy"
            }
            58..=65 => {
                // Restore an entry of this store or, by uid, of a lost one.
                let entries = s.trash.entries_of(&*fake, super::Scope::All).await.unwrap();
                // By name, so the walk is the seed's alone (uids are random).
                let mut restorable: Vec<_> = entries
                    .iter()
                    .filter(|e| e.kind == super::names::KIND_PROJECT)
                    .filter(|e| s.store.get(Kind::Project, &e.name).is_none())
                    .collect();
                restorable.sort_by(|a, b| a.name.cmp(&b.name));
                if restorable.is_empty() {
                    continue;
                }
                let entry = restorable[rng.random_range(0..restorable.len())].clone();
                let back: Vec<String> = entry
                    .volumes
                    .iter()
                    .filter_map(|v| v.config.get(SIM_ID).cloned())
                    .collect();
                s.trash
                    .restore(&*fake, &s.admission, s.restore(&entry.uid, None))
                    .await
                    .unwrap();
                s.converge(&entry.name).await;
                for id in back {
                    things.insert(id, None);
                }
                next_id += 1;
                tag_container(&fake, &entry.name, format!("c{next_id}")).await;
                things.insert(format!("c{next_id}"), None);
                live.push(entry.name.clone());
                "restore"
            }
            66..=85 => {
                let by = Duration::from_secs(rng.random_range(60..3000));
                real += by;
                mono += by;
                shift += chrono::Duration::from_std(by).unwrap();
                "time passes"
            }
            86..=91 => {
                // Set forward by days, then back: the purge pauses, and resumes by itself.
                let jump = chrono::Duration::days(rng.random_range(1..30));
                crate::clock::shift_this_thread(Some(shift + jump));
                let _ = s
                    .trash
                    .sweep_at(&*fake, crate::clock::now(), m0 + mono)
                    .await;
                assert!(
                    s.trash.purge_paused().is_some(),
                    "step {step}: a jump pauses"
                );
                check(&fake, &things, real, RETENTION, step, "a jump");
                crate::clock::shift_this_thread(Some(shift));
                "clock jumps and comes back"
            }
            92..=95 => {
                // Suspended for hours: real time the monotonic clock did not see. The purge
                // pauses; an admin who knows the clock is right purges.
                let by = Duration::from_secs(rng.random_range(7200..20_000));
                real += by;
                shift += chrono::Duration::from_std(by).unwrap();
                crate::clock::shift_this_thread(Some(shift));
                let _ = s
                    .trash
                    .sweep_at(&*fake, crate::clock::now(), m0 + mono)
                    .await;
                check(&fake, &things, real, RETENTION, step, "a suspend");
                s.trash
                    .purge_now(&*fake, crate::clock::now())
                    .await
                    .unwrap();
                "suspend, then an admin purges"
            }
            _ if step % 3 == 0 => {
                // The store is lost: the projects it knew stay in LXD, unmanaged.
                s = setup_on(Arc::clone(&fake), RETENTION);
                live.clear();
                "store lost"
            }
            _ => continue,
        };
        let _ = s
            .trash
            .sweep_at(&*fake, crate::clock::now(), m0 + mono)
            .await;
        check(&fake, &things, real, RETENTION, step, what);
        *counts.entry(what).or_default() += 1;
    }
    crate::clock::shift_this_thread(None);
    // The random walk reached every kind of step, and purged something.
    for what in [
        "create",
        "replace",
        "delete",
        "checkout copy",
        "restore",
        "clock jumps and comes back",
        "suspend, then an admin purges",
        "store lost",
    ] {
        assert!(
            counts.get(what).copied().unwrap_or(0) >= 2,
            "too few {what}: {counts:?} (seed {SEED:#x})"
        );
    }
    let present = tagged(&fake);
    assert!(
        things.keys().any(|id| !present.contains(id)),
        "nothing was ever purged: {counts:?}"
    );

    /// Every thing is in LXD unless it spent a full retention of real time in the trash.
    fn check(
        fake: &FakeRuntime,
        things: &BTreeMap<String, Option<Duration>>,
        real: Duration,
        retention: Duration,
        step: usize,
        what: &str,
    ) {
        let present = tagged(fake);
        for (id, trashed) in things {
            let may_be_gone = trashed.is_some_and(|at| real.saturating_sub(at) >= retention);
            assert!(
                present.contains(id) || may_be_gone,
                "step {step} ({what}): {id} is gone after {:?} in the trash (seed {SEED:#x})",
                trashed.map(|at| real.saturating_sub(at))
            );
        }
    }
}
