//! Bootstrapped: for every profile of a project, the CLI verified (and installed where the
//! profile says how), non-secret runtime assets and credentials placed, and berth's own support
//! files (runner wrapper, offline agent) pushed. Nothing under /workspace is written here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use berth_api::files::{WORKSPACE_DIR, absolute_path, is_within};
use berth_api::{AgentProfileSpec, FileMode};

use super::exec::{
    exit_failure, output_tail, parent_dir, run_script, run_script_with_env, shell_quote, write_file,
};
use super::{
    ADAPTER_PATH, AgentError, CREDENTIALS_FILE_NAME, NamedProfile, RUN_DIR, RUNNER_WRAPPER_PATH,
    Result, SHELL_AGENT_PATH, SUPPORT_DIR,
};
use crate::runtime::Runtime;

const REASON: &str = "InstallFailed";

/// How long a profile's `install.command` may run (npm installs are slow on a busy host).
pub const INSTALL_TIMEOUT: Duration = Duration::from_secs(20 * 60);
const PREPARE_TIMEOUT: Duration = Duration::from_secs(60);

/// The offline agent the `shell` profile runs.
pub const SHELL_AGENT_SCRIPT: &str = include_str!("shell-agent.sh");
/// Wraps every runner: appends its output to the capped runner log.
pub const RUNNER_WRAPPER_SCRIPT: &str = include_str!("runner.sh");
/// Runs the CLIs of the other runner protocols and keeps the status contract for them.
pub const ADAPTER_SCRIPT: &str = include_str!("adapter.js");

/// Whether a profile's CLI was there already or had to be installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallOutcome {
    /// `install.check` passed at once.
    Present,
    /// `install.check` failed, `install.command` ran, and the check passes now.
    Installed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileBootstrap {
    pub profile: String,
    pub install: InstallOutcome,
    /// The version the profile says its install command installs.
    pub version: Option<String>,
    /// The first line `install.check` printed (`2.1.90 (Claude Code)`), as untrusted text.
    pub reported: Option<String>,
    /// Runtime assets written (paths).
    pub assets: Vec<String>,
    /// Secret keys placed in the profile's credentials file (never the values).
    pub credentials: Vec<String>,
}

/// What a bootstrap did, for events: one entry per profile, plus warnings about optional parts
/// that could not be done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootstrapReport {
    pub profiles: Vec<ProfileBootstrap>,
    pub warnings: Vec<String>,
    /// Best-effort profiles (listed only in `agents`) that failed, with why; the project goes
    /// on without them.
    pub failed: Vec<(String, String)>,
}

