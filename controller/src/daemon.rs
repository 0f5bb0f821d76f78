//! `berth serve`: loads the configuration, takes the data directory's lock, opens the store,
//! serves the API and runs the controller until SIGTERM or SIGINT.
//!
//! Every shared part (the store, secrets, metrics, the runtime handle, the activity log, the
//! inspector, the tools, the trash) is built once here, top-down, and handed to what uses it at
//! construction; nothing is wired afterwards.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use nix::fcntl::{Flock, FlockArg};
use tokio_util::sync::CancellationToken;

use crate::api::{self, Admission, ApiState, Listeners};
use crate::config::Config;
use crate::runtime_handle::RuntimeHandle;
use crate::secrets::Secrets;
use crate::store::Store;

/// How long the scheduler's activity pass waits for one workspace's inspection.
const SCHEDULER_INSPECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What the command line may override in the configuration file.
#[derive(Debug, Clone, Default)]
pub struct DaemonOptions {
    pub config_path: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    pub listen: Option<String>,
    pub preview: Option<String>,
    pub paused: bool,
    pub log_format: String,
}

/// The configuration file with the flags laid over it, validated.
pub fn effective_config(opts: &DaemonOptions) -> anyhow::Result<Config> {
    let mut config = Config::load(opts.config_path.as_deref())?;
    if let Some(dir) = &opts.data_dir {
        config.data_dir = dir.clone();
    }
    if let Some(socket) = &opts.socket {
        config.listen.socket = socket.clone();
    }
    if let Some(listen) = &opts.listen {
        config.listen.http = listen.clone();
    }
    if let Some(preview) = &opts.preview {
        config.listen.preview = preview.clone();
    }
    config.paused |= opts.paused;
    config.validate()?;
    Ok(config)
}

pub fn run(opts: DaemonOptions) -> anyhow::Result<()> {
    init_logging(&opts.log_format)?;
    let config = effective_config(&opts)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("berth")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(config))
}

fn init_logging(format: &str) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let (filter, refused) = match std::env::var("BERTH_LOG") {
        Ok(spec) if !spec.trim().is_empty() => match EnvFilter::try_new(&spec) {
            Ok(filter) => (filter, None),
            Err(e) => (
                EnvFilter::new("info"),
                Some(format!(
                    "BERTH_LOG={spec:?} is not a log filter ({e}); logging at info"
                )),
            ),
        },
        _ => (EnvFilter::new("info"), None),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let result = match format {
        "text" => builder.try_init(),
        "json" => builder.json().try_init(),
        other => anyhow::bail!("--log-format: {other:?} is not text or json"),
    };
    // Already initialised (e.g. by an embedding test): keep that subscriber.
    let _ = result;
    if let Some(message) = refused {
        tracing::warn!("{message}");
    }
    Ok(())
}

/// Holds `<dataDir>/berth.lock` for the daemon's lifetime: one daemon per data directory.
fn lock_data_dir(config: &Config) -> anyhow::Result<Flock<std::fs::File>> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&config.data_dir)
        .with_context(|| format!("creating dataDir {}", config.data_dir.display()))?;
    let path = config.lock_path();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        if errno == nix::errno::Errno::EWOULDBLOCK {
            anyhow::anyhow!(
                "{}: another berth serve is already using the data directory {}",
                path.display(),
                config.data_dir.display()
            )
        } else {
            anyhow::anyhow!("{}: cannot take the lock: {errno}", path.display())
        }
    })
}

/// File descriptors kept for the store, LXD, git and the like beside API connections.
const RESERVED_FDS: u64 = 256;

