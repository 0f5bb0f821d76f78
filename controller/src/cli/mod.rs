//! The `berth` command line: one module per subcommand, dispatched from [`Command`].
//!
//! Adding a subcommand: a module with an `Args` struct (clap derive) and an
//! `async fn run(&Context, Args) -> anyhow::Result<ExitCode>`, one variant here, one dispatch arm.
//!
//! The subcommands: `apply`, `diff`, `delete`, `get`, `describe`, `create`, `power` (start, stop,
//! restart), `wait`, `events`, `logs`, `exec`, `answer`, `tool`, `mcp`, `reap`, `reconcile`,
//! `ports`, `port_forward`, `secret`, `members`, `user`, `gitsource`, `trash`, `restore`,
//! `checkout` (`--force`: a held checkout goes ahead), `rename`, `repair_network`, `ide`, `serve`,
//! `version`, `completion` and `ui` (the console on a loopback port, carrying only `/ui/` to the
//! unix socket). Their shared parts: `manifest.rs` (`-f` files, directories and stdin over
//! `crate::manifests`, a server's field paths pointed back at the document they came from),
//! `progress.rs` (waiting on objects), `render.rs` (`-o` formats, columns, ages), `table.rs`,
//! `jsonpath.rs`, `colour.rs`, `textdiff.rs` (unified diffs by `similar`) and `duration.rs`.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::client::{Client, ClientError, Server};

mod answer;
mod apply;
mod checkout;
mod colour;
mod completion;
mod create;
mod delete;
mod describe;
mod diff;
mod duration;
mod events;
mod exec;
mod get;
mod gitsource;
mod ide;
mod jsonpath;
mod logs;
mod manifest;
mod mcp;
mod members;
mod port_forward;
mod ports;
mod power;
mod progress;
mod reap;
mod reconcile;
mod rename;
mod render;
mod repair_network;
mod restore;
mod secret;
mod serve;
mod table;
mod textdiff;
mod tool;
mod trash;
mod ui;
mod user;
mod version;
mod wait;

#[derive(Debug, Parser)]
#[command(
    name = "berth",
    version,
    about = "Durable LXD workspaces for AI coding agents"
)]
pub struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

/// Options every client subcommand shares.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// The berth server: a unix socket path or an http(s) URL [default: the local daemon's socket]
    #[arg(
        long,
        global = true,
        env = "BERTH_SERVER",
        hide_env_values = true,
        value_name = "SOCKET|URL"
    )]
    server: Option<String>,
    /// Bearer token for a TCP server. On the command line it is visible to every user of the
    /// host (`ps`); prefer --token-file or the environment.
    #[arg(long, global = true, env = "BERTH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A file holding the bearer token (surrounding whitespace ignored).
    #[arg(
        long,
        global = true,
        env = "BERTH_TOKEN_FILE",
        hide_env_values = true,
        value_name = "FILE"
    )]
    token_file: Option<std::path::PathBuf>,
    /// PEM certificate(s) to trust for an https server instead of the system roots.
    #[arg(
        long,
        global = true,
        env = "BERTH_CA_CERT",
        hide_env_values = true,
        value_name = "PEM"
    )]
    certificate_authority: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon: API, store and controller.
    Serve(serve::ServeArgs),
    /// Create or update objects from manifests (files, directories or stdin).
    Apply(apply::ApplyArgs),
    /// List objects, or show one.
    Get(get::GetArgs),
    /// Show one object in detail: spec, status, conditions, container and recent events.
    Describe(describe::DescribeArgs),
    /// Delete objects by name or by manifest; waits until they are gone.
    Delete(delete::DeleteArgs),
    /// Show what `apply` would change (exit 0: no difference, 1: differences, >1: error).
    Diff(diff::DiffArgs),
    /// Wait for a condition on an object, or for its deletion.
    Wait(wait::WaitArgs),
    /// List recent events, for every object or for one.
    Events(events::EventsArgs),
    /// Run a command in a project's container (members only).
    Exec(exec::ExecArgs),
    /// Create an object from a few flags.
    Create(create::CreateArgs),
    /// Change a project's display name.
    Rename(rename::RenameArgs),
    /// Restart a project's container (or replace it with --recreate).
    Restart(power::RestartArgs),
    /// Stop a project's container.
    Stop(power::StopArgs),
    /// Start a stopped or idled project.
    Start(power::StartArgs),
    /// List the ports a project listens on beyond loopback, with their preview URLs.
    Ports(ports::PortsArgs),
    /// Forward a local port to a port inside a project's container (members only).
    PortForward(port_forward::PortForwardArgs),
    /// Start the IDE (code-server) in a project if it is not running and print its URL.
    Ide(ide::IdeArgs),
    /// Show what the reaper will do next to each project (`--dry-run`).
    Reap(reap::ReapArgs),
    /// List what deletions put in the trash (`trash list`).
    Trash(trash::TrashArgs),
    /// Bring a deleted project back from the trash.
    Restore(restore::RestoreArgs),
    /// Force a project's held checkout (`--force`), its workspace copied to the trash first.
    Checkout(checkout::CheckoutArgs),
    /// Re-apply the network configuration of a project's container and restart its networking.
    RepairNetwork(repair_network::RepairNetworkArgs),
    /// Print the client and server versions.
    Version(version::VersionArgs),
    /// Set, list or delete a project's secrets.
    Secret(secret::SecretArgs),
    /// Set, list or delete a GitSource's credentials (`gitsource secret`, admins only).
    Gitsource(gitsource::GitSourceArgs),
    /// Sync a GitSource now (`reconcile gitsource NAME`) and wait for the outcome.
    Reconcile(reconcile::ReconcileArgs),
    /// Run a workspace tool (Read, Glob, Grep, Write, Edit, Bash) in a project's container.
    Tool(tool::ToolArgs),
    /// Serve a project's workspace tools to a local agent over MCP (stdio).
    Mcp(mcp::McpArgs),
    /// List, add or remove a project's members.
    Members(members::MembersArgs),
    /// Add, list or remove users of the TCP listener (admins only).
    User(user::UserArgs),
    /// Answer a project's blocked agent.
    Answer(answer::AnswerArgs),
    /// Serve the web console on a loopback port for the local admin, printing a one-time
    /// sign-in URL.
    Ui(ui::UiArgs),
    /// Print the output of a project's agent runner.
    Logs(logs::LogsArgs),
    /// Print a shell completion script.
    Completion(completion::CompletionArgs),
    /// Print berth's man page (roff).
    #[command(hide = true)]
    Man(completion::ManArgs),
}

