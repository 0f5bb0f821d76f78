use super::*;
use crate::runtime::ExecOutput;

fn b64(text: &[u8]) -> String {
    B64.encode(text)
}

/// /proc/net/tcp as the kernel writes it: a listener on 0.0.0.0:3000, one on 127.0.0.1:5000
/// (loopback), one on :22 (privileged), and an established connection on :8080.
const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0BB8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1234 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1388 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1235 1 0000000000000000 100 0 0 10 0
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1236 1 0000000000000000 100 0 0 10 0
   3: 0A00000A:1F90 0B00000A:C350 01 00000000:00000000 00:00000000 00000000     0        0 1237 1 0000000000000000 20 4 30 10 -1
";

/// tcp6: `::`:8000 and `::`:3000 (again), `::1`:9000 and `::ffff:127.0.0.1`:9001 (loopback).
const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2234 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000000000000:0BB8 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2235 1 0000000000000000 100 0 0 10 0
   2: 00000000000000000000000001000000:2328 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2236 1 0000000000000000 100 0 0 10 0
   3: 0000000000000000FFFF00000100007F:2329 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2237 1 0000000000000000 100 0 0 10 0
";

/// `ip -o -f inet addr show` as iproute2 prints it (busybox prints the same without the
/// lifetimes): loopback, two addresses on one interface, one on another.
const IPV4: &str = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: eth0    inet 10.1.2.3/24 brd 10.1.2.255 scope global eth0\\       valid_lft forever preferred_lft forever
2: eth0    inet 10.1.2.4/24 scope global secondary eth0\\       valid_lft forever preferred_lft forever
7: eth1    inet 127.77.0.2/32 scope host eth1
";

/// One `repo` line of a report.
#[derive(Clone)]
struct Repo {
    kind: &'static str,
    dir: &'static str,
    porcelain: Vec<u8>,
    stashes: &'static str,
    unpushed: &'static str,
    flagged: &'static str,
    ignored: Vec<u8>,
}

impl Default for Repo {
    fn default() -> Self {
        Repo {
            kind: "main",
            dir: ".",
            porcelain: Vec::new(),
            stashes: "0",
            unpushed: "",
            flagged: "",
            ignored: Vec::new(),
        }
    }
}

impl Repo {
    fn render(&self) -> String {
        let enc = |b: &[u8]| {
            if b.is_empty() {
                "-".to_string()
            } else {
                b64(b)
            }
        };
        format!(
            "repo {} {} {} {} {} {} {}",
            self.kind,
            b64(self.dir.as_bytes()),
            enc(&self.porcelain),
            self.stashes,
            enc(self.unpushed.as_bytes()),
            enc(self.flagged.as_bytes()),
            enc(&self.ignored)
        )
    }
}

struct Report {
    agent: Option<Vec<u8>>,
    git: &'static str,
    repos: Vec<Repo>,
    known: Vec<(&'static str, &'static str)>,
    env_mine: &'static str,
    nongit_unsaved: &'static str,
    nongit_files: &'static str,
    cpu_ticks: &'static str,
    newest: &'static str,
    end: bool,
}

impl Default for Report {
    fn default() -> Self {
        Report {
            agent: None,
            git: "repo",
            repos: vec![Repo::default()],
            known: Vec::new(),
            env_mine: "0",
            nongit_unsaved: "0",
            nongit_files: "",
            cpu_ticks: "1234",
            newest: "1767225600.5000000000",
            end: true,
        }
    }
}

impl Report {
    /// A report of the workspace's repository alone, as `main`.
    fn main(repo: Repo) -> Report {
        Report {
            repos: vec![repo],
            ..Report::default()
        }
    }

