//! Notices of writes in a directory of a container on this host: inotify on the directory as
//! the host sees it, found through the container's root (`/proc/<init pid>/root`).
//!
//! The directory is resolved inside that root (`openat2` with `RESOLVE_IN_ROOT`), as the
//! container itself would resolve it: an absolute symlink the container planted there cannot
//! make berth watch a host path. A notice is only a trigger; whoever receives it reads the file
//! through LXD's file API as before, never through `/proc`. Only a daemon reached over its unix
//! socket (and on a cluster, only the instances on the member answering it) shares berth's pid
//! namespace, so only those are watched; the rest are polled by the caller.
//!
//! A watch is known to be the one asked for before ([`Watch::Already`]) while it has not ended
//! (the kernel's `IN_IGNORED`, when the directory goes away with its tmpfs or is removed), no
//! events were dropped, and the init it was found through still runs. Otherwise the directory
//! is resolved again, and inotify answering with the same watch descriptor (it gives the same
//! one for an inode it watches already, and allocates new ones cyclically) is what says the
//! watch never ended; any other answer is a new watch ([`Watch::Started`]).

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags};
use tokio::sync::broadcast;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::runtime::Watch;

/// Notices not yet received before a receiver lags.
const NOTICE_BUFFER: usize = 1024;

/// What a watch reacts to: a file written and closed, or renamed into the directory (how the
/// runner replaces a report atomically). The directory going away ends the watch (`IGNORED`).
const EVENTS: WatchFlags = WatchFlags::CLOSE_WRITE
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::ONLYDIR);

/// The watches of one LXD client.
pub(super) struct FileWatch {
    notices: broadcast::Sender<String>,
    /// Created on the first watch: a client that never watches holds no inotify descriptor.
    inner: tokio::sync::OnceCell<Option<Arc<Inner>>>,
    /// Ends the reading task when the client is dropped.
    stop: DropGuard,
}

struct Inner {
    fd: OwnedFd,
    watches: Mutex<Watches>,
    /// Held while events are read and handled, by the reading thread or by a caller catching
    /// up: events are handled in the order the kernel queued them.
    reading: Mutex<()>,
}

#[derive(Default)]
struct Watches {
    /// Instance name and directory by watch descriptor.
    by_wd: HashMap<i32, (String, String)>,
    /// The watch of each instance name and directory.
    by_name: HashMap<(String, String), Watched>,
}

struct Watched {
    wd: i32,
    /// A pidfd of the process the directory was resolved through, where the kernel gives one.
    /// Once it has exited, the instance may see another directory at that path (restarted,
    /// while something keeps its old mounts alive), so the path is resolved again.
    init: Option<OwnedFd>,
    /// Events were dropped (the queue overflowed), perhaps the `IGNORED` that ended this
    /// watch: the path is resolved again before the watch is trusted.
    unsure: bool,
}

impl FileWatch {
    pub(super) fn new() -> FileWatch {
        FileWatch {
            notices: broadcast::channel(NOTICE_BUFFER).0,
            inner: tokio::sync::OnceCell::new(),
            stop: CancellationToken::new().drop_guard(),
        }
    }

    pub(super) fn subscribe(&self) -> broadcast::Receiver<String> {
        self.notices.subscribe()
    }

    /// Whether `dir` of `instance` is watched, by a watch that has not ended (the events the
    /// kernel queued so far are handled first) and that was found through a process still
    /// running. When not, [`Self::watch`] says whether the directory is still the one watched.
    pub(super) fn is_watching(&self, instance: &str, dir: &str) -> bool {
        let Some(inner) = self.inner.get().and_then(Option::as_ref) else {
            return false;
        };
        inner.catch_up(&self.notices);
        lock(&inner.watches)
            .by_name
            .get(&(instance.to_string(), dir.to_string()))
            .is_some_and(|watched| !watched.unsure && !watched.init.as_ref().is_some_and(exited))
    }

