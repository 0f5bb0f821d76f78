//! berth: the daemon and its kubectl-like client.

pub mod api;
pub mod auth;
pub mod cli;
pub mod client;
pub mod config;
pub mod daemon;
pub mod lxd;
pub mod runtime;
pub mod secrets;
pub mod store;
pub mod tools;