    fn render(&self) -> String {
        let mut out = vec![HEADER.to_string()];
        out.push(match &self.agent {
            Some(json) => format!("agent {}", b64(json)),
            None => "agent -".into(),
        });
        for (path, hash) in &self.known {
            out.push(format!("known {} {hash}", b64(path.as_bytes())));
        }
        out.push(format!("env_mine {}", self.env_mine));
        out.push(format!("git {}", self.git));
        if self.git == "repo" {
            out.extend(self.repos.iter().map(Repo::render));
        } else {
            out.push(format!("nongit_unsaved {}", self.nongit_unsaved));
            out.push(format!(
                "nongit_files {}",
                if self.nongit_files.is_empty() {
                    "-".to_string()
                } else {
                    b64(self.nongit_files.as_bytes())
                }
            ));
        }
        out.push(format!("tcp {}", b64(TCP.as_bytes())));
        out.push(format!("tcp6 {}", b64(TCP6.as_bytes())));
        out.push(format!("cpu_ticks {}", self.cpu_ticks));
        out.push("clk_tck 100".into());
        out.push(format!("newest_mtime {}", self.newest));
        out.push(format!("ipv4 {}", b64(IPV4.as_bytes())));
        if self.end {
            out.push("end".into());
        }
        out.join("\n") + "\n"
    }
}

/// Counts as `status.unsavedWork` shows them, `files` aside.
fn counts(got: &UnsavedWork) -> [u32; 7] {
    [
        got.uncommitted,
        got.untracked,
        got.stashes,
        got.unpushed,
        got.ignored,
        got.modified_seeds,
        got.worktrees,
    ]
}

const HASH_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const HASH_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn known() -> KnownFiles {
    [
        ("AGENTS.md".to_string(), HASH_A.to_string()),
        (".env.local".to_string(), HASH_A.to_string()),
    ]
    .into()
}

fn expected() -> Expected {
    Expected {
        known: known(),
        volume: "berth-u1-workspace".into(),
        protect_ignored: Vec::new(),
        origin: None,
    }
}

#[test]
fn clean_repository() {
    let got = parse_report(&Report::default().render(), &known()).unwrap();
    assert_eq!(got.kind, WorkspaceKind::Git);
    assert_eq!(got.unsaved, UnsavedWork::default());
    assert_eq!(got.agent, None);
    assert!(!got.agent_unreadable);
    assert_eq!(got.ports, vec![3000, 8000]);
    assert_eq!(got.cpu, Duration::from_millis(12_340));
    assert_eq!(
        got.newest_mtime,
        Some(Utc.timestamp_opt(1_767_225_600, 500_000_000).unwrap())
    );
}

#[test]
fn ipv4_addresses_are_read_by_interface() {
    let got = parse_report(&Report::default().render(), &known()).unwrap();
    let want = BTreeMap::from([
        (
            "eth0".to_string(),
            vec!["10.1.2.3/24".to_string(), "10.1.2.4/24".to_string()],
        ),
        ("eth1".to_string(), vec!["127.77.0.2/32".to_string()]),
        ("lo".to_string(), vec!["127.0.0.1/8".to_string()]),
    ]);
    assert_eq!(got.ipv4, Some(want));

    let without_ip = Report::default()
        .render()
        .replace(&format!("ipv4 {}", b64(IPV4.as_bytes())), "ipv4 -");
    let got = parse_report(&without_ip, &known()).unwrap();
    assert_eq!(got.ipv4, None, "no `ip` in the container: could not tell");
}

#[test]
fn ipv4_lines_that_are_not_addresses_are_left_out() {
    let cases = [
        ("2: eth0    inet6 fe80::1/64 scope link", None),
        ("2: eth0    inet 10.1.2.300/24 scope global eth0", None),
        ("2: eth0    inet 10.1.2.3/33 scope global eth0", None),
        ("2: eth0    inet 10.1.2.3 scope global eth0", None),
        ("2: a-name-far-too-long-for-linux    inet 10.1.2.3/24", None),
        ("garbage", None),
        ("", None),
        (
            "3: eth0@if9    inet 10.1.2.3/24",
            Some(("eth0", "10.1.2.3/24")),
        ),
    ];
    for (line, want) in cases {
        let got = ipv4_addresses(line);
        let want: BTreeMap<String, Vec<String>> = want
            .into_iter()
            .map(|(i, a)| (i.to_string(), vec![a.to_string()]))
            .collect();
        assert_eq!(got, want, "{line:?}");
    }
    let many: String = (0..200)
        .map(|i| format!("{i}: if{i}    inet 10.0.{}.{}/32\n", i / 250, i % 250))
        .collect();
    assert_eq!(ipv4_addresses(&many).len(), MAX_INTERFACES, "bounded");
}

