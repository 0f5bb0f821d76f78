//! Colour on a terminal, as kubectl's and git's output has it: diff lines, Warning events and
//! phases. Off when stdout is not a terminal or `NO_COLOR` is set (<https://no-color.org>).

use std::io::IsTerminal;

/// An SGR colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colour {
    Red,
    Green,
    Yellow,
    Cyan,
}

impl Colour {
    fn code(self) -> &'static str {
        match self {
            Colour::Red => "\x1b[31m",
            Colour::Green => "\x1b[32m",
            Colour::Yellow => "\x1b[33m",
            Colour::Cyan => "\x1b[36m",
        }
    }

    /// `text` in this colour.
    pub fn paint(self, text: &str) -> String {
        format!("{}{text}{RESET}", self.code())
    }
}

const RESET: &str = "\x1b[0m";

/// Whether what goes to stdout may be coloured.
pub fn stdout() -> bool {
    wanted(
        std::io::stdout().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

/// `NO_COLOR` set to anything but the empty string turns colour off.
fn wanted(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// A project's phase: Ready green, Error and Missing red, on the way yellow.
pub fn phase(text: &str) -> Option<Colour> {
    match text {
        "Ready" => Some(Colour::Green),
        "Error" | "Missing" => Some(Colour::Red),
        "Pending" | "Provisioning" | "Deleting" => Some(Colour::Yellow),
        _ => None,
    }
}

/// An event's type: Warning yellow.
pub fn event_type(text: &str) -> Option<Colour> {
    (text == "Warning").then_some(Colour::Yellow)
}

/// A unified diff with removed lines red, added lines green and hunk headers cyan.
pub fn diff(text: &str) -> String {
    text.split_inclusive('\n')
        .map(|line| {
            let colour = match line.as_bytes().first() {
                _ if line.starts_with("+++") || line.starts_with("---") => None,
                Some(b'+') => Some(Colour::Green),
                Some(b'-') => Some(Colour::Red),
                Some(b'@') => Some(Colour::Cyan),
                _ => None,
            };
            match colour {
                Some(colour) => {
                    let (body, end) = match line.strip_suffix('\n') {
                        Some(body) => (body, "\n"),
                        None => (line, ""),
                    };
                    format!("{}{end}", colour.paint(body))
                }
                None => line.to_string(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn only_a_terminal_without_no_color_gets_colour() {
        assert!(wanted(true, None));
        assert!(wanted(true, Some(OsStr::new(""))));
        assert!(!wanted(true, Some(OsStr::new("1"))));
        assert!(!wanted(false, None));
    }

    #[test]
    fn diff_lines_are_coloured_by_their_mark() {
        let text = "--- a\n+++ b\n@@ -1 +1 @@\n-old\n+new\n same\n";
        assert_eq!(
            diff(text),
            "--- a\n+++ b\n\x1b[36m@@ -1 +1 @@\x1b[0m\n\x1b[31m-old\x1b[0m\n\x1b[32m+new\x1b[0m\n same\n"
        );
    }
}