/// Raises the soft limit on open files to the hard one, and warns when the two listeners' full
/// `listen.maxConnections` could still exhaust it: connections past the cap are closed at once,
/// but those under it hold a descriptor each, and running out fails LXD calls too.
fn raise_fd_limit(max_connections: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    let soft = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    };
    let needed = 2 * max_connections as u64 + RESERVED_FDS;
    if soft < needed {
        tracing::warn!(
            limit = soft,
            needed,
            "the open-file limit is below what listen.maxConnections needs; lower it or raise the limit"
        );
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let _lock = lock_data_dir(&config)?;
    raise_fd_limit(config.listen.max_connections);
    let db_path = config.database_path();
    let store = Store::open(&db_path)
        .with_context(|| format!("opening the store {}", db_path.display()))?;
    let store = Arc::new(store);
    tracing::info!(
        resource_version = store.resource_version(),
        database = %db_path.display(),
        controller = store.controller_id(),
        "store open"
    );

    let secrets = Arc::new(Secrets::open(Arc::clone(&store), &config.data_dir)?);

    // One certificate for both TCP listeners (the API and previews), read when either is on.
    let tls_acceptor = match (config.listen.http.as_str(), config.listen.preview.as_str()) {
        ("", "") => None,
        _ if config.listen.tls.is_configured() => Some(api::tls_acceptor(
            Path::new(&config.listen.tls.cert),
            Path::new(&config.listen.tls.key),
        )?),
        _ => None,
    };
    let tls = tls_acceptor
        .clone()
        .filter(|_| !config.listen.http.is_empty());
    let listeners = Listeners {
        unix: api::bind_unix(&config.listen.socket).await?,
        unix_path: config.listen.socket.clone(),
        tcp: match config.listen.http.as_str() {
            "" => None,
            addr => Some(api::bind_tcp(addr, tls.is_some()).await?),
        },
        tls,
        max_connections: config.listen.max_connections,
        metrics: None,
    };
    if let Some(tcp) = &listeners.tcp {
        // The bound address, so `--listen 127.0.0.1:0` can be found.
        let addr = tcp
            .local_addr()
            .context("reading the TCP listener's address")?;
        tracing::info!(%addr, tls = listeners.tls.is_some(), "serving the API over TCP");
    }

    // Bound before the controller starts, which gives containers a way to it.
    let agent_listener = api::bind_unix(&config.agent_api_socket()).await?;

    // Bound before the controller starts: `status.ports` carries the listener's port.
    let preview_tls = tls_acceptor.filter(|_| !config.listen.preview.is_empty());
    let preview_listener = match config.listen.preview.as_str() {
        "" => None,
        addr => Some(api::bind_preview(addr, preview_tls.is_some()).await?),
    };
    let preview_port = match &preview_listener {
        Some(listener) => {
            let addr = listener
                .local_addr()
                .context("reading the preview listener's address")?;
            tracing::info!(%addr, tls = preview_tls.is_some(), domain = %config.preview_domain, "serving previews");
            Some(addr.port())
        }
        None => None,
    };
    let previews = Arc::new(crate::preview::Previews {
        site: crate::preview::PreviewSite::new(
            &config.preview_domain,
            preview_tls.is_some(),
            preview_port,
        ),
        listening: preview_listener.is_some(),
        tickets: Default::default(),
        upstreams: crate::preview::upstream::Upstreams::new(config.data_dir.join("preview")),
    });

    let shutdown = CancellationToken::new();
    let readiness = ControllerReadiness::default();
    // One registry for the whole daemon: the controller feeds it, `/metrics` encodes it.
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let listeners = Listeners {
        metrics: Some(Arc::clone(&metrics)),
        ..listeners
    };
    // Projects are counted by phase from the first scrape (also while paused), not only after
    // the controller's first resync.
    crate::reconcile::triggers::count_phases(&store, &metrics);
    // The one LXD connection, shared by the controller, the API's container routes and the
    // tools; connected when the controller starts or on the first tool call.
    let lxd = Arc::new(RuntimeHandle::lxd(lxd_client_config(
        &config.lxd,
        &metrics,
    )?));
    let activity = Arc::new(crate::activity_log::ActivityLog::default());
    // A paused daemon reaches into no container: its inspector has no runtime.
    let inspector = Arc::new(crate::inspect::Inspector::new(
        config.lxd.endpoint.clone(),
        store.controller_id(),
        (!config.paused).then(|| Arc::clone(&lxd)),
        Arc::clone(&activity),
    ));
    let trash = Arc::new(
        crate::trash::Trash::new(
            Arc::clone(&store),
            config.lxd.storage_pool.clone(),
            config.trash.settings(),
        )
        .with_metrics(Arc::clone(&metrics)),
    );
    // Built here, not in the controller: the API shows it also while the controller is
    // paused or not yet connected.
    let warm_pool = Arc::new(crate::reconcile::pool::WarmPool::new(
        &config.defaults.image,
        config.pool.size as usize,
    ));
    warm_pool.expose(&metrics);
    let controller = start_controller(
        &config,
        &warm_pool,
        &store,
        &secrets,
        &metrics,
        &lxd,
        &activity,
        &trash,
        &shutdown,
        &readiness,
        previews.site.clone(),
    );

    let started = Arc::clone(&readiness.started);
    let scheduler_health = Arc::clone(&readiness.scheduler);
    let admission = Admission::new(config.defaults.clone());
    if !config.paused {
        tokio::spawn(read_host_capacity(
            Arc::clone(&lxd),
            admission.host_slot(),
            shutdown.clone(),
        ));
    }
    let state = ApiState::new(
        Arc::clone(&store),
        Arc::clone(&secrets),
        admission,
        shutdown.clone(),
    )
    .with_allowed_file_roots(config.allowed_file_roots.clone())
    .with_allowed_forward_targets(config.allowed_forward_targets.clone())
    .with_metrics({
        let metrics = Arc::clone(&metrics);
        Arc::new(move || metrics.encode())
    })
    .with_inspector(Arc::clone(&inspector))
    .with_trash(trash)
    .with_pool(warm_pool)
    .with_previews(previews)
    .with_readiness_check(
        "controller",
        Arc::new(move || {
            if started.load(Ordering::Relaxed) {
                Ok(())
            } else {
                Err("not started".to_string())
            }
        }),
    )
    .with_readiness_check("scheduler", Arc::new(move || scheduler_health.check()));
    let state = state.with_tools(Arc::new(crate::tools::Tools::new(
        Arc::clone(&store),
        Arc::clone(&secrets),
        Arc::clone(&lxd),
    )));
    // A paused daemon never connects to LXD, so LXD's reachability says nothing about it.
    let state = if config.paused {
        state
    } else {
        let _probe = inspector.spawn_probe(shutdown.clone());
        let inspector = Arc::clone(&inspector);
        state.with_readiness_check("lxd", Arc::new(move || inspector.reachability()))
    };
    // The console's cookies are `Secure` where the TCP listener speaks HTTPS.
    let state = if listeners.tls.is_some() {
        state.with_console_over_tls()
    } else {
        state
    };
    let state = Arc::new(state);
    let preview_server = preview_listener.map(|listener| {
        tokio::spawn(api::serve_previews(
            Arc::clone(&state),
            listener,
            preview_tls,
            config.listen.max_connections,
            Some(Arc::clone(&metrics)),
        ))
    });
    let agent_server = tokio::spawn(api::agent_api::serve_agent_api(
        Arc::clone(&state),
        agent_listener,
        config.listen.max_connections,
        Some(Arc::clone(&metrics)),
    ));
    let server = tokio::spawn(api::serve(state, listeners));
    tracing::info!(
        socket = %config.listen.socket.display(),
        http = %config.listen.http,
        preview = %config.listen.preview,
        tls = config.listen.tls.is_configured(),
        paused = config.paused,
        "berth is serving"
    );

    wait_for_signal().await?;
    tracing::info!("shutting down");
    shutdown.cancel();
    if let Some(controller) = controller {
        let _ = controller.await;
    }
    server.await.context("the API server stopped abnormally")?;
    if let Some(preview_server) = preview_server {
        let _ = preview_server.await;
    }
    let _ = agent_server.await;
    let _ = std::fs::remove_file(config.agent_api_socket());
    drop(store);
    tracing::info!("stopped");
    Ok(())
}

