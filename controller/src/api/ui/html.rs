//! HTML text: every value rendered goes through [`esc`] (text and attribute values alike), and
//! every page through [`page`], which names the vendored stylesheet and script.

use std::fmt::Write as _;

/// `text` safe inside an element or a quoted attribute value.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '`' => out.push_str("&#96;"),
            c => out.push(c),
        }
    }
    out
}

/// What a path segment keeps as it is: RFC 3986's unreserved characters.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A path segment for an href (project names are DNS labels, but nothing is assumed).
pub fn seg(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, SEGMENT).to_string()
}

/// The signed-in person shown in the header, with the sign-out form.
pub struct Header<'a> {
    pub identity: &'a str,
    pub csrf: &'a str,
}

/// A whole page: `title` (escaped here), the header when signed in, then `main` (already HTML).
pub fn page(title: &str, header: Option<&Header<'_>>, main: &str) -> String {
    let mut html = String::new();
    let _ = write!(
        html,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · berth</title>\
         <link rel=\"stylesheet\" href=\"/ui/static/console.css\">\
         <script src=\"/ui/static/console.js\" defer></script></head><body>\
         <a class=\"skip\" href=\"#main\">Skip to content</a>\
         <header class=\"top\"><a class=\"brand\" href=\"/ui/\">berth</a>",
        esc(title)
    );
    if let Some(header) = header {
        let _ = write!(
            html,
            "<span class=\"who\">Signed in as <strong>{}</strong></span>\
             <form method=\"post\" action=\"/ui/signout\" class=\"inline\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <button type=\"submit\">Sign out</button></form>",
            esc(header.identity),
            esc(header.csrf)
        );
    }
    let _ = writeln!(
        html,
        "</header><main id=\"main\" tabindex=\"-1\">{main}</main></body></html>"
    );
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_markup_character_is_escaped() {
        let table = [
            ("plain", "plain"),
            (
                "<script>alert(1)</script>",
                "&lt;script&gt;alert(1)&lt;/script&gt;",
            ),
            ("a & b", "a &amp; b"),
            ("\" onmouseover=\"x", "&quot; onmouseover=&quot;x"),
            ("it's `x`", "it&#39;s &#96;x&#96;"),
            ("ünïcode ✓", "ünïcode ✓"),
        ];
        for (text, want) in table {
            assert_eq!(esc(text), want, "{text}");
        }
    }

    #[test]
    fn a_page_escapes_its_title_and_identity() {
        let html = page(
            "<b>x</b>",
            Some(&Header {
                identity: "<img src=x>",
                csrf: "\"t\"",
            }),
            "<p>body</p>",
        );
        assert!(html.contains("<title>&lt;b&gt;x&lt;/b&gt; · berth</title>"));
        assert!(html.contains("<strong>&lt;img src=x&gt;</strong>"));
        assert!(html.contains("value=\"&quot;t&quot;\""));
        assert!(!html.contains("<img src=x>"));
    }
}
