//! `berth.yaml`: the daemon's configuration. Every key has a default, so no file is needed; an
//! unknown key is an error naming the key and the file, because a typo must not be silently
//! ignored.
//!
//! Also the default socket path (`default_socket_path`) and `check_socket_dir`: a socket whose
//! directory is another user's, or writable by others, is refused by `berth serve` and the client
//! alike. `HELD_RECHECK`, the default `scheduler.recheckInterval`, lives here so that config
//! imports no controller module.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use berth_api::Defaults;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    /// SQLite database, secrets key, git source checkouts.
    pub data_dir: PathBuf,
    pub listen: ListenConfig,
    pub lxd: LxdConfig,
    /// What a new project gets when its manifest leaves a field out; resolved at admission,
    /// so changing these affects new projects only.
    pub defaults: Defaults,
    pub scheduler: SchedulerConfig,
    pub preview_domain: String,
    /// Host paths that `file://` repositories may name.
    pub allowed_file_roots: Vec<PathBuf>,
    /// Host addresses (`HOST:PORT`) besides loopback that `spec.forwards` may reach.
    pub allowed_forward_targets: Vec<String>,
    pub secrets: SecretsConfig,
    /// How long a deleted project's volumes are kept before housekeeping purges them.
    pub trash: TrashConfig,
    /// How long the events of a deleted or pruned object stay listed.
    pub events: EventsConfig,
    /// Serve the API and the store, but let the controller act on nothing.
    pub paused: bool,
    /// Containers of `defaults.image` kept ready for new projects to claim.
    pub pool: PoolConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: default_data_dir(),
            listen: ListenConfig::default(),
            lxd: LxdConfig::default(),
            defaults: Defaults::default(),
            scheduler: SchedulerConfig::default(),
            preview_domain: "localhost".to_string(),
            allowed_file_roots: Vec::new(),
            allowed_forward_targets: Vec::new(),
            secrets: SecretsConfig::default(),
            trash: TrashConfig::default(),
            events: EventsConfig::default(),
            paused: false,
            pool: PoolConfig::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ListenConfig {
    pub socket: PathBuf,
    /// TCP address for the API, e.g. `127.0.0.1:7480`; empty serves the unix socket only.
    pub http: String,
    pub tls: TlsConfig,
    /// The preview listener's TCP address (`<name>--<port>.<previewDomain>` routed to that
    /// port in the project's container, for members); empty disables it. HTTPS with
    /// `listen.tls`, and only then on a non-loopback address.
    pub preview: String,
    /// The most connections each listener (the unix socket, the TCP address) holds open at
    /// once; more are closed as soon as they are accepted.
    pub max_connections: usize,
}

/// The preview listener's address when the configuration says nothing.
pub const DEFAULT_PREVIEW_LISTEN: &str = "127.0.0.1:7481";

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            socket: default_socket_path(),
            http: String::new(),
            tls: TlsConfig::default(),
            preview: DEFAULT_PREVIEW_LISTEN.to_string(),
            max_connections: 512,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TlsConfig {
    pub cert: String,
    pub key: String,
}

