//! A randomized simulation through the daemon's real passes (activity, the look at stopped
//! projects, reap with its re-check, the status writes and the store) over a fake runtime and
//! simulated weeks: workspaces gain and save work, agents block and carry on, people stop and
//! start projects, inspections fail, and things change between the activity pass and the reap
//! pass that acts on it. Whatever happens, nothing that holds work, waits for a person or
//! cannot be inspected is ever idled or deleted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_api::UnsavedWork;
use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::tests::{Setup, setup_with};
use crate::runtime::{ExecOutput, InstanceStatus};
use crate::scheduler::{Pass, Passes};
use crate::testing::inspection::{FakeWorkspace, inspection_report, is_inspection};
use berth_api::Kind;

/// The true state of one workspace, which the passes only learn by inspecting it.
#[derive(Debug, Clone, Default)]
struct World {
    unsaved: UnsavedWork,
    blocked: bool,
    /// Its inspection fails (a timeout, a broken repository).
    failing: bool,
    /// The newest file change.
    edited_at: Option<DateTime<Utc>>,
}

impl World {
    fn protected(&self) -> bool {
        self.unsaved.any() || self.blocked || self.failing
    }

    fn workspace(&self) -> FakeWorkspace {
        FakeWorkspace {
            unsaved: self.unsaved.clone(),
            agent_json: Some(
                if self.blocked {
                    r#"{"state":"blocked","message":"which database?"}"#
                } else {
                    r#"{"state":"done"}"#
                }
                .to_string(),
            ),
            ports: Vec::new(),
            newest_mtime: self.edited_at,
            ipv4: None,
        }
    }
}

type Worlds = Arc<Mutex<BTreeMap<String, World>>>;

/// Every inspection in the fake reports the project's world as it is at that moment.
fn script_worlds(s: &Setup, worlds: &Worlds) {
    let worlds = worlds.clone();
    s.fake.on_exec(move |name, request| {
        if !is_inspection(request) {
            return None;
        }
        let world = worlds.lock().unwrap().get(name).cloned()?;
        Some(Ok(if world.failing {
            ExecOutput {
                exit_code: 0,
                stdout: format!("{}\nagent -\n", crate::workspace::inspect::HEADER).into_bytes(),
                stderr: Vec::new(),
            }
        } else {
            ExecOutput {
                exit_code: 0,
                stdout: inspection_report(&world.workspace()).into_bytes(),
                stderr: Vec::new(),
            }
        }))
    });
}

/// Something happening to one workspace.
fn stir(rng: &mut StdRng, world: &mut World, now: DateTime<Utc>, running: bool, temper: &Temper) {
    if running && rng.random_bool(temper.active) {
        world.edited_at = Some(now - chrono::Duration::minutes(rng.random_range(0..20)));
        if rng.random_bool(temper.dirty) {
            match rng.random_range(0..4) {
                0 => world.unsaved.uncommitted += 1,
                1 => world.unsaved.untracked += 1,
                2 => world.unsaved.stashes += 1,
                _ => world.unsaved.unpushed += 1,
            }
        }
        if rng.random_bool(temper.block) {
            world.blocked = true;
        }
    }
    if running && rng.random_bool(temper.save) {
        world.unsaved = UnsavedWork::default();
    }
    if running && world.blocked && rng.random_bool(0.1) {
        world.blocked = false;
    }
    if rng.random_bool(temper.fail) {
        world.failing = !world.failing;
    }
}

/// Something that makes a workspace worth keeping, right after a pass looked at it: only the
/// re-check before acting can see it.
fn threaten(rng: &mut StdRng, world: &mut World, running: bool) {
    match rng.random_range(0..3) {
        0 if running => world.unsaved.untracked += 1,
        1 if running => world.blocked = true,
        _ => world.failing = true,
    }
}

/// How one workspace tends to be used.
struct Temper {
    active: f64,
    dirty: f64,
    save: f64,
    block: f64,
    fail: f64,
}

