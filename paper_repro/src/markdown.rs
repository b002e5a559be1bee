//! Markdown table writing and the cell formats every table, the headline and the plots'
//! axes share (numbers, intervals, paired differences, sizes, counts).

use crate::rows::Interval;

/// Cell of a value that does not exist by definition (the dense model has no solver, tanh no
/// closed-form solution). Distinct from a missing key, which is an error, never a cell.
pub const NOT_APPLICABLE: &str = "n/a";
/// A cell whose figure the run's records predate.
pub const NOT_RECORDED: &str = "not recorded";

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

/// A difference with its sign always written (`+0.200`), so that a gain reads as one.
pub fn signed_float(x: f64) -> String {
    format!("{}{}", if x >= 0.0 { "+" } else { "" }, float(x))
}

/// `value [lo, hi]`.
pub fn iv(i: &Interval) -> String {
    format!("{} [{}, {}]", float(i.value), float(i.lo), float(i.hi))
}

/// A paired difference `+value [+lo, +hi]`, marked ↑ or ↓ when its interval excludes 0.
pub fn signed(i: &Interval) -> String {
    let mark = if i.lo > 0.0 {
        " ↑"
    } else if i.hi < 0.0 {
        " ↓"
    } else {
        ""
    };
    format!(
        "{} [{}, {}]{mark}",
        signed_float(i.value),
        signed_float(i.lo),
        signed_float(i.hi)
    )
}

/// An interval that may not exist by definition: `f` of it, else [`NOT_APPLICABLE`].
pub fn opt(i: &Option<Interval>, f: fn(&Interval) -> String) -> String {
    i.as_ref().map_or_else(|| NOT_APPLICABLE.to_string(), f)
}

/// Bytes in MiB, one decimal.
pub fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1u64 << 20) as f64)
}

/// A fraction as a percentage, one decimal.
pub fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// `12.3k` tokens, `1.2M`.
pub fn count(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
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

    #[test]
    fn signed_interval_marks_sure_differences() {
        let i = Interval {
            value: 0.2,
            lo: 0.1,
            hi: 0.3,
        };
        assert_eq!(signed(&i), "+0.200 [+0.100, +0.300] ↑");
        let i = Interval {
            value: -0.2,
            lo: -0.3,
            hi: 0.1,
        };
        assert_eq!(signed(&i), "-0.200 [-0.300, +0.100]");
    }
}