impl TlsConfig {
    pub fn is_configured(&self) -> bool {
        !self.cert.is_empty() && !self.key.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LxdConfig {
    /// `unix:///path/to/unix.socket` or `https://host:8443`.
    pub endpoint: String,
    pub project: String,
    pub storage_pool: String,
    /// Cluster member or `@group`; empty lets LXD place instances.
    pub target: String,
    pub client_cert: String,
    pub client_key: String,
    /// sha256 of the server certificate; required for https endpoints.
    pub server_fingerprint: String,
}

impl Default for LxdConfig {
    fn default() -> Self {
        LxdConfig {
            endpoint: "unix:///var/lib/lxd/unix.socket".to_string(),
            project: "default".to_string(),
            storage_pool: "default".to_string(),
            target: String::new(),
            client_cert: String::new(),
            client_key: String::new(),
            server_fingerprint: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SchedulerConfig {
    pub interval: String,
    pub workers: u32,
    /// How often a held deletion, or a stopped project kept by what its last inspection found,
    /// is inspected again (a stopped one is booted for it).
    pub recheck_interval: String,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            interval: "30s".to_string(),
            workers: 8,
            recheck_interval: "3m".to_string(),
        }
    }
}

impl SchedulerConfig {
    /// `recheckInterval` as a duration (validated at load, so the default stands in otherwise).
    pub fn recheck(&self) -> std::time::Duration {
        self.recheck_interval
            .parse::<berth_api::BerthDuration>()
            .map(|d| d.as_std())
            .unwrap_or(HELD_RECHECK)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SecretsConfig {
    /// Also set single-line secrets as LXD `environment.KEY`, where LXD keeps them in plain
    /// text in its database (and `lxc config show` prints them). Off by default.
    pub mirror_to_lxd: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TrashConfig {
    /// `0s` disables the trash: a deletion deletes the volumes.
    pub retention: String,
}

impl Default for TrashConfig {
    fn default() -> Self {
        TrashConfig {
            retention: "7d".to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EventsConfig {
    /// How long the events of an object that went (deleted, pruned) stay listed (`berth events
    /// NAME`) before housekeeping prunes them; `0s` prunes them at the next pass.
    pub retention: String,
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            retention: "1h".to_string(),
        }
    }
}

/// The warm pool: `size` containers of `defaults.image`, booted once and stopped, holding no
/// project's data, which a new project claims instead of creating its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PoolConfig {
    pub size: u32,
}

/// The largest `pool.size`: every member is a container on the host, whatever claims it.
pub const MAX_POOL_SIZE: u32 = 64;

/// How long a gone object's events stay unless `events.retention` says otherwise.
pub const EVENT_RETENTION: std::time::Duration = std::time::Duration::from_secs(3600);

impl EventsConfig {
    /// `retention` as a duration (validated at load, so the default stands in otherwise).
    pub fn retention(&self) -> std::time::Duration {
        self.retention
            .parse::<berth_api::BerthDuration>()
            .map(|d| d.as_std())
            .unwrap_or(EVENT_RETENTION)
    }
}

/// The longest duration a setting may hold.
const MAX_DURATION_DAYS: u64 = 36_500;

/// How often a held deletion's workspace is inspected again unless `scheduler.recheckInterval`
/// says otherwise (its default, `3m`): booting a stopped container to look is not free, and
/// saved work does not need to be noticed within seconds.
pub const HELD_RECHECK: std::time::Duration = std::time::Duration::from_secs(180);

impl TrashConfig {
    /// The trash's settings (validated at load, so the default stands in otherwise).
    pub fn settings(&self) -> crate::trash::TrashSettings {
        crate::trash::TrashSettings {
            retention: self
                .retention
                .parse::<berth_api::BerthDuration>()
                .map(|d| d.as_std())
                .unwrap_or(crate::trash::DEFAULT_RETENTION),
        }
    }
}

impl Config {
    /// berth's agent socket (`<dataDir>/agent-api.sock`), which agents reach from inside
    /// their containers through a proxy device (capability `schedules`).
    pub fn agent_api_socket(&self) -> PathBuf {
        self.data_dir.join("agent-api.sock")
    }

    /// Reads `path` (no path: every default), then validates. There is no implicit system
    /// file: what a daemon runs with is what its command line says.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let config = match path {
            Some(path) => Self::read(path)?,
            None => Config::default(),
        };
        config.validate()?;
        Ok(config)
    }

    fn read(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Parses a `berth.yaml` text; an empty document is the default configuration.
    pub fn parse(text: &str) -> Result<Config, serde_yaml::Error> {
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        serde_yaml::from_str(text)
    }

    /// Refuses settings that would expose the fleet: an unauthenticated LXD server or a
    /// plain-text API off this host.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.lxd.endpoint.starts_with("https://") && self.lxd.server_fingerprint.is_empty() {
            return Err(invalid(
                "lxd.serverFingerprint",
                "required for an https endpoint (the sha256 of the server certificate)",
            ));
        }
        if !self.lxd.endpoint.starts_with("https://") && !self.lxd.endpoint.starts_with("unix://") {
            return Err(invalid(
                "lxd.endpoint",
                &format!(
                    "{:?} must start with unix:// or https://",
                    self.lxd.endpoint
                ),
            ));
        }
        for (i, target) in self.allowed_forward_targets.iter().enumerate() {
            if target.parse::<std::net::SocketAddr>().is_err() {
                return Err(invalid(
                    &format!("allowedForwardTargets[{i}]"),
                    &format!("{target:?} must be IP:PORT (IPv6 as [ADDR]:PORT)"),
                ));
            }
        }
        if self.listen.socket.as_os_str().is_empty() {
            return Err(invalid("listen.socket", "must not be empty"));
        }
        if self.listen.max_connections == 0 {
            return Err(invalid("listen.maxConnections", "must be at least 1"));
        }
        if self.listen.tls.cert.is_empty() != self.listen.tls.key.is_empty() {
            let missing = if self.listen.tls.cert.is_empty() {
                "cert"
            } else {
                "key"
            };
            return Err(invalid(
                &format!("listen.tls.{missing}"),
                "required when the other of listen.tls.cert and listen.tls.key is set",
            ));
        }
        if !self.listen.preview.is_empty() {
            let addr = parse_listen_addr(&self.listen.preview).ok_or_else(|| {
                invalid(
                    "listen.preview",
                    &format!(
                        "{:?} is not an address like 127.0.0.1:7481 (\"\" disables previews)",
                        self.listen.preview
                    ),
                )
            })?;
            if !addr.ip().is_loopback() && !self.listen.tls.is_configured() {
                return Err(invalid(
                    "listen.preview",
                    &format!(
                        "{addr} is not a loopback address; listen.tls.cert and listen.tls.key are required"
                    ),
                ));
            }
        }
        if !self.listen.http.is_empty() {
            let addr = parse_listen_addr(&self.listen.http).ok_or_else(|| {
                invalid(
                    "listen.http",
                    &format!(
                        "{:?} is not an address like 127.0.0.1:7480",
                        self.listen.http
                    ),
                )
            })?;
            if !addr.ip().is_loopback() && !self.listen.tls.is_configured() {
                return Err(invalid(
                    "listen.http",
                    &format!(
                        "{addr} is not a loopback address; listen.tls.cert and listen.tls.key are required"
                    ),
                ));
            }
        }
        if let Err(errors) = self.defaults.validate("defaults") {
            let first = errors.causes.first();
            return Err(ConfigError::Invalid {
                field: first.map(|c| c.field.clone()).unwrap_or_default(),
                message: first
                    .map(|c| c.message.clone())
                    .unwrap_or_else(|| errors.to_string()),
            });
        }
        if self.scheduler.workers == 0 {
            return Err(invalid("scheduler.workers", "must be at least 1"));
        }
        check_interval("scheduler.interval", &self.scheduler.interval)?;
        check_interval(
            "scheduler.recheckInterval",
            &self.scheduler.recheck_interval,
        )?;
        match self.trash.retention.parse::<berth_api::BerthDuration>() {
            Ok(d) if d.as_std().as_secs() > MAX_DURATION_DAYS * 86_400 => {
                return Err(invalid(
                    "trash.retention",
                    &format!(
                        "{:?} is longer than {MAX_DURATION_DAYS}d",
                        self.trash.retention
                    ),
                ));
            }
            Ok(_) => {}
            Err(e) => return Err(invalid("trash.retention", &e.to_string())),
        }
        match self.events.retention.parse::<berth_api::BerthDuration>() {
            Ok(d) => d.check_cap().map_err(|e| invalid("events.retention", &e))?,
            Err(e) => return Err(invalid("events.retention", &e.to_string())),
        }
        if self.pool.size > MAX_POOL_SIZE {
            return Err(invalid(
                "pool.size",
                &format!("{} is more than {MAX_POOL_SIZE}", self.pool.size),
            ));
        }
        Ok(())
    }

    /// `<dataDir>/berth.db`.
    pub fn database_path(&self) -> PathBuf {
        self.data_dir.join("berth.db")
    }

    /// `<dataDir>/berth.lock`: held by the one daemon serving this data directory.
    pub fn lock_path(&self) -> PathBuf {
        self.data_dir.join("berth.lock")
    }
}

/// A duration key: it parses, is longer than 0 and at most the cap every duration has (timers
/// and times computed from a longer one would overflow).
fn check_interval(field: &str, text: &str) -> Result<(), ConfigError> {
    match text.parse::<berth_api::BerthDuration>() {
        Ok(d) if d.is_zero() => Err(invalid(field, "must be longer than 0")),
        Ok(d) => d.check_cap().map_err(|e| invalid(field, &e)),
        Err(e) => Err(invalid(field, &e.to_string())),
    }
}

fn invalid(field: &str, message: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_string(),
        message: message.to_string(),
    }
}

fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// `/var/lib/berth` as root, else `$XDG_DATA_HOME/berth` or `~/.local/share/berth`.
pub fn default_data_dir() -> PathBuf {
    if running_as_root() {
        return PathBuf::from("/var/lib/berth");
    }
    if let Some(dir) = non_empty_env("XDG_DATA_HOME") {
        return PathBuf::from(dir).join("berth");
    }
    match non_empty_env("HOME") {
        Some(home) => PathBuf::from(home).join(".local/share/berth"),
        None => std::env::temp_dir().join(format!("berth-{}", nix::unistd::getuid())),
    }
}

/// `/run/berth/berth.sock` as root, else `$XDG_RUNTIME_DIR/berth/berth.sock` or
/// `/tmp/berth-<uid>/berth.sock`. The CLI uses it as its default `--server`.
pub fn default_socket_path() -> PathBuf {
    if running_as_root() {
        return PathBuf::from("/run/berth/berth.sock");
    }
    match non_empty_env("XDG_RUNTIME_DIR") {
        Some(dir) => PathBuf::from(dir).join("berth/berth.sock"),
        None => PathBuf::from(format!("/tmp/berth-{}/berth.sock", nix::unistd::getuid())),
    }
}

/// Refuses a unix socket whose directory another local user could have made or could change:
/// the directory must belong to this user (or root) and be writable by no one else. Whoever
/// controls it can put their own socket there, and a client would hand them its requests.
/// Both `berth serve` and the CLI ask before using a socket.
pub fn check_socket_dir(socket: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let dir = match socket.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let meta = match std::fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("socket directory {}: {e}", dir.display())),
    };
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!(
            "socket directory {} belongs to uid {}, not to you (uid {me}): another user may have \
             made it to catch berth's requests; remove it, or set XDG_RUNTIME_DIR",
            dir.display(),
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "socket directory {} is writable by others (mode {mode:04o}): anyone could swap the \
             socket; make it 0700 or 0755, or set XDG_RUNTIME_DIR",
            dir.display()
        ));
    }
    Ok(())
}

