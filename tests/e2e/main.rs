//! The end-to-end tests: one binary, one module per area. Each drives the real `berth` binary
//! (or the LXD client) against the real LXD daemon, real git repositories and real SQLite.
//! `support` starts daemons (`support::daemon`, the one launcher), runs the `berth` client
//! against them (`support::cli`) and waits on conditions; `harness` applies and watches projects;
//! `ops` holds what the operations tests share.

mod harness;
mod ops;
mod support;

mod access_admission;
mod access_browser;
mod access_cli;
mod access_limits;
mod access_matrix;
mod access_reach;
mod access_tls;
mod agent_browser;
mod agent_manifests;
mod agent_provisioning;
mod agent_skills;
mod agents_real;
mod api_daemon;
mod api_resources;
mod apply_fleet;
mod cli_commands;
mod cluster_fleet;
mod console_access;
mod console_browser;
mod deb_package;
mod deletion_held;
mod gitops_credentials;
mod gitops_sync;
mod helm_chart;
mod ide;
mod input_limits;
mod inspect_hidden_work;
mod lxd_cluster;
mod lxd_recovery;
mod lxd_runtime;
mod mcp_bridge;
mod monitoring_rules;
mod network_repair;
mod ops_exec_limits;
mod ops_exec_tty;
mod ops_logs;
mod ops_metrics;
mod ops_readiness;
mod ops_runtime;
mod pipeline_agent;
mod preview_urls;
mod provider_homes;
mod readme_walkthrough;
mod reap_scheduler;
mod reconcile_crash;
mod reconcile_lifecycle;
mod replace_trash;
mod restore_admission;
mod scheduler_inspect;
mod schedules;
mod secrets_at_rest;
mod tools_workspace;
mod trash_clock_store;
mod trash_restore;
mod warm_pool;
mod workspace_bytes;