    /// Watches `dir` in the root of process `pid` (the instance's init) for `instance`.
    /// [`Watch::Unavailable`] when there is no such process, the directory is not there (yet),
    /// or this host gives berth no inotify.
    pub(super) async fn watch(
        &self,
        instance: &str,
        pid: i64,
        dir: &str,
    ) -> std::io::Result<Watch> {
        let Some(process) = i32::try_from(pid)
            .ok()
            .filter(|pid| *pid > 0)
            .and_then(Pid::from_raw)
        else {
            return Ok(Watch::Unavailable);
        };
        // The pidfd first: the root opened next is then this process's, not one that got its
        // pid after it exited.
        let init = match rustix::process::pidfd_open(process, PidfdFlags::empty()) {
            Ok(pidfd) => Some(pidfd),
            Err(Errno::SRCH) => return Ok(Watch::Unavailable),
            // A kernel without pidfds: the watch is trusted until it ends.
            Err(_) => None,
        };
        let root = match rustix::fs::open(
            format!("/proc/{pid}/root"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(root) => root,
            Err(Errno::NOENT | Errno::SRCH) => return Ok(Watch::Unavailable),
            Err(e) => return Err(e.into()),
        };
        if init.as_ref().is_some_and(exited) {
            return Ok(Watch::Unavailable);
        }
        self.watch_in(instance, &root, dir, init).await
    }

    /// Watches `dir` resolved inside the directory `root` as if it were `/`; `init`, if any,
    /// is a pidfd of the process `root` belongs to.
    async fn watch_in(
        &self,
        instance: &str,
        root: &OwnedFd,
        dir: &str,
        init: Option<OwnedFd>,
    ) -> std::io::Result<Watch> {
        let Some(inner) = self.inner().await else {
            return Ok(Watch::Unavailable);
        };
        let relative = dir.trim_start_matches('/');
        let opened = rustix::fs::openat2(
            root,
            if relative.is_empty() { "." } else { relative },
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        );
        let opened = match opened {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::NOTDIR) => return Ok(Watch::Unavailable),
            Err(e) => return Err(e.into()),
        };
        // The descriptor's own magic link names exactly the directory resolved above.
        let wd = inotify::add_watch(
            &inner.fd,
            format!("/proc/self/fd/{}", opened.as_raw_fd()),
            EVENTS,
        )?;
        let key = (instance.to_string(), dir.to_string());
        let mut watches = lock(&inner.watches);
        // inotify answers with the descriptor of the watch already on this inode, if any, and
        // never soon reuses one that ended: the same descriptor as before is the same watch,
        // in place all along, so no write since went unnoticed.
        let already = watches.by_name.get(&key).is_some_and(|w| w.wd == wd);
        // A descriptor names one inode: the same directory watched by another name (after a
        // pid was reused) is this name's now.
        if let Some(other) = watches.by_wd.insert(wd, key.clone())
            && other != key
        {
            watches.by_name.remove(&other);
        }
        if let Some(old) = watches.by_name.insert(
            key,
            Watched {
                wd,
                init,
                unsure: false,
            },
        ) && old.wd != wd
        {
            // The instance's directory is another inode now (a restarted or replaced
            // container): the old watch, if it has not ended yet, watches nothing of use.
            watches.by_wd.remove(&old.wd);
            let _ = inotify::remove_watch(&inner.fd, old.wd);
        }
        Ok(if already {
            Watch::Already
        } else {
            Watch::Started
        })
    }

    async fn inner(&self) -> Option<Arc<Inner>> {
        self.inner
            .get_or_init(|| async {
                match start(self.notices.clone(), self.stop.token().clone()) {
                    Ok(inner) => Some(inner),
                    Err(e) => {
                        tracing::warn!(error = %e, "no inotify: agent reports are polled only");
                        None
                    }
                }
            })
            .await
            .clone()
    }
}

/// Whether the process of a pidfd has exited (the pidfd reads ready).
fn exited(pidfd: &OwnedFd) -> bool {
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let mut ready = [PollFd::new(pidfd, PollFlags::IN)];
    rustix::event::poll(&mut ready, Some(&now)).is_ok_and(|n| n > 0)
}

/// How long the reading thread waits for events before it looks whether the client is gone.
const POLL_TIMEOUT: Timespec = Timespec {
    tv_sec: 1,
    tv_nsec: 0,
};