#[test]
fn git_states_are_counted() {
    // Modified, staged, deleted, renamed (with its source path), two untracked files, and an
    // untracked file whose name holds a newline and a would-be report line.
    let porcelain =
        b" M src/main.rs\0M  lib.rs\0 D old.rs\0R  new.rs\0was.rs\0?? notes.txt\0?? a\nunpushed 0\0"
            .to_vec();
    let report = Report::main(Repo {
        porcelain,
        stashes: "2",
        unpushed: "2 refs/heads/main 1a2b3c4 5d6e7f8\n1 refs/tags/v1 9abcdef\n",
        ..Repo::default()
    });
    let got = parse_report(&report.render(), &known()).unwrap();
    assert_eq!(counts(&got.unsaved), [4, 2, 2, 3, 0, 0, 0]);
    assert_eq!(
        got.unsaved.commits,
        [
            "1a2b3c4 on refs/heads/main",
            "5d6e7f8 on refs/heads/main",
            "9abcdef on refs/tags/v1"
        ]
    );
    assert_eq!(
        got.unsaved.files,
        [
            "src/main.rs",
            "lib.rs",
            "old.rs",
            "new.rs",
            "notes.txt",
            "a?unpushed 0",
            "refs/stash",
            "refs/heads/main",
            "refs/tags/v1"
        ]
    );
}

#[test]
fn files_berth_wrote_count_only_once_changed() {
    let porcelain = b"?? AGENTS.md\0 M .env.local\0?? mine.txt\0".to_vec();
    // AGENTS.md still holds what berth wrote; .env.local was edited since.
    let report = Report {
        known: vec![("AGENTS.md", HASH_A), (".env.local", HASH_B)],
        ..Report::main(Repo {
            porcelain,
            ..Repo::default()
        })
    };
    let got = parse_report(&report.render(), &known()).unwrap();
    assert_eq!(counts(&got.unsaved), [1, 1, 0, 0, 0, 1, 0]);
    assert_eq!(got.unsaved.files, [".env.local", "mine.txt"]);

    // A known file the script could not hash (gone, or unreadable) is not excused.
    let report = Report::main(Repo {
        porcelain: b"?? AGENTS.md\0".to_vec(),
        ..Repo::default()
    });
    let got = parse_report(&report.render(), &known()).unwrap();
    assert_eq!(got.unsaved.untracked, 1);
}

/// Every file berth writes is in `.git/info/exclude`, so git never shows an edit of one: the
/// recorded hash tells.
#[test]
fn an_edited_seed_git_does_not_show_is_unsaved_work() {
    let report = Report {
        known: vec![("AGENTS.md", HASH_B), (".env.local", HASH_A)],
        ..Report::default()
    };
    let got = parse_report(&report.render(), &known()).unwrap();
    assert_eq!(counts(&got.unsaved), [0, 0, 0, 0, 0, 1, 0]);
    assert_eq!(got.unsaved.files, ["AGENTS.md"]);
    assert!(got.unsaved.any());
}

