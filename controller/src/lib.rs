//! berth: the daemon and its kubectl-like client.

pub mod api;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod lxd;
pub mod metrics;
pub mod reconcile;
pub mod runtime;
pub mod store;
