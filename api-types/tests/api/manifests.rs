//! Bad manifests and the exact errors they produce.

use berth_api::{Kind, decode_manifest};

use crate::yaml;

const HEADER: &str = "apiVersion: berth.dev/v1alpha1\n";

/// (case, manifest without the apiVersion line, expected "field: message" causes in order).
const BAD: &[(&str, &str, &[&str])] = &[
    (
        "unknown field at spec level",
        "kind: Project\nmetadata: {name: p}\nspec: {imgae: x}\n",
        &[
            "spec.imgae: unknown field (expected one of `displayName`, `state`, `image`, `resources`, `agent`, `agents`, `repo`, `seedFiles`, `env`, `brief`, `schedules`, `capabilities`, `reap`, `forwards`)",
        ],
    ),
    (
        "unknown fields at top, metadata and nested levels at once",
        "kind: Project\nmetadata: {name: p, namespace: x}\nspecs: {}\nspec:\n  resources: {memroy: 4GiB}\n  repo: {url: 'https://h/r.git', brnach: main}\n  seedFiles: [{path: a, bogus: 1}]\n",
        &[
            "metadata.namespace: unknown field (expected one of `name`, `uid`, `generation`, `resourceVersion`, `labels`, `annotations`, `creationTimestamp`, `deletionTimestamp`, `finalizers`)",
            "spec.repo.brnach: unknown field (expected `url` or `branch`)",
            "spec.resources.memroy: unknown field (expected one of `cpu`, `memory`, `disk`, `workspaceSize`, `processes`)",
            "spec.seedFiles[0].bogus: unknown field (expected one of `path`, `content`, `mode`, `merge`)",
            "specs: unknown field (expected one of `apiVersion`, `kind`, `metadata`, `spec`, `status`)",
        ],
    ),
    (
        "bad quantities",
        "kind: Project\nmetadata: {name: p}\nspec:\n  resources: {cpu: two, memory: 4 gigs, disk: 20GiBs, workspaceSize: -1}\n",
        &[
            "spec.resources.cpu: \"two\" is not a CPU quantity",
            "spec.resources.disk: \"20GiBs\" is not a quantity",
            "spec.resources.memory: \"4 gigs\" is not a quantity",
            "spec.resources.workspaceSize: \"-1\" is not a quantity",
        ],
    ),
    (
        "zero resources",
        "kind: Project\nmetadata: {name: p}\nspec:\n  resources: {cpu: 0m, memory: 0}\n",
        &[
            "spec.resources.cpu: must be more than 0",
            "spec.resources.memory: must be more than 0",
        ],
    ),
    (
        "memory below what LXD can start",
        "kind: Project\nmetadata: {name: p}\nspec:\n  resources: {memory: 1KiB}\n",
        &[
            "spec.resources.memory: \"1KiB\" is below the minimum of 32MiB: LXD cannot start a container with less",
        ],
    ),
    (
        "bad durations",
        "kind: Project\nmetadata: {name: p}\nspec:\n  reap: {idleAfter: 2 hours, idleAction: Pause, maxAge: forever}\n",
        &[
            "spec.reap.idleAction: \"Pause\" is not a valid value (expected `Stop` or `Delete`)",
            "spec.reap.idleAfter: \"2 hours\" is not a duration (write e.g. 30s, 5m, 2h, 30d or 1h30m)",
            "spec.reap.maxAge: \"forever\" is not a duration or \"never\" (write e.g. 30d)",
        ],
    ),
    (
        "zero durations",
        "kind: Project\nmetadata: {name: p}\nspec:\n  reap: {idleAfter: 0s, maxAge: 0d}\n",
        &[
            "spec.reap.idleAfter: must be more than 0",
            "spec.reap.maxAge: must be more than 0 (write \"never\" to disable)",
        ],
    ),
    (
        "durations past the cap",
        "kind: Project\nmetadata: {name: p}\nspec:\n  reap: {idleAfter: 100000000d, maxAge: 36501d}\n",
        &[
            "spec.reap.idleAfter: \"100000000d\" is too long: at most 36500d",
            "spec.reap.maxAge: \"36501d\" is too long: at most 36500d",
        ],
    ),
    (
        "a duration too long to count",
        "kind: Project\nmetadata: {name: p}\nspec:\n  reap: {idleAfter: 99999999999999999999d, maxAge: 30000000000000000w}\n",
        &[
            "spec.reap.idleAfter: \"99999999999999999999d\" is too long: at most 36500d",
            "spec.reap.maxAge: \"30000000000000000w\" is too long: at most 36500d",
        ],
    ),
    (
        "a git source polled less than once a century",
        "kind: GitSource\nmetadata: {name: fleet}\nspec: {url: 'https://h/r.git', interval: 5214w3d}\n",
        &["spec.interval: \"5214w3d\" is too long: at most 36500d"],
    ),
    (
        "bad protectIgnored globs",
        "kind: Project\nmetadata: {name: p}\nspec:\n  reap: {protectIgnored: ['*.db', '/etc/*', '../up/*.db', '', 'a/../../b', ':(top)x', \"a\\nb\"]}\n",
        &[
            "spec.reap.protectIgnored[1]: \"/etc/*\" must be relative to /workspace",
            "spec.reap.protectIgnored[2]: \"../up/*.db\" must not contain \"..\"",
            "spec.reap.protectIgnored[3]: must not be empty",
            "spec.reap.protectIgnored[4]: \"a/../../b\" must not contain \"..\"",
            "spec.reap.protectIgnored[5]: \":(top)x\" must not start with ':'",
            "spec.reap.protectIgnored[6]: \"a\\nb\" must not contain control characters",
        ],
    ),
    (
        "too many protectIgnored globs",
        "kind: Project\nmetadata: {name: p}\nspec:\n  reap: {protectIgnored: [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, d0, d1, d2]}\n",
        &["spec.reap.protectIgnored: at most 32 globs"],
    ),
    (
        "bad names",
        "kind: Project\nmetadata: {name: Payments_API}\nspec: {agent: Claude, agents: [codex, -x]}\n",
        &[
            "metadata.name: \"Payments_API\" is not a valid name (must be lower-case letters, digits and '-', start with a letter, end with a letter or digit, at most 63 characters)",
            "spec.agent: \"Claude\" is not a valid name (must be lower-case letters, digits and '-', start with a letter, end with a letter or digit, at most 63 characters)",
            "spec.agents[1]: \"-x\" is not a valid name (must be lower-case letters, digits and '-', start with a letter, end with a letter or digit, at most 63 characters)",
        ],
    ),
    (
        "missing name",
        "kind: Project\nspec: {}\n",
        &["metadata.name: required"],
    ),
    (
        "bad seed paths and modes",
        "kind: Project\nmetadata: {name: p}\nspec:\n  seedFiles:\n    - {path: ../etc/passwd}\n    - {path: /etc/hosts}\n    - {path: /workspace/ok.txt, mode: '0644'}\n    - {path: 'docs/', content: x}\n    - {path: /workspace/a/../../b}\n    - {content: no path}\n    - {path: x, mode: '0888'}\n    - {path: y, merge: prepend}\n    - {path: z, mode: 0o644}\n",
        &[
            "spec.seedFiles[0].path: \"../etc/passwd\" must not contain '..'",
            "spec.seedFiles[1].path: \"/etc/hosts\" must lie under /workspace",
            "spec.seedFiles[3].path: \"docs/\" must name a file, not a directory",
            "spec.seedFiles[4].path: \"/workspace/a/../../b\" must not contain '..'",
            "spec.seedFiles[5].path: required",
            "spec.seedFiles[6].mode: \"0888\" is not an octal file mode (write e.g. \"0644\")",
            "spec.seedFiles[7].merge: \"prepend\" is not a valid value (expected `replace` or `append`)",
            "spec.seedFiles[8].mode: the number 420 is ambiguous as a file mode: write the octal mode in quotes, e.g. \"0644\"",
        ],
    ),
    (
        "bad forwards",
        "kind: Project\nmetadata: {name: p}\nspec:\n  forwards:\n    - {port: 0, to: '127.0.0.1:1'}\n    - {port: 8080, to: 'localhost:11434'}\n    - {port: 8080, to: '127.0.0.1:0'}\n    - {port: 9000}\n    - {port: 9001, to: '[::1]:80'}\n",
        &[
            "spec.forwards[0].port: must be 1 to 65535",
            "spec.forwards[1].to: \"localhost:11434\" must be IP:PORT (IPv6 as [ADDR]:PORT) with a port from 1 to 65535",
            "spec.forwards[2].port: 8080 is forwarded twice",
            "spec.forwards[2].to: \"127.0.0.1:0\" must be IP:PORT (IPv6 as [ADDR]:PORT) with a port from 1 to 65535",
            "spec.forwards[3].to: required",
        ],
    ),
    (
        "bad env keys",
        "kind: Project\nmetadata: {name: p}\nspec:\n  env: {1PORT: x, MY-VAR: y, GOOD_ONE: z, VERSION: 1.10}\n",
        &[
            "spec.env.1PORT: \"1PORT\" is not a valid environment variable name (letters, digits and '_', not starting with a digit)",
            "spec.env.MY-VAR: \"MY-VAR\" is not a valid environment variable name (letters, digits and '_', not starting with a digit)",
            "spec.env.VERSION: the number 1.1 must be quoted to be kept as written (e.g. \"1.1\")",
        ],
    ),
    (
        "bad repo",
        "kind: Project\nmetadata: {name: p}\nspec:\n  repo: {url: 'ftp://h/r.git', branch: 'bad branch'}\n",
        &[
            "spec.repo.branch: \"bad branch\" is not a valid git branch name",
            "spec.repo.url: \"ftp://h/r.git\": scheme \"ftp\" is not allowed (use one of: https, http, ssh, git, file)",
        ],
    ),
    (
        "relative file repo",
        "kind: Project\nmetadata: {name: p}\nspec:\n  repo: {url: 'file://repos/x'}\n",
        &["spec.repo.url: \"file://repos/x\" must name an absolute path (file:///path)"],
    ),
    (
        "repo without url",
        "kind: Project\nmetadata: {name: p}\nspec:\n  repo: {branch: main}\n",
        &["spec.repo.url: required"],
    ),
    (
        "wrong types",
        "kind: Project\nmetadata: {name: p}\nspec: {agents: claude, state: 3, displayName: [a]}\n",
        &[
            "spec.agents: invalid type: string \"claude\", expected a sequence",
            "spec.displayName: invalid type: sequence, expected a string",
            "spec.state: invalid type: integer `3`, expected a string",
        ],
    ),
    (
        "incomplete agent profile names every missing field",
        "kind: AgentProfile\nmetadata: {name: claude}\nspec: {}\n",
        &[
            "spec.home: required",
            "spec.install.check: required",
            "spec.runner.command: required",
        ],
    ),
    (
        "bad agent profile",
        "kind: AgentProfile\nmetadata: {name: claude}\nspec:\n  home: .claude\n  install: {check: ''}\n  instructions: {target: /etc/CLAUDE.md}\n  credentials: [{secret: ANTHROPIC-KEY}, {}]\n  runtimeAssets: [{path: /root/.claude/settings.json}]\n  runner: {command: []}\n",
        &[
            "spec.credentials[0].secret: \"ANTHROPIC-KEY\" is not a valid environment variable name (letters, digits and '_', not starting with a digit)",
            "spec.credentials[1].secret: required",
            "spec.home: \".claude\" must be an absolute path",
            "spec.install.check: required",
            "spec.instructions.target: \"/etc/CLAUDE.md\" must lie under /workspace",
            "spec.runner.command: required",
        ],
    ),
    (
        "profile assets must lie under home, home not under /workspace",
        "kind: AgentProfile\nmetadata: {name: claude}\nspec:\n  home: /root/.claude\n  install: {check: claude --version}\n  runtimeAssets:\n    - {path: /root/.claude/settings.json}\n    - {path: /root/.bashrc}\n    - {path: /root/.claude/../.ssh/id}\n    - {path: /root/.claude}\n  runner: {command: [claude]}\n",
        &[
            "spec.runtimeAssets[1].path: \"/root/.bashrc\" must lie under home /root/.claude",
            "spec.runtimeAssets[2].path: \"/root/.claude/../.ssh/id\" must not contain '..'",
            "spec.runtimeAssets[3].path: \"/root/.claude\" must lie under home /root/.claude",
        ],
    ),
    (
        "profile skills name a source and a directory under /workspace",
        "kind: AgentProfile\nmetadata: {name: claude}\nspec:\n  home: /root/.claude\n  install: {check: claude --version}\n  skills:\n    - {path: /srv/skills/pdf, target: .claude/skills/}\n    - {path: /srv/other/pdf, target: /workspace/.claude/skills}\n    - {target: .claude/skills}\n    - {path: /srv/x, repo: {url: 'file:///srv/x'}, target: .claude/skills}\n    - {path: srv/y, target: /etc/skills}\n    - {repo: {url: 'ftp://h/r.git', branch: 'a..b'}, target: /workspace}\n    - {path: /srv/z}\n  runner: {command: [claude]}\n",
        &[
            "spec.skills[1]: places its files at /workspace/.claude/skills/pdf, as spec.skills[0] does",
            "spec.skills[2]: give a path or a repo",
            "spec.skills[3]: give either path or repo, not both",
            "spec.skills[4].path: \"srv/y\" must be an absolute path",
            "spec.skills[4].target: \"/etc/skills\" must lie under /workspace",
            "spec.skills[5].repo.branch: \"a..b\" is not a valid git branch name",
            "spec.skills[5].repo.url: \"ftp://h/r.git\": scheme \"ftp\" is not allowed (use one of: https, http, ssh, git, file)",
            "spec.skills[5].target: \"/workspace\" must name a directory under /workspace",
            "spec.skills[6].target: required",
        ],
    ),
    (
        "profile home under workspace",
        "kind: AgentProfile\nmetadata: {name: x}\nspec: {home: /workspace/.x, install: {check: x}, runner: {command: [x]}}\n",
        &["spec.home: \"/workspace/.x\" must not lie under /workspace"],
    ),
    (
        "bad git source",
        "kind: GitSource\nmetadata: {name: fleet}\nspec: {url: 'ssh://h/r.git', path: /abs, interval: soon, prune: maybe}\n",
        &[
            "spec.interval: \"soon\" is not a duration (write e.g. 30s, 5m, 2h, 30d or 1h30m)",
            "spec.path: \"/abs\" must be relative to the repository",
            "spec.prune: invalid type: string \"maybe\", expected a boolean",
            "spec.url: \"ssh://h/r.git\": scheme \"ssh\" is not allowed (use one of: https, file)",
        ],
    ),
    (
        "git source without url, escaping path",
        "kind: GitSource\nmetadata: {name: fleet}\nspec: {path: ../up, interval: 0s}\n",
        &[
            "spec.interval: must be more than 0",
            "spec.path: \"../up\" must not contain '..'",
            "spec.url: required",
        ],
    ),
    (
        "bad labels and annotations",
        "kind: Project\nmetadata:\n  name: p\n  labels: {'bad key!': x, team: 'has space'}\n  annotations: {'/nope': x}\n",
        &[
            "metadata.annotations./nope: \"/nope\" is not a valid key (optional DNS prefix and '/', then at most 63 letters, digits, '-', '_', '.')",
            "metadata.labels.bad key!: \"bad key!\" is not a valid key (optional DNS prefix and '/', then at most 63 letters, digits, '-', '_', '.')",
            "metadata.labels.team: \"has space\" is not a valid label value (at most 63 letters, digits, '-', '_', '.', starting and ending with a letter or digit)",
        ],
    ),
    (
        "label and annotation values must be strings, as in Kubernetes",
        "kind: Project\nmetadata:\n  name: p\n  labels: {tier: 1, canary: true, ok: 'yes'}\n  annotations: {ratio: 1.5, list: [a]}\n",
        &[
            "metadata.annotations.list: must be a string, not a list",
            "metadata.annotations.ratio: must be a string (quote it: \"1.5\")",
            "metadata.labels.canary: must be a string (quote it: \"true\")",
            "metadata.labels.tier: must be a string (quote it: \"1\")",
        ],
    ),
    (
        "unknown kind",
        "kind: Workspace\nmetadata: {name: p}\n",
        &["kind: \"Workspace\" is not a known kind (Project, AgentProfile or GitSource)"],
    ),
    (
        "kind in the wrong case",
        "kind: project\nmetadata: {name: p}\n",
        &["kind: \"project\" is not a known kind (did you mean Project?)"],
    ),
    ("missing kind", "metadata: {name: p}\n", &["kind: required"]),
    (
        "every problem at once: decode and validation errors together",
        "kind: Project\nmetadata: {name: Bad Name, labels: {ok: fine}}\nspec:\n  displayName: '   '\n  image: 'two words'\n  resources: {memory: lots, cpu: '0'}\n  agent: Shell\n  seedFiles: [{path: /root/x}]\n  env: {A-B: x}\n  reap: {idleAfter: 0s}\n  extra: 1\n",
        &[
            "metadata.name: \"Bad Name\" is not a valid name (must be lower-case letters, digits and '-', start with a letter, end with a letter or digit, at most 63 characters)",
            "spec.agent: \"Shell\" is not a valid name (must be lower-case letters, digits and '-', start with a letter, end with a letter or digit, at most 63 characters)",
            "spec.displayName: must not be blank",
            "spec.env.A-B: \"A-B\" is not a valid environment variable name (letters, digits and '_', not starting with a digit)",
            "spec.extra: unknown field (expected one of `displayName`, `state`, `image`, `resources`, `agent`, `agents`, `repo`, `seedFiles`, `env`, `brief`, `schedules`, `capabilities`, `reap`, `forwards`)",
            "spec.image: \"two words\" must not contain whitespace",
            "spec.reap.idleAfter: must be more than 0",
            "spec.resources.cpu: must be more than 0",
            "spec.resources.memory: \"lots\" is not a quantity",
            "spec.seedFiles[0].path: \"/root/x\" must lie under /workspace",
        ],
    ),
    (
        "a browser with no agent to publish it to",
        "kind: Project\nmetadata: {name: p}\nspec: {capabilities: [browser]}\n",
        &["spec.capabilities: browser is published to the project's agent: set spec.agent"],
    ),
    (
        "schedules as a profile's default",
        "kind: AgentProfile\nmetadata: {name: a}\nspec:\n  home: /root/.a\n  install: {check: 'true'}\n  runner: {command: [a]}\n  capabilities: [browser, schedules]\n",
        &[
            "spec.capabilities[1]: schedules is a project's own: set it in the Project's spec.capabilities",
        ],
    ),
];

