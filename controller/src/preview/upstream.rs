//! Reaching a port inside a project's container without a NIC: an LXD `proxy` device bound on
//! the host (`bind=host`) listening on a unix socket under `<dataDir>/preview/` (mode 0600,
//! owned by the daemon's user) and connecting to `127.0.0.1:PORT` inside the container.
//!
//! A unix socket rather than a host TCP port, so no other local user reaches the container's
//! port around berth's membership check. The device is added on first use and kept: LXD keeps
//! it across stops and starts, and a recreated container gets it again on its next preview.
//! The socket is keyed by the project's uid, so a socket left by a deleted project is never
//! another project's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixStream;

use crate::runtime::{Device, Instance, InstancePatch, InstanceStatus, Runtime, RuntimeError};

/// Every preview device berth adds is named with this prefix and the port.
pub const DEVICE_PREFIX: &str = "berth-preview-";
/// How long a freshly added device may take to listen on its socket.
const LISTEN_DEADLINE: Duration = Duration::from_secs(10);
const LISTEN_POLL: Duration = Duration::from_millis(50);
/// The longest path a unix socket may have (sun_path, with its terminating NUL).
const SOCKET_PATH_MAX: usize = 107;

/// Why a container's port cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("the container is not running ({0})")]
    NotRunning(String),
    #[error("{0}")]
    Runtime(#[from] RuntimeError),
    #[error("the preview socket {}: {source}", path.display())]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The device name of the preview of `port`.
pub fn device_name(port: u16) -> String {
    format!("{DEVICE_PREFIX}{port}")
}

/// Where the host end of the project `uid`'s port `port` listens.
pub fn socket_path(dir: &Path, uid: &str, port: u16) -> PathBuf {
    dir.join(format!("{uid}-{port}.sock"))
}

/// The proxy device of one preview port: LXD listens on `socket` on the host and connects to
/// the port on the container's loopback. The socket belongs to `owner` (uid, gid), mode 0600.
pub fn device(socket: &Path, port: u16, owner: (u32, u32)) -> Device {
    BTreeMap::from([
        ("type".to_string(), "proxy".to_string()),
        ("bind".to_string(), "host".to_string()),
        ("listen".to_string(), format!("unix:{}", socket.display())),
        ("connect".to_string(), format!("tcp:127.0.0.1:{port}")),
        ("mode".to_string(), "0600".to_string()),
        ("uid".to_string(), owner.0.to_string()),
        ("gid".to_string(), owner.1.to_string()),
    ])
}

/// Where the preview sockets of one daemon live, and whose they are.
#[derive(Debug, Clone)]
pub struct Upstreams {
    dir: PathBuf,
    owner: (u32, u32),
}

impl Upstreams {
    /// Sockets under `dir` (created 0700 on first use), owned by the daemon's own user.
    pub fn new(dir: PathBuf) -> Upstreams {
        let owner = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        Upstreams { dir, owner }
    }

    /// A connection to `port` inside `instance`, the project `uid`'s own container (the caller
    /// checked that): the preview device is added when the container lacks it (or has another
    /// one of that name), then its socket is connected.
    pub async fn connect(
        &self,
        runtime: &dyn Runtime,
        instance: &Instance,
        uid: &str,
        port: u16,
    ) -> Result<UnixStream, UpstreamError> {
        if instance.status != InstanceStatus::Running {
            return Err(UpstreamError::NotRunning(
                instance.status.as_str().to_string(),
            ));
        }
        let path = socket_path(&self.dir, uid, port);
        let socket_err = |source| UpstreamError::Socket {
            path: path.clone(),
            source,
        };
        if path.as_os_str().len() > SOCKET_PATH_MAX {
            return Err(socket_err(std::io::Error::other(format!(
                "longer than the {SOCKET_PATH_MAX} bytes a unix socket path may have; use a shorter dataDir"
            ))));
        }
        let want = device(&path, port, self.owner);
        let name = device_name(port);
        if instance.devices.get(&name) != Some(&want) {
            self.make_dir().map_err(socket_err)?;
            let patch = InstancePatch {
                config: BTreeMap::new(),
                devices: BTreeMap::from([(name, want)]),
            };
            runtime.patch_instance(&instance.name, &patch).await?;
            return wait_listening(&path).await.map_err(socket_err);
        }
        match UnixStream::connect(&path).await {
            Ok(stream) => Ok(stream),
            // LXD restarts the device's listener when the container starts: give it a moment.
            Err(_) => wait_listening(&path).await.map_err(socket_err),
        }
    }

    fn make_dir(&self) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
    }
}

/// Connects to `path` once LXD listens there, within [`LISTEN_DEADLINE`].
async fn wait_listening(path: &Path) -> std::io::Result<UnixStream> {
    let deadline = tokio::time::Instant::now() + LISTEN_DEADLINE;
    loop {
        match UnixStream::connect(path).await {
            Ok(stream) => return Ok(stream),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(LISTEN_POLL).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preview_is_a_proxy_from_a_host_socket_to_the_containers_loopback() {
        let path = socket_path(Path::new("/var/lib/berth/preview"), "u-1", 5173);
        assert_eq!(path, Path::new("/var/lib/berth/preview/u-1-5173.sock"));
        let d = device(&path, 5173, (0, 0));
        assert_eq!(d["type"], "proxy");
        assert_eq!(d["bind"], "host");
        assert_eq!(d["listen"], "unix:/var/lib/berth/preview/u-1-5173.sock");
        assert_eq!(d["connect"], "tcp:127.0.0.1:5173");
        assert_eq!(d["mode"], "0600");
        assert_eq!(device_name(5173), "berth-preview-5173");
    }
}