#[tokio::test(start_paused = true)]
async fn randomized_passes_never_idle_or_delete_protected_work() {
    let pass = Duration::from_secs(30 * 60);
    // Longer than a pass, so that spacing the looks at stopped projects shows.
    let s = setup_with(Duration::from_secs(2 * 3600));
    let mut rng = StdRng::seed_from_u64(0x6265_7274_6809);
    let worlds: Worlds = Arc::default();
    script_worlds(&s, &worlds);
    let mut tempers = BTreeMap::new();
    for i in 0..16 {
        let name = format!("w{i:02}");
        let idle_action = if rng.random_bool(0.3) {
            "Delete"
        } else {
            "Stop"
        };
        let max_age = if rng.random_bool(0.3) {
            "never".to_string()
        } else {
            format!("{}d", rng.random_range(2..=8))
        };
        s.project(
            &name,
            json!({"idleAfter": format!("{}h", rng.random_range(1..=6)),
                   "idleAction": idle_action, "maxAge": max_age}),
            true,
        );
        worlds
            .lock()
            .unwrap()
            .insert(name.clone(), World::default());
        tempers.insert(
            name,
            Temper {
                active: rng.random_range(0.0..0.3),
                dirty: rng.random_range(0.0..0.4),
                save: rng.random_range(0.0..0.3),
                block: rng.random_range(0.0..0.05),
                fail: if i % 4 == 0 {
                    0.0
                } else {
                    rng.random_range(0.0..0.1)
                },
            },
        );
    }

    let (mut idled, mut deleted, mut kept_stopped, mut stopped_passes) = (0, 0, 0, 0);
    for _ in 0..(10 * 48) {
        tokio::time::advance(pass).await;
        let now = s.now();
        // People stop and start projects, as the reconciler would carry it out.
        for name in worlds.lock().unwrap().keys() {
            let Some(object) = s.store.get(Kind::Project, name) else {
                continue;
            };
            let running = object.status.value()["container"]["pid"].is_number();
            if running && rng.random_bool(0.02) {
                s.fake.set_status(name, InstanceStatus::Stopped);
                s.patch_status(
                    name,
                    json!({"phase": "Stopped", "container": {"name": name}}),
                );
            } else if !running && rng.random_bool(0.05) {
                s.fake.set_status(name, InstanceStatus::Running);
                let mut reap = object.status.value()["reap"].clone();
                if let Some(reap) = reap.as_object_mut() {
                    reap.remove("idledAt");
                }
                s.patch_status(
                    name,
                    json!({"phase": "Ready", "container": {"name": name, "pid": 7},
                           "reap": reap}),
                );
            }
        }
        {
            let mut worlds = worlds.lock().unwrap();
            for (name, world) in worlds.iter_mut() {
                let running = s.fake.instance(name).is_some_and(|i| i.is_running());
                stir(&mut rng, world, now, running, &tempers[name]);
            }
        }
        s.passes.run(Pass::Activity).await;
        // And between the pass that looked and the pass that acts.
        {
            let mut worlds = worlds.lock().unwrap();
            for (name, world) in worlds.iter_mut() {
                let running = s.fake.instance(name).is_some_and(|i| i.is_running());
                if rng.random_bool(0.1) {
                    threaten(&mut rng, world, running);
                } else if rng.random_bool(0.2) {
                    stir(&mut rng, world, now, running, &tempers[name]);
                }
            }
        }
        let before: BTreeMap<String, bool> = worlds
            .lock()
            .unwrap()
            .keys()
            .filter_map(|n| {
                let object = s.store.get(Kind::Project, n)?;
                Some((
                    n.clone(),
                    object.status.value()["reap"]["idledAt"].is_string(),
                ))
            })
            .collect();
        s.passes.run(Pass::Reap).await;

        let mut worlds = worlds.lock().unwrap();
        for (name, was_idled) in before {
            let world = worlds[&name].clone();
            let Some(object) = s.store.get(Kind::Project, &name) else {
                assert!(
                    !world.protected(),
                    "{name} deleted while it held {:?}, blocked {}, failing {}",
                    world.unsaved,
                    world.blocked,
                    world.failing
                );
                deleted += 1;
                worlds.remove(&name);
                continue;
            };
            let idled_now = object.status.value()["reap"]["idledAt"].is_string();
            if idled_now && !was_idled {
                assert!(
                    !world.protected(),
                    "{name} idled while it held {:?}, blocked {}, failing {}",
                    world.unsaved,
                    world.blocked,
                    world.failing
                );
                idled += 1;
                // The reconciler stops an idled project.
                s.fake.set_status(&name, InstanceStatus::Stopped);
                s.patch_status(
                    &name,
                    json!({"phase": "Stopped", "container": {"name": name}}),
                );
            }
            let stopped = !object.status.value()["container"]["pid"].is_number() || idled_now;
            if stopped {
                stopped_passes += 1;
                if world.protected() {
                    kept_stopped += 1;
                }
            }
            // A look at a stopped project leaves it stopped.
            if stopped {
                assert_eq!(
                    s.fake.instance(&name).map(|i| i.status),
                    Some(InstanceStatus::Stopped),
                    "{name} left running after a look"
                );
            }
        }
        if worlds.is_empty() {
            break;
        }
    }
    let boots = s.fake.count("start_instance");
    eprintln!(
        "idled {idled}, deleted {deleted}, protected while stopped {kept_stopped} of \
         {stopped_passes} stopped passes, boots {boots}"
    );
    // The simulation must exercise every path, or it proves nothing.
    assert!(idled >= 5, "too few idled: {idled}");
    assert!(deleted >= 3, "too few deleted: {deleted}");
    assert!(
        kept_stopped >= 20,
        "too few stopped protected passes: {kept_stopped}"
    );
    assert!(s.metric("berth_reap_refusals_total{reason=\"UnsavedWork\"}") > 0.0);
    assert!(s.metric("berth_reap_refusals_total{reason=\"InspectionFailed\"}") > 0.0);
    // Stopped projects are booted now and then, not in every pass.
    assert!(
        boots * 2 < stopped_passes,
        "{boots} boots in {stopped_passes} stopped passes"
    );
}
