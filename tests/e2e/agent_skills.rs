//! AgentProfile skills through the real `berth` binary against real LXD: two profiles, one
//! with a skill from a host directory and one with a skill from a `file://` repository, are
//! applied with a project by `berth apply`; Seeded places both skills at their targets, the
//! scheduler's inspection does not count them as unsaved work, a person's change to one does;
//! a new brief places the changed sources again before the runner gets it, keeping the
//! person's file and removing what the source dropped; a skill outside `allowedFileRoots` is
//! refused at apply; the console's project page lists the skills.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::harness::{Berth, exec, unique_name};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(300);

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn apply(berth: &Berth, dir: &Path, manifest: &str) -> std::process::Output {
    let file = dir.join(format!("manifest-{:08x}.yaml", rand::random::<u32>()));
    std::fs::write(&file, manifest).unwrap();
    berth.cli(&["apply", "-f", file.to_str().unwrap()])
}

/// The two profiles and the project, as `berth apply` takes them.
fn manifests(name: &str, pdf: &Path, review: &Path, brief: &str) -> String {
    format!(
        r#"apiVersion: berth.dev/v1alpha1
kind: AgentProfile
metadata: {{name: {name}-a}}
spec:
  home: /root/.{name}-a
  install: {{check: "test -x /usr/local/lib/berth/shell-agent"}}
  skills:
    - {{path: {pdf}, target: .claude/skills/}}
  runner: {{command: ["/usr/local/lib/berth/shell-agent", "{{briefFile}}"]}}
---
apiVersion: berth.dev/v1alpha1
kind: AgentProfile
metadata: {{name: {name}-b}}
spec:
  home: /root/.{name}-b
  install: {{check: "true"}}
  skills:
    - {{repo: {{url: "file://{review}", branch: main}}, target: .agents/skills}}
  runner: {{command: ["true"]}}
---
apiVersion: berth.dev/v1alpha1
kind: Project
metadata: {{name: {name}}}
spec:
  image: berth-base
  agent: {name}-a
  agents: [{name}-b]
  brief: "{brief}"
"#,
        pdf = pdf.display(),
        review = review.display(),
    )
}

/// The project's events as (reason, message), in order.
fn events(berth: &Berth, name: &str) -> Vec<(String, String)> {
    let list = berth
        .client()
        .get(&format!("{}/{name}/events", crate::harness::PROJECTS))
        .json();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let text = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (text("reason"), text("message"))
        })
        .collect()
}

fn in_container(name: &str, script: &str) -> String {
    exec(name, script).unwrap_or_else(|e| panic!("{script}: {e}"))
}

