//! Hand-written SVG bar charts (no dependencies): a grid of panels, each a
//! grouped bar chart (one group per category, one bar per series), with a
//! y axis on "nice" ticks, value labels, and a legend for several series.

use std::fmt::Write as _;

/// One grouped bar chart.
#[derive(Clone, Debug)]
pub struct Panel {
    pub title: String,
    /// Category labels along x (routers).
    pub categories: Vec<String>,
    /// (series name, one value per category; None = no bar).
    pub series: Vec<(String, Vec<Option<f64>>)>,
    /// Fixed top of the y axis (e.g. 1.0 for a rate); None = from the data.
    pub y_max: Option<f64>,
    /// Decimals of value labels.
    pub decimals: usize,
}

const PANEL_W: f64 = 420.0;
const PANEL_H: f64 = 300.0;
const LEFT: f64 = 52.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 86.0;
const COLORS: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

/// XML-escapes text.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A y axis for data up to `max`: (top, step), the step 1, 2, 2.5 or 5
/// times a power of ten, at most 4 steps, top = a whole number of steps.
pub fn axis(max: f64) -> (f64, f64) {
    if !(max.is_finite() && max > 0.0) {
        return (1.0, 0.25);
    }
    let raw = max / 4.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw * (1.0 - 1e-12))
        .unwrap_or(10.0 * mag);
    let n = (max / step - 1e-9).ceil().max(1.0);
    (n * step, step)
}

fn fmt_tick(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e9 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Draws one panel with its top-left corner at (x0, y0).
fn panel(out: &mut String, p: &Panel, x0: f64, y0: f64) {
    let plot_w = PANEL_W - LEFT - RIGHT;
    let plot_h = PANEL_H - TOP - BOTTOM;
    let data_max = p
        .series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let (top, step) = match p.y_max {
        Some(top) => (top, top / 4.0),
        None => axis(data_max),
    };
    let y_of = |v: f64| y0 + TOP + plot_h * (1.0 - (v / top).clamp(0.0, 1.0));
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" font-weight="bold">{}</text>"#,
        x0 + 8.0,
        y0 + 18.0,
        esc(&p.title)
    );
    // Axis and grid.
    let ticks = (top / step).round() as i32;
    for i in 0..=ticks {
        let v = step * f64::from(i);
        let y = y_of(v);
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">{}</text>"##,
            x0 + LEFT,
            x0 + LEFT + plot_w,
            x0 + LEFT - 4.0,
            y + 3.5,
            fmt_tick(v)
        );
    }
    let _ = writeln!(
        out,
        r##"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="#333"/>"##,
        x0 + LEFT,
        y0 + TOP,
        y0 + TOP + plot_h
    );
    let n_cat = p.categories.len().max(1) as f64;
    let n_ser = p.series.len().max(1) as f64;
    let group_w = plot_w / n_cat;
    let bar_w = (group_w * 0.8 / n_ser).min(40.0);
    for (ci, cat) in p.categories.iter().enumerate() {
        let gx = x0 + LEFT + group_w * ci as f64;
        let first = gx + (group_w - bar_w * n_ser) / 2.0;
        for (si, (name, values)) in p.series.iter().enumerate() {
            let Some(v) = values.get(ci).copied().flatten() else {
                continue;
            };
            let x = first + bar_w * si as f64;
            let y = y_of(v);
            let color = COLORS[si % COLORS.len()];
            let _ = writeln!(
                out,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{color}"><title>{}: {} = {}</title></rect>"#,
                (bar_w - 1.0).max(1.0),
                (y0 + TOP + plot_h - y).max(0.0),
                esc(cat),
                esc(name),
                fmt_value(v, p.decimals)
            );
            if p.series.len() <= 2 {
                let _ = writeln!(
                    out,
                    r#"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle">{}</text>"#,
                    x + bar_w / 2.0,
                    y - 3.0,
                    fmt_value(v, p.decimals)
                );
            }
        }
        let lx = gx + group_w / 2.0;
        let ly = y0 + TOP + plot_h + 12.0;
        let _ = writeln!(
            out,
            r#"<text x="{lx:.1}" y="{ly:.1}" font-size="10" text-anchor="end" transform="rotate(-35 {lx:.1} {ly:.1})">{}</text>"#,
            esc(cat)
        );
    }
    if p.series.len() > 1 {
        let mut lx = x0 + LEFT;
        for (si, (name, _)) in p.series.iter().enumerate() {
            let _ = writeln!(
                out,
                r#"<rect x="{lx:.1}" y="{:.1}" width="10" height="10" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="10">{}</text>"#,
                y0 + 26.0,
                COLORS[si % COLORS.len()],
                lx + 13.0,
                y0 + 35.0,
                esc(name)
            );
            lx += 18.0 + 6.0 * name.chars().count() as f64;
        }
    }
}

