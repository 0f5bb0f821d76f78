//! What the reconciler needs from a container runtime, in LXD's terms: instances, operations,
//! exec, files, custom storage volumes, images and the event stream.
//!
//! The trait knows LXD concepts (an instance, a `user.*` config key, a storage pool) but nothing
//! about berth projects. `crate::lxd::LxdClient` implements it against a real daemon;
//! `crate::testing::fake_runtime::FakeRuntime` implements it in memory with fault injection for
//! unit tests, benchmarks and scale simulation.
//!
//! The errors are typed, `Busy` among them, classified by the LXD client: nothing else reads
//! LXD's wording. Calls are chosen by what they cost LXD: a project's volumes are found by name
//! (`volumes_named`), since a volume listing with `recursion=1` makes LXD work out every volume's
//! users over every instance, and the resync lists instances without state.

mod error;
mod types;

use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use futures::Stream;

pub use error::RuntimeError;
pub use types::*;

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// Lifecycle and operation events as they arrive; the stream ends when the connection drops and
/// the caller reconnects (and resyncs, since events may have been missed meanwhile).
pub type EventStream = Pin<Box<dyn Stream<Item = Result<RuntimeEvent>> + Send>>;

/// A mutation applied to an instance's config, devices and profiles by [`Runtime::update_instance`].
/// It may run more than once: when someone else changed the instance in between, the update is
/// re-read and the closure applied again.
pub type InstanceEditFn<'a> = &'a (dyn Fn(&mut InstanceEdit) + Send + Sync);

/// A container runtime, used as `Arc<dyn Runtime>`.
///
/// Every method has a deadline: calls that take a `timeout` give up with
/// [`RuntimeError::Timeout`] after it, the others after the client's per-request timeout.
#[async_trait]
pub trait Runtime: Send + Sync {
    /// Version, API extensions and cluster members, as read when the client connected
    /// (members are re-read on every call).
    async fn server_info(&self) -> Result<ServerInfo>;

    /// The memory and CPU threads of the host that answers (`/1.0/resources`).
    async fn host_capacity(&self) -> Result<HostCapacity>;

    /// All instances in one call, with state when `with_state` (running ones only carry it).
    /// With a `config_prefix`, only instances that have a config key starting with it
    /// (for example `user.berth.`) are returned.
    async fn list_instances(
        &self,
        config_prefix: Option<&str>,
        with_state: bool,
    ) -> Result<Vec<Instance>>;

    /// The names of all instances, without reading any of them: LXD answers this from its
    /// database alone, where a listing with config loads every instance.
    async fn instance_names(&self) -> Result<Vec<String>>;

    /// One instance with its state, or `None` when it does not exist.
    async fn get_instance(&self, name: &str) -> Result<Option<Instance>>;

    /// One instance without its state (so without its pid), or `None` when it does not exist:
    /// LXD gathers a running container's state from the container itself, which costs it
    /// several times the read of the instance's record.
    async fn get_instance_record(&self, name: &str) -> Result<Option<Instance>>;

    /// Submits the creation of a (stopped) instance. Idempotent: when an instance of that name
    /// exists it is returned as [`Created::Exists`] and nothing is submitted; the caller decides
    /// whether it is its own (by its config labels). With `known_absent` the existence is not
    /// looked up: an existing instance then fails the operation
    /// ([`RuntimeError::is_already_exists`]).
    async fn create_instance(&self, request: &CreateInstance) -> Result<Created>;

    /// Waits for a submitted operation. A failed operation is [`RuntimeError::OperationFailed`]
    /// with LXD's message; one that no longer exists (finished long ago, or the daemon restarted)
    /// is [`RuntimeError::OperationVanished`]: judge the outcome by the instance's state.
    async fn wait_operation(&self, operation: &str, timeout: Duration) -> Result<Operation>;

    /// Starts a stopped instance; starting a running one succeeds without doing anything.
    async fn start_instance(&self, name: &str, timeout: Duration) -> Result<()>;

    /// Asks the instance to shut down cleanly, waiting up to `stop.clean_timeout`; when it has not
    /// stopped by then and `stop.force_after` is set, kills it. Stopping a stopped instance
    /// succeeds without doing anything.
    async fn stop_instance(&self, name: &str, stop: StopOptions) -> Result<()>;

    /// Restarts a running instance; `force` kills it instead of asking (for a wedged container).
    async fn restart_instance(&self, name: &str, force: bool, timeout: Duration) -> Result<()>;

