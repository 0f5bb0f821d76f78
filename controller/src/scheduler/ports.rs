//! `status.ports`: the ports a workspace listens on and the preview URLs that reach them.

use berth_api::PortStatus;

use crate::preview::PreviewSite;

/// One entry per port, `http://<name>--<port>.<previewDomain>[:<listener port>]`, in port order.
pub fn port_statuses(project: &str, ports: &[u16], site: &PreviewSite) -> Vec<PortStatus> {
    let mut ports = ports.to_vec();
    ports.sort_unstable();
    ports.dedup();
    ports
        .into_iter()
        .map(|port| PortStatus {
            port,
            url: site.url(project, port),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_project_and_port() {
        let got = port_statuses(
            "payments-api",
            &[8080, 3000, 3000],
            &PreviewSite::new("localhost", false, Some(80)),
        );
        assert_eq!(
            got,
            vec![
                PortStatus {
                    port: 3000,
                    url: "http://payments-api--3000.localhost".into()
                },
                PortStatus {
                    port: 8080,
                    url: "http://payments-api--8080.localhost".into()
                },
            ]
        );
        assert_eq!(
            port_statuses(
                "web",
                &[5173],
                &PreviewSite::new(".dev.example.", false, Some(80))
            )[0]
            .url,
            "http://web--5173.dev.example"
        );
        assert!(port_statuses("web", &[], &PreviewSite::new("localhost", false, None)).is_empty());
    }
}
