//! Simple SVG charts for the evaluation report: grouped bars and lines over categorical x
//! positions, written as standalone SVG 1.1 text with no dependencies. Output is deterministic:
//! the same input gives byte-identical text.

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 360.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 56.0;
const BOTTOM: f64 = 56.0;
/// Extra room under the plot when category labels are rotated.
const BOTTOM_ROTATED: f64 = 80.0;
/// Category labels are rotated once there are more than this many.
const ROTATE_ABOVE: usize = 8;
/// Tableau 10 (first 8): distinguishable, assigned by series index and cycled.
const PALETTE: [&str; 8] = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7"];

/// One named series of values, one per category (None: no value there, nothing drawn).
pub struct Series {
    /// Shown in the legend and in each bar's or point's hover title.
    pub name: String,
    /// One value per category; NaN and infinite values are treated as None.
    pub values: Vec<Option<f64>>,
}

/// Grouped vertical bar chart: one group per category, one bar per series in each group.
/// `reference_line`: an optional horizontal dashed line (e.g. y = 1.0 for a speedup chart), labelled with its value.
///
/// The y axis runs from 0 to a nice maximum: negative values are clamped to 0 (a bar of height
/// 0, its hover title still giving the real value), and a negative or non-finite reference
/// line is not drawn.
pub fn grouped_bars(
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[Series],
    reference_line: Option<f64>,
) -> String {
    let frame = Frame::new(categories.len(), series, reference_line);
    let mut out = frame.open(title, y_label);
    frame.category_labels(&mut out, categories);

    out.push_str("<g class=\"bars\">\n");
    let group_w = frame.slot_width();
    // 10% padding on each side of a group keeps neighbouring groups apart.
    let bar_w = if series.is_empty() { 0.0 } else { group_w * 0.8 / series.len() as f64 };
    for (i, _) in categories.iter().enumerate() {
        let group_x = frame.left + i as f64 * group_w + group_w * 0.1;
        for (j, s) in series.iter().enumerate() {
            let Some(v) = value_at(s, i) else { continue };
            let y = frame.y_of(v);
            out.push_str(&format!(
                "<rect class=\"bar\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{}: {}</title></rect>\n",
                group_x + j as f64 * bar_w,
                y,
                bar_w,
                frame.bottom - y,
                color(j),
                escape(&s.name),
                fmt_num(v),
            ));
        }
    }
    out.push_str("</g>\n");

    frame.close(out, series, reference_line)
}

/// Line chart over categorical x positions (evenly spaced, e.g. "64", "1K", "16K", "1M"): one polyline with a circle marker per point for each series; a None breaks the line.
///
/// The y axis runs from 0 to a nice maximum: negative values are drawn at 0 (the marker's hover
/// title still giving the real value), and a negative or non-finite reference line is not
/// drawn.
pub fn lines(
    title: &str,
    x_label: &str,
    y_label: &str,
    x_labels: &[String],
    series: &[Series],
    reference_line: Option<f64>,
) -> String {
    let frame = Frame::new(x_labels.len(), series, reference_line);
    let mut out = frame.open(title, y_label);
    frame.category_labels(&mut out, x_labels);
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
        (frame.left + frame.right) / 2.0,
        HEIGHT - 8.0,
        escape(x_label),
    ));

    out.push_str("<g class=\"lines\">\n");
    for (j, s) in series.iter().enumerate() {
        let points: Vec<Option<(f64, f64, f64)>> =
            (0..x_labels.len()).map(|i| value_at(s, i).map(|v| (frame.slot_center(i), frame.y_of(v), v))).collect();
        for segment in points.split(Option::is_none) {
            if segment.is_empty() {
                continue;
            }
            let coords: Vec<String> = segment.iter().flatten().map(|(x, y, _)| format!("{x:.1},{y:.1}")).collect();
            out.push_str(&format!(
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n",
                coords.join(" "),
                color(j),
            ));
        }
        for &(x, y, v) in points.iter().flatten() {
            out.push_str(&format!(
                "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3.5\" fill=\"{}\"><title>{}: {}</title></circle>\n",
                color(j),
                escape(&s.name),
                fmt_num(v),
            ));
        }
    }
    out.push_str("</g>\n");

    frame.close(out, series, reference_line)
}

/// The plot area and y scale shared by both chart kinds.
struct Frame {
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    y_max: f64,
    slots: usize,
    rotate: bool,
}