/// Bootstraps the project's own agent profile `agent`, which must succeed (its failure is the
/// step's), then every other profile on its own, best effort: one that fails for good (install,
/// credentials, an invalid spec) is listed in [`BootstrapReport::failed`] and blocks nothing.
/// A transient failure (LXD unreachable, a timeout) fails the step, to be retried.
pub async fn bootstrap_best_effort(
    rt: &dyn Runtime,
    instance: &str,
    agent: Option<&str>,
    profiles: &[NamedProfile<'_>],
    secrets: &BTreeMap<String, String>,
) -> Result<BootstrapReport> {
    let (required, optional): (Vec<_>, Vec<_>) = profiles
        .iter()
        .copied()
        .partition(|(name, _)| Some(*name) == agent);
    let mut report = bootstrap(rt, instance, &required, secrets).await?;
    for profile in optional {
        match bootstrap(rt, instance, &[profile], secrets).await {
            Ok(one) => {
                report.profiles.extend(one.profiles);
                report.warnings.extend(one.warnings);
            }
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => report.failed.push((profile.0.to_string(), e.to_string())),
        }
    }
    Ok(report)
}

/// Converges every profile in `profiles` in the container. Idempotent: a second run finds the
/// CLIs present and rewrites the same files. `secrets` are the project's secret values by key;
/// a credential a profile names that is missing fails the step before anything is written.
pub async fn bootstrap(
    rt: &dyn Runtime,
    instance: &str,
    profiles: &[NamedProfile<'_>],
    secrets: &BTreeMap<String, String>,
) -> Result<BootstrapReport> {
    let mut plans = Vec::with_capacity(profiles.len());
    for (name, spec) in profiles {
        plans.push(ProfilePlan::new(name, spec, secrets)?);
    }

    prepare(rt, instance, &plans).await?;

    let mut report = BootstrapReport::default();
    let mut modes: Vec<(u32, String)> = Vec::new();
    for plan in &plans {
        let (install, reported) = install(rt, instance, plan).await?;
        for asset in &plan.assets {
            write_file(
                rt,
                instance,
                REASON,
                &asset.path,
                &asset.content,
                asset.mode,
            )
            .await?;
        }
        let credentials_path = format!("{}/{CREDENTIALS_FILE_NAME}", plan.home);
        if plan.credentials.is_empty() {
            // A profile that no longer needs credentials keeps none lying around.
            if let Err(e) = rt.file_delete(instance, &credentials_path).await {
                report.warnings.push(format!(
                    "agent profile {}: could not remove {credentials_path}: {e}",
                    plan.name
                ));
            }
        } else {
            let content = credentials_file(&plan.credentials);
            write_file(
                rt,
                instance,
                REASON,
                &credentials_path,
                content.as_bytes(),
                0o600,
            )
            .await?;
            modes.push((0o600, credentials_path));
        }
        report.profiles.push(ProfileBootstrap {
            profile: plan.name.clone(),
            install,
            version: plan.spec.install.version.clone(),
            reported,
            assets: plan.assets.iter().map(|a| a.path.clone()).collect(),
            credentials: plan.credentials.keys().cloned().collect(),
        });
    }
    set_modes(rt, instance, &modes).await?;
    Ok(report)
}

/// Rewrites every profile's credentials file from the current secrets, checking and installing
/// nothing: for secrets propagation after the bootstrap. A key no longer set is dropped from the
/// file (a profile left with none has no file); the keys missing are returned as
/// `profile/KEY` for a warning, since the next bootstrap fails on them anyway.
pub async fn sync_credentials(
    rt: &dyn Runtime,
    instance: &str,
    profiles: &[NamedProfile<'_>],
    secrets: &BTreeMap<String, String>,
) -> Result<Vec<String>> {
    let mut missing = Vec::new();
    let mut modes = Vec::new();
    for (name, spec) in profiles {
        let home = absolute_path(&spec.home).map_err(|message| AgentError::InvalidProfile {
            profile: name.to_string(),
            field: "spec.home".to_string(),
            message,
        })?;
        let mut present = BTreeMap::new();
        for cred in &spec.credentials {
            match secrets.get(&cred.secret) {
                Some(value) => {
                    present.insert(cred.secret.clone(), value.clone());
                }
                None => missing.push(format!("{name}/{}", cred.secret)),
            }
        }
        let path = format!("{home}/{CREDENTIALS_FILE_NAME}");
        if present.is_empty() {
            rt.file_delete(instance, &path)
                .await
                .map_err(|source| AgentError::Runtime {
                    reason: REASON,
                    what: format!("delete {path} in {instance}"),
                    source,
                })?;
        } else {
            let content = credentials_file(&present);
            write_file(rt, instance, REASON, &path, content.as_bytes(), 0o600).await?;
            modes.push((0o600, path));
        }
    }
    set_modes(rt, instance, &modes).await?;
    Ok(missing)
}

/// One profile, checked and resolved before anything is written.
struct ProfilePlan<'a> {
    name: String,
    spec: &'a AgentProfileSpec,
    home: String,
    assets: Vec<Asset>,
    credentials: BTreeMap<String, String>,
}

struct Asset {
    path: String,
    content: Vec<u8>,
    mode: u32,
}

impl<'a> ProfilePlan<'a> {
    fn new(
        name: &str,
        spec: &'a AgentProfileSpec,
        secrets: &BTreeMap<String, String>,
    ) -> Result<ProfilePlan<'a>> {
        let invalid = |field: &str, message: String| AgentError::InvalidProfile {
            profile: name.to_string(),
            field: field.to_string(),
            message,
        };
        // Validated at apply already; checked again because a profile runs as root in every
        // project that uses it, and a stored object may predate a rule.
        let home = absolute_path(&spec.home).map_err(|e| invalid("spec.home", e))?;
        if home == "/" || is_within(&home, WORKSPACE_DIR) {
            return Err(invalid(
                "spec.home",
                format!("{home:?} must not be / nor lie under {WORKSPACE_DIR}"),
            ));
        }
        if spec.install.check.trim().is_empty() {
            return Err(invalid("spec.install.check", "required".to_string()));
        }
        let mut assets = Vec::new();
        for (i, asset) in spec.runtime_assets.iter().enumerate() {
            let field = format!("spec.runtimeAssets[{i}].path");
            let path = absolute_path(&asset.path).map_err(|e| invalid(&field, e))?;
            if path == home || !is_within(&path, &home) {
                return Err(invalid(
                    &field,
                    format!("{path:?} must lie under home {home}"),
                ));
            }
            assets.push(Asset {
                path,
                content: asset.content.clone().into_bytes(),
                mode: asset.mode.map_or(0o644, FileMode::bits),
            });
        }
        let mut credentials = BTreeMap::new();
        for cred in &spec.credentials {
            let Some(value) = secrets.get(&cred.secret) else {
                return Err(AgentError::CredentialMissing {
                    profile: name.to_string(),
                    key: cred.secret.clone(),
                });
            };
            credentials.insert(cred.secret.clone(), value.clone());
        }
        Ok(ProfilePlan {
            name: name.to_string(),
            spec,
            home,
            assets,
            credentials,
        })
    }
}

/// `export KEY='value'` lines, for `. <home>/.berth-credentials.env` in a shell.
fn credentials_file(credentials: &BTreeMap<String, String>) -> String {
    let mut out = String::from("# Written by berth from the project's secrets; do not edit.\n");
    for (key, value) in credentials {
        out.push_str(&format!("export {key}={}\n", shell_quote(value)));
    }
    out
}

/// One round trip: berth's directories, its support files (replaced by rename only when they
/// changed, so a running agent never reads a half-rewritten script), and the directories every
/// profile's files go into.
async fn prepare(rt: &dyn Runtime, instance: &str, plans: &[ProfilePlan<'_>]) -> Result<()> {
    const SCRIPT: &str = r#"
set -eu
place() {
    tmp="$1.berth-new"
    printf '%s' "$3" > "$tmp"
    chmod "$2" "$tmp"
    if cmp -s "$tmp" "$1" 2>/dev/null; then rm -f "$tmp"; else mv -f "$tmp" "$1"; fi
}
mkdir -p "$SUPPORT_DIR" /var/log/berth "$RUN_DIR"
place "$SHELL_AGENT" 0755 "$1"
place "$RUNNER" 0755 "$2"
place "$ADAPTER" 0755 "$3"
shift 3
for dir in "$@"; do mkdir -p "$dir"; done
"#;
    let mut dirs = BTreeSet::new();
    for plan in plans {
        dirs.insert(plan.home.clone());
        for asset in &plan.assets {
            dirs.insert(parent_dir(&asset.path).to_string());
        }
    }
    let mut args = vec![SHELL_AGENT_SCRIPT, RUNNER_WRAPPER_SCRIPT, ADAPTER_SCRIPT];
    args.extend(dirs.iter().map(String::as_str));
    let env = BTreeMap::from([
        ("SUPPORT_DIR".to_string(), SUPPORT_DIR.to_string()),
        ("RUN_DIR".to_string(), RUN_DIR.to_string()),
        ("SHELL_AGENT".to_string(), SHELL_AGENT_PATH.to_string()),
        ("RUNNER".to_string(), RUNNER_WRAPPER_PATH.to_string()),
        ("ADAPTER".to_string(), ADAPTER_PATH.to_string()),
    ]);
    let out =
        run_script_with_env(rt, instance, REASON, SCRIPT, &args, &env, PREPARE_TIMEOUT).await?;
    if !out.success() {
        return Err(AgentError::InstallFailed {
            profile: "(berth support files)".to_string(),
            message: exit_failure("preparing directories", &out),
        });
    }
    Ok(())
}

/// The file API sets a mode only when it creates a file: one round trip sets it on every file
/// written, also on ones that existed.
async fn set_modes(rt: &dyn Runtime, instance: &str, modes: &[(u32, String)]) -> Result<()> {
    if modes.is_empty() {
        return Ok(());
    }
    const SCRIPT: &str = r#"
while [ "$#" -gt 1 ]; do
    chmod "$1" "$2" || exit 1
    shift 2
done
"#;
    let mut args = Vec::with_capacity(modes.len() * 2);
    for (mode, path) in modes {
        args.push(format!("{mode:o}"));
        args.push(path.clone());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_script(rt, instance, REASON, SCRIPT, &args, PREPARE_TIMEOUT).await?;
    if !out.success() {
        return Err(AgentError::InstallFailed {
            profile: "(file modes)".to_string(),
            message: exit_failure("chmod", &out),
        });
    }
    Ok(())
}

/// One round trip per profile: the check, and when it fails the install command (under a lock,
/// so an install still running from a timed-out attempt is waited for, not started twice)
/// followed by the check again. Returns what the passing check printed first, for a version.
async fn install(
    rt: &dyn Runtime,
    instance: &str,
    plan: &ProfilePlan<'_>,
) -> Result<(InstallOutcome, Option<String>)> {
    const SCRIPT: &str = r#"
check=$1 install=$2 lock=$3
passes() {
    out=$(sh -c "$check" 2>/dev/null) || return 1
    printf 'reported %s\n' "$(printf '%s\n' "$out" | head -n 1)"
}
if passes; then echo present; exit 0; fi
if [ -z "$install" ]; then
    echo "install.check failed and the profile has no install.command:" >&2
    sh -c "$check" 1>&2
    exit 20
fi
if command -v flock >/dev/null 2>&1; then
    exec 9>"$lock"
    flock -w 1800 9 || true
fi
if passes; then echo present; exit 0; fi
if ! sh -c "$install" 1>&2; then echo "install.command failed" >&2; exit 21; fi
if ! passes; then
    sh -c "$check" 1>&2
    echo "install.check still fails after install.command" >&2
    exit 22
fi
echo installed
"#;
    let install = plan.spec.install.command.as_deref().unwrap_or("");
    let lock = format!("{RUN_DIR}/install-{}.lock", plan.name);
    let args = [plan.spec.install.check.as_str(), install, lock.as_str()];
    let out = run_script(rt, instance, REASON, SCRIPT, &args, INSTALL_TIMEOUT).await?;
    let said = out.stdout_str();
    let reported = said
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("reported "))
        .map(|v| {
            super::sanitize_untrusted(v)
                .chars()
                .take(80)
                .collect::<String>()
        })
        .filter(|v| !v.is_empty());
    match (out.exit_code, said.lines().last()) {
        (0, Some("present")) => Ok((InstallOutcome::Present, reported)),
        (0, Some("installed")) => Ok((InstallOutcome::Installed, reported)),
        (code, _) => Err(AgentError::InstallFailed {
            profile: plan.name.clone(),
            message: format!("exit {code}: {}", output_tail(&out, 5)),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_api::{CredentialRef, RuntimeAsset};

    fn spec() -> AgentProfileSpec {
        AgentProfileSpec {
            home: "/root/.claude".into(),
            install: berth_api::AgentInstall {
                check: "true".into(),
                command: None,
                version: None,
            },
            credentials: vec![CredentialRef {
                secret: "API_KEY".into(),
            }],
            runtime_assets: vec![RuntimeAsset {
                path: "/root/.claude/settings.json".into(),
                content: "{}".into(),
                mode: None,
            }],
            ..AgentProfileSpec::default()
        }
    }

    #[test]
    fn a_missing_credential_names_the_key_not_a_value() {
        let secrets = BTreeMap::from([("OTHER".to_string(), "s3cr3t".to_string())]);
        let spec = spec();
        let err = ProfilePlan::new("claude", &spec, &secrets).err().unwrap();
        assert_eq!(err.reason(), "CredentialMissing");
        let text = err.to_string();
        assert!(
            text.contains("API_KEY") && !text.contains("s3cr3t"),
            "{text}"
        );
    }

    #[test]
    fn assets_outside_home_are_refused() {
        let mut spec = spec();
        spec.credentials.clear();
        for bad in ["/etc/passwd", "/root/.claude", "/root/.claude/../x", "rel"] {
            spec.runtime_assets[0].path = bad.into();
            let err = ProfilePlan::new("claude", &spec, &BTreeMap::new())
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            assert_eq!(err.reason(), "InvalidProfile", "{bad}: {err}");
        }
        spec.home = "/workspace/.claude".into();
        spec.runtime_assets.clear();
        let err = ProfilePlan::new("claude", &spec, &BTreeMap::new())
            .err()
            .unwrap();
        assert_eq!(err.reason(), "InvalidProfile");
    }

    #[test]
    fn credentials_file_quotes_values_for_a_shell() {
        let creds = BTreeMap::from([
            ("A".to_string(), "x'y".to_string()),
            ("B".to_string(), "$HOME".to_string()),
        ]);
        let text = credentials_file(&creds);
        assert!(text.contains("export A='x'\\''y'\n"), "{text}");
        assert!(text.contains("export B='$HOME'\n"), "{text}");
    }
}
