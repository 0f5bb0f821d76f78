//! The raw-LXD baseline of `scripts/bench-reconcile`: the minimal REST calls that give N
//! projects what berth gives each on the way to Ready (create the workspace volume, create the
//! container with the volume device, limits and labels, start it, run one exec), made from this
//! one process straight over LXD's unix socket with the HTTP client berth itself uses, at
//! berth's concurrency. No process start per call: this is the physical limit berth is judged
//! against. Prints the seconds the whole batch took; the caller removes what it created.
//!
//!   bench-raw-lxd SOCKET POOL CONFIG_JSON PREFIX COUNT CONCURRENCY
//!
//! CONFIG_JSON is the container's `config` object (limits and labels) copied from berth's.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(150);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [socket, pool, config, prefix, count, concurrency] = args.as_slice() else {
        bail!("usage: bench-raw-lxd SOCKET POOL CONFIG_JSON PREFIX COUNT CONCURRENCY");
    };
    let config: Value = serde_json::from_str(config).context("CONFIG_JSON")?;
    let count: usize = count.parse().context("COUNT")?;
    let concurrency: usize = concurrency.parse().context("CONCURRENCY")?;
    // As berth's LXD transport builds it: LXD 5.0 wedges on idle pooled unix connections.
    let http = reqwest::Client::builder()
        .unix_socket(std::path::PathBuf::from(socket))
        .pool_max_idle_per_host(0)
        .http1_only()
        .timeout(TIMEOUT)
        .build()?;
    let lxd = Lxd { http };
    let names: Vec<String> = (1..=count).map(|i| format!("{prefix}{i:03}")).collect();
    let started = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(&names)
        .map(|name| lxd.project(pool, &config, name))
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let took = started.elapsed();
    for result in results {
        result?;
    }
    println!("{:.3}", took.as_secs_f64());
    Ok(())
}

struct Lxd {
    http: reqwest::Client,
}

impl Lxd {
    /// One project's calls, each async one judged by its operation.
    async fn project(&self, pool: &str, config: &Value, name: &str) -> anyhow::Result<()> {
        let volume = format!("{name}-workspace");
        let labels: serde_json::Map<String, Value> = config
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.starts_with("user."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.call(
            reqwest::Method::POST,
            &format!("/1.0/storage-pools/{pool}/volumes/custom"),
            json!({"name": volume, "type": "custom", "content_type": "filesystem",
                   "config": labels}),
        )
        .await
        .with_context(|| format!("{name}: create volume"))?;
        let created = self
            .call(
                reqwest::Method::POST,
                "/1.0/instances",
                json!({"name": name, "type": "container",
                       "source": {"type": "image", "alias": "berth-tiny"}, "config": config,
                       "devices": {"workspace": {"type": "disk", "pool": pool, "source": volume,
                                                 "path": "/workspace"}}}),
            )
            .await
            .with_context(|| format!("{name}: create container"))?;
        self.wait(&created)
            .await
            .with_context(|| format!("{name}: create container"))?;
        let started = self
            .call(
                reqwest::Method::PUT,
                &format!("/1.0/instances/{name}/state"),
                json!({"action": "start", "timeout": 60}),
            )
            .await
            .with_context(|| format!("{name}: start"))?;
        self.wait(&started)
            .await
            .with_context(|| format!("{name}: start"))?;
        let exec = self
            .call(
                reqwest::Method::POST,
                &format!("/1.0/instances/{name}/exec"),
                json!({"command": ["true"], "environment": {}, "record-output": false,
                       "wait-for-websocket": false, "interactive": false}),
            )
            .await
            .with_context(|| format!("{name}: exec"))?;
        self.wait(&exec)
            .await
            .with_context(|| format!("{name}: exec"))
    }

    /// One request; its envelope when LXD accepted it.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Value,
    ) -> anyhow::Result<Value> {
        let reply = self
            .http
            .request(method, format!("http://lxd{path}"))
            .json(&body)
            .send()
            .await?;
        let status = reply.status();
        let envelope: Value = reply.json().await?;
        if !status.is_success() || envelope["type"] == "error" {
            bail!("LXD answered {status}: {}", envelope["error"]);
        }
        Ok(envelope)
    }

    /// Waits for the operation an async reply names; fails unless it succeeded.
    async fn wait(&self, reply: &Value) -> anyhow::Result<()> {
        let Some(operation) = reply["operation"].as_str() else {
            bail!("no operation in {reply}");
        };
        let waited: Value = self
            .http
            .get(format!("http://lxd{operation}/wait?timeout=120"))
            .send()
            .await?
            .json()
            .await?;
        match waited["metadata"]["status"].as_str() {
            Some("Success") => Ok(()),
            other => bail!(
                "{operation} ended {}: {}",
                other.unwrap_or("without a status"),
                waited["metadata"]["err"]
            ),
        }
    }
}