/// `.env` is judged by the lines outside berth's block: its recorded hash covers the whole
/// file, so it would take a person's lines for berth's after the next secret change.
#[test]
fn a_persons_lines_in_env_are_unsaved_work() {
    let with_env: KnownFiles = [(".env".to_string(), HASH_A.to_string())].into();
    let report = |hash: &'static str, mine: &'static str| Report {
        known: vec![(".env", hash)],
        env_mine: mine,
        ..Report::default()
    };
    // The hash matches, but a person's line is there.
    let got = parse_report(&report(HASH_A, "1").render(), &with_env).unwrap();
    assert_eq!(counts(&got.unsaved), [0, 0, 0, 0, 0, 1, 0]);
    assert_eq!(got.unsaved.files, [".env"]);
    // Only berth's block, whatever the hash says.
    let got = parse_report(&report(HASH_B, "0").render(), &with_env).unwrap();
    assert!(!got.unsaved.any(), "{:?}", got.unsaved);
    // A `.env` berth did not write is judged as any other file (by git, or protectIgnored).
    let got = parse_report(&report(HASH_A, "3").render(), &known()).unwrap();
    assert!(!got.unsaved.any(), "{:?}", got.unsaved);
}

/// Submodules, nested repositories, worktrees, flags that hide changes and ignored files that
/// protect: each counts, under its path from /workspace.
#[test]
fn work_git_hides_is_counted_where_it_is() {
    let report = Report {
        repos: vec![
            Repo {
                porcelain: b" M sub\0".to_vec(),
                unpushed: "1 HEAD\n",
                flagged: "config/local.yml\n",
                // .env.local is berth's: judged by its hash alone.
                ignored: b"data/app.db\0.env.local\0".to_vec(),
                ..Repo::default()
            },
            Repo {
                kind: "nested",
                dir: "./sub",
                porcelain: b"?? scratch.txt\0".to_vec(),
                stashes: "1",
                unpushed: "2 refs/heads/main\n",
                ..Repo::default()
            },
            Repo {
                kind: "outside",
                dir: "/tmp/wt",
                porcelain: b" M a\0".to_vec(),
                ..Repo::default()
            },
        ],
        known: vec![(".env.local", HASH_A)],
        ..Report::default()
    };
    let got = parse_report(&report.render(), &known()).unwrap();
    assert_eq!(counts(&got.unsaved), [3, 1, 1, 3, 1, 0, 1]);
    assert_eq!(
        got.unsaved.files,
        [
            "sub",
            "HEAD",
            "config/local.yml",
            "data/app.db",
            "sub/scratch.txt",
            "refs/stash in sub",
            "refs/heads/main in sub",
            "/tmp/wt",
            "/tmp/wt/a"
        ]
    );
}

#[test]
fn the_files_list_is_bounded_and_sanitised() {
    let porcelain: Vec<u8> = (0..30)
        .flat_map(|i| format!("?? f{i}\x1b[31m{}\0", "x".repeat(300)).into_bytes())
        .collect();
    let report = Report::main(Repo {
        porcelain,
        ..Repo::default()
    });
    let got = parse_report(&report.render(), &known()).unwrap();
    assert_eq!(got.unsaved.untracked, 30);
    assert_eq!(got.unsaved.files.len(), UnsavedWork::MAX_FILES);
    for name in &got.unsaved.files {
        assert!(!name.chars().any(char::is_control), "{name:?}");
        assert!(name.chars().count() <= 201, "{name:?}");
    }
}

#[test]
fn plain_workspace_counts_files_berth_did_not_write() {
    let report = Report {
        git: "none",
        nongit_unsaved: "5",
        nongit_files: "./notes.txt\n./src/a.rs\n",
        known: vec![("AGENTS.md", HASH_B)],
        ..Report::default()
    };
    let got = parse_report(&report.render(), &known()).unwrap();
    assert_eq!(got.kind, WorkspaceKind::Plain);
    assert_eq!(counts(&got.unsaved), [0, 5, 0, 0, 0, 1, 0]);
    assert_eq!(got.unsaved.files, ["AGENTS.md", "notes.txt", "src/a.rs"]);
    assert!(got.unsaved.any());
}

