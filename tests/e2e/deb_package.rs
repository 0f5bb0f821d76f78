//! The Debian package, installed the way an operator installs it: `scripts/build-deb` builds
//! it, dpkg installs it in a clean `berth-base` container (no NIC, no systemd), the installed
//! `berth serve` runs there and the installed CLI reaches it; `apt-get remove` keeps
//! /var/lib/berth, a purge keeps it by default and removes it when debconf's answer says so.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::lxd::{self, BASE, Cleanup, OP_TIMEOUT};
use berth::runtime::{ExecOutput, ExecRequest, FileWrite, Runtime};

/// dpkg and apt on a busy two-core machine.
const PACKAGE_TIMEOUT: Duration = Duration::from_secs(300);

/// Builds the package (the binary the test suite runs, in the package `make deb` makes) and
/// returns its path.
fn build_package() -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/build-deb");
    let out = Command::new("bash")
        .args([script, "--test-build"])
        .output()
        .expect("run scripts/build-deb");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scripts/build-deb --test-build failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = PathBuf::from(stdout.lines().last().expect("the package's path").trim());
    let file_name = path.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        file_name.starts_with(&format!("berth_{}_", env!("CARGO_PKG_VERSION")))
            && file_name.ends_with(".deb"),
        "{path:?}"
    );
    path
}

struct Box_ {
    lxd: std::sync::Arc<berth::lxd::LxdClient>,
    name: String,
}

impl Box_ {
    async fn sh(&self, script: &str) -> ExecOutput {
        let mut request = ExecRequest::new(["sh", "-c", script], PACKAGE_TIMEOUT);
        request
            .env
            .insert("DEBIAN_FRONTEND".into(), "noninteractive".into());
        request.env.insert(
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        );
        self.lxd.exec(&self.name, &request).await.expect("exec")
    }

    /// Runs `script` and fails the test, with its output, unless it exits 0.
    async fn ok(&self, script: &str) -> String {
        let out = self.sh(script).await;
        assert!(
            out.success(),
            "`{script}` exited {}:\n{}\n{}",
            out.exit_code,
            out.stdout_str(),
            out.stderr_str()
        );
        out.stdout_str()
    }

