//! The README runs as written: every ```sh block of README.md that is not marked
//! `<!-- readme-test: skip (why) -->` on the line before its fence is run line by line with bash,
//! in order, against a real `berth serve` on real LXD, and a line that exits non-zero fails the
//! test naming its README line.
//!
//! The daemon runs in an LXD project of its own (`lxd.project`, created here and removed with
//! everything in it), so the README's fixed names (`quickstart`, `payments-api`, `agent-demo`)
//! never meet another test's instances. Lines run in a scratch directory whose `examples`,
//! `manifests` and `scripts` are the checkout's. Three lines are rewritten, and only these (the
//! test fails when one is no longer in the README):
//!
//! - `make run` sets up LXD and starts the daemon at `/run/berth/berth.sock`; here the daemon is
//!   the test's own, so the line is what `make run` then does: apply `examples/quickstart/` and
//!   wait until it is Ready;
//! - `export BERTH_SERVER=...` names the test daemon's socket;
//! - `alias berth=target/release/berth` names the binary under test.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::daemon::{Daemon, wait_with_deadline};
use crate::support::lxd::TestProject;

const BERTH: &str = env!("CARGO_BIN_EXE_berth");
const README: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
const CHECKOUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
const SKIP_MARKER: &str = "<!-- readme-test: skip";
/// A line that has not finished by then is stuck (the README's own waits are shorter, but for
/// the quickstart's `--timeout 10m`, which a Ready project meets in seconds).
const LINE_DEADLINE: Duration = Duration::from_secs(480);

/// One command of the README: where it is and what it says (continuation lines joined).
#[derive(Debug, Clone)]
struct Line {
    number: usize,
    text: String,
}

/// The ```sh blocks to run, each a list of commands, and how many were marked to skip.
fn runnable_blocks(readme: &str) -> (Vec<Vec<Line>>, usize) {
    let mut blocks = Vec::new();
    let mut skipped = 0;
    let mut previous = "";
    let mut lines = readme.lines().enumerate();
    while let Some((_, line)) = lines.next() {
        let fence = line.trim_end();
        if fence != "```sh" {
            if !line.trim().is_empty() {
                previous = line;
            }
            continue;
        }
        let skip = previous.trim_start().starts_with(SKIP_MARKER);
        if skip {
            assert!(
                previous.contains('(') && previous.trim_end().ends_with(") -->"),
                "a skip marker says why: {previous}"
            );
        }
        let mut block = Vec::new();
        let mut pending: Option<Line> = None;
        for (index, line) in lines.by_ref() {
            if line.trim_end() == "```" {
                break;
            }
            let (text, continues) = match line.strip_suffix('\\') {
                Some(head) => (head, true),
                None => (line, false),
            };
            let current = match pending.take() {
                Some(mut open) => {
                    open.text.push(' ');
                    open.text.push_str(text.trim());
                    open
                }
                None => Line {
                    number: index + 1,
                    text: text.trim().to_string(),
                },
            };
            if continues {
                pending = Some(current);
            } else if !current.text.is_empty() && !current.text.starts_with('#') {
                block.push(current);
            }
        }
        assert!(pending.is_none(), "a README block ends in a continuation");
        previous = "";
        if skip {
            skipped += 1;
        } else {
            blocks.push(block);
        }
    }
    (blocks, skipped)
}

/// What a line printed and how it ended.
struct Ran {
    success: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `command` with bash in `dir`, `berth` being the binary under test talking to `socket`.
fn run_line(dir: &Path, socket: &Path, command: &str, number: usize) -> Ran {
    let script =
        format!("set -o pipefail\nshopt -s expand_aliases\nalias berth={BERTH}\n{command}\n");
    let stdout_path = dir.join(format!(".line-{number}.out"));
    let stderr_path = dir.join(format!(".line-{number}.err"));
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir)
        .env("BERTH_SERVER", socket)
        .env("NO_COLOR", "1")
        .env_remove("BERTH_TOKEN")
        .env_remove("BERTH_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("run bash");
    let status = wait_with_deadline(&mut child, LINE_DEADLINE);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    Ran {
        success: status.is_some_and(|s| s.success()),
        code: status.and_then(|s| s.code()),
        stdout: std::fs::read_to_string(&stdout_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&stderr_path).unwrap_or_default(),
    }
}

/// A scratch directory that holds the checkout's `examples`, `manifests` and `scripts`.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in ["examples", "manifests", "scripts"] {
        std::os::unix::fs::symlink(PathBuf::from(CHECKOUT).join(entry), dir.path().join(entry))
            .expect("link the checkout into the scratch directory");
    }
    dir
}