/// What a client subcommand needs: the parsed global options and a way to reach the server.
pub struct Context {
    global: GlobalArgs,
}

impl Context {
    /// Built on demand: `version --client` needs no server, and a bad `--server` is reported
    /// only by commands that use one.
    pub fn client(&self) -> Result<Client, ClientError> {
        // An empty BERTH_SERVER counts as unset, as shells make it easy to export one.
        let server = match self.global.server.as_deref().map(str::trim) {
            Some(value) if !value.is_empty() => Server::parse(value)?,
            _ => Server::Unix(crate::config::default_socket_path()),
        };
        let ca =
            match &self.global.certificate_authority {
                Some(path) => Some(std::fs::read(path).map_err(|source| {
                    ClientError::CertificateAuthority {
                        path: path.clone(),
                        source,
                    }
                })?),
                None => None,
            };
        Client::with_certificate_authority(server, self.token()?, ca.as_deref())
    }

    /// The bearer token: `--token`/`BERTH_TOKEN`, or read from `--token-file`/`BERTH_TOKEN_FILE`.
    fn token(&self) -> Result<Option<String>, ClientError> {
        let Some(path) = &self.global.token_file else {
            return Ok(self.global.token.clone());
        };
        if self.global.token.is_some() {
            return Err(ClientError::TwoTokens);
        }
        read_token_file(path).map(Some)
    }
}

/// The most a token file may hold: a token is well under a hundred bytes.
const TOKEN_FILE_LIMIT: u64 = 4096;

