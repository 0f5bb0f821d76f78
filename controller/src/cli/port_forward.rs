//! `berth port-forward NAME [LOCAL:]REMOTE`: a local port that reaches a port inside a
//! project's container, for clients without the preview domain's DNS, as `kubectl
//! port-forward` does. Each local connection is carried to the daemon over its own websocket
//! (`GET .../projects/NAME/portforward?port=REMOTE`) and relayed there to the port. Runs until
//! interrupted.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use berth_api::Kind;
use clap::Args;

use super::Context;
use super::exec::connect;
use crate::client::{API_PREFIX, encode_segment};

#[derive(Debug, Args)]
pub struct PortForwardArgs {
    /// The project.
    name: String,
    /// `REMOTE` (the same port locally), `LOCAL:REMOTE`, or `:REMOTE` / `0:REMOTE` for a free
    /// local port, printed when listening.
    ports: String,
    /// The local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    address: IpAddr,
}

/// `[LOCAL:]REMOTE` as (local, remote); local 0 picks a free port.
fn parse_ports(text: &str) -> anyhow::Result<(u16, u16)> {
    let port = |what: &str, value: &str, zero: bool| -> anyhow::Result<u16> {
        match value.parse::<u16>() {
            Ok(0) if !zero => bail!("{what}: 0 is not a port in {text:?}"),
            Ok(port) => Ok(port),
            Err(_) => bail!("{what}: {value:?} is not a port number in {text:?}"),
        }
    };
    match text.split_once(':') {
        None => {
            let remote = port("REMOTE", text, false)?;
            Ok((remote, remote))
        }
        Some(("", remote)) => Ok((0, port("REMOTE", remote, false)?)),
        Some((local, remote)) => Ok((port("LOCAL", local, true)?, port("REMOTE", remote, false)?)),
    }
}

pub async fn run(context: &Context, args: PortForwardArgs) -> anyhow::Result<ExitCode> {
    let (local, remote) = parse_ports(&args.ports)?;
    let client = context.client()?;
    // A project the caller cannot see fails here, before anything listens.
    client.get(Kind::Project, &args.name).await?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(args.address, local))
        .await
        .with_context(|| format!("listening on {}", SocketAddr::new(args.address, local)))?;
    let bound = listener.local_addr().context("reading the local address")?;
    println!("Forwarding from {bound} -> {remote}");
    let path = format!(
        "{API_PREFIX}/projects/{}/portforward?port={remote}",
        encode_segment(&args.name)
    );
    loop {
        let accepted = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            accepted = listener.accept() => accepted,
        };
        let (stream, _) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                eprintln!("port-forward: accepting a connection: {e}");
                continue;
            }
        };
        println!(
            "Handling connection for {local_port}",
            local_port = bound.port()
        );
        let server = client.server().clone();
        let token = context.global.token.clone();
        let authority = context.global.certificate_authority.clone();
        let path = path.clone();
        tokio::spawn(async move {
            match connect(&server, token.as_deref(), authority.as_deref(), &path).await {
                Ok(socket) => crate::preview::relay::relay(socket, stream).await,
                Err(e) => eprintln!("port-forward: {e:#}"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ports read, or the start of the error.
    type Read = Result<(u16, u16), &'static str>;

    #[test]
    fn ports_read_as_kubectl_reads_them() {
        let table: [(&str, Read); 8] = [
            ("8000", Ok((8000, 8000))),
            ("9000:8000", Ok((9000, 8000))),
            (":8000", Ok((0, 8000))),
            ("0:8000", Ok((0, 8000))),
            ("0", Err("REMOTE")),
            ("8000:", Err("REMOTE")),
            ("x:8000", Err("LOCAL")),
            ("70000", Err("REMOTE")),
        ];
        for (text, want) in table {
            match (parse_ports(text), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text}"),
                (Err(e), Err(field)) => assert!(e.to_string().starts_with(field), "{text}: {e}"),
                (got, want) => panic!("{text}: {got:?}, wanted {want:?}"),
            }
        }
    }
}