#[test]
fn every_kind_of_work_makes_any_true_and_old_statuses_decode() {
    let one = |set: fn(&mut UnsavedWork)| {
        let mut u = UnsavedWork::default();
        set(&mut u);
        u
    };
    for unsaved in [
        one(|u| u.uncommitted = 1),
        one(|u| u.untracked = 1),
        one(|u| u.stashes = 1),
        one(|u| u.unpushed = 1),
        one(|u| u.ignored = 1),
        one(|u| u.modified_seeds = 1),
        one(|u| u.worktrees = 1),
        one(|u| u.files = vec!["a".into()]),
    ] {
        assert!(unsaved.any(), "{unsaved:?}");
        // Every count has its words in the summary messages and describe show.
        assert!(
            !unsaved.summary().is_empty() || !unsaved.files.is_empty(),
            "{unsaved:?}"
        );
    }
    assert!(!UnsavedWork::default().any());
    assert_eq!(UnsavedWork::default().summary(), "");
    // A status stored before these fields existed.
    let old: UnsavedWork = serde_json::from_value(serde_json::json!({
        "uncommitted": 1, "untracked": 0, "stashes": 0, "unpushed": 2
    }))
    .unwrap();
    assert_eq!(counts(&old), [1, 0, 0, 2, 0, 0, 0]);
}

#[test]
fn protect_ignored_globs_become_git_pathspecs() {
    let globs: Vec<String> = [".env*", "*.db", "data/*.sqlite", "/top.db", "cache/"]
        .map(String::from)
        .into();
    assert_eq!(
        pathspecs(&globs),
        ":(glob)**/.env*\n:(glob)**/*.db\n:(glob)data/*.sqlite\n:(glob)**/top.db\n:(glob)**/cache/**"
    );
}

#[test]
fn agent_status_file() {
    let json = br#"{"briefId":"b-1","state":"blocked","title":"Fix flaky test","message":"Which DB?","updatedAt":"2026-01-01T10:00:00Z"}"#;
    let report = Report {
        agent: Some(json.to_vec()),
        ..Report::default()
    };
    let got = parse_report(&report.render(), &known()).unwrap();
    let agent = got.agent.unwrap();
    assert_eq!(agent.state, AgentState::Blocked);
    assert_eq!(agent.brief_id.as_deref(), Some("b-1"));
    assert_eq!(agent.title.as_deref(), Some("Fix flaky test"));
    assert_eq!(agent.message.as_deref(), Some("Which DB?"));
    assert_eq!(
        agent.updated_at,
        Some(Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 0).unwrap())
    );

    // Caught mid-write: reported as unreadable, the rest of the inspection stands.
    let report = Report {
        agent: Some(br#"{"state":"work"#.to_vec()),
        ..Report::default()
    };
    let got = parse_report(&report.render(), &known()).unwrap();
    assert_eq!(got.agent, None);
    assert!(got.agent_unreadable);
}

#[test]
fn incomplete_or_malformed_reports_fail() {
    let base = Report::default().render();
    let cases: Vec<(&str, String)> = vec![
        ("empty", String::new()),
        ("no header", base.replacen(HEADER, "", 1)),
        (
            "cut short",
            Report {
                end: false,
                ..Report::default()
            }
            .render(),
        ),
        (
            "truncated mid-way",
            base.lines().take(4).collect::<Vec<_>>().join("\n"),
        ),
        ("missing env_mine", base.replace("env_mine 0\n", "")),
        (
            "missing ipv4",
            base.replace(&format!("ipv4 {}\n", b64(IPV4.as_bytes())), ""),
        ),
        (
            "missing the workspace's repository",
            Report {
                repos: Vec::new(),
                ..Report::default()
            }
            .render(),
        ),
        ("short repo line", base.replacen(" 0 - - -", " 0 - -", 1)),
        (
            "unknown repo kind",
            Report::main(Repo {
                kind: "elsewhere",
                ..Repo::default()
            })
            .render(),
        ),
        (
            "forged duplicate",
            base.replace("end\n", "env_mine 0\nend\n"),
        ),
        ("output after end", base.clone() + "unpushed 0\n"),
        (
            "bad count",
            Report::main(Repo {
                unpushed: "lots refs/heads/main\n",
                ..Repo::default()
            })
            .render(),
        ),
        (
            "empty count",
            Report::main(Repo {
                stashes: "",
                ..Repo::default()
            })
            .render(),
        ),
        (
            "unknown git state",
            Report {
                git: "maybe",
                ..Report::default()
            }
            .render(),
        ),
        (
            "bad cpu",
            Report {
                cpu_ticks: "",
                ..Report::default()
            }
            .render(),
        ),
        (
            "bad base64",
            base.replacen("repo main Lg==", "repo main %%%", 1),
        ),
        (
            "malformed porcelain",
            Report::main(Repo {
                porcelain: b"X\0".to_vec(),
                ..Repo::default()
            })
            .render(),
        ),
    ];
    for (name, text) in cases {
        match parse_report(&text, &known()) {
            Err(InspectError::Parse(_)) => {}
            other => panic!("{name}: expected a parse failure, got {other:?}"),
        }
    }
}