fn read_token_file(path: &std::path::Path) -> Result<String, ClientError> {
    use std::io::Read;
    let failed = |reason: String| ClientError::TokenFile {
        path: path.to_path_buf(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| failed(e.to_string()))?;
    let mut text = String::new();
    file.take(TOKEN_FILE_LIMIT + 1)
        .read_to_string(&mut text)
        .map_err(|e| failed(e.to_string()))?;
    if text.len() as u64 > TOKEN_FILE_LIMIT {
        return Err(failed(format!(
            "larger than {TOKEN_FILE_LIMIT} bytes; expected one token"
        )));
    }
    let token = text.trim();
    if token.is_empty() {
        return Err(failed("the file is empty".to_string()));
    }
    if token.contains(char::is_whitespace) {
        return Err(failed("expected one token on one line".to_string()));
    }
    Ok(token.to_string())
}

/// True when `--token` itself is on the command line (not from BERTH_TOKEN), where every user
/// of the host can read it; words after `--` belong to a command run elsewhere.
fn token_on_command_line(args: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    args.into_iter()
        .skip(1)
        .take_while(|arg| arg != "--")
        .any(|arg| {
            let arg = arg.to_string_lossy();
            arg == "--token" || arg.starts_with("--token=")
        })
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if token_on_command_line(std::env::args_os()) {
        eprintln!(
            "warning: --token on the command line is visible to every user of this host (ps); \
             use --token-file FILE or BERTH_TOKEN instead"
        );
    }
    let context = Context { global: cli.global };
    // The daemon's output goes to a log, and a panic there must never pass for a closed pipe.
    if !matches!(cli.command, Command::Serve(_)) {
        exit_quietly_on_broken_pipe();
    }
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Completion(args) => completion::run(args),
        Command::Man(args) => completion::man(args),
        command => run_client_command(&context, command),
    };
    match result {
        Ok(code) => code,
        // Whoever read the output went away (`| head`): end as quietly as a printing panic does.
        Err(err) if closed_pipe(&err) => ExitCode::from(BROKEN_PIPE_EXIT as u8),
        Err(err) => {
            report(&err);
            ExitCode::FAILURE
        }
    }
}

fn closed_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn run_client_command(context: &Context, command: Command) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match command {
            Command::Apply(args) => apply::run(context, args).await,
            Command::Get(args) => get::run(context, args).await,
            Command::Describe(args) => describe::run(context, args).await,
            Command::Delete(args) => delete::run(context, args).await,
            Command::Diff(args) => diff::run(context, args).await,
            Command::Wait(args) => wait::run(context, args).await,
            Command::Events(args) => events::run(context, args).await,
            Command::Exec(args) => exec::run(context, args).await,
            Command::Create(args) => create::run(context, args).await,
            Command::Rename(args) => rename::run(context, args).await,
            Command::Restart(args) => power::restart(context, args).await,
            Command::Stop(args) => power::stop(context, args).await,
            Command::Start(args) => power::start(context, args).await,
            Command::Ports(args) => ports::run(context, args).await,
            Command::PortForward(args) => port_forward::run(context, args).await,
            Command::Ide(args) => ide::run(context, args).await,
            Command::Reap(args) => reap::run(context, args).await,
            Command::Trash(args) => trash::run(context, args).await,
            Command::Restore(args) => restore::run(context, args).await,
            Command::Checkout(args) => checkout::run(context, args).await,
            Command::RepairNetwork(args) => repair_network::run(context, args).await,
            Command::Version(args) => version::run(context, args).await,
            Command::Secret(args) => secret::run(context, args).await,
            Command::Gitsource(args) => gitsource::run(context, args).await,
            Command::Reconcile(args) => reconcile::run(context, args).await,
            Command::Tool(args) => tool::run(context, args).await,
            Command::Mcp(args) => mcp::run(context, args).await,
            Command::Members(args) => members::run(context, args).await,
            Command::User(args) => user::run(context, args).await,
            Command::Answer(args) => answer::run(context, args).await,
            Command::Ui(args) => ui::run(context, args).await,
            Command::Logs(args) => logs::run(context, args).await,
            Command::Serve(_) | Command::Completion(_) | Command::Man(_) => {
                unreachable!("dispatched before the runtime starts")
            }
        }
    })
}

/// The exit status of a process ended by SIGPIPE, as a shell reports it.
const BROKEN_PIPE_EXIT: i32 = 128 + 13;

/// A reader that went away (`berth get projects | head -1`) ends the command quietly, as it
/// ends kubectl or coreutils. Rust ignores SIGPIPE, so printing to the closed pipe panics;
/// the hook turns that one panic into the exit a SIGPIPE would have caused, for every client
/// command.
fn exit_quietly_on_broken_pipe() {
    let broken_pipe = std::io::Error::from_raw_os_error(nix::libc::EPIPE).to_string();
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        let printing = message.starts_with("failed printing to stdout")
            || message.starts_with("failed printing to stderr");
        if printing && message.ends_with(&broken_pipe) {
            std::process::exit(BROKEN_PIPE_EXIT);
        }
        default(info);
    }));
}

