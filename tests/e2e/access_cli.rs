//! `berth user`, `berth members` and `berth secret` as a user types them, against a real daemon:
//! the local admin on the unix socket, users with tokens over TCP.

use crate::support::cli::{berth, client, collect};
use crate::support::daemon::Daemon;
use serde_json::json;

#[test]
fn users_members_and_secrets_from_the_command_line() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let socket = daemon.socket.to_str().unwrap().to_string();
    let url = format!("http://{}", daemon.tcp_addr());
    let local = |args: &[&str], stdin: &[u8]| {
        let mut all = vec!["--server", socket.as_str()];
        all.extend_from_slice(args);
        berth(&all, stdin)
    };

    // The token is alone on stdout, once.
    let added = local(&["user", "add", "cleo"], b"");
    assert!(added.success(), "{}", added.stderr);
    let token = added.stdout.trim().to_string();
    assert!(
        token.starts_with("berth_") && !token.contains('\n'),
        "{token:?}"
    );
    assert!(added.stderr.contains("shown this once"), "{}", added.stderr);
    let listed = local(&["user", "list"], b"");
    assert!(
        listed.success() && listed.stdout.contains("cleo"),
        "{}",
        listed.stdout
    );
    assert!(!listed.stdout.contains(&token));
    let bad = local(&["user", "add", "Not_A_Name"], b"");
    assert!(
        !bad.success() && bad.stderr.contains("NAME"),
        "{}",
        bad.stderr
    );

    // The token from a file, as `ps` would otherwise show it.
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("cleo.token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let token_path = token_file.to_str().unwrap().to_string();
    let as_cleo = |args: &[&str], stdin: &[u8]| {
        let mut all = vec![
            "--server",
            url.as_str(),
            "--token-file",
            token_path.as_str(),
        ];
        all.extend_from_slice(args);
        berth(&all, stdin)
    };
    let whoami = as_cleo(&["get", "projects"], b"");
    assert!(whoami.success(), "{}", whoami.stderr);
    assert!(!whoami.stderr.contains("warning"), "{}", whoami.stderr);
    // On the command line it works too, with a warning that others can read it.
    let flagged = berth(
        &["--server", &url, "--token", &token, "get", "projects"],
        b"",
    );
    assert!(flagged.success(), "{}", flagged.stderr);
    assert!(
        flagged
            .stderr
            .contains("warning: --token on the command line is visible"),
        "{}",
        flagged.stderr
    );
    // BERTH_TOKEN_FILE, and a clear refusal when two tokens are given.
    let args = ["--server", &url, "get", "projects"];
    let mut from_env = client(&args);
    from_env.env("BERTH_TOKEN_FILE", &token_file);
    let from_env = collect(from_env.spawn().expect("run berth"), &args);
    assert!(from_env.status.success(), "{from_env:?}");
    assert!(
        !String::from_utf8_lossy(&from_env.stderr).contains("warning"),
        "{from_env:?}"
    );
    let both = berth(
        &[
            "--server",
            &url,
            "--token-file",
            &token_path,
            "--token",
            "x",
            "get",
            "projects",
        ],
        b"",
    );
    assert!(!both.success());
    assert!(both.stderr.contains("use one"), "{}", both.stderr);
    let empty = token_dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let empty = berth(
        &[
            "--server",
            &url,
            "--token-file",
            empty.to_str().unwrap(),
            "get",
            "projects",
        ],
        b"",
    );
    assert!(!empty.success());
    assert!(
        empty.stderr.contains("--token-file") && empty.stderr.contains("empty"),
        "{}",
        empty.stderr
    );
    let reply = daemon.client().post_json(
        "/apis/berth.dev/v1alpha1/projects",
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                "metadata": {"name": "cli-shared"}, "spec": {}}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());

    // Not a member yet: told what a name nobody holds would get.
    let refused = as_cleo(&["secret", "list", "cli-shared"], b"");
    assert!(!refused.success(), "{}", refused.stdout);
    assert!(
        refused
            .stderr
            .contains("Error from server (NotFound): Project \"cli-shared\" not found"),
        "{}",
        refused.stderr
    );

    let add = local(&["members", "add", "cli-shared", "cleo"], b"");
    assert!(add.success(), "{}", add.stderr);
    let members = as_cleo(&["members", "list", "cli-shared"], b"");
    assert!(members.success(), "{}", members.stderr);
    let names: Vec<&str> = members.stdout.lines().collect();
    assert!(names.contains(&"cleo"), "{names:?}");
    let creator = names
        .iter()
        .find(|n| n.starts_with("unix:"))
        .expect("the creator is a member")
        .to_string();

    // A value from stdin loses its one trailing newline; from a file it is kept as is.
    let set = as_cleo(
        &["secret", "set", "cli-shared", "API_TOKEN"],
        b"from-stdin\n",
    );
    assert!(set.success(), "{}", set.stderr);
    let file = daemon.dir.path().join("value.txt");
    std::fs::write(&file, "from-file\n").unwrap();
    let set = as_cleo(
        &[
            "secret",
            "set",
            "cli-shared",
            "FILE_VALUE",
            "--from-file",
            file.to_str().unwrap(),
        ],
        b"",
    );
    assert!(set.success(), "{}", set.stderr);
    let api = daemon.client();
    let value = |key: &str| {
        api.get(&format!(
            "/apis/berth.dev/v1alpha1/projects/cli-shared/secrets/{key}"
        ))
        .json()["value"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(value("API_TOKEN"), "from-stdin");
    assert_eq!(value("FILE_VALUE"), "from-file\n");
    let list = as_cleo(&["secret", "list", "cli-shared"], b"");
    assert!(list.success(), "{}", list.stderr);
    assert!(list.stdout.starts_with("KEY"), "{}", list.stdout);
    assert!(list.stdout.contains("API_TOKEN") && list.stdout.contains("FILE_VALUE"));
    assert!(!list.stdout.contains("from-"), "{}", list.stdout);
    let bad_key = as_cleo(&["secret", "set", "cli-shared", "bad-key"], b"x");
    assert!(
        !bad_key.success() && bad_key.stderr.contains("KEY"),
        "{}",
        bad_key.stderr
    );
    let deleted = as_cleo(&["secret", "delete", "cli-shared", "API_TOKEN"], b"");
    assert!(deleted.success(), "{}", deleted.stderr);
    let again = as_cleo(&["secret", "delete", "cli-shared", "API_TOKEN"], b"");
    assert!(
        !again.success() && again.stderr.contains("NotFound"),
        "{}",
        again.stderr
    );

    // Members manage members, a local user included (its name travels percent-encoded), but
    // the last one stays unless an admin removes it.
    let removed = as_cleo(&["members", "remove", "cli-shared", &creator], b"");
    assert!(removed.success(), "{}", removed.stderr);
    let last = as_cleo(&["members", "remove", "cli-shared", "cleo"], b"");
    assert!(
        !last.success() && last.stderr.contains("last member"),
        "{}",
        last.stderr
    );
    let readd = as_cleo(&["members", "add", "cli-shared", &creator], b"");
    assert!(readd.success(), "{}", readd.stderr);

    // A removed user's token stops working.
    let gone = local(&["user", "remove", "cleo"], b"");
    assert!(gone.success(), "{}", gone.stderr);
    let after = as_cleo(&["members", "list", "cli-shared"], b"");
    assert!(
        !after.success() && after.stderr.contains("Unauthorized"),
        "{}",
        after.stderr
    );
}