#[test]
fn every_readme_block_runs_as_written() {
    let readme = std::fs::read_to_string(README).expect("read README.md");
    let (blocks, skipped) = runnable_blocks(&readme);
    assert!(
        blocks.len() >= 3 && skipped >= 1,
        "the walkthrough, agent and trash blocks run; found {} to run, {skipped} skipped",
        blocks.len()
    );

    let lxd_project = TestProject::create("berth-readme", false);
    let daemon = Daemon::running()
        .config(&format!("lxd:\n  project: {}\n", lxd_project.name))
        .start();
    let dir = scratch();
    let socket = daemon.socket.to_str().expect("a utf-8 socket path");

    // The rewritten lines (see the module's doc), each of which must still be in the README.
    let rewrites = [
        (
            "make run",
            "berth apply -f examples/quickstart/ --wait --timeout 10m".to_string(),
        ),
        (
            "export BERTH_SERVER=/run/berth/berth.sock",
            format!("export BERTH_SERVER={socket}"),
        ),
        (
            "alias berth=target/release/berth",
            format!("alias berth={BERTH}"),
        ),
    ];
    // What the first line starting so must print, as its README comment says.
    let prints = [
        ("berth get projects", "quickstart"),
        ("berth apply -f qs.yaml", "project/quickstart unchanged"),
        ("berth create project \"Payments API\"", "payments-api"),
        ("berth trash list", "payments-api"),
        ("berth get project agent-demo -o jsonpath=", "colour"),
        ("berth logs agent-demo -f", "shell agent: done"),
        ("berth exec agent-demo -- git status", "On branch main"),
        ("berth tool agent-demo Read", "Working in this workspace"),
    ];
    let mut rewritten = BTreeSet::new();
    let mut checked = BTreeSet::new();

    for line in blocks.iter().flatten() {
        let command = match rewrites.iter().find(|(readme, _)| {
            line.text == *readme || line.text.starts_with(&format!("{readme} "))
        }) {
            Some((readme, instead)) => {
                rewritten.insert(*readme);
                instead.clone()
            }
            None => line.text.clone(),
        };
        eprintln!("README.md:{}: {command}", line.number);
        let ran = run_line(dir.path(), &daemon.socket, &command, line.number);
        assert!(
            ran.success,
            "README.md:{}: `{}` failed (exit {:?})\n--- stdout ---\n{}\n--- stderr ---\n{}\n\
             --- daemon log (last 60 lines) ---\n{}",
            line.number,
            line.text,
            ran.code,
            ran.stdout,
            ran.stderr,
            tail(&daemon.log_text(), 60),
        );
        for (start, expected) in prints {
            // The first line of its kind: `berth trash list` is run again once the trash is empty.
            if line.text.starts_with(start) && checked.insert(start) {
                assert!(
                    ran.stdout.contains(expected),
                    "README.md:{}: `{}` printed no {expected:?}:\n{}",
                    line.number,
                    line.text,
                    ran.stdout
                );
            }
        }
    }
    for (readme, _) in &rewrites {
        assert!(
            rewritten.contains(readme),
            "the README no longer runs `{readme}`: update this test's rewrites"
        );
    }
    for (start, _) in &prints {
        assert!(
            checked.contains(start),
            "the README no longer runs `{start}`: update this test's expectations"
        );
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[test]
fn blocks_are_found_and_skips_say_why() {
    let readme = "\
intro
```sh
berth get projects   # all
berth create project x \\
  --memory 4GiB
# a comment line

```
<!-- readme-test: skip (needs a cluster) -->
```sh
kubectl apply -f x
```
```toml
a = 1
```
";
    let (blocks, skipped) = runnable_blocks(readme);
    assert_eq!(skipped, 1);
    let lines: Vec<(usize, &str)> = blocks
        .iter()
        .flatten()
        .map(|l| (l.number, l.text.as_str()))
        .collect();
    assert_eq!(
        lines,
        [
            (3, "berth get projects   # all"),
            (4, "berth create project x --memory 4GiB"),
        ]
    );
}