/// What `/readyz` reads of the controller: whether it started, and how its scheduler fares.
#[derive(Default)]
struct ControllerReadiness {
    started: Arc<AtomicBool>,
    scheduler: Arc<crate::scheduler::Health>,
}

/// Where the controller starts. With `paused` it does not: the API and the store are served,
/// nothing in the fleet is touched. Marks `readiness.started` once the controller runs.
#[allow(clippy::too_many_arguments)] // the daemon's shared parts, each handed on once
fn start_controller(
    config: &Config,
    warm_pool: &Arc<crate::reconcile::pool::WarmPool>,
    store: &Arc<Store>,
    secrets: &Arc<Secrets>,
    metrics: &Arc<crate::metrics::Metrics>,
    lxd: &Arc<RuntimeHandle>,
    activity: &Arc<crate::activity_log::ActivityLog>,
    trash: &Arc<crate::trash::Trash>,
    shutdown: &CancellationToken,
    readiness: &ControllerReadiness,
    preview_site: crate::preview::PreviewSite,
) -> Option<tokio::task::JoinHandle<()>> {
    if config.paused {
        tracing::info!("paused: the controller acts on nothing");
        // A paused daemon is ready by design: there is no controller to wait for.
        readiness.started.store(true, Ordering::Relaxed);
        return None;
    }
    // GitSources are applied whether or not LXD answers: they only write desired state.
    let gitops = crate::gitops::spawn(
        Arc::clone(store),
        Arc::clone(secrets),
        crate::admission::Admission::new(config.defaults.clone())
            .with_forward_targets(config.allowed_forward_targets.clone())
            .with_file_roots(config.allowed_file_roots.clone()),
        config.data_dir.clone(),
        shutdown.clone(),
    );
    let metrics = Arc::clone(metrics);
    let settings = match crate::reconcile::settings_from_config(config) {
        Ok(settings) => crate::reconcile::ControllerSettings {
            pool: Arc::clone(warm_pool),
            ..settings
        },
        Err(e) => {
            tracing::error!(error = %e, "the controller cannot start");
            return Some(gitops);
        }
    };
    let lxd = Arc::clone(lxd);
    let event_retention = config.events.retention();
    let pass_settings = crate::scheduler::passes::PassSettings {
        workers: config.scheduler.workers.max(1) as usize,
        inspect_timeout: SCHEDULER_INSPECT_TIMEOUT,
        preview_site,
        recheck_interval: config.scheduler.recheck(),
    };
    let store = Arc::clone(store);
    let secrets = Arc::clone(secrets);
    let agent_settings = crate::reconcile::AgentSettings {
        mirror_secrets_to_lxd: config.secrets.mirror_to_lxd,
        file_roots: crate::file_roots::FileRoots::new(config.allowed_file_roots.clone()),
        storage_pool: config.lxd.storage_pool.clone(),
        ..crate::reconcile::AgentSettings::default()
    };
    let shutdown = shutdown.clone();
    let started = Arc::clone(&readiness.started);
    let activity = Arc::clone(activity);
    let trash = Arc::clone(trash);
    let scheduler_health = Arc::clone(&readiness.scheduler);
    Some(tokio::spawn(async move {
        if let Some(runtime) = crate::reconcile::connect_runtime(&lxd, &shutdown).await {
            let mut settings = settings;
            settings.pool_enforces_quotas =
                crate::reconcile::pool_enforces_sizes(&*runtime, &settings.storage_pool).await;
            let agent_steps = Arc::new(crate::reconcile::AgentSteps::new(
                Arc::clone(&store),
                secrets,
                Arc::clone(&runtime),
                agent_settings,
            ));
            let interval = settings.resync_interval;
            let controller = crate::reconcile::spawn_controller(
                Arc::clone(&store),
                Arc::clone(&runtime),
                Arc::clone(&metrics),
                settings,
                agent_steps.clone(),
                shutdown.child_token(),
            );
            let agent_watch =
                agent_steps.spawn_watch(controller.queue.clone(), shutdown.child_token());
            let passes = crate::scheduler::passes::DaemonPasses::new(
                store,
                runtime,
                controller.queue.clone(),
                metrics,
                activity,
                pass_settings,
            )
            .with_trash(trash)
            .with_event_retention(event_retention)
            .with_settle(interval)
            .with_resync(controller.resync());
            let scheduler = tokio::spawn(crate::scheduler::run(
                Arc::new(passes),
                interval,
                shutdown.child_token(),
                scheduler_health,
            ));
            started.store(true, Ordering::Relaxed);
            tracing::info!("controller started");
            shutdown.cancelled().await;
            // The running pass finishes first: a reap half done is worse than a late exit.
            let _ = scheduler.await;
            controller.shutdown().await;
            let _ = agent_watch.await;
        }
        if let Err(e) = gitops.await {
            tracing::error!(error = %e, "the GitSource controller ended abnormally");
        }
    }))
}

