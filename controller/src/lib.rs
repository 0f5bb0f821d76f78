//! berth: the daemon and its kubectl-like client.

pub mod agent;
pub mod api;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod lxd;
pub mod runtime;
pub mod store;