impl Frame {
    fn new(slots: usize, series: &[Series], reference_line: Option<f64>) -> Self {
        let largest = series
            .iter()
            .flat_map(|s| s.values.iter().filter_map(|v| clean(*v)))
            .chain(clean_reference(reference_line))
            .fold(0.0, f64::max);
        let rotate = slots > ROTATE_ABOVE;
        Frame {
            left: LEFT,
            right: WIDTH - RIGHT,
            top: TOP,
            bottom: HEIGHT - if rotate { BOTTOM_ROTATED } else { BOTTOM },
            y_max: nice_max(largest),
            slots,
            rotate,
        }
    }

    fn y_of(&self, v: f64) -> f64 {
        let frac = (v / self.y_max).clamp(0.0, 1.0);
        self.bottom - frac * (self.bottom - self.top)
    }

    fn slot_width(&self) -> f64 {
        (self.right - self.left) / self.slots.max(1) as f64
    }

    fn slot_center(&self, i: usize) -> f64 {
        self.left + (i as f64 + 0.5) * self.slot_width()
    }

    /// Document header, background, title, y label, gridlines with tick labels, and axes.
    fn open(&self, title: &str, y_label: &str) -> String {
        let mut out = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n",
            w = WIDTH,
            h = HEIGHT,
        );
        out.push_str(&format!("<rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"white\"/>\n"));
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"22.0\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
            WIDTH / 2.0,
            escape(title),
        ));
        let mid = (self.top + self.bottom) / 2.0;
        out.push_str(&format!(
            "<text x=\"16.0\" y=\"{mid:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 16.0 {mid:.1})\">{}</text>\n",
            escape(y_label),
        ));
        out.push_str("<g class=\"grid\">\n");
        let divisions = divisions(self.y_max);
        for i in 0..=divisions {
            let v = self.y_max * f64::from(i) / f64::from(divisions);
            let y = self.y_of(v);
            out.push_str(&format!(
                "<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#dddddd\"/>\n",
                self.left, self.right,
            ));
            out.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
                self.left - 6.0,
                y + 4.0,
                fmt_num(v),
            ));
        }
        out.push_str(&format!(
            "<line x1=\"{l:.1}\" y1=\"{t:.1}\" x2=\"{l:.1}\" y2=\"{b:.1}\" stroke=\"black\"/>\n<line x1=\"{l:.1}\" y1=\"{b:.1}\" x2=\"{r:.1}\" y2=\"{b:.1}\" stroke=\"black\"/>\n",
            l = self.left,
            t = self.top,
            b = self.bottom,
            r = self.right,
        ));
        out.push_str("</g>\n");
        out
    }

    /// One label under each slot, rotated -30 degrees when there are many.
    fn category_labels(&self, out: &mut String, labels: &[String]) {
        out.push_str("<g class=\"categories\">\n");
        for (i, label) in labels.iter().enumerate() {
            let x = self.slot_center(i);
            let y = self.bottom + 16.0;
            if self.rotate {
                out.push_str(&format!(
                    "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"end\" transform=\"rotate(-30 {x:.1} {y:.1})\">{}</text>\n",
                    escape(label),
                ));
            } else {
                out.push_str(&format!(
                    "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"middle\">{}</text>\n",
                    escape(label),
                ));
            }
        }
        out.push_str("</g>\n");
    }

    /// Reference line and legend, drawn last so they sit above the data, then the closing tag.
    fn close(&self, mut out: String, series: &[Series], reference_line: Option<f64>) -> String {
        if let Some(r) = clean_reference(reference_line) {
            let y = self.y_of(r);
            out.push_str(&format!(
                "<g class=\"reference\">\n<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#333333\" stroke-dasharray=\"6,4\"/>\n<text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n</g>\n",
                self.left,
                self.right,
                self.left + 4.0,
                y - 4.0,
                fmt_num(r),
            ));
        }
        if !series.is_empty() {
            // One row between the title and the plot area, so it never covers the data. No
            // text metrics in SVG 1.1: each entry is spaced by a rough 7 px per character.
            out.push_str("<g class=\"legend\">\n");
            let (mut x, y) = (self.left, self.top - 22.0);
            for (j, s) in series.iter().enumerate() {
                out.push_str(&format!(
                    "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"10.0\" height=\"10.0\" fill=\"{}\"/>\n<text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
                    color(j),
                    x + 16.0,
                    y + 9.0,
                    escape(&s.name),
                ));
                x += 32.0 + s.name.chars().count() as f64 * 7.0;
            }
            out.push_str("</g>\n");
        }
        out.push_str("</svg>\n");
        out
    }
}

fn color(index: usize) -> &'static str {
    PALETTE[index % PALETTE.len()]
}

/// A finite value, or None.
fn clean(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite())
}

fn clean_reference(r: Option<f64>) -> Option<f64> {
    clean(r).filter(|x| *x >= 0.0)
}

