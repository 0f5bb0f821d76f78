//! What `berth serve` does to start the controller: settings from the configuration and a
//! connection to LXD that waits for LXD to come up.

use std::sync::Arc;
use std::time::Duration;

use berth_api::BerthDuration;
use tokio_util::sync::CancellationToken;

use super::ControllerSettings;
use crate::config::Config;
use crate::runtime::Runtime;
use crate::runtime_handle::RuntimeHandle;

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
        agent_api_socket: Some(config.agent_api_socket()),
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

/// Connects the daemon's runtime handle to LXD, retrying with backoff until it answers or
/// `shutdown` fires.
pub async fn connect_runtime(
    lxd: &RuntimeHandle,
    shutdown: &CancellationToken,
) -> Option<Arc<dyn Runtime>> {
    let mut delay = Duration::from_millis(500);
    loop {
        match lxd.connect().await {
            Ok(runtime) => return Some(runtime),
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
