//! berth: the daemon and its kubectl-like client.

pub mod api;
pub mod cli;
pub mod client;
pub mod config;
pub mod daemon;
pub mod store;