#[test]
fn causes_are_ordered_with_numeric_indices() {
    let seeds: String = (0..12).map(|_| "    - {path: ../x}\n").collect();
    let err = decode_manifest(yaml(&format!(
        "{HEADER}kind: Project\nmetadata: {{name: p}}\nspec:\n  seedFiles:\n{seeds}"
    )))
    .unwrap_err();
    let fields: Vec<_> = err.causes.iter().map(|c| c.field.clone()).collect();
    let want: Vec<_> = (0..12)
        .map(|i| format!("spec.seedFiles[{i}].path"))
        .collect();
    assert_eq!(fields, want);
}

#[test]
fn bad_manifests_report_every_problem_with_its_path() {
    let mut failures = Vec::new();
    for (case, body, want) in BAD {
        let got = match decode_manifest(yaml(&format!("{HEADER}{body}"))) {
            Ok(obj) => vec![format!("accepted: {obj:?}")],
            Err(e) => e.causes.iter().map(ToString::to_string).collect(),
        };
        let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        if got != want {
            failures.push(format!("{case}:\n  got:  {got:#?}\n  want: {want:#?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn api_version_is_checked_without_hiding_other_problems() {
    let err =
        decode_manifest(yaml("apiVersion: v1\nkind: Project\nmetadata: {name: P}\n")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "apiVersion: \"v1\" is not supported (use berth.dev/v1alpha1); metadata.name: \"P\" is not a valid name (must be lower-case letters, digits and '-', start with a letter, end with a letter or digit, at most 63 characters)"
    );
    let err = decode_manifest(yaml("kind: Project\nmetadata: {name: p}\n")).unwrap_err();
    assert_eq!(err.to_string(), "apiVersion: required");
}

#[test]
fn a_manifest_must_be_a_mapping() {
    let err = decode_manifest(yaml("- a\n- b\n")).unwrap_err();
    assert_eq!(err.to_string(), "a manifest must be a mapping, not a list");
}

#[test]
fn display_joins_causes() {
    let err = decode_manifest(yaml(&format!(
        "{HEADER}kind: Project\nmetadata: {{name: p}}\nspec: {{resources: {{memory: 4 gigs}}}}\n"
    )))
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "spec.resources.memory: \"4 gigs\" is not a quantity"
    );
}

/// Manifests that must be accepted, with the kind they decode to.
const GOOD: &[(&str, &str, Kind)] = &[
    (
        "the DESIGN project",
        "kind: Project
metadata:
  name: payments-api
  labels: {team: payments}
spec:
  displayName: Payments API
  state: Running
  image: berth-base
  resources: {cpu: \"2\", memory: 4GiB, disk: 20GiB, workspaceSize: 50GiB}
  agent: shell
  agents: [claude, codex]
  repo: {url: https://git.example/pay.git, branch: main}
  seedFiles:
    - {path: .env.local, content: \"PORT=3000\\n\", mode: \"0644\"}
    - {path: AGENTS.md, content: \"...\", merge: append}
  env: {NODE_ENV: development, PORT: 3000, DEBUG: true}
  brief: Fix the flaky checkout test
  reap:
    idleAfter: 2h
    idleAction: Stop
    maxAge: 30d
",
        Kind::Project,
    ),
    (
        "the DESIGN profile",
        "kind: AgentProfile
metadata: {name: claude}
spec:
  home: /root/.claude
  install: {check: \"claude --version\", command: \"npm i -g @anthropic-ai/claude-code@2.0.1\", version: 2.0.1}
  instructions: {target: /workspace/CLAUDE.md, content: \"...\"}
  credentials: [{secret: ANTHROPIC_API_KEY}]
  runtimeAssets: [{path: /root/.claude/settings.json, content: \"{}\"}]
  runner: {command: [\"claude\", \"-p\", \"--input-file\", \"{briefFile}\"]}
",
        Kind::AgentProfile,
    ),
    (
        "a profile with skills",
        "kind: AgentProfile
metadata: {name: claude}
spec:
  home: /root/.claude
  install: {check: \"claude --version\"}
  skills:
    - {path: /srv/berth-skills/pdf, target: .claude/skills}
    - {repo: {url: \"file:///srv/berth-skills/review.git\", branch: main}, target: .claude/skills}
  runner: {command: [claude]}
",
        Kind::AgentProfile,
    ),
    (
        "a git source with defaults",
        "kind: GitSource\nmetadata: {name: fleet}\nspec: {url: 'file:///srv/fleet.git', ref: main}\n",
        Kind::GitSource,
    ),
    (
        "a project with nothing but a name; server fields and status ignored",
        "kind: Project
metadata:
  name: bare
  uid: 0b7c
  generation: 3
  resourceVersion: \"17\"
  creationTimestamp: 2026-01-01T00:00:00Z
  finalizers: [berth.dev/cleanup]
status: {phase: Ready, whatever: 1}
",
        Kind::Project,
    ),
    (
        "keys written without a value count as absent",
        "kind: Project\nmetadata:\n  name: empty\n  labels:\nspec:\n  resources:\n  repo:\n  env: {A: x, B: }\n",
        Kind::Project,
    ),
    (
        "a timestamp-like annotation is text",
        "kind: Project\nmetadata:\n  name: labelled\n  annotations: {berth.dev/restartedAt: 2026-01-01T00:00:00Z}\n",
        Kind::Project,
    ),
    (
        "max age never, unquoted numbers and a file repo",
        "kind: Project\nmetadata: {name: n}\nspec:\n  resources: {cpu: 1.5, memory: 1073741824}\n  reap: {maxAge: never}\n  repo: {url: 'file:///srv/repos/n'}\n  seedFiles: [{path: /workspace/x/y, mode: 0755}]\n",
        Kind::Project,
    ),
];

#[test]
fn good_manifests_decode() {
    for (case, body, kind) in GOOD {
        let obj = decode_manifest(yaml(&format!("{HEADER}{body}")))
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(obj.kind(), *kind, "{case}");
        let meta = obj.metadata();
        assert!(meta.uid.is_none() && meta.generation.is_none(), "{case}");
        assert!(
            meta.resource_version.is_none() && meta.finalizers.is_empty(),
            "{case}"
        );
        assert!(obj.status_value().is_null(), "{case}: status is ignored");
    }
}

#[test]
fn get_output_applies_back() {
    // What `get -o yaml` prints: a stored object with server metadata and status.
    let stored = berth_api::decode_stored(yaml(&format!(
        "{HEADER}kind: Project
metadata:
  name: round
  uid: 6f1c
  generation: 2
  resourceVersion: \"9\"
  creationTimestamp: 2026-01-01T00:00:00Z
  finalizers: [berth.dev/cleanup]
spec: {{displayName: Round, resources: {{memory: 2GiB}}}}
status:
  observedGeneration: 2
  phase: Ready
  step: Briefed
  conditions: [{{type: Ready, status: \"True\", reason: Briefed, lastTransitionTime: 2026-01-01T00:00:00Z}}]
"
    )))
    .expect("stored object decodes");
    let printed = serde_yaml::to_string(&stored).expect("serializes");
    let applied = decode_manifest(yaml(&printed)).expect("get -o yaml output applies back");
    assert_eq!(applied.spec_value(), stored.spec_value());
    assert_eq!(applied.metadata().name, "round");
}

#[test]
fn seed_targets_resolve_under_workspace() {
    let obj = decode_manifest(yaml(&format!(
        "{HEADER}kind: Project\nmetadata: {{name: p}}\nspec:\n  seedFiles: [{{path: ./a//b.txt}}, {{path: /workspace/c}}]\n"
    )))
    .expect("valid");
    let berth_api::Object::Project(p) = obj else {
        panic!("not a project")
    };
    let targets: Vec<_> = p.spec.seed_files.iter().map(|s| s.target()).collect();
    assert_eq!(
        targets,
        vec![
            Some("/workspace/a/b.txt".to_string()),
            Some("/workspace/c".to_string())
        ]
    );
}

#[test]
fn a_skill_is_named_after_its_directory_or_repository() {
    use berth_api::{AgentSkill, Repo};
    let path = |p: &str| AgentSkill {
        path: Some(p.into()),
        repo: None,
        target: ".claude/skills/".into(),
    };
    let repo = |url: &str| AgentSkill {
        path: None,
        repo: Some(Repo {
            url: url.into(),
            branch: None,
        }),
        target: "/workspace/.agents/skills".into(),
    };
    let cases = [
        (
            path("/srv/skills/pdf"),
            Some("/workspace/.claude/skills/pdf"),
        ),
        (
            path("/srv/skills/pdf/"),
            Some("/workspace/.claude/skills/pdf"),
        ),
        (
            repo("https://git.example/team/review.git"),
            Some("/workspace/.agents/skills/review"),
        ),
        (
            repo("file:///srv/skills/lint/"),
            Some("/workspace/.agents/skills/lint"),
        ),
        (
            repo("ssh://git@host:tools.git"),
            Some("/workspace/.agents/skills/tools"),
        ),
        (repo("file:///srv/.git"), None),
    ];
    for (skill, want) in cases {
        assert_eq!(skill.placed_at().as_deref(), want, "{skill:?}");
    }
}