/// How many workspace inspections the scheduler has made that answered.
fn inspections(berth: &Berth) -> f64 {
    const SAMPLE: &str = "berth_scheduler_inspections_total{result=\"ok\"}";
    let text = berth.client().get("/metrics").text();
    text.lines()
        .find_map(|l| {
            l.strip_prefix(SAMPLE)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// Waits until the scheduler has inspected the workspaces twice more, and answers the
/// project's `status.unsavedWork` and `status.reap.protectedBy` then.
fn work_after_inspections(berth: &Berth, name: &str) -> (Value, Value) {
    let before = inspections(berth);
    let deadline = Instant::now() + DEADLINE;
    while inspections(berth) < before + 2.0 {
        assert!(Instant::now() < deadline, "the scheduler inspected nothing");
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = berth.get_project(name).unwrap()["status"].clone();
    (
        status["unsavedWork"].clone(),
        status["reap"]["protectedBy"].clone(),
    )
}

#[test]
fn skills_are_placed_refreshed_for_a_new_brief_and_not_unsaved_work() {
    let host = tempfile::tempdir().unwrap();
    let roots = host.path().join("skills");
    let pdf = roots.join("pdf");
    write(&pdf.join("SKILL.md"), "# PDF\nFill forms.\n");
    write(&pdf.join("scripts/fill.sh"), "#!/bin/sh\necho v1\n");
    let mut perms = std::fs::metadata(pdf.join("scripts/fill.sh"))
        .unwrap()
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(pdf.join("scripts/fill.sh"), perms).unwrap();
    let review = roots.join("review");
    write(&review.join("SKILL.md"), "# Review\n");
    write(&review.join("checklist.md"), "- tests\n");
    crate::support::git(&review, &["init", "-q", "-b", "main"]);
    crate::support::git(&review, &["add", "-A"]);
    crate::support::git(&review, &["commit", "-q", "-m", "one"]);

    let config = host.path().join("berth.yaml");
    std::fs::write(
        &config,
        format!(
            "allowedFileRoots: [{}]\nscheduler: {{interval: 1s, recheckInterval: 30s}}\n",
            roots.display()
        ),
    )
    .unwrap();
    let mut berth = Berth::start_with(&[], &["--config", config.to_str().unwrap()]);
    let name = unique_name();

    // A skill outside allowedFileRoots is refused at apply, naming the field.
    let outside = host.path().join("elsewhere");
    std::fs::create_dir_all(&outside).unwrap();
    let refused = apply(
        &berth,
        host.path(),
        &manifests(&name, &outside, &review, "never"),
    );
    assert!(!refused.status.success(), "{refused:?}");
    let said = crate::support::said(&refused);
    assert!(
        said.contains("spec.skills[0].path") && said.contains("is not under allowedFileRoots"),
        "{said}"
    );
    assert!(berth.get_project(&name).is_none(), "nothing was applied");

    let applied = apply(
        &berth,
        host.path(),
        &manifests(&name, &pdf, &review, "First brief\\necho one"),
    );
    assert!(
        applied.status.success(),
        "{}",
        crate::support::said(&applied)
    );
    let project = berth.get_project(&name).expect("applied");
    berth.track(&project);
    let project = berth.wait_ready(&name);
    let first = project["status"]["briefId"].as_str().unwrap().to_string();

    // Both profiles' skills, at their targets, with their modes; recorded as berth's.
    let claude = "/workspace/.claude/skills/pdf";
    let agents = "/workspace/.agents/skills/review";
    assert_eq!(
        in_container(&name, &format!("cat {claude}/SKILL.md")),
        "# PDF\nFill forms.\n"
    );
    assert_eq!(
        in_container(&name, &format!("stat -c %a {claude}/scripts/fill.sh")),
        "755\n"
    );
    assert_eq!(
        in_container(&name, &format!("cat {agents}/checklist.md")),
        "- tests\n"
    );
    in_container(&name, &format!("test ! -e {agents}/.git"));
    let seeded = project["status"]["seededFiles"].as_object().unwrap();
    for path in [
        format!("{claude}/SKILL.md"),
        format!("{claude}/scripts/fill.sh"),
        format!("{agents}/SKILL.md"),
        format!("{agents}/checklist.md"),
    ] {
        assert!(seeded.contains_key(&path), "{path}: {seeded:?}");
    }

    // Not unsaved work while unchanged; a person's change to one is.
    let (work, protected) = work_after_inspections(&berth, &name);
    let counted = |w: &Value, key: &str| w[key].as_u64().unwrap_or(0);
    assert!(
        counted(&work, "untracked") == 0 && counted(&work, "modifiedSeeds") == 0,
        "skill files counted as work: {work}"
    );
    assert!(
        !protected.to_string().contains("UnsavedWork"),
        "{protected}"
    );
    in_container(&name, &format!("echo 'my note' >>{claude}/SKILL.md"));
    // The inspection records the work; the reap pass after it records the protection.
    let project = berth.wait_for(&name, "the changed skill file seen as work", |p| {
        p["status"]["unsavedWork"]["modifiedSeeds"] == 1
            && p["status"]["reap"]["protectedBy"] == serde_json::json!(["UnsavedWork"])
    });
    assert_eq!(
        project["status"]["unsavedWork"]["files"],
        serde_json::json!([".claude/skills/pdf/SKILL.md"])
    );
    assert_eq!(
        project["status"]["reap"]["protectedBy"],
        serde_json::json!(["UnsavedWork"])
    );

    // The sources change; a new brief meets them.
    write(&pdf.join("scripts/fill.sh"), "#!/bin/sh\necho v2\n");
    write(&pdf.join("forms.md"), "forms\n");
    std::fs::remove_file(review.join("checklist.md")).unwrap();
    crate::support::git(&review, &["commit", "-q", "-a", "-m", "two"]);
    let applied = apply(
        &berth,
        host.path(),
        &manifests(&name, &pdf, &review, "Second brief\\necho two"),
    );
    assert!(
        applied.status.success(),
        "{}",
        crate::support::said(&applied)
    );
    let project = berth.wait_for(&name, "briefed with the second brief", |p| {
        p["status"]["step"] == "Briefed"
            && p["status"]["briefId"] != first.as_str()
            && p["status"]["agent"]["briefId"] == p["status"]["briefId"]
            && crate::harness::ready_reason(p).is_some_and(|(s, _)| s == "True")
            && p["status"]["observedGeneration"] == p["metadata"]["generation"]
    });
    let second = project["status"]["briefId"].as_str().unwrap().to_string();
    assert_eq!(
        in_container(&name, &format!("cat {claude}/scripts/fill.sh")),
        "#!/bin/sh\necho v2\n"
    );
    assert_eq!(
        in_container(&name, &format!("cat {claude}/forms.md")),
        "forms\n"
    );
    assert_eq!(
        in_container(&name, &format!("cat {claude}/SKILL.md")),
        "# PDF\nFill forms.\nmy note\n",
        "a person's change is never written over"
    );
    in_container(&name, &format!("test ! -e {agents}/checklist.md"));
    let seeded = project["status"]["seededFiles"].as_object().unwrap();
    assert!(!seeded.contains_key(&format!("{agents}/checklist.md")));
    assert!(seeded.contains_key(&format!("{claude}/forms.md")));

    // Placed before the runner got the new brief, and the kept file said so.
    let events = events(&berth, &name);
    let position = |reason: &str, words: &str| {
        events
            .iter()
            .position(|(r, m)| r == reason && m.contains(words))
            .unwrap_or_else(|| panic!("no {reason} event naming {words}: {events:#?}"))
    };
    assert!(
        position("SeedWritten", "fill.sh") < position("RunnerStarted", &second),
        "{events:#?}"
    );
    position("SkillRemoved", "checklist.md");
    position("SeedSkipped", &format!("{claude}/SKILL.md"));

    // The console's project page lists both skills.
    let page = console_page(&berth, &format!("/ui/projects/{name}"));
    for words in [
        "<h2 id=\"h-skills\">Skills</h2>",
        &format!("<code>{claude}</code>"),
        &format!("<code>{agents}</code>"),
        &format!("file://{} (main)", review.display()),
    ] {
        assert!(page.contains(words), "{words}: {page}");
    }
}

/// A console page read through `berth ui`, signed in by the one-time URL it prints.
fn console_page(berth: &Berth, path: &str) -> String {
    let mut ui = berth
        .command(&["ui"])
        .stderr(Stdio::null())
        .spawn()
        .expect("berth ui");
    let mut lines = BufReader::new(ui.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("berth ui printed its URL").unwrap();
        if let Some(at) = line.find("http://127.0.0.1:")
            && line.contains("?token=")
        {
            break line[at..].trim().to_string();
        }
    };
    let rest = &url["http://".len()..];
    let (addr, sign_in) = rest.split_at(rest.find('/').unwrap());
    let get = |target: &str, cookie: &str| {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect to berth ui");
        stream.set_read_timeout(Some(DEADLINE)).unwrap();
        write!(
            stream,
            "GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{cookie}\r\n"
        )
        .unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        raw
    };
    let signed = get(sign_in, "");
    let cookies: Vec<String> = signed
        .lines()
        .filter_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or(l.strip_prefix("Set-Cookie: "))
        })
        .filter_map(|c| c.split(';').next().map(str::to_string))
        .collect();
    assert!(!cookies.is_empty(), "no session: {signed}");
    let deadline = Instant::now() + DEADLINE;
    let page = loop {
        let page = get(path, &format!("Cookie: {}\r\n", cookies.join("; ")));
        if page.starts_with("HTTP/1.1 200") || Instant::now() > deadline {
            break page;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = ui.kill();
    let _ = ui.wait();
    page
}