/// Creates the inotify descriptor and the thread that turns its events into notices; the
/// thread ends within a second of `stop`.
fn start(
    notices: broadcast::Sender<String>,
    stop: CancellationToken,
) -> std::io::Result<Arc<Inner>> {
    let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)?;
    let inner = Arc::new(Inner {
        fd,
        watches: Mutex::new(Watches::default()),
        reading: Mutex::new(()),
    });
    let reading = inner.clone();
    std::thread::Builder::new()
        .name("berth-inotify".into())
        .spawn(move || reading.read_until(&stop, &notices))?;
    Ok(inner)
}

impl Inner {
    fn read_until(&self, stop: &CancellationToken, notices: &broadcast::Sender<String>) {
        while !stop.is_cancelled() {
            let mut ready = [PollFd::new(&self.fd, PollFlags::IN)];
            match rustix::event::poll(&mut ready, Some(&POLL_TIMEOUT)) {
                Ok(0) | Err(Errno::INTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "waiting for inotify events failed; agent reports are polled only");
                    return;
                }
            }
            self.catch_up(notices);
        }
    }

    /// Reads and handles the events queued so far.
    fn catch_up(&self, notices: &broadcast::Sender<String>) {
        let _reading = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        let mut buffer = [MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = inotify::Reader::new(&self.fd, &mut buffer);
        loop {
            match reader.next() {
                Ok(event) => self.handle(event.wd(), event.events(), notices),
                Err(Errno::WOULDBLOCK) => return,
                Err(Errno::INTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "reading inotify events failed");
                    return;
                }
            }
        }
    }

    fn handle(&self, wd: i32, events: ReadFlags, notices: &broadcast::Sender<String>) {
        let mut watches = lock(&self.watches);
        if events.contains(ReadFlags::IGNORED) {
            // The watch ended: the next `watch` of its directory starts a new one.
            if let Some(key) = watches.by_wd.remove(&wd)
                && watches.by_name.get(&key).is_some_and(|w| w.wd == wd)
            {
                watches.by_name.remove(&key);
            }
            return;
        }
        if events.intersects(ReadFlags::CLOSE_WRITE | ReadFlags::MOVED_TO)
            && let Some((instance, _)) = watches.by_wd.get(&wd)
        {
            // No receiver is fine: nobody asked yet.
            let _ = notices.send(instance.clone());
        }
        if events.contains(ReadFlags::QUEUE_OVERFLOW) {
            // Events were dropped: every watched instance may have changed, and any watch
            // may have ended unseen.
            for watched in watches.by_name.values_mut() {
                watched.unsure = true;
            }
            let names: std::collections::BTreeSet<&String> =
                watches.by_wd.values().map(|(name, _)| name).collect();
            for name in names {
                let _ = notices.send(name.clone());
            }
        }
        drop(watches);
    }
}