fn value_at(s: &Series, i: usize) -> Option<f64> {
    s.values.get(i).copied().and_then(clean)
}

/// The smallest of {1, 2, 2.5, 5} x 10^k that is >= `v`; 1 when `v` is not positive.
fn nice_max(v: f64) -> f64 {
    if !(v > 0.0 && v.is_finite()) {
        return 1.0;
    }
    let k = v.log10().floor() as i32;
    for exp in (k - 1)..=(k + 1) {
        for m in [1.0, 2.0, 2.5, 5.0] {
            // Dividing by an exact power of ten rounds correctly, so 0.25 or 0.5 compare exactly.
            let c = if exp >= 0 { m * 10f64.powi(exp) } else { m / 10f64.powi(-exp) };
            if c >= v {
                return c;
            }
        }
    }
    10f64.powi(k + 2)
}

/// Gridline intervals for an axis up to `y_max` (a [`nice_max`]): 5 when its leading digits are
/// 2.5 or 5, so that the steps are 0.5 or 1 of that decade, otherwise 4.
fn divisions(y_max: f64) -> u32 {
    let leading = y_max / 10f64.powi(y_max.log10().floor() as i32);
    if (leading - 2.5).abs() < 1e-9 || (leading - 5.0).abs() < 1e-9 {
        5
    } else {
        4
    }
}

