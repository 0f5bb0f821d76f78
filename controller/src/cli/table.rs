//! Tables aligned like kubectl's: upper-case headers, columns separated by three spaces, no
//! trailing blanks.

/// Column gap kubectl's tabwriter uses.
const GAP: usize = 3;

use super::colour::Colour;

/// Picks a cell's colour from its text.
pub type Painter = fn(&str) -> Option<Colour>;

#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    /// Per column, how its cells are coloured; nothing is coloured unless asked.
    painters: Vec<(usize, Painter)>,
}

impl Table {
    pub fn new<I, S>(headers: I) -> Table
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
            painters: Vec::new(),
        }
    }

    /// Colours the cells of the column headed `header` (when `on`: a terminal that wants it).
    pub fn paint(mut self, header: &str, painter: Painter, on: bool) -> Table {
        if let Some(column) = self.headers.iter().position(|h| h == header)
            && on
        {
            self.painters.push((column, painter));
        }
        self
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Adds a column header at the end.
    pub fn push_header(&mut self, header: impl Into<String>) {
        self.headers.push(header.into());
    }

    /// Adds a row; missing cells print as blanks, cells keep to one line.
    pub fn row(&mut self, cells: Vec<String>) {
        let cells = cells.into_iter().map(|c| one_line(&c)).collect();
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let header_cells: Vec<String> = self.headers.iter().map(|h| h.to_uppercase()).collect();
        self.lines(std::iter::once(&header_cells).chain(self.rows.iter()), None)
    }

    /// The rows without the header, each column at least as wide as in `above` (a table already
    /// printed), as `get -w` prints the changes under its first table.
    pub fn render_rows_under(&self, above: &Table) -> String {
        self.lines(self.rows.iter(), Some(above))
    }

    fn widths(&self) -> Vec<usize> {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(width(cell));
            }
        }
        widths
    }

    fn lines<'a>(
        &self,
        rows: impl Iterator<Item = &'a Vec<String>>,
        above: Option<&Table>,
    ) -> String {
        let columns = self.headers.len();
        let mut widths = self.widths();
        if let Some(above) = above {
            for (w, a) in widths.iter_mut().zip(above.widths()) {
                *w = (*w).max(a);
            }
        }
        let mut out = String::new();
        for cells in rows {
            let mut line = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = cells.get(i).map(String::as_str).unwrap_or("");
                let colour = self
                    .painters
                    .iter()
                    .find(|(column, _)| *column == i)
                    .and_then(|(_, painter)| painter(cell));
                match colour {
                    // Headers are upper case: never a painted value.
                    Some(colour) => line.push_str(&colour.paint(cell)),
                    None => line.push_str(cell),
                }
                if i + 1 < columns {
                    line.push_str(&" ".repeat(w - width(cell) + GAP));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

fn width(text: &str) -> usize {
    text.chars().count()
}

/// Control characters (a newline in a message) would break the alignment.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_with_three_space_gaps() {
        let mut table = Table::new(["name", "display name", "phase"]);
        table.row(vec![
            "payments-api".into(),
            "Payments API".into(),
            "Ready".into(),
        ]);
        table.row(vec!["a".into(), "".into(), "Pending".into()]);
        let expected = "\
NAME           DISPLAY NAME   PHASE
payments-api   Payments API   Ready
a                             Pending
";
        assert_eq!(table.render(), expected);
    }

    #[test]
    fn trailing_blanks_are_trimmed_and_newlines_flattened() {
        let mut table = Table::new(["a", "b"]);
        table.row(vec!["x".into(), "".into()]);
        table.row(vec!["y".into(), "two\nlines".into()]);
        assert_eq!(table.render(), "A   B\nx\ny   two lines\n");
    }
}