/// A server `Status` prints as kubectl prints it, however deep it was wrapped; everything else
/// as `error: ...`.
pub(crate) fn report(err: &anyhow::Error) {
    let text = format!("{err:#}");
    if text.starts_with("Error from server (") {
        eprintln!("{text}");
    } else {
        eprintln!("error: {text}");
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_token_file_is_read_trimmed_and_refused_when_odd() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "  berth_abc123\n").unwrap();
        assert_eq!(super::read_token_file(&file).unwrap(), "berth_abc123");
        for (text, says) in [
            ("\n \n", "the file is empty"),
            ("berth_a\nberth_b\n", "one token on one line"),
        ] {
            std::fs::write(&file, text).unwrap();
            let err = super::read_token_file(&file).unwrap_err().to_string();
            assert!(
                err.starts_with("--token-file ") && err.contains(says),
                "{err}"
            );
        }
        let missing = super::read_token_file(&dir.path().join("nope"))
            .unwrap_err()
            .to_string();
        assert!(missing.starts_with("--token-file "), "{missing}");
    }

    #[test]
    fn only_a_token_given_on_the_command_line_is_warned_about() {
        let argv = |args: &[&str]| {
            args.iter()
                .map(std::ffi::OsString::from)
                .collect::<Vec<_>>()
        };
        let table: &[(&[&str], bool)] = &[
            (&["berth", "--token", "t", "get", "projects"], true),
            (&["berth", "get", "projects", "--token=t"], true),
            (&["berth", "--token-file", "f", "get", "projects"], false),
            (&["berth", "get", "projects"], false),
            (&["berth", "exec", "p", "--", "tool", "--token", "x"], false),
        ];
        for (args, warned) in table {
            assert_eq!(
                super::token_on_command_line(argv(args)),
                *warned,
                "{args:?}"
            );
        }
    }

    #[test]
    fn flags_parse_as_documented() {
        let accepted: &[&[&str]] = &[
            &[
                "berth",
                "apply",
                "-f",
                "a.yaml",
                "-f",
                "dir",
                "-R",
                "--dry-run",
            ],
            &[
                "berth",
                "apply",
                "-f",
                "-",
                "--prune",
                "--applyset",
                "fleet",
                "--wait",
                "--timeout",
                "10m",
            ],
            &["berth", "get", "projects", "-l", "team=a", "-o", "wide"],
            &["berth", "get", "project", "a", "-o", "yaml"],
            &[
                "berth",
                "delete",
                "project",
                "a",
                "b",
                "--force",
                "--wait=false",
            ],
            &["berth", "delete", "-f", "a.yaml"],
            &[
                "berth",
                "wait",
                "project/a",
                "--for=condition=Ready",
                "--timeout=5m",
            ],
            &["berth", "wait", "project", "a", "--for", "delete"],
            &["berth", "events", "project", "a"],
            &[
                "berth",
                "create",
                "project",
                "Payments API",
                "--agent",
                "shell",
                "--image",
                "berth-base",
                "--brief",
                "fix it",
            ],
            &["berth", "restart", "a", "--recreate"],
            &["berth", "--server", "/tmp/b.sock", "stop", "a"],
            &["berth", "start", "a", "--wait"],
            &[
                "berth",
                "diff",
                "-f",
                "dir",
                "-R",
                "--prune",
                "--applyset",
                "fleet",
            ],
            &["berth", "version"],
            &["berth", "completion", "zsh"],
        ];
        for args in accepted {
            if let Err(err) = Cli::try_parse_from(*args) {
                panic!("{args:?}: {err}");
            }
        }
        let rejected: &[&[&str]] = &[
            &["berth", "apply"],
            &["berth", "apply", "-f", "a.yaml", "--prune"],
            &["berth", "diff", "-f", "dir", "--prune"],
            &["berth", "get", "pods"],
            &["berth", "get", "projects", "-o", "table"],
            &["berth", "delete"],
            &["berth", "delete", "project", "a", "-f", "a.yaml"],
            &["berth", "wait", "project/a", "--for=ready"],
            &[
                "berth",
                "wait",
                "project/a",
                "--for=condition=Ready",
                "--timeout=soon",
            ],
            &["berth", "completion", "powershell"],
        ];
        for args in rejected {
            assert!(
                Cli::try_parse_from(*args).is_err(),
                "{args:?} should be rejected"
            );
        }
    }
}