    async fn exists(&self, path: &str) -> bool {
        self.sh(&format!("test -e {path}")).await.success()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_package_installs_serves_and_keeps_the_data_unless_told() {
    let package = build_package();
    let content = std::fs::read(&package).expect("read the package");

    let lxd = lxd::client().await;
    let name = lxd::unique_name();
    let mut cleanup = Cleanup::new();
    cleanup.instance(&name);
    lxd::create(&lxd, &lxd::request(&name, BASE)).await;
    lxd.start_instance(&name, OP_TIMEOUT).await.expect("start");
    let host = Box_ {
        lxd: lxd.clone(),
        name: name.clone(),
    };

    // Pushed with LXD's file API: the container has no network to fetch anything.
    lxd.file_write(
        &name,
        &FileWrite {
            path: "/root/berth.deb".into(),
            content,
            uid: 0,
            gid: 0,
            mode: 0o644,
        },
    )
    .await
    .expect("push the package");
    host.ok("dpkg -i /root/berth.deb").await;

    // What the package installs.
    for path in [
        "/usr/bin/berth",
        "/usr/lib/systemd/system/berth.service",
        "/usr/share/man/man1/berth.1.gz",
        "/usr/share/bash-completion/completions/berth",
        "/usr/share/zsh/vendor-completions/_berth",
        "/usr/share/fish/vendor_completions.d/berth.fish",
    ] {
        assert!(host.exists(path).await, "{path} is not installed");
    }
    let depends = host.ok("dpkg-query -W -f='${Depends}' berth").await;
    assert_eq!(depends, "git, libc6 (>= 2.34)");
    let conffiles = host.ok("dpkg-query -W -f='${Conffiles}' berth").await;
    assert!(conffiles.contains("/etc/berth/berth.yaml"), "{conffiles}");
    let unit = host.ok("cat /usr/lib/systemd/system/berth.service").await;
    assert!(
        unit.contains("ExecStart=/usr/bin/berth serve --config /etc/berth/berth.yaml"),
        "{unit}"
    );
    let man = host.ok("gzip -dc /usr/share/man/man1/berth.1.gz").await;
    assert!(
        man.contains(".TH berth 1") && man.contains("berth\\-apply"),
        "{man}"
    );
    let completion = host
        .ok("cat /usr/share/bash-completion/completions/berth")
        .await;
    assert!(completion.contains("complete -F _berth"), "{completion}");
    let questions = host.ok("debconf-show berth").await;
    assert!(questions.contains("berth/purge-data"), "{questions}");
    assert_eq!(
        host.ok("stat -c %a /var/lib/berth").await.trim(),
        "700",
        "the data directory is the daemon's alone"
    );

    // The installed daemon with the installed configuration, reached by the installed CLI on
    // its default socket. There is no systemd here (nor LXD): the API serves the store anyway.
    host.ok(
        "setsid berth serve --config /etc/berth/berth.yaml >/var/log/berth.log 2>&1 </dev/null & \
         echo $! >/root/berth.pid",
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = host.sh("berth get projects").await;
        if out.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "berth get projects never reached the installed daemon:\n{}\n{}\n--- log ---\n{}",
            out.stdout_str(),
            out.stderr_str(),
            host.sh("cat /var/log/berth.log").await.stdout_str()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    host.ok(
        "printf 'apiVersion: berth.dev/v1alpha1\\nkind: Project\\nmetadata: {name: kept}\\n\
         spec: {image: berth-base}\\n' | berth apply -f -",
    )
    .await;
    let listed = host.ok("berth get projects").await;
    assert!(listed.contains("kept"), "{listed}");
    assert!(host.exists("/var/lib/berth/berth.db").await);
    // Stopped by the pid it was started with; then it is gone.
    host.ok("kill $(cat /root/berth.pid)").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while host.sh("kill -0 $(cat /root/berth.pid)").await.success() {
        assert!(
            Instant::now() < deadline,
            "the daemon did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // remove: the program goes, the data and the configuration stay.
    host.ok("apt-get remove -y berth").await;
    assert!(!host.exists("/usr/bin/berth").await);
    assert!(host.exists("/var/lib/berth/berth.db").await);
    assert!(host.exists("/etc/berth/berth.yaml").await);

    // purge without an answer: the configuration goes, the data stays (debconf's default).
    host.ok("dpkg --purge berth").await;
    assert!(!host.exists("/etc/berth/berth.yaml").await);
    assert!(
        host.exists("/var/lib/berth/berth.db").await,
        "a purge nobody answered removed the data"
    );

    // Installed again, the store is the one kept: the project is still there.
    host.ok("dpkg -i /root/berth.deb").await;
    host.ok(
        "setsid berth serve --config /etc/berth/berth.yaml >/var/log/berth.log 2>&1 </dev/null & \
         echo $! >/root/berth.pid",
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = host.sh("berth get projects").await;
        if out.success() {
            assert!(out.stdout_str().contains("kept"), "{}", out.stdout_str());
            break;
        }
        assert!(Instant::now() < deadline, "{}", out.stderr_str());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    host.ok("kill $(cat /root/berth.pid)").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while host.sh("kill -0 $(cat /root/berth.pid)").await.success() {
        assert!(
            Instant::now() < deadline,
            "the daemon did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // purge answered yes through debconf: the data goes too.
    host.ok("echo 'berth berth/purge-data boolean true' | debconf-set-selections")
        .await;
    host.ok("dpkg --purge berth").await;
    assert!(
        !host.exists("/var/lib/berth").await,
        "purge answered yes kept the data"
    );
    assert!(
        !host
            .ok("dpkg-query -W -f='${Status}' berth 2>/dev/null || true")
            .await
            .contains("installed")
    );
    drop(cleanup);
}
