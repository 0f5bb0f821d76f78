//! The raw-LXD baselines of `scripts/bench-reconcile`, made from this one process straight over
//! LXD's unix socket with the HTTP client berth itself uses, at berth's concurrency. No process
//! start per call: this is the physical limit berth is judged against. Prints the seconds the
//! whole batch took; the caller removes what it created.
//!
//! - `create`: the minimal REST calls that give N projects what berth gives each on the way to
//!   Ready (create the workspace volume, create the container with the volume device, limits and
//!   labels, start it, run one exec).
//! - `delete`: what berth's deletion of each of them does to LXD, with nothing to keep it: stop
//!   the container (cleanly, as berth does, forced after 10 s), move it into the trash (its
//!   volume's disk detached and labels added in one update, then a rename) and move its volume
//!   into the trash (labels, then a rename). `delete-looking` does what berth's deletion does
//!   to look first: berth's inspection script run in the running container (its output
//!   recorded and read), one exec that ends the container's processes as a clean stop would
//!   (SIGTERM, then SIGSTOP for what is left) and the inspection again, and then it kills the
//!   container instead of stopping it cleanly, as berth does after those looks.
//!
//!   bench-raw-lxd create SOCKET POOL CONFIG_JSON PREFIX COUNT CONCURRENCY
//!   bench-raw-lxd delete|delete-looking SOCKET POOL PREFIX COUNT CONCURRENCY
//!
//! CONFIG_JSON is the container's `config` object (limits and labels) copied from berth's. The
//! containers `delete` takes are the ones `create` made with the same PREFIX and COUNT.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use berth::workspace::inspect::SCRIPT as INSPECT_SCRIPT;
use berth::workspace::look::QUIESCE_SCRIPT;
use futures::StreamExt;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(150);

/// How long a container gets to stop cleanly, as berth's deletion gives it.
const CLEAN_STOP_SECS: u64 = 10;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: bench-raw-lxd create SOCKET POOL CONFIG_JSON PREFIX COUNT CONCURRENCY\n\
                 \x20      bench-raw-lxd delete|delete-looking SOCKET POOL PREFIX COUNT CONCURRENCY";
    let (mode, socket, pool, prefix, count, concurrency) = match args.as_slice() {
        [mode, socket, pool, config, prefix, count, concurrency] if mode == "create" => {
            let config: Value = serde_json::from_str(config).context("CONFIG_JSON")?;
            (
                Mode::Create(config),
                socket,
                pool,
                prefix,
                count,
                concurrency,
            )
        }
        [mode, socket, pool, prefix, count, concurrency] if mode.starts_with("delete") => {
            let looking = match mode.as_str() {
                "delete" => false,
                "delete-looking" => true,
                _ => bail!("{usage}"),
            };
            (
                Mode::Delete { looking },
                socket,
                pool,
                prefix,
                count,
                concurrency,
            )
        }
        _ => bail!("{usage}"),
    };
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
        .map(|name| async {
            match &mode {
                Mode::Create(config) => lxd.project(pool, config, name).await,
                Mode::Delete { looking } => lxd.delete(pool, name, *looking).await,
            }
        })
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

enum Mode {
    Create(Value),
    Delete { looking: bool },
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