fn lock(watches: &Mutex<Watches>) -> std::sync::MutexGuard<'_, Watches> {
    watches.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn next(notices: &mut broadcast::Receiver<String>) -> String {
        tokio::time::timeout(Duration::from_secs(30), notices.recv())
            .await
            .expect("a notice within 30 s")
            .expect("the notice channel open")
    }

    fn this_process() -> i64 {
        i64::from(std::process::id())
    }

    /// This process's own root stands in for a container's: the directory is resolved in it
    /// exactly as it would be in a container's.
    #[tokio::test]
    async fn a_write_or_a_rename_in_the_directory_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap().to_string();
        let watch = FileWatch::new();
        let mut notices = watch.subscribe();
        assert_eq!(
            watch.watch("c1", this_process(), &path).await.unwrap(),
            Watch::Started
        );
        assert!(watch.is_watching("c1", &path));
        assert_eq!(
            watch.watch("c1", this_process(), &path).await.unwrap(),
            Watch::Already
        );

        std::fs::write(dir.path().join("agent.json"), b"{}").unwrap();
        assert_eq!(next(&mut notices).await, "c1");
        std::fs::write(dir.path().join("tmp"), b"{}").unwrap();
        assert_eq!(next(&mut notices).await, "c1");
        std::fs::rename(dir.path().join("tmp"), dir.path().join("agent.json")).unwrap();
        assert_eq!(next(&mut notices).await, "c1");
    }

    /// A directory removed ends its watch, known at once (the kernel's `IGNORED` is handled
    /// before the answer); one made again in its place is watched by a new watch.
    #[tokio::test]
    async fn a_missing_directory_is_not_watched_and_a_removed_one_stops_its_watch() {
        let dir = tempfile::tempdir().unwrap();
        let watch = FileWatch::new();
        let missing = dir.path().join("absent");
        assert_eq!(
            watch
                .watch("c1", this_process(), missing.to_str().unwrap())
                .await
                .unwrap(),
            Watch::Unavailable
        );

        let gone = dir.path().join("gone");
        std::fs::create_dir(&gone).unwrap();
        let path = gone.to_str().unwrap().to_string();
        assert_eq!(
            watch.watch("c1", this_process(), &path).await.unwrap(),
            Watch::Started
        );
        std::fs::remove_dir(&gone).unwrap();
        assert!(!watch.is_watching("c1", &path), "watch not dropped");
        assert_eq!(
            watch.watch("c1", this_process(), &path).await.unwrap(),
            Watch::Unavailable
        );

        // Made again, and removed and made again before anyone looks: a new watch each time,
        // whether or not the old one's end was handled yet.
        std::fs::create_dir(&gone).unwrap();
        assert_eq!(
            watch.watch("c1", this_process(), &path).await.unwrap(),
            Watch::Started
        );
        std::fs::remove_dir(&gone).unwrap();
        std::fs::create_dir(&gone).unwrap();
        assert_eq!(
            watch.watch("c1", this_process(), &path).await.unwrap(),
            Watch::Started
        );
        let mut notices = watch.subscribe();
        std::fs::write(gone.join("agent.json"), b"{}").unwrap();
        assert_eq!(next(&mut notices).await, "c1");
        assert_eq!(
            watch.watch("c1", this_process(), &path).await.unwrap(),
            Watch::Already
        );
    }

    /// A watch found through a process that has exited is not trusted (its instance may have
    /// restarted into another directory at that path); resolved again through the running one
    /// to the directory still watched, it is the same watch.
    #[tokio::test]
    async fn a_watch_through_an_exited_process_is_resolved_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap().to_string();
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let first = i64::from(child.id());
        let watch = FileWatch::new();
        assert_eq!(
            watch.watch("c1", first, &path).await.unwrap(),
            Watch::Started
        );
        assert!(watch.is_watching("c1", &path));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!watch.is_watching("c1", &path), "trusted past its init");
        assert_eq!(
            watch.watch("c1", first, &path).await.unwrap(),
            Watch::Unavailable,
            "no such process"
        );
        assert_eq!(
            watch.watch("c1", this_process(), &path).await.unwrap(),
            Watch::Already
        );
        assert!(watch.is_watching("c1", &path));
        let mut notices = watch.subscribe();
        std::fs::write(dir.path().join("agent.json"), b"{}").unwrap();
        assert_eq!(next(&mut notices).await, "c1");
    }

    #[tokio::test]
    async fn a_symlink_planted_in_the_root_stays_inside_it() {
        // A container's `/run` made an absolute symlink to the host's `/tmp`: resolved in the
        // container's root it leads to the container's own `/tmp`, never the host's.
        let root_dir = tempfile::tempdir().unwrap();
        let host_dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(host_dir.path().join("berth")).unwrap();
        std::os::unix::fs::symlink(host_dir.path(), root_dir.path().join("run")).unwrap();
        let root = rustix::fs::open(
            root_dir.path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let watch = FileWatch::new();
        assert_eq!(
            watch
                .watch_in("c1", &root, "/run/berth", None)
                .await
                .unwrap(),
            Watch::Unavailable
        );

        // Inside the root, the same link is followed as the container would follow it.
        let inside = root_dir
            .path()
            .join(host_dir.path().strip_prefix("/").unwrap());
        std::fs::create_dir_all(inside.join("berth")).unwrap();
        let mut notices = watch.subscribe();
        assert_eq!(
            watch
                .watch_in("c1", &root, "/run/berth", None)
                .await
                .unwrap(),
            Watch::Started
        );
        std::fs::write(inside.join("berth/agent.json"), b"{}").unwrap();
        assert_eq!(next(&mut notices).await, "c1");
        // The watch is on the directory inside: removing it ends the watch.
        std::fs::remove_file(inside.join("berth/agent.json")).unwrap();
        std::fs::remove_dir(inside.join("berth")).unwrap();
        assert!(!watch.is_watching("c1", "/run/berth"), "watch not dropped");
    }
}
