//! Benchmark of berth's LXD client against raw `curl` over the same unix socket: create, start,
//! exec, stop and delete of N `berth-tiny` containers, the two interleaved container by
//! container so load from elsewhere on the machine hits both alike. Prints per-phase totals and
//! the client/raw ratio. Run with `scripts/bench-lxd [N]`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use berth::lxd::{Endpoint, LxdClient, LxdConfig};
use berth::runtime::{CreateInstance, Created, ExecRequest, ImageSource, Runtime, StopOptions};
use serde_json::{Value, json};

#[path = "bench-reconcile.d/table.rs"]
mod table;

const PHASES: [&str; 5] = ["create", "start", "exec", "stop", "delete"];
const IMAGE: &str = "berth-tiny";
const TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count: usize = match std::env::args().nth(1) {
        Some(n) => n.parse().context("N must be a number of containers")?,
        None => 20,
    };
    let Endpoint::Unix(socket) = Endpoint::local() else {
        bail!("the benchmark runs against the local unix socket");
    };
    let mut config = LxdConfig::new(Endpoint::Unix(socket.clone()));
    config.request_timeout = TIMEOUT;
    let client = LxdClient::connect(config)
        .await
        .with_context(|| format!("LXD at {}; run scripts/setup-lxd", socket.display()))?;
    let raw = Curl { socket };
    let run_id = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
    let result = measure(&client, &raw, &run_id, count).await;
    // Whatever failed, leave no container of this run behind.
    let prefix = format!("berth-b-{run_id}-");
    for instance in client.list_instances(None, false).await.unwrap_or_default() {
        if instance.name.starts_with(&prefix) {
            let stop = StopOptions::clean_then_force(Duration::ZERO);
            let _ = client.stop_instance(&instance.name, stop).await;
            let _ = client.delete_instance(&instance.name, TIMEOUT).await;
        }
    }
    result
}

async fn measure(client: &LxdClient, raw: &Curl, run_id: &str, count: usize) -> anyhow::Result<()> {
    // One untimed round of each warms caches (image unpack paths, connection pool).
    run_client(client, &format!("berth-b-{run_id}-cw")).await?;
    run_raw(raw, &format!("berth-b-{run_id}-rw")).await?;

    let mut client_totals = [Duration::ZERO; 5];
    let mut raw_totals = [Duration::ZERO; 5];
    for i in 0..count {
        let c = run_client(client, &format!("berth-b-{run_id}-c{i}")).await?;
        let r = run_raw(raw, &format!("berth-b-{run_id}-r{i}")).await?;
        for p in 0..5 {
            client_totals[p] += c[p];
            raw_totals[p] += r[p];
        }
    }

    println!("LXD client vs raw curl, {count} berth-tiny containers (totals, ms)");
    println!(
        "{:<8} {:>10} {:>10} {:>7}",
        "phase", "client", "raw", "ratio"
    );
    for (p, phase) in PHASES.iter().enumerate() {
        row(phase, client_totals[p], raw_totals[p]);
    }
    let (c, r) = (
        client_totals.iter().sum::<Duration>(),
        raw_totals.iter().sum::<Duration>(),
    );
    row("total", c, r);
    let overhead = (c.as_secs_f64() / r.as_secs_f64() - 1.0) * 100.0;
    println!("client overhead over raw LXD: {overhead:+.1}% (target <= 5%)");
    table::row(
        &format!("LXD client vs curl, {count} containers' calls"),
        &format!("{:.0} ms", c.as_secs_f64() * 1e3),
        &format!("{:.0} ms", r.as_secs_f64() * 1e3),
        &format!("{:.3}x", c.as_secs_f64() / r.as_secs_f64()),
        "<= 1.05x",
        if overhead <= 5.0 { "ok" } else { "SLOW" },
    );
    Ok(())
}

fn row(phase: &str, client: Duration, raw: Duration) {
    println!(
        "{:<8} {:>10.1} {:>10.1} {:>7.3}",
        phase,
        client.as_secs_f64() * 1e3,
        raw.as_secs_f64() * 1e3,
        client.as_secs_f64() / raw.as_secs_f64()
    );
}