/// The LXD client settings of the `lxd:` configuration, every request reported to `metrics`.
fn lxd_client_config(
    settings: &crate::config::LxdConfig,
    metrics: &Arc<crate::metrics::Metrics>,
) -> anyhow::Result<crate::lxd::LxdConfig> {
    let path = |s: &str| (!s.is_empty()).then(|| PathBuf::from(s));
    let endpoint = crate::lxd::Endpoint::parse(
        &settings.endpoint,
        path(&settings.client_cert),
        path(&settings.client_key),
        Some(settings.server_fingerprint.as_str()),
    )?;
    let mut config = crate::lxd::LxdConfig::new(endpoint);
    config.project = settings.project.clone();
    // No default target: the controller places each project on a member itself
    // (`reconcile::placement`) and names it in every call that creates something.
    config.observer = Some(Arc::clone(metrics) as Arc<dyn crate::lxd::RequestObserver>);
    Ok(config)
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// Reads the host's capacity for admission's warnings once LXD answers; until then, and if it
/// never does, admission warns of nothing.
async fn read_host_capacity(
    lxd: Arc<RuntimeHandle>,
    slot: api::admission::HostSlot,
    shutdown: CancellationToken,
) {
    const TRY_EVERY: std::time::Duration = std::time::Duration::from_secs(30);
    loop {
        let read = async { lxd.connect().await?.host_capacity().await };
        match tokio::time::timeout(TRY_EVERY, read).await {
            Ok(Ok(host)) => {
                tracing::debug!(
                    memory_bytes = host.memory_bytes,
                    cpus = host.cpus,
                    "host capacity"
                );
                *slot
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(host);
                return;
            }
            Ok(Err(err)) => tracing::debug!(error = %err, "cannot read the host's capacity yet"),
            Err(_) => tracing::debug!("reading the host's capacity timed out"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(TRY_EVERY) => {}
        }
    }
}
