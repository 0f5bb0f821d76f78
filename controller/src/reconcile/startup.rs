//! What `berth serve` does to start the controller: settings from the configuration and a
//! connection to LXD that waits for LXD to come up.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use berth_api::BerthDuration;
use tokio_util::sync::CancellationToken;

use super::ControllerSettings;
use crate::config::{Config, LxdConfig};
use crate::lxd::{Endpoint, LxdClient};
use crate::metrics::Metrics;
use crate::runtime::Runtime;

/// The controller's settings from berth.yaml (validated when it was loaded); a value that
/// does not parse names its key.
pub fn settings_from_config(config: &Config) -> Result<ControllerSettings, String> {
    let interval: BerthDuration = config
        .scheduler
        .interval
        .parse()
        .map_err(|e| format!("scheduler.interval: {e}"))?;
    let target = Some(config.lxd.target.trim().to_string()).filter(|t| !t.is_empty());
    Ok(ControllerSettings {
        storage_pool: config.lxd.storage_pool.clone(),
        // Known once LXD answers (`pool_enforces_sizes`); until then sizes are not promised.
        pool_enforces_quotas: false,
        target,
        workers: config.scheduler.workers.max(1) as usize,
        resync_interval: interval.as_std().max(Duration::from_secs(1)),
        held_recheck: config.scheduler.recheck(),
        trash: config.trash.settings(),
        default_image: config.defaults.image.clone(),
        ..ControllerSettings::default()
    })
}

/// Whether the storage pool of the durable volumes enforces sizes. An unreadable pool counts
/// as not enforcing: a size is then reported as `QuotaNotEnforced`, never promised.
pub async fn pool_enforces_sizes(runtime: &dyn Runtime, pool: &str) -> bool {
    match runtime.storage_pool(pool).await {
        Ok(found) => {
            tracing::info!(
                pool,
                driver = found.driver.as_str(),
                enforces_sizes = found.enforces_sizes(),
                "storage pool for durable volumes"
            );
            found.enforces_sizes()
        }
        Err(e) => {
            tracing::warn!(pool, error = %e, "cannot read the storage pool; sizes are not promised");
            false
        }
    }
}

/// Connects to LXD, retrying with backoff until it answers or `shutdown` fires. Every request
/// is reported to `metrics`.
pub async fn connect_runtime(
    lxd: &LxdConfig,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
) -> Option<Arc<dyn Runtime>> {
    let optional = |s: &str| Some(PathBuf::from(s)).filter(|p| !p.as_os_str().is_empty());
    let endpoint = match Endpoint::parse(
        &lxd.endpoint,
        optional(&lxd.client_cert),
        optional(&lxd.client_key),
        Some(lxd.server_fingerprint.as_str()),
    ) {
        Ok(endpoint) => endpoint,
        Err(e) => {
            tracing::error!(error = %e, "the controller cannot start");
            return None;
        }
    };
    let mut client_config = crate::lxd::LxdConfig::new(endpoint);
    client_config.project = lxd.project.clone();
    client_config.target = Some(lxd.target.trim().to_string()).filter(|t| !t.is_empty());
    client_config.observer = Some(metrics.clone());

    let mut delay = Duration::from_millis(500);
    loop {
        match LxdClient::connect(client_config.clone()).await {
            Ok(client) => {
                let server = client.server();
                tracing::info!(
                    endpoint = %client_config.endpoint.describe(),
                    version = server.version.as_str(),
                    "connected to LXD"
                );
                return Some(Arc::new(client));
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?delay, "LXD is not reachable");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}
