//! The daemon's one connection to LXD, made once in `daemon.rs` and shared by everything that
//! reaches LXD: the controller and scheduler, the API's container routes and the workspace
//! tools. One client, so every request is counted in `berth_lxd_requests_total`.
//!
//! A daemon starts while LXD is down: the handle connects on first use (a tool call) or when
//! the controller starts (which retries until LXD answers), whichever comes first, and keeps
//! that client.

use std::sync::Arc;

use tokio::sync::OnceCell;

use crate::lxd::{LxdClient, LxdConfig};
use crate::runtime::{Runtime, RuntimeError};

pub struct RuntimeHandle {
    /// How to connect; `None` for a handle made with its runtime.
    config: Option<LxdConfig>,
    runtime: OnceCell<Arc<dyn Runtime>>,
}

impl std::fmt::Debug for RuntimeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeHandle")
            .field("config", &self.config)
            .field("connected", &self.runtime.initialized())
            .finish()
    }
}

impl RuntimeHandle {
    /// Connects to LXD with `config` (its observer included) when first asked.
    pub fn lxd(config: LxdConfig) -> RuntimeHandle {
        RuntimeHandle {
            config: Some(config),
            runtime: OnceCell::new(),
        }
    }

    /// A handle already connected to `runtime` (a fake in tests).
    pub fn ready(runtime: Arc<dyn Runtime>) -> RuntimeHandle {
        RuntimeHandle {
            config: None,
            runtime: OnceCell::new_with(Some(runtime)),
        }
    }

    /// The runtime, if connected; never waits.
    pub fn get(&self) -> Option<Arc<dyn Runtime>> {
        self.runtime.get().cloned()
    }

    /// The runtime, connecting first if no one has yet (one attempt; callers retry).
    pub async fn connect(&self) -> Result<Arc<dyn Runtime>, RuntimeError> {
        self.runtime
            .get_or_try_init(|| async {
                let config = self.config.clone().ok_or_else(|| {
                    RuntimeError::Config("this runtime handle has no LXD to connect to".into())
                })?;
                let client = LxdClient::connect(config.clone()).await?;
                tracing::info!(
                    endpoint = %config.endpoint.describe(),
                    version = client.server().version.as_str(),
                    "connected to LXD"
                );
                Ok(Arc::new(client) as Arc<dyn Runtime>)
            })
            .await
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ready_handle_hands_out_its_runtime() {
        let fake: Arc<dyn Runtime> = Arc::new(crate::testing::fake_runtime::FakeRuntime::new());
        let handle = RuntimeHandle::ready(Arc::clone(&fake));
        assert!(Arc::ptr_eq(&handle.get().unwrap(), &fake));
        assert!(Arc::ptr_eq(&handle.connect().await.unwrap(), &fake));
    }

    #[tokio::test]
    async fn an_unreachable_lxd_is_not_connected_and_is_tried_again() {
        let endpoint = crate::lxd::Endpoint::Unix("/nonexistent/berth-test.socket".into());
        let handle = RuntimeHandle::lxd(LxdConfig::new(endpoint));
        assert!(handle.connect().await.is_err());
        assert!(handle.get().is_none());
        assert!(handle.connect().await.is_err());
    }
}