    /// One project's deletion: the container and its volume into the trash (renamed with a
    /// `-trash` suffix, so the caller's cleanup by prefix still finds them).
    async fn delete(&self, pool: &str, name: &str, looking: bool) -> anyhow::Result<()> {
        let volume = format!("{name}-workspace");
        if looking {
            self.look(name, &volume).await?;
            self.exec(name, &["sh", "-c", QUIESCE_SCRIPT, "quiesce", "30"])
                .await?;
            self.look(name, &volume).await?;
            self.async_call(
                reqwest::Method::PUT,
                &format!("/1.0/instances/{name}/state"),
                json!({"action": "stop", "force": true}),
            )
            .await
            .with_context(|| format!("{name}: kill"))?;
        } else {
            self.stop(name).await?;
        }
        let mut instance = self
            .get(&format!("/1.0/instances/{name}"))
            .await
            .with_context(|| format!("{name}: read"))?;
        let mut edit = json!({});
        for key in [
            "architecture",
            "config",
            "devices",
            "ephemeral",
            "profiles",
            "stateful",
            "description",
        ] {
            edit[key] = instance[key].take();
        }
        if let Some(devices) = edit["devices"].as_object_mut() {
            devices.remove("workspace");
        }
        edit["config"]["user.berth.trash.reason"] = json!("deleted");
        self.async_call(
            reqwest::Method::PUT,
            &format!("/1.0/instances/{name}"),
            edit,
        )
        .await
        .with_context(|| format!("{name}: label and detach"))?;
        // LXD 5.0 under load now and then fails a rename right after a stop ("file exists" on
        // the instance's log directory); berth's reconcile tries again, and so does this.
        let mut attempt = 1;
        loop {
            let renamed = self
                .async_call(
                    reqwest::Method::POST,
                    &format!("/1.0/instances/{name}"),
                    json!({"name": format!("{name}-trash")}),
                )
                .await;
            match renamed {
                Ok(()) => break,
                // A failed operation may have renamed it all the same.
                Err(_)
                    if self
                        .get(&format!("/1.0/instances/{name}-trash"))
                        .await
                        .is_ok() =>
                {
                    break;
                }
                Err(_) if attempt < 5 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e.context(format!("{name}: rename into the trash"))),
            }
        }
        let path = format!("/1.0/storage-pools/{pool}/volumes/custom/{volume}");
        self.call(
            reqwest::Method::PATCH,
            &path,
            json!({"config": {"user.berth.trash.reason": "deleted"}}),
        )
        .await
        .with_context(|| format!("{volume}: label"))?;
        let renamed = self
            .call(
                reqwest::Method::POST,
                &path,
                json!({"name": format!("{volume}-trash")}),
            )
            .await
            .with_context(|| format!("{volume}: rename into the trash"))?;
        // LXD 5.0 renames a custom volume synchronously; a later one may answer with an
        // operation.
        if renamed["type"] == "async" {
            self.wait(&renamed).await?;
        }
        Ok(())
    }

    /// A clean stop, forced when it does not end in time (as berth stops).
    async fn stop(&self, name: &str) -> anyhow::Result<()> {
        let path = format!("/1.0/instances/{name}/state");
        let clean = self
            .async_call(
                reqwest::Method::PUT,
                &path,
                json!({"action": "stop", "timeout": CLEAN_STOP_SECS, "force": false}),
            )
            .await;
        if clean.is_err() {
            self.async_call(
                reqwest::Method::PUT,
                &path,
                json!({"action": "stop", "force": true}),
            )
            .await
            .with_context(|| format!("{name}: force stop"))?;
        }
        Ok(())
    }

    /// One exec of `command`, waited for.
    async fn exec(&self, name: &str, command: &[&str]) -> anyhow::Result<()> {
        self.async_call(
            reqwest::Method::POST,
            &format!("/1.0/instances/{name}/exec"),
            json!({"command": command, "environment": {}, "record-output": false,
                   "wait-for-websocket": false, "interactive": false}),
        )
        .await
        .with_context(|| format!("{name}: exec"))
    }

    /// One look at the workspace as berth's deletion takes it: berth's inspection script run
    /// with LXD recording its output, which is then read and deleted.
    async fn look(&self, name: &str, volume: &str) -> anyhow::Result<()> {
        let reply = self
            .call(
                reqwest::Method::POST,
                &format!("/1.0/instances/{name}/exec"),
                json!({"command": ["/bin/sh", "-c", INSPECT_SCRIPT],
                       "environment": {"BERTH_VOLUME": volume, "LC_ALL": "C",
                                       "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
                       "record-output": true, "wait-for-websocket": false, "interactive": false}),
            )
            .await
            .with_context(|| format!("{name}: look"))?;
        let done = self.wait_for(&reply).await?;
        let logs = done["metadata"]["output"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for path in logs.values().filter_map(Value::as_str) {
            let log = format!("http://lxd{path}");
            self.http.get(&log).send().await?.bytes().await?;
            self.http.delete(&log).send().await?;
        }
        Ok(())
    }

    /// A request LXD answers with an operation, and the wait for it.
    async fn async_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Value,
    ) -> anyhow::Result<()> {
        let reply = self.call(method, path, body).await?;
        self.wait(&reply).await
    }

    /// A GET's metadata.
    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let reply = self.http.get(format!("http://lxd{path}")).send().await?;
        let status = reply.status();
        let mut envelope: Value = reply.json().await?;
        if !status.is_success() || envelope["type"] == "error" {
            bail!("LXD answered {status}: {}", envelope["error"]);
        }
        Ok(envelope["metadata"].take())
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
        self.wait_for(reply).await.map(drop)
    }

    /// [`Self::wait`], answering the operation as it ended.
    async fn wait_for(&self, reply: &Value) -> anyhow::Result<Value> {
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
            Some("Success") => Ok(waited["metadata"].clone()),
            other => bail!(
                "{operation} ended {}: {}",
                other.unwrap_or("without a status"),
                waited["metadata"]["err"]
            ),
        }
    }
}
