//! Markdown table writing and the number format every table shares.

/// Cell of a value that does not exist by definition (the dense model has no solver, tanh no
/// closed-form solution). Distinct from a missing key, which is an error, never a cell.
pub const NOT_APPLICABLE: &str = "n/a";

/// A Markdown table built row by row.
pub struct Table {
    text: String,
    columns: usize,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        let mut text = format!("| {} |\n|", headers.join(" | "));
        text.push_str(&"---|".repeat(headers.len()));
        text.push('\n');
        Table {
            text,
            columns: headers.len(),
        }
    }

    pub fn row(&mut self, cells: &[String]) {
        debug_assert_eq!(cells.len(), self.columns, "row width != header width");
        self.text.push_str("| ");
        self.text.push_str(&cells.join(" | "));
        self.text.push_str(" |\n");
    }

    pub fn into_markdown(self) -> String {
        self.text
    }
}

/// Three decimals in a readable range, else scientific notation.
pub fn float(x: f64) -> String {
    if x == 0.0 || (1e-2..1e5).contains(&x.abs()) {
        format!("{x:.3}")
    } else {
        format!("{x:.3e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_header_separator_and_rows() {
        let mut t = Table::new(&["a", "b"]);
        t.row(&["1".into(), "2".into()]);
        assert_eq!(t.into_markdown(), "| a | b |\n|---|---|\n| 1 | 2 |\n");
    }

    #[test]
    fn float_switches_to_scientific_outside_the_readable_range() {
        assert_eq!(float(0.0), "0.000");
        assert_eq!(float(1.5), "1.500");
        assert_eq!(float(1e-9), "1.000e-9");
        assert_eq!(float(123456.0), "1.235e5");
    }
}
