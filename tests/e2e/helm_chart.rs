//! charts/berth, checked offline by `scripts/check-chart` (Helm's own SDK: lint and template
//! with the defaults and with non-default values; Kubernetes' schemas; the Prometheus
//! operator's CRDs' shape), and what it renders read back here: the berth.yaml it hands the
//! daemon is one berth itself accepts, the pod is what the design asks for, and the
//! PrometheusRule carries the tested alert rules.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::Value;

const CASES: [&str; 2] = ["default", "non-default"];

fn repo_path(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

/// Runs scripts/check-chart with --out into a temp dir; fails with its output.
fn rendered() -> tempfile::TempDir {
    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new("bash")
        .arg(repo_path("scripts/check-chart"))
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("run scripts/check-chart");
    assert!(
        run.status.success(),
        "scripts/check-chart failed (scripts/setup-test-deps makes its virtualenv):\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    out
}

/// The one manifest of `kind` a case rendered.
fn manifest(dir: &Path, case: &str, kind: &str) -> Value {
    let mut found: Vec<Value> = std::fs::read_dir(dir.join(case))
        .expect("the case's directory")
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{kind}-")))
        })
        .map(|path| serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap())
        .collect();
    assert_eq!(found.len(), 1, "{case}: {} {kind}", found.len());
    found.remove(0)
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    let mut at = value;
    for key in path {
        at = &at[*key];
    }
    at.as_str()
        .unwrap_or_else(|| panic!("no string at {path:?} in {value:?}"))
}

#[test]
fn the_chart_renders_what_berth_and_kubernetes_accept() {
    let out = rendered();
    for case in CASES {
        // The daemon's configuration: the init container puts the Secret's fingerprint in.
        let config_map = manifest(out.path(), case, "ConfigMap");
        let text = str_at(&config_map, &["data", "berth.yaml"]);
        assert!(text.contains("@SERVER_FINGERPRINT@"), "{text}");
        let text = text.replace("@SERVER_FINGERPRINT@", &"ab".repeat(32));
        let config = berth::config::Config::parse(&text).unwrap_or_else(|e| {
            panic!("{case}: berth refuses the chart's berth.yaml: {e}\n{text}")
        });
        config.validate().unwrap_or_else(|e| {
            panic!("{case}: berth refuses the chart's berth.yaml: {e}\n{text}")
        });
        assert!(text.contains("dataDir: /var/lib/berth"), "{text}");

        let deployment = manifest(out.path(), case, "Deployment");
        let spec = &deployment["spec"];
        assert_eq!(
            spec["replicas"],
            Value::from(1),
            "{case}: SQLite has one writer"
        );
        assert_eq!(str_at(spec, &["strategy", "type"]), "Recreate");
        let pod = &spec["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], Value::from(true));
        let container = &pod["containers"][0];
        assert_eq!(
            str_at(container, &["livenessProbe", "httpGet", "path"]),
            "/livez"
        );
        assert_eq!(
            str_at(container, &["readinessProbe", "httpGet", "path"]),
            "/readyz"
        );
        assert_eq!(
            container["securityContext"]["allowPrivilegeEscalation"],
            Value::from(false)
        );
        let mounts = serde_yaml::to_string(&container["volumeMounts"]).unwrap();
        assert!(mounts.contains("/var/lib/berth"), "{mounts}");

        let notes = std::fs::read_to_string(out.path().join(case).join("NOTES.txt")).unwrap();
        assert!(
            notes.contains("/livez") && notes.contains("helm test"),
            "{notes}"
        );
    }

    // Only the non-default case asked for the Prometheus operator's objects.
    let rule = manifest(out.path(), "non-default", "PrometheusRule");
    let alerts: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_path("examples/monitoring/alerts.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        rule["spec"]["groups"], alerts["groups"],
        "the PrometheusRule is not examples/monitoring/alerts.yaml"
    );
    let monitor = manifest(out.path(), "non-default", "ServiceMonitor");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(str_at(endpoint, &["path"]), "/metrics");
    // The rules ask for job="berth", whatever the release is named.
    assert_eq!(str_at(&endpoint["relabelings"][0], &["targetLabel"]), "job");
    assert_eq!(
        str_at(&endpoint["relabelings"][0], &["replacement"]),
        "berth"
    );
    let defaults: Vec<String> = std::fs::read_dir(out.path().join("default"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !defaults
            .iter()
            .any(|n| n.starts_with("ServiceMonitor-") || n.starts_with("PrometheusRule-")),
        "serviceMonitor and prometheusRule are off by default: {defaults:?}"
    );
}
