//! Notices of writes in a directory of a container on this host: inotify on the directory as
//! the host sees it, found through the container's root (`/proc/<init pid>/root`).
//!
//! The directory is resolved inside that root (`openat2` with `RESOLVE_IN_ROOT`), as the
//! container itself would resolve it: an absolute symlink the container planted there cannot
//! make berth watch a host path. A notice is only a trigger; whoever receives it reads the file
//! through LXD's file API as before, never through `/proc`. Only a daemon reached over its unix
//! socket (and on a cluster, only the instances on the member answering it) shares berth's pid
//! namespace, so only those are watched; the rest are polled by the caller.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use rustix::event::{PollFd, PollFlags};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use tokio::sync::broadcast;
use tokio_util::sync::{CancellationToken, DropGuard};

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
}

#[derive(Default)]
struct Watches {
    /// Instance name and directory by watch descriptor.
    by_wd: HashMap<i32, (String, String)>,
    /// Watch descriptor by instance name and directory.
    by_name: HashMap<(String, String), i32>,
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

    /// Whether `dir` of `instance` is watched already.
    pub(super) fn is_watching(&self, instance: &str, dir: &str) -> bool {
        self.inner
            .get()
            .and_then(Option::as_ref)
            .is_some_and(|inner| {
                lock(&inner.watches)
                    .by_name
                    .contains_key(&(instance.to_string(), dir.to_string()))
            })
    }

    /// Watches `dir` in the root of process `pid` (the instance's init) for `instance`.
    /// `Ok(false)` when the directory is not there (yet) or this host gives berth no inotify.
    pub(super) async fn watch(&self, instance: &str, pid: i64, dir: &str) -> std::io::Result<bool> {
        if pid <= 0 {
            return Ok(false);
        }
        let root = rustix::fs::open(
            format!("/proc/{pid}/root"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        self.watch_in(instance, &root, dir).await
    }

    /// Watches `dir` resolved inside the directory `root` as if it were `/`.
    async fn watch_in(&self, instance: &str, root: &OwnedFd, dir: &str) -> std::io::Result<bool> {
        let Some(inner) = self.inner().await else {
            return Ok(false);
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
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => return Ok(false),
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
        // A descriptor names one inode: the same directory watched again (or by another
        // name after a pid was reused) keeps one entry.
        if let Some((old_instance, old_dir)) = watches.by_wd.remove(&wd) {
            watches.by_name.remove(&(old_instance, old_dir));
        }
        if let Some(old) = watches.by_name.insert(key.clone(), wd)
            && old != wd
        {
            // The instance's directory is another inode now (a replaced container).
            watches.by_wd.remove(&old);
            let _ = inotify::remove_watch(&inner.fd, old);
        }
        watches.by_wd.insert(wd, key);
        Ok(true)
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

/// How long the reading thread waits for events before it looks whether the client is gone.
const POLL_TIMEOUT: rustix::event::Timespec = rustix::event::Timespec {
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
    });
    let reading = inner.clone();
    std::thread::Builder::new()
        .name("berth-inotify".into())
        .spawn(move || reading.read_until(&stop, &notices))?;
    Ok(inner)
}

impl Inner {
    fn read_until(&self, stop: &CancellationToken, notices: &broadcast::Sender<String>) {
        let mut buffer = [MaybeUninit::<u8>::uninit(); 4096];
        while !stop.is_cancelled() {
            let mut ready = [PollFd::new(&self.fd, PollFlags::IN)];
            match rustix::event::poll(&mut ready, Some(&POLL_TIMEOUT)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "waiting for inotify events failed; agent reports are polled only");
                    return;
                }
            }
            let mut reader = inotify::Reader::new(&self.fd, &mut buffer);
            loop {
                match reader.next() {
                    Ok(event) => self.handle(event.wd(), event.events(), notices),
                    Err(rustix::io::Errno::WOULDBLOCK) => break,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "reading inotify events failed");
                        break;
                    }
                }
            }
        }
    }

    fn handle(&self, wd: i32, events: ReadFlags, notices: &broadcast::Sender<String>) {
        let mut watches = lock(&self.watches);
        if events.contains(ReadFlags::IGNORED) {
            if let Some(key) = watches.by_wd.remove(&wd)
                && watches.by_name.get(&key) == Some(&wd)
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
            // Events were dropped: every watched instance may have changed.
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

    /// This process's own root stands in for a container's: the directory is resolved in it
    /// exactly as it would be in a container's.
    #[tokio::test]
    async fn a_write_or_a_rename_in_the_directory_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap().to_string();
        let watch = FileWatch::new();
        let mut notices = watch.subscribe();
        let pid = i64::from(std::process::id());
        assert!(watch.watch("c1", pid, &path).await.unwrap());
        assert!(watch.is_watching("c1", &path));

        std::fs::write(dir.path().join("agent.json"), b"{}").unwrap();
        assert_eq!(next(&mut notices).await, "c1");
        std::fs::write(dir.path().join("tmp"), b"{}").unwrap();
        assert_eq!(next(&mut notices).await, "c1");
        std::fs::rename(dir.path().join("tmp"), dir.path().join("agent.json")).unwrap();
        assert_eq!(next(&mut notices).await, "c1");
    }

    #[tokio::test]
    async fn a_missing_directory_is_not_watched_and_a_removed_one_stops_its_watch() {
        let dir = tempfile::tempdir().unwrap();
        let pid = i64::from(std::process::id());
        let watch = FileWatch::new();
        let missing = dir.path().join("absent");
        assert!(
            !watch
                .watch("c1", pid, missing.to_str().unwrap())
                .await
                .unwrap()
        );

        let gone = dir.path().join("gone");
        std::fs::create_dir(&gone).unwrap();
        let gone = gone.to_str().unwrap().to_string();
        assert!(watch.watch("c1", pid, &gone).await.unwrap());
        std::fs::remove_dir(&gone).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while watch.is_watching("c1", &gone) {
            assert!(tokio::time::Instant::now() < deadline, "watch not dropped");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
        assert!(!watch.watch_in("c1", &root, "/run/berth").await.unwrap());

        // Inside the root, the same link is followed as the container would follow it.
        let inside = root_dir
            .path()
            .join(host_dir.path().strip_prefix("/").unwrap());
        std::fs::create_dir_all(inside.join("berth")).unwrap();
        let mut notices = watch.subscribe();
        assert!(watch.watch_in("c1", &root, "/run/berth").await.unwrap());
        std::fs::write(inside.join("berth/agent.json"), b"{}").unwrap();
        assert_eq!(next(&mut notices).await, "c1");
        // The watch is on the directory inside: removing it ends the watch.
        std::fs::remove_file(inside.join("berth/agent.json")).unwrap();
        std::fs::remove_dir(inside.join("berth")).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while watch.is_watching("c1", "/run/berth") {
            assert!(tokio::time::Instant::now() < deadline, "watch not dropped");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
