//! `status.ports`: the ports a workspace listens on and the preview URLs that reach them.

use berth_api::PortStatus;

/// One entry per port, `http://<name>--<port>.<previewDomain>`, in port order.
pub fn port_statuses(project: &str, ports: &[u16], preview_domain: &str) -> Vec<PortStatus> {
    let domain = preview_domain.trim().trim_matches('.');
    let mut ports = ports.to_vec();
    ports.sort_unstable();
    ports.dedup();
    ports
        .into_iter()
        .map(|port| PortStatus {
            port,
            url: format!("http://{project}--{port}.{domain}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_project_and_port() {
        let got = port_statuses("payments-api", &[8080, 3000, 3000], "localhost");
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
            port_statuses("web", &[5173], ".dev.example.")[0].url,
            "http://web--5173.dev.example"
        );
        assert!(port_statuses("web", &[], "localhost").is_empty());
    }
}