async fn run_client(client: &LxdClient, name: &str) -> anyhow::Result<[Duration; 5]> {
    let mut times = [Duration::ZERO; 5];
    let t = Instant::now();
    let request = CreateInstance {
        name: name.to_string(),
        image: ImageSource::Alias(IMAGE.into()),
        config: Default::default(),
        devices: Default::default(),
        profiles: Vec::new(),
        target: None,
        known_absent: false,
    };
    match client.create_instance(&request).await? {
        Created::Submitted { operation } => {
            client.wait_operation(&operation, TIMEOUT).await?;
        }
        Created::Exists(_) => bail!("{name} already exists"),
    }
    times[0] = t.elapsed();
    let t = Instant::now();
    client.start_instance(name, TIMEOUT).await?;
    times[1] = t.elapsed();
    let t = Instant::now();
    let out = client
        .exec(name, &ExecRequest::new(["echo", "hello"], TIMEOUT))
        .await?;
    anyhow::ensure!(
        out.stdout == b"hello\n",
        "exec output {:?}",
        out.stdout_str()
    );
    times[2] = t.elapsed();
    let t = Instant::now();
    client
        .stop_instance(name, StopOptions::clean_then_force(Duration::from_secs(30)))
        .await?;
    times[3] = t.elapsed();
    let t = Instant::now();
    client.delete_instance(name, TIMEOUT).await?;
    times[4] = t.elapsed();
    Ok(times)
}

/// The same sequence as plain HTTP requests made by `curl`, one process per request.
struct Curl {
    socket: PathBuf,
}

impl Curl {
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Vec<u8>> {
        let mut cmd = tokio::process::Command::new("curl");
        cmd.arg("-sS")
            .arg("--unix-socket")
            .arg(&self.socket)
            .args(["-X", method]);
        if let Some(body) = body {
            cmd.args([
                "-H",
                "Content-Type: application/json",
                "-d",
                &body.to_string(),
            ]);
        }
        cmd.arg(format!("http://lxd{path}"));
        let out = cmd.output().await.context("run curl")?;
        anyhow::ensure!(
            out.status.success(),
            "curl {method} {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(out.stdout)
    }

    async fn json(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let bytes = self.call(method, path, body).await?;
        let value: Value = serde_json::from_slice(&bytes)?;
        if value["type"] == "error" {
            bail!("{method} {path}: {}", value["error"]);
        }
        Ok(value)
    }

    /// Submits an async request and waits for its operation; returns the operation.
    async fn run(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let submitted = self.json(method, path, body).await?;
        let operation = submitted["operation"]
            .as_str()
            .context("no operation")?
            .to_string();
        let done = self
            .json("GET", &format!("{operation}/wait?timeout=120"), None)
            .await?;
        if done["metadata"]["status"] != "Success" {
            bail!("{method} {path}: {}", done["metadata"]["err"]);
        }
        Ok(done["metadata"].clone())
    }
}

async fn run_raw(raw: &Curl, name: &str) -> anyhow::Result<[Duration; 5]> {
    let mut times = [Duration::ZERO; 5];
    let instance = format!("/1.0/instances/{name}");
    let t = Instant::now();
    raw.run(
        "POST",
        "/1.0/instances",
        Some(
            json!({"name": name, "type": "container", "source": {"type": "image", "alias": IMAGE}}),
        ),
    )
    .await?;
    times[0] = t.elapsed();
    let t = Instant::now();
    raw.run(
        "PUT",
        &format!("{instance}/state"),
        Some(json!({"action": "start", "timeout": 120})),
    )
    .await?;
    times[1] = t.elapsed();
    let t = Instant::now();
    let op = raw
        .run(
            "POST",
            &format!("{instance}/exec"),
            Some(
                json!({"command": ["echo", "hello"], "environment": {}, "wait-for-websocket": false,
                "interactive": false, "record-output": true}),
            ),
        )
        .await?;
    let stdout_log = op["metadata"]["output"]["1"]
        .as_str()
        .context("stdout log")?
        .to_string();
    let stderr_log = op["metadata"]["output"]["2"]
        .as_str()
        .context("stderr log")?
        .to_string();
    let stdout = raw.call("GET", &stdout_log, None).await?;
    raw.call("GET", &stderr_log, None).await?;
    raw.call("DELETE", &stdout_log, None).await?;
    raw.call("DELETE", &stderr_log, None).await?;
    anyhow::ensure!(stdout == b"hello\n", "raw exec output {stdout:?}");
    times[2] = t.elapsed();
    let t = Instant::now();
    raw.run(
        "PUT",
        &format!("{instance}/state"),
        Some(json!({"action": "stop", "timeout": 30, "force": false})),
    )
    .await?;
    times[3] = t.elapsed();
    let t = Instant::now();
    raw.run("DELETE", &instance, None).await?;
    times[4] = t.elapsed();
    Ok(times)
}