/// Compact number: up to 3 decimals (more for small values, keeping 3 significant digits),
/// trailing zeros dropped: 0, 0.5, 1.25, 0.00025.
fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        return "0".to_string();
    }
    let magnitude = v.abs().log10().floor() as i32;
    let decimals = (2 - magnitude).clamp(3, 12) as usize;
    let s = format!("{v:.decimals$}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(name: &str, values: &[Option<f64>]) -> Series {
        Series { name: name.to_string(), values: values.to_vec() }
    }

    fn cats(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("c{i}")).collect()
    }

    /// The `height` attribute of every bar rect, in document order.
    fn bar_heights(svg: &str) -> Vec<f64> {
        svg.match_indices("<rect class=\"bar\"")
            .map(|(at, _)| {
                let tag = &svg[at..at + svg[at..].find('>').unwrap()];
                let start = tag.find(" height=\"").unwrap() + " height=\"".len();
                let len = tag[start..].find('"').unwrap();
                tag[start..start + len].parse().unwrap()
            })
            .collect()
    }

    fn assert_balanced(svg: &str) {
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert_eq!(svg.matches("<svg").count(), 1);
        assert_eq!(svg.matches("</svg>").count(), 1);
        assert!(svg.trim_end().ends_with("</svg>"));
        let opened = svg.matches("<g ").count() + svg.matches("<g>").count();
        assert!(opened > 0);
        assert_eq!(opened, svg.matches("</g>").count());
    }

    #[test]
    fn gridlines_fall_on_round_steps() {
        for (y_max, divisions_wanted) in [(1.0, 4), (2.0, 4), (2.5, 5), (5.0, 5), (0.25, 5), (500.0, 5), (10.0, 4)] {
            assert_eq!(divisions(y_max), divisions_wanted, "{y_max}");
        }
    }

    #[test]
    fn nice_max_cases() {
        for (v, want) in [
            (0.7, 1.0),
            (1.0, 1.0),
            (1.2, 2.0),
            (2.2, 2.5),
            (3.0, 5.0),
            (7.0, 10.0),
            (95.0, 100.0),
            (0.0, 1.0),
            (0.25, 0.25),
            (0.3, 0.5),
            (-4.0, 1.0),
            (f64::NAN, 1.0),
        ] {
            assert_eq!(nice_max(v), want, "nice_max({v})");
        }
    }

    #[test]
    fn tick_labels_are_compact() {
        let svg = grouped_bars("t", "y", &cats(1), &[s("a", &[Some(1.7)])], None);
        for label in [">0<", ">0.5<", ">1<", ">1.5<", ">2<"] {
            assert!(svg.contains(label), "missing tick {label}");
        }
        let svg = grouped_bars("t", "y", &cats(1), &[s("a", &[Some(80.0)])], None);
        for label in [">0<", ">25<", ">50<", ">75<", ">100<"] {
            assert!(svg.contains(label), "missing tick {label}");
        }
        assert_eq!(fmt_num(1.23456), "1.235");
        assert_eq!(fmt_num(0.00025), "0.00025");
    }

    #[test]
    fn bar_heights_proportional_to_values() {
        let series = [s("a", &[Some(1.0), Some(2.0)]), s("b", &[Some(0.5), None])];
        let heights = bar_heights(&grouped_bars("t", "y", &cats(2), &series, None));
        // Document order: category 0 (a, b), then category 1 (a).
        assert_eq!(heights.len(), 3);
        let (one, half, two) = (heights[0], heights[1], heights[2]);
        assert!(one > 0.0);
        assert!((two - 2.0 * one).abs() <= 0.1, "{two} vs 2 x {one}");
        assert!((one - 2.0 * half).abs() <= 0.1, "{one} vs 2 x {half}");
    }

    #[test]
    fn negative_values_clamp_to_zero_height() {
        let series = [s("a", &[Some(-3.0), Some(1.0)])];
        let heights = bar_heights(&grouped_bars("t", "y", &cats(2), &series, None));
        assert_eq!(heights.len(), 2);
        assert_eq!(heights[0], 0.0);
        assert!(heights[1] > 0.0);
    }

    #[test]
    fn escapes_all_text() {
        let series = [s("a<b&c", &[Some(1.0)])];
        let labels = vec!["x\"'>".to_string()];
        for svg in [
            grouped_bars("T<1>", "y&", &labels, &series, Some(1.0)),
            lines("T<1>", "x'", "y&", &labels, &series, Some(1.0)),
        ] {
            assert!(svg.contains("a&lt;b&amp;c"));
            assert!(!svg.contains("a<b&c"));
            assert!(svg.contains("T&lt;1&gt;"));
            assert!(svg.contains("x&quot;&apos;&gt;"));
            assert!(!svg.contains("T<1>"));
            assert!(!svg.contains("y&<"));
        }
    }

    #[test]
    fn none_and_non_finite_draw_no_bar() {
        let series = [s("a", &[Some(1.0), None, Some(f64::NAN)]), s("b", &[None, Some(f64::INFINITY), Some(2.0)])];
        let svg = grouped_bars("t", "y", &cats(3), &series, None);
        assert_eq!(svg.matches("<rect class=\"bar\"").count(), 2);
        assert_eq!(svg.matches("<title>").count(), 2);
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn tags_balanced() {
        let series = [s("a", &[Some(1.0), None]), s("b", &[Some(3.0), Some(2.0)])];
        assert_balanced(&grouped_bars("t", "y", &cats(2), &series, Some(1.0)));
        assert_balanced(&grouped_bars("t", "y", &cats(12), &series, None));
        assert_balanced(&grouped_bars("t", "y", &[], &[], None));
        assert_balanced(&lines("t", "x", "y", &cats(2), &series, Some(1.0)));
        assert_balanced(&lines("t", "x", "y", &[], &[], None));
    }

    #[test]
    fn rotates_labels_only_when_many() {
        let series = [s("a", &[Some(1.0)])];
        assert!(!grouped_bars("t", "y", &cats(8), &series, None).contains("rotate(-30"));
        assert_eq!(grouped_bars("t", "y", &cats(9), &series, None).matches("rotate(-30").count(), 9);
    }

    #[test]
    fn deterministic() {
        let make = || vec![s("a", &[Some(1.25), None, Some(3.0)]), s("b", &[Some(0.1), Some(2.2), Some(f64::NAN)])];
        assert_eq!(
            grouped_bars("t", "y", &cats(3), &make(), Some(1.0)),
            grouped_bars("t", "y", &cats(3), &make(), Some(1.0))
        );
        assert_eq!(lines("t", "x", "y", &cats(3), &make(), None), lines("t", "x", "y", &cats(3), &make(), None));
    }

    #[test]
    fn lines_one_polyline_per_segment_one_circle_per_point() {
        let series = [
            // Two segments (broken by None), 4 points.
            s("a", &[Some(1.0), Some(2.0), None, Some(3.0), Some(4.0)]),
            // One segment, 5 points.
            s("b", &[Some(1.0), Some(1.0), Some(1.0), Some(1.0), Some(1.0)]),
            // Leading/trailing None and NaN: two segments, 2 points.
            s("c", &[None, Some(1.0), Some(f64::NAN), Some(2.0), None]),
        ];
        let svg = lines("t", "x", "y", &cats(5), &series, Some(1.0));
        assert_eq!(svg.matches("<polyline").count(), 5);
        assert_eq!(svg.matches("<circle").count(), 11);
    }

    #[test]
    fn reference_line_counts_toward_axis_and_is_labelled() {
        let svg = grouped_bars("t", "y", &cats(1), &[s("a", &[Some(0.4)])], Some(1.2));
        assert!(svg.contains("stroke-dasharray"));
        assert!(svg.contains(">1.2<"));
        // Axis max is nice_max(1.2) = 2, not nice_max(0.4) = 0.5.
        assert!(svg.contains(">2<"));
    }
}