#[test]
fn listening_ports_skip_loopback_privileged_and_connections() {
    assert_eq!(listening_ports(TCP).unwrap(), vec![3000]);
    assert_eq!(listening_ports(TCP6).unwrap(), vec![8000, 3000]);
    assert!(listening_ports("header\n   0: nonsense\n").is_err());
}

#[test]
fn known_files_are_given_in_sha256sum_format() {
    assert_eq!(
        known_lines(&known()),
        format!("{HASH_A}  ./.env.local\n{HASH_A}  ./AGENTS.md")
    );
}

mod on_fake_runtime {
    use super::*;
    use crate::runtime::Instance;
    use crate::testing::fake_runtime::FakeRuntime;

    fn running(fake: &FakeRuntime, name: &str) {
        fake.insert_instance(Instance::running(name, BTreeMap::new()));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_of_the_exec_are_inspection_failures() {
        let fake = FakeRuntime::new();
        // No such instance.
        let err = inspect(&fake, "nope", &expected(), Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(matches!(err, InspectError::Exec(_)), "{err:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn script_errors_name_the_step() {
        let fake = FakeRuntime::new();
        running(&fake, "web");
        fake.on_exec(|_, _| {
            Some(Ok(ExecOutput {
                exit_code: 3,
                stdout: b"berth-inspect 1\nagent -\ngit repo\nerror git-status\n".to_vec(),
                stderr: b"fatal: not a git repository".to_vec(),
            }))
        });
        let err = inspect(&fake, "web", &expected(), Duration::from_secs(10))
            .await
            .unwrap_err();
        match err {
            InspectError::Exited { code: 3, detail } => assert_eq!(detail, "git-status"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_exec_times_out() {
        let fake = FakeRuntime::new();
        running(&fake, "web");
        fake.on_exec(|_, _| None);
        fake.set_latency(Duration::from_secs(3600));
        let err = inspect(&fake, "web", &expected(), Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(matches!(err, InspectError::Timeout(_)), "{err:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_script_gets_the_known_files() {
        let fake = FakeRuntime::new();
        running(&fake, "web");
        let report = Report::default().render();
        fake.on_exec(move |_, request| {
            assert_eq!(request.command[..2], ["/bin/sh", "-c"]);
            assert!(request.env["BERTH_KNOWN"].contains("  ./AGENTS.md"));
            Some(Ok(ExecOutput {
                exit_code: 0,
                stdout: report.clone().into_bytes(),
                stderr: Vec::new(),
            }))
        });
        let got = inspect(&fake, "web", &expected(), Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(got.ports, vec![3000, 8000]);
    }
}

#[test]
fn known_files_come_from_the_seeded_record_relative_to_the_workspace() {
    let status = serde_json::json!({
        "seededFiles": {
            "/workspace/AGENTS.md": "aa",
            "/workspace/.env": "bb",
            "/root/.claude/settings.json": "cc",
            "/workspace/bad": 7
        }
    });
    let known = known_files_of(&status);
    assert_eq!(
        known.into_iter().collect::<Vec<_>>(),
        [
            (".env".to_string(), "bb".to_string()),
            ("AGENTS.md".to_string(), "aa".to_string())
        ]
    );
    assert!(known_files_of(&serde_json::json!({})).is_empty());
}
