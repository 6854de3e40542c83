//! Rendering of listings: aligned tables in the GPFS layout (header, a dashed rule, rows)
//! and the `-Y` colon-separated form (`prefix:record:HEADER:version:reserved:reserved:...`
//! followed by `prefix:record:0:1:::values...`), with `:` inside values written as `%3A`.

/// Column alignment.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A table whose columns line up.
pub struct Table {
    headers: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            align: vec![Align::Left; headers.len()],
            rows: Vec::new(),
        }
    }

    /// Right-aligns the columns at `columns` (numbers).
    pub fn right(mut self, columns: &[usize]) -> Table {
        for c in columns {
            self.align[*c] = Align::Right;
        }
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(
            cells.len(),
            self.headers.len(),
            "row width must match the header"
        );
        self.rows.push(cells);
    }

    fn widths(&self) -> Vec<usize> {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        widths
    }

    fn line(&self, cells: &[String], widths: &[usize]) -> String {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let w = widths[i];
            let last = i + 1 == cells.len();
            let text = match self.align[i] {
                Align::Right => format!("{cell:>w$}"),
                Align::Left if last => cell.clone(),
                Align::Left => format!("{cell:<w$}"),
            };
            if i > 0 {
                out.push_str("  ");
            }
            out.push_str(&text);
        }
        out.trim_end().to_string()
    }

    /// The table as text, one line per row, ending with a newline.
    pub fn render(&self) -> String {
        let widths = self.widths();
        let total: usize = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
        let mut out = self.line(&self.headers, &widths);
        out.push('\n');
        out.push_str(&"-".repeat(total));
        out.push('\n');
        for row in &self.rows {
            out.push_str(&self.line(row, &widths));
            out.push('\n');
        }
        out
    }
}

/// Escapes a `-Y` value: `:` would split the field, `%` starts an escape.
pub fn y_escape(value: &str) -> String {
    value.replace('%', "%25").replace(':', "%3A")
}

/// Builder of `-Y` output for one record type.
pub struct YRecord {
    prefix: String,
}

impl YRecord {
    /// `command` is the listing (`nsd`, `fs`, `df`), `record` the record type or "".
    pub fn new(command: &str, record: &str) -> YRecord {
        YRecord {
            prefix: format!("{command}:{record}"),
        }
    }

    pub fn header(&self, fields: &[&str]) -> String {
        format!(
            "{}:HEADER:version:reserved:reserved:{}:",
            self.prefix,
            fields.join(":")
        )
    }

    pub fn data(&self, values: &[String]) -> String {
        let values: Vec<String> = values.iter().map(|v| y_escape(v)).collect();
        format!("{}:0:1:::{}:", self.prefix, values.join(":"))
    }
}

pub fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// `part` as a whole percentage of `whole`, as mmdf shows it: `( 98%)`.
pub fn percent(part: u64, whole: u64) -> String {
    let pct = if whole == 0 {
        0
    } else {
        (u128::from(part) * 100 / u128::from(whole)) as u64
    };
    format!("({pct:>3}%)")
}

/// `unix` as local time in the form GPFS prints dates: `Wed Jun  1 13:30:20 2011`, with
/// the zone when `zone` is set (`Wed Jun  1 13:30:20 EDT 2011`).
pub fn local_time(unix: u64, zone: bool) -> String {
    let t = unix as libc::time_t;
    // SAFETY: localtime_r and strftime write only into the locals given to them.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return unix.to_string();
        }
        let fmt: &[u8] = if zone {
            b"%a %b %e %H:%M:%S %Z %Y\0"
        } else {
            b"%a %b %e %H:%M:%S %Y\0"
        };
        let mut buf = [0u8; 64];
        let n = libc::strftime(buf.as_mut_ptr().cast(), buf.len(), fmt.as_ptr().cast(), &tm);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

/// The local time of day of `unix_nanos` with microseconds, as mmdiag prints I/O start
/// times: `14:25:22.169607`.
pub fn clock_time(unix_nanos: u64) -> String {
    let secs = unix_nanos / 1_000_000_000;
    let micros = (unix_nanos % 1_000_000_000) / 1000;
    let t = secs as libc::time_t;
    // SAFETY: localtime_r writes only into the local given to it.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return format!("{secs}.{micros:06}");
        }
        format!(
            "{:02}:{:02}:{:02}.{micros:06}",
            tm.tm_hour, tm.tm_min, tm.tm_sec
        )
    }
}

/// A command that did its main work but not all of it (`umount` whose final checkpoint
/// failed): the message says what happened, and the process exits with `code` so that a
/// script can tell it from a plain failure (1).
#[derive(Debug)]
pub struct PartlyDone {
    pub code: u8,
    pub message: String,
}

impl std::fmt::Display for PartlyDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PartlyDone {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up() {
        let mut t = Table::new(&["Disk name", "Size"]).right(&[1]);
        t.row(vec!["nsd1".into(), "1".into()]);
        t.row(vec!["a-much-longer-name".into(), "12345".into()]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[2].len(), lines[3].len());
        assert!(lines[1].starts_with("-----"));
    }

    #[test]
    fn y_output_escapes_colons() {
        let y = YRecord::new("nsd", "");
        assert_eq!(
            y.header(&["a", "b"]),
            "nsd::HEADER:version:reserved:reserved:a:b:"
        );
        assert_eq!(y.data(&["x:y".into(), "z".into()]), "nsd::0:1:::x%3Ay:z:");
    }

    #[test]
    fn percentages() {
        assert_eq!(percent(98, 100), "( 98%)");
        assert_eq!(percent(0, 0), "(  0%)");
    }
}