fn non_empty_env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// A TCP listen address: `IP:PORT`, or `localhost:PORT` for the IPv4 loopback. Other host
/// names are not resolved: what the daemon binds must be exactly what the operator wrote.
pub fn parse_listen_addr(text: &str) -> Option<SocketAddr> {
    if let Some(port) = text.strip_prefix("localhost:") {
        let port: u16 = port.parse().ok()?;
        return Some(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_default() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
        assert_eq!(Config::parse("{}\n").unwrap(), Config::default());
        // The settings built without a file (the controller's own defaults) say the same.
        assert_eq!(Config::default().scheduler.recheck(), super::HELD_RECHECK);
    }

    /// The example of DESIGN.md (Configuration), key for key: it parses, and it says what the
    /// defaults are.
    #[test]
    fn the_documented_file_parses_to_the_defaults() {
        let documented = r#"
dataDir: /var/lib/berth
listen:
  socket: /run/berth/berth.sock
  http: ""
  tls: {cert: "", key: ""}
  preview: 127.0.0.1:7481
lxd:
  endpoint: unix:///var/lib/lxd/unix.socket
  project: default
  storagePool: default
  target: ""
  clientCert: ""
  clientKey: ""
  serverFingerprint: ""
defaults:
  image: berth-base
  resources: {cpu: "2", memory: 4GiB}
  reap: {idleAfter: 8h, idleAction: Stop, maxAge: 30d}
scheduler: {interval: 30s, workers: 8}
previewDomain: localhost
allowedFileRoots: []
secrets: {mirrorToLxd: false}
"#;
        let parsed = Config::parse(documented).unwrap();
        parsed.validate().unwrap();
        let expected = Config {
            data_dir: PathBuf::from("/var/lib/berth"),
            listen: ListenConfig {
                socket: PathBuf::from("/run/berth/berth.sock"),
                ..ListenConfig::default()
            },
            ..Config::default()
        };
        assert_eq!(parsed, expected);
    }

    #[test]
    fn partial_file_keeps_other_defaults() {
        let config =
            Config::parse("listen:\n  http: 127.0.0.1:7480\nscheduler: {workers: 2}\n").unwrap();
        assert_eq!(config.listen.http, "127.0.0.1:7480");
        assert_eq!(config.listen.socket, default_socket_path());
        assert_eq!(config.scheduler.workers, 2);
        assert_eq!(config.scheduler.interval, "30s");
        assert_eq!(
            config.scheduler.recheck(),
            std::time::Duration::from_secs(180)
        );
        assert_eq!(config.defaults, Defaults::default());
        assert_eq!(config.events.retention(), EVENT_RETENTION);
        config.validate().unwrap();
        let config = Config::parse("events: {retention: 10m}\n").unwrap();
        config.validate().unwrap();
        assert_eq!(
            config.events.retention(),
            std::time::Duration::from_secs(600)
        );
    }

    #[test]
    fn protect_ignored_defaults_to_the_built_in_globs_or_what_the_file_says() {
        let builtin = Config::default().defaults.reap.protect_ignored;
        assert_eq!(
            builtin,
            Some(vec![".env*".into(), "*.db".into(), "*.sqlite*".into()])
        );
        let config = Config::parse("defaults: {reap: {protectIgnored: ['*.pem']}}").unwrap();
        config.validate().unwrap();
        assert_eq!(
            config.defaults.reap.protect_ignored,
            Some(vec!["*.pem".into()])
        );
        // Only that key given: the other reap defaults stay.
        assert_eq!(
            config.defaults.reap.idle_after,
            Config::default().defaults.reap.idle_after
        );
    }

    #[test]
    fn the_warm_pool_is_off_by_default_and_bounded() {
        assert_eq!(Config::default().pool.size, 0);
        let config = Config::parse("pool: {size: 3}\n").unwrap();
        config.validate().unwrap();
        assert_eq!(config.pool.size, 3);
        let err = Config::parse("pool: {size: 65}\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("pool.size"), "{err}");
        let err = Config::parse("pool: {sise: 2}\n").unwrap_err().to_string();
        assert!(err.contains("sise"), "{err}");
    }

    #[test]
    fn unknown_key_names_the_key_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("berth.yaml");
        std::fs::write(&path, "listen:\n  htp: 127.0.0.1:1\n").unwrap();
        let err = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("berth.yaml"), "{err}");
        assert!(err.contains("htp"), "{err}");
        assert!(err.contains("listen"), "{err}");
    }

    #[test]
    fn insecure_settings_are_refused() {
        let table = [
            (
                "lxd: {endpoint: 'https://lxd.example:8443'}",
                "lxd.serverFingerprint",
            ),
            ("listen: {http: '0.0.0.0:7480'}", "listen.http"),
            ("listen: {http: 'nonsense'}", "listen.http"),
            ("listen: {maxConnections: 0}", "listen.maxConnections"),
            ("listen: {preview: '0.0.0.0:7481'}", "listen.preview"),
            ("listen: {preview: 'nonsense'}", "listen.preview"),
            ("lxd: {endpoint: 'tcp://x'}", "lxd.endpoint"),
            ("scheduler: {workers: 0}", "scheduler.workers"),
            ("events: {retention: soon}", "events.retention"),
            (
                "scheduler: {recheckInterval: soon}",
                "scheduler.recheckInterval",
            ),
            (
                "scheduler: {recheckInterval: 0s}",
                "scheduler.recheckInterval",
            ),
            (
                "scheduler: {recheckInterval: 100000000d}",
                "scheduler.recheckInterval: \"100000000d\" is too long: at most 36500d",
            ),
            ("scheduler: {interval: soon}", "scheduler.interval"),
            ("scheduler: {interval: 0s}", "scheduler.interval"),
            (
                "scheduler: {interval: 36501d}",
                "scheduler.interval: \"36501d\" is too long: at most 36500d",
            ),
            (
                "defaults: {reap: {idleAfter: 100000000d}}",
                "defaults.reap.idleAfter: \"100000000d\" is too long: at most 36500d",
            ),
            ("listen: {tls: {cert: /c.pem}}", "listen.tls.key"),
            ("listen: {tls: {key: /k.pem}}", "listen.tls.cert"),
            ("trash: {retention: soon}", "trash.retention"),
            ("trash: {retention: 36501d}", "trash.retention"),
            (
                "defaults: {reap: {protectIgnored: ['*.db', '../x']}}",
                "defaults.reap.protectIgnored[1]",
            ),
        ];
        for (text, field) in table {
            let err = Config::parse(text).unwrap().validate().unwrap_err();
            assert!(err.to_string().starts_with(field), "{text}: {err}");
        }
        let err = Config::parse("defaults: {resources: {memory: 4gigs}}").unwrap_err();
        assert!(
            err.to_string().contains("defaults.resources.memory"),
            "{err}"
        );
        for (text, retention) in [
            ("", crate::trash::DEFAULT_RETENTION),
            ("trash: {retention: 0s}", std::time::Duration::ZERO),
            (
                "trash: {retention: 36500d}",
                std::time::Duration::from_secs(36_500 * 86_400),
            ),
        ] {
            let config = Config::parse(text).unwrap();
            config.validate().unwrap();
            assert_eq!(config.trash.settings().retention, retention, "{text}");
        }
        assert!(
            Config::parse("trash: {keep: 1d}").is_err(),
            "unknown keys are refused"
        );
        let ok = "lxd: {endpoint: 'https://lxd.example:8443', serverFingerprint: abc}\nlisten: {http: '[::1]:7480'}";
        Config::parse(ok).unwrap().validate().unwrap();
        Config::parse("listen: {http: 'localhost:7480'}")
            .unwrap()
            .validate()
            .unwrap();
        for (text, addr) in [
            ("localhost:7480", Some("127.0.0.1:7480")),
            ("127.0.0.2:1", Some("127.0.0.2:1")),
            ("[::1]:7480", Some("[::1]:7480")),
            ("localhost", None),
            ("localhost:http", None),
            ("example.com:7480", None),
        ] {
            assert_eq!(
                parse_listen_addr(text).map(|a| a.to_string()).as_deref(),
                addr,
                "{text}"
            );
        }
        // With a certificate and key, any address may be served.
        let tls = "listen: {http: '0.0.0.0:7480', tls: {cert: /etc/berth/tls.crt, key: /etc/berth/tls.key}}";
        Config::parse(tls).unwrap().validate().unwrap();
    }
}