    /// Deletes a stopped instance; deleting a missing one succeeds.
    async fn delete_instance(&self, name: &str, timeout: Duration) -> Result<()>;

    /// Renames a stopped instance (LXD refuses a running one). Renaming to the name it already
    /// has succeeds; a missing instance is [`RuntimeError::NotFound`].
    async fn rename_instance(&self, name: &str, new_name: &str, timeout: Duration) -> Result<()>;

    /// Merges config keys and devices into the instance (a key set to "" is removed).
    async fn patch_instance(&self, name: &str, patch: &InstancePatch) -> Result<()>;

    /// Reads the instance, applies `edit`, and writes it back only if nobody changed it meanwhile
    /// (retrying on a concurrent change). Needed to remove devices, which a merge cannot do.
    async fn update_instance(&self, name: &str, edit: InstanceEditFn<'_>) -> Result<()>;

    /// Restarts every network interface (`nic` device) of the instance, its own and those its
    /// profiles give it, with the configuration it has: the host side is made again and what
    /// the device configures inside (its name, MAC address, MTU, and the addresses of the NIC
    /// types whose addresses LXD sets) is applied again, the MAC address kept. Answers the
    /// interfaces' names inside the instance, empty when it has none.
    async fn restart_nics(&self, name: &str) -> Result<Vec<String>>;

    /// Runs a command to completion (stdin at end of file) and returns its exit code and
    /// output. Past `timeout` it returns [`RuntimeError::Timeout`]; the process may still be
    /// running inside (LXD cannot cancel an exec), so run long commands in their own process
    /// group. Past `request.max_output` bytes on either stream it returns
    /// [`RuntimeError::TooLarge`] with the exit code and the output up to the cap: a command
    /// that goes on printing is stopped there (its next write fails), and nothing past the cap
    /// is ever held by the daemon or written on the host.
    async fn exec(&self, name: &str, request: &ExecRequest) -> Result<ExecOutput>;

    /// Starts a command whose stdin, stdout and stderr stay connected to the caller (one pseudo
    /// terminal for all three when `terminal` is given). `request.timeout` bounds only the start;
    /// the session lasts until the process exits.
    async fn exec_interactive(
        &self,
        name: &str,
        request: &ExecRequest,
        terminal: Option<TerminalSize>,
    ) -> Result<InteractiveExec>;

    /// Writes a whole file (also on a stopped instance), replacing any previous content.
    async fn file_write(&self, name: &str, file: &FileWrite) -> Result<()>;

    /// Reads a whole file of at most `max_bytes` ([`RuntimeError::TooLarge`] past it: the file
    /// is not read further); [`RuntimeError::NotFound`] when it does not exist.
    async fn file_read(&self, name: &str, path: &str, max_bytes: u64) -> Result<Vec<u8>>;

    /// Creates one directory (not its parents); an existing one is left as it is.
    async fn mkdir(&self, name: &str, dir: &Mkdir) -> Result<()>;

    /// Deletes a file or an empty directory; a missing one succeeds.
    async fn file_delete(&self, name: &str, path: &str) -> Result<()>;

    /// A storage pool's name and driver; [`RuntimeError::NotFound`] when there is none.
    async fn storage_pool(&self, pool: &str) -> Result<StoragePool>;

    /// The bytes a storage pool uses and has ([`PoolSpace`]); an error when there is no such
    /// pool (LXD 5.0 answers that one with a 500).
    async fn storage_pool_space(&self, pool: &str) -> Result<PoolSpace>;

    /// Creates a custom storage volume; an existing one of that name is returned unchanged.
    async fn create_volume(&self, request: &CreateVolume) -> Result<Volume>;

    /// Copies custom volume `source` of `request.pool` (on `request.target`) to a new volume
    /// `request.name` on the same member, labelled with `request.config`. A taken name is
    /// [`RuntimeError::Conflict`]; the source may be in use.
    async fn copy_volume(&self, source: &str, request: &CreateVolume) -> Result<Volume>;

    /// One custom volume, or `None`.
    async fn get_volume(
        &self,
        pool: &str,
        name: &str,
        target: Option<&str>,
    ) -> Result<Option<Volume>>;

    /// The custom volumes of a pool whose name starts with `name_prefix`, each read by name.
    /// Cheaper than [`Runtime::list_volumes`] when few match: LXD lists names alone quickly, but
    /// a full listing works out every volume's users across every instance.
    async fn volumes_named(&self, pool: &str, name_prefix: &str) -> Result<Vec<Volume>>;

    /// Custom volumes of a pool in one call, optionally only those with a config key starting
    /// with `config_prefix`.
    async fn list_volumes(&self, pool: &str, config_prefix: Option<&str>) -> Result<Vec<Volume>>;

    /// Deletes a custom volume; a missing one succeeds, one in use is [`RuntimeError::Rejected`].
    async fn delete_volume(&self, pool: &str, name: &str, target: Option<&str>) -> Result<()>;

    /// Renames a custom volume. A missing one is [`RuntimeError::NotFound`], a taken new name
    /// [`RuntimeError::Conflict`]; a volume in use cannot be renamed.
    async fn rename_volume(
        &self,
        pool: &str,
        name: &str,
        new_name: &str,
        target: Option<&str>,
    ) -> Result<()>;

    /// Merges config keys into a custom volume's config (a key set to "" is removed).
    async fn patch_volume(
        &self,
        pool: &str,
        name: &str,
        config: &std::collections::BTreeMap<String, String>,
        target: Option<&str>,
    ) -> Result<()>;

    /// The bytes a custom volume uses, or `None` where the pool cannot tell (LXD 5.0's `dir`
    /// driver answers "Not supported").
    async fn volume_usage(
        &self,
        pool: &str,
        name: &str,
        target: Option<&str>,
    ) -> Result<Option<u64>>;

    /// The fingerprint an image alias or fingerprint (prefix) names, or `None` if no such image.
    async fn resolve_image(&self, image: &ImageSource) -> Result<Option<String>>;

    /// The size LXD gives for the image `fingerprint` (its compressed files), or `None` when
    /// there is no such image.
    async fn image_size(&self, fingerprint: &str) -> Result<Option<u64>>;

    /// The last `max_bytes` of the instance's console log (its init's output).
    async fn console_log_tail(&self, name: &str, max_bytes: usize) -> Result<String>;

    /// Subscribes to lifecycle and operation events of every client.
    async fn events(&self) -> Result<EventStream>;

    /// Asks to be told (on [`Runtime::file_notices`]) when a file in the directory `dir` of the
    /// running `instance` is written or moved into place, and says what it did: see [`Watch`].
    /// Cheap once watching; the watch ends by itself when the directory goes away (the
    /// instance deleted, or its tmpfs unmounted by a stop or restart), and the next call
    /// starts a new one.
    async fn watch_files(&self, instance: &str, dir: &str) -> Result<Watch>;

    /// The instances whose watched directory saw a write, as they happen. A notice is only a
    /// trigger: what changed is read through the runtime as before. A lagged receiver missed
    /// some and should look at every instance it cares about.
    fn file_notices(&self) -> tokio::sync::broadcast::Receiver<String>;
}

/// What [`Runtime::watch_files`] did.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// A new watch: writes from now on are noticed, but the directory may have changed before,
    /// unseen, so the caller reads what it watches once.
    Started,
    /// The watch asked for before is still in place: no write since then went unnoticed.
    Already,
    /// This runtime cannot watch the directory (a remote LXD, a cluster member other than this
    /// host, no inotify, the instance not running, no such directory yet): the caller polls.
    Unavailable,
}

/// The size of a terminal, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminalSize {
    pub width: u16,
    pub height: u16,
}

/// What the holder of an [`InteractiveExec`] sends to the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecInput {
    /// Bytes for the process's stdin (its terminal, with one).
    Data(Vec<u8>),
    /// Stdin has ended: the process reads end of file (without a terminal).
    Eof,
    /// The caller's terminal changed size.
    Resize(TerminalSize),
}

/// Bytes the process wrote: `fd` 1 for stdout, 2 for stderr (a terminal is all 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecChunk {
    pub fd: u8,
    pub data: Vec<u8>,
}

/// A running interactive command. Dropping `input` is not end of file (send
/// [`ExecInput::Eof`]); `output` ends when the process's streams close, and `exit` then carries
/// its exit code.
pub struct InteractiveExec {
    pub input: tokio::sync::mpsc::Sender<ExecInput>,
    pub output: tokio::sync::mpsc::Receiver<ExecChunk>,
    pub exit: tokio::sync::oneshot::Receiver<Result<i32>>,
}

impl std::fmt::Debug for InteractiveExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InteractiveExec").finish_non_exhaustive()
    }
}
