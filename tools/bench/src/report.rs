//! Output: plain-text tables on stdout and one JSON file per run under
//! `results/` (gitignored) in the repository root.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// A titled table with aligned columns; the first column is left-aligned,
/// the others right-aligned (numbers).
#[derive(Clone, Debug, Default)]
pub struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: AsRef<str>>(title: &str, header: &[S]) -> Table {
        Table {
            title: title.to_string(),
            header: header.iter().map(|h| h.as_ref().to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row<S: ToString>(&mut self, cells: &[S]) {
        self.rows
            .push(cells.iter().map(ToString::to_string).collect());
    }

    /// The table as text, ending with a newline.
    pub fn render(&self) -> String {
        let cols = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.header.len()])
            .max()
            .unwrap_or(0);
        let mut width = vec![0; cols];
        for row in self.rows.iter().chain([&self.header]) {
            for (i, cell) in row.iter().enumerate() {
                width[i] = width[i].max(cell.chars().count());
            }
        }
        let line = |row: &[String]| {
            let mut s = String::new();
            for (i, w) in width.iter().enumerate() {
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                let pad = w - cell.chars().count();
                if i == 0 {
                    let _ = write!(s, "{cell}{}", " ".repeat(pad));
                } else {
                    let _ = write!(s, "  {}{cell}", " ".repeat(pad));
                }
            }
            s.trim_end().to_string()
        };
        let total: usize = width.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
        let mut out = format!("\n{}\n", self.title);
        out.push_str(&line(&self.header));
        out.push('\n');
        out.push_str(&"-".repeat(total));
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// `results/` in the repository root.
pub fn results_dir() -> PathBuf {
    harness::repo_root().join("results")
}

/// Writes `value` to `results/<name>-<unix seconds>.json`; returns the path.
pub fn write_json(name: &str, value: &Value) -> PathBuf {
    write_json_in(None, name, value)
}

/// [`write_json`] into `dir` instead of `results/` when given.
pub fn write_json_in(dir: Option<&Path>, name: &str, value: &Value) -> PathBuf {
    let dir = dir.map_or_else(results_dir, Path::to_path_buf);
    std::fs::create_dir_all(&dir).expect("create the results dir");
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let path = dir.join(format!("{name}-{secs}.json"));
    let text = serde_json::to_string_pretty(value).expect("serialize results");
    std::fs::write(&path, text).expect("write results JSON");
    // A tidy path for humans: `tools/bench/../../results/x` -> `results/x`.
    path.canonicalize().unwrap_or(path)
}

/// Output files of one run.
pub struct Written {
    pub json: PathBuf,
    pub svg: Option<PathBuf>,
    pub txt: PathBuf,
}

impl Written {
    /// Prints where the files went and the wall time.
    pub fn print(&self, wall_s: f64) {
        println!("\nresults: {}", self.json.display());
        if let Some(svg) = &self.svg {
            println!("chart:   {}", svg.display());
        }
        println!("table:   {}\nwall time: {wall_s:.0} s", self.txt.display());
    }
}

/// Writes `<dir>/<stem>-<unix secs>.{json,svg,txt}` (no SVG when None).
pub fn write_outputs(
    dir: Option<&PathBuf>,
    stem: &str,
    json: &Value,
    svg: Option<&str>,
    txt: &str,
) -> Written {
    let dir = dir.cloned().unwrap_or_else(results_dir);
    std::fs::create_dir_all(&dir).expect("create results dir");
    let dir = dir.canonicalize().unwrap_or(dir);
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let base = dir.join(format!("{stem}-{secs}"));
    let with = |ext: &str| base.with_extension(ext);
    let w = Written {
        json: with("json"),
        svg: svg.map(|_| with("svg")),
        txt: with("txt"),
    };
    std::fs::write(
        &w.json,
        serde_json::to_string_pretty(json).expect("serialize results"),
    )
    .expect("write JSON");
    if let (Some(path), Some(svg)) = (&w.svg, svg) {
        std::fs::write(path, svg).expect("write SVG");
    }
    std::fs::write(&w.txt, txt).expect("write table text");
    w
}

/// A number with `decimals` places.
pub fn num(v: f64, decimals: usize) -> String {
    format!("{v:.decimals$}")
}

/// `PASS`/`MISS` for a target check.
pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align() {
        let mut t = Table::new("T", &["name", "value"]);
        t.row(&["a", "1"]);
        t.row(&["longer", "12345"]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "T");
        assert_eq!(lines[2], "name    value");
        assert_eq!(lines[4], "a           1");
        assert_eq!(lines[5], "longer  12345");
    }
}
