//! Preview URLs: `<name>--<port>.<previewDomain>` names a port inside a project's container,
//! and `<name>--ide.<previewDomain>` the project's IDE (code-server, `agent::ide`).
//! [`PreviewSite`] makes and reads those names (and the URLs `status.ports` shows),
//! [`tickets`] holds the one-time tickets and the sessions they open, and [`upstream`] reaches
//! the port through LXD. The listener itself, with its access check, is `api::preview`; the
//! API's port-forward relays to the same [`upstream`].

pub mod relay;
pub mod tickets;
pub mod upstream;

/// What a preview host leads to inside the project's container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `<name>--<port>`: that port.
    Port(u16),
    /// `<name>--ide`: the IDE.
    Ide,
}

/// The label after `--` that names the IDE.
const IDE_LABEL: &str = "ide";

/// What the preview listener and the API's port-forward share.
#[derive(Debug)]
pub struct Previews {
    pub site: PreviewSite,
    /// The preview listener is serving (`listen.preview` is set): tickets are worth issuing.
    pub listening: bool,
    pub tickets: tickets::Tickets,
    pub upstreams: upstream::Upstreams,
}

/// Where previews are served: the domain, and the scheme and port of the listener as clients
/// reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewSite {
    /// `previewDomain`, without surrounding dots, in lower case.
    domain: String,
    /// The listener speaks HTTPS.
    pub tls: bool,
    /// The listener's port; `None` when previews are not served here (the URL then carries no
    /// port, as before there was a listener).
    pub port: Option<u16>,
}

impl PreviewSite {
    pub fn new(domain: &str, tls: bool, port: Option<u16>) -> PreviewSite {
        PreviewSite {
            domain: domain.trim().trim_matches('.').to_ascii_lowercase(),
            tls,
            port,
        }
    }

    /// The host of a project's port, `<name>--<port>.<previewDomain>`.
    pub fn host(&self, project: &str, port: u16) -> String {
        self.target_host(project, Target::Port(port))
    }

    /// The host of a project's port or IDE (`<name>--ide.<previewDomain>`).
    pub fn target_host(&self, project: &str, target: Target) -> String {
        match target {
            Target::Port(port) => format!("{project}--{port}.{}", self.domain),
            Target::Ide => format!("{project}--{IDE_LABEL}.{}", self.domain),
        }
    }

    /// The URL of a project's port: the scheme, the host, and the listener's port when it is
    /// not the scheme's default.
    pub fn url(&self, project: &str, port: u16) -> String {
        self.target_url(project, Target::Port(port))
    }

    /// The URL of a project's port or IDE.
    pub fn target_url(&self, project: &str, target: Target) -> String {
        let (scheme, default) = if self.tls {
            ("https", 443)
        } else {
            ("http", 80)
        };
        let host = self.target_host(project, target);
        match self.port {
            Some(listener) if listener != default => format!("{scheme}://{host}:{listener}"),
            _ => format!("{scheme}://{host}"),
        }
    }

    /// Every preview host as a CSP source (`http://*.localhost:7481`): where the console's
    /// preview forms may send a browser.
    pub fn csp_source(&self) -> String {
        let any = self.url("*", 1);
        any.replacen("*--1.", "*.", 1)
    }

    /// The project and port (or IDE) a `Host` header names, and the host without its port;
    /// `None` for any other host.
    pub fn parse_host(&self, header: &str) -> Option<(String, Target, String)> {
        let header = header.trim().to_ascii_lowercase();
        // `name--8000.localhost:7481`: the listener's port is not part of the preview host.
        let host = match header.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => header.as_str(),
        };
        let host = host.trim_end_matches('.');
        let label = host.strip_suffix(&self.domain)?.strip_suffix('.')?;
        let (project, after) = label.rsplit_once("--")?;
        if project.is_empty() {
            return None;
        }
        let target = if after == IDE_LABEL {
            Target::Ide
        } else {
            let port: u16 = after.parse().ok().filter(|p| *p > 0)?;
            if port.to_string() != after {
                return None;
            }
            Target::Port(port)
        };
        Some((project.to_string(), target, host.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preview_host_is_one_csp_source() {
        let site = PreviewSite::new("localhost", false, Some(7481));
        assert_eq!(site.csp_source(), "http://*.localhost:7481");
        let site = PreviewSite::new("Dev.Example.", true, Some(443));
        assert_eq!(site.csp_source(), "https://*.dev.example");
    }

    #[test]
    fn the_ide_host_is_the_one_its_url_names_and_its_parse_reads() {
        let site = PreviewSite::new("localhost", false, Some(7481));
        assert_eq!(site.target_host("web", Target::Ide), "web--ide.localhost");
        assert_eq!(
            site.target_url("web", Target::Ide),
            "http://web--ide.localhost:7481"
        );
        let (project, target, host) = site.parse_host("web--ide.localhost:7481").unwrap();
        assert_eq!((project.as_str(), target), ("web", Target::Ide));
        assert_eq!(host, site.target_host("web", Target::Ide));
    }

    #[test]
    fn urls_carry_the_listeners_port_unless_it_is_the_default() {
        let table = [
            (false, Some(7481), "http://web--5173.localhost:7481"),
            (false, Some(80), "http://web--5173.localhost"),
            (true, Some(443), "https://web--5173.localhost"),
            (true, Some(80), "https://web--5173.localhost:80"),
            (false, None, "http://web--5173.localhost"),
        ];
        for (tls, port, want) in table {
            let site = PreviewSite::new(".localhost.", tls, port);
            assert_eq!(site.url("web", 5173), want, "{tls} {port:?}");
        }
    }

    #[test]
    fn a_host_names_a_project_and_a_port_or_its_ide_under_the_domain() {
        let site = PreviewSite::new("dev.example", false, Some(7481));
        let table: &[(&str, Option<(&str, Target)>)] = &[
            ("web--8000.dev.example", Some(("web", Target::Port(8000)))),
            (
                "WEB--8000.Dev.Example:7481",
                Some(("web", Target::Port(8000))),
            ),
            (
                "my--app--3000.dev.example.",
                Some(("my--app", Target::Port(3000))),
            ),
            ("web--ide.dev.example", Some(("web", Target::Ide))),
            ("Web--IDE.dev.example:7481", Some(("web", Target::Ide))),
            ("ide--8000.dev.example", Some(("ide", Target::Port(8000)))),
            ("my--ide--ide.dev.example", Some(("my--ide", Target::Ide))),
            (
                "web--ide--8000.dev.example",
                Some(("web--ide", Target::Port(8000))),
            ),
            ("--ide.dev.example", None),
            ("web--ides.dev.example", None),
            ("web--id.dev.example", None),
            ("web-ide.dev.example", None),
            ("web--ide.other.example", None),
            ("web--8000.other.example", None),
            ("web--8000.xdev.example", None),
            ("web-8000.dev.example", None),
            ("--8000.dev.example", None),
            ("web--0.dev.example", None),
            ("web--70000.dev.example", None),
            ("web--08000.dev.example", None),
            ("dev.example", None),
        ];
        for (header, want) in table {
            let got = site.parse_host(header);
            assert_eq!(
                got.as_ref().map(|(p, t, _)| (p.as_str(), *t)),
                *want,
                "{header}"
            );
        }
        assert_eq!(
            site.parse_host("web--8000.dev.example:7481").unwrap().2,
            "web--8000.dev.example"
        );
        assert_eq!(
            site.parse_host("web--ide.dev.example:7481").unwrap().2,
            "web--ide.dev.example"
        );
    }
}