/// Splits `text` into lines of at most `width` characters at spaces.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

fn fmt_value(v: f64, decimals: usize) -> String {
    format!("{v:.decimals$}")
}

/// An SVG document: `title`, then one row of panels per entry of `rows`,
/// each row with an optional heading.
pub fn render(title: &str, rows: &[(String, Vec<Panel>)]) -> String {
    let cols = rows.iter().map(|(_, r)| r.len()).max().unwrap_or(1).max(1);
    let row_h = PANEL_H + 40.0;
    let width = PANEL_W * cols as f64;
    let height = 40.0 + row_h * rows.len() as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="26" font-size="16" font-weight="bold">{}</text>"#,
        esc(title)
    );
    for (ri, (heading, panels)) in rows.iter().enumerate() {
        let y0 = 40.0 + row_h * ri as f64;
        let max_chars = (width / 6.5) as usize;
        for (li, line) in wrap(heading, max_chars).iter().take(2).enumerate() {
            let _ = writeln!(
                out,
                r##"<text x="10" y="{:.1}" font-size="11" fill="#555">{}</text>"##,
                y0 + 12.0 + 13.0 * li as f64,
                esc(line)
            );
        }
        for (pi, p) in panels.iter().enumerate() {
            panel(&mut out, p, PANEL_W * pi as f64, y0 + 34.0);
        }
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_steps_are_round() {
        assert_eq!(axis(0.0), (1.0, 0.25));
        assert_eq!(axis(f64::NAN), (1.0, 0.25));
        assert_eq!(axis(0.93), (1.0, 0.25));
        assert_eq!(axis(23.0), (30.0, 10.0));
        assert_eq!(axis(300.0), (300.0, 100.0));
        assert_eq!(axis(301.0), (400.0, 100.0));
        assert_eq!(axis(43.0), (60.0, 20.0));
        assert_eq!(axis(1000.0), (1000.0, 250.0));
    }

    #[test]
    fn wraps_at_spaces() {
        assert_eq!(wrap("aa bb cc", 5), vec!["aa bb", "cc"]);
        assert_eq!(wrap("", 5), Vec::<String>::new());
    }

    #[test]
    fn escapes_text() {
        assert_eq!(esc("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
    }

    #[test]
    fn renders_bars_labels_and_legend() {
        let p = Panel {
            title: "TTFT <ms>".into(),
            categories: vec!["round-robin".into(), "filter".into()],
            series: vec![
                ("p50".into(), vec![Some(120.0), Some(30.0)]),
                ("p90".into(), vec![Some(300.0), None]),
            ],
            y_max: None,
            decimals: 0,
        };
        let svg = render("t & t", &[("row".into(), vec![p])]);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<rect x=").count(),
            3 + 2,
            "3 bars + 2 legend boxes"
        );
        assert!(svg.contains("TTFT &lt;ms&gt;") && svg.contains("t &amp; t"));
        assert!(svg.contains(">round-robin</text>") && svg.contains(">p90</text>"));
        // The axis tops at 300 in steps of 100.
        assert!(svg.contains(">300</text>") && svg.contains(">100</text>"));
        // Balanced tags.
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    }
}
