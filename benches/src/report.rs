//! Results: a table for people, JSON for scripts, and SVG plots (throughput and p99 against concurrency for a sweep,
//! and a latency CDF) written next to the JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::load::Outcome;

/// One HTTP run.
#[derive(Debug, Clone, Serialize)]
pub struct HttpReport {
    pub model: String,
    pub protocol: crate::bodies::Protocol,
    pub rows_per_request: usize,
    /// Closed loop: clients. Open loop: `None`.
    pub concurrency: Option<usize>,
    /// Open loop: requests per second asked for.
    pub rate: Option<f64>,
    pub duration_s: f64,
    pub requests_ok: u64,
    /// Answers that were not 2xx, by status code (0: no answer).
    pub errors: BTreeMap<u16, u64>,
    pub throughput_rps: f64,
    pub rows_per_s: f64,
    pub latency_us: Percentiles,
    /// Mean `x-inferd-batch-size` of the answers: how well requests were batched.
    pub mean_batch_rows: Option<f64>,
    /// (latency µs, fraction of requests at or under it).
    pub cdf: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
    pub mean: f64,
}

impl Percentiles {
    pub fn of(h: &hdrhistogram::Histogram<u64>) -> Self {
        Percentiles {
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
            mean: h.mean(),
        }
    }
}

impl HttpReport {
    pub fn new(
        model: &str,
        protocol: crate::bodies::Protocol,
        rows: usize,
        concurrency: Option<usize>,
        rate: Option<f64>,
        outcome: &Outcome,
    ) -> Self {
        let ok: u64 = outcome.statuses.iter().filter(|(c, _)| (200..300).contains(*c)).map(|(_, n)| n).sum();
        let errors = outcome.statuses.iter().filter(|(c, _)| !(200..300).contains(*c)).map(|(c, n)| (*c, *n)).collect();
        let seconds = outcome.elapsed.as_secs_f64().max(1e-9);
        let h = &outcome.latency_us;
        let cdf = (0..=200)
            .map(|i| {
                let q = i as f64 / 200.0;
                (h.value_at_quantile(q) as f64, q)
            })
            .collect();
        HttpReport {
            model: model.to_owned(),
            protocol,
            rows_per_request: rows,
            concurrency,
            rate,
            duration_s: seconds,
            requests_ok: ok,
            errors,
            throughput_rps: ok as f64 / seconds,
            rows_per_s: (ok * rows as u64) as f64 / seconds,
            latency_us: Percentiles::of(h),
            mean_batch_rows: (outcome.batch_rows.1 > 0)
                .then(|| outcome.batch_rows.0 as f64 / outcome.batch_rows.1 as f64),
            cdf,
        }
    }
}

/// One engine-only measurement at one batch size.
#[derive(Debug, Clone, Serialize)]
pub struct EngineReport {
    pub model: String,
    pub batch_size: usize,
    pub calls: u64,
    pub rows_per_s: f64,
    pub latency_us: Percentiles,
    /// A text model's padded tokens over real tokens in the batches run.
    pub padding_waste: Option<f64>,
    /// A vision model: milliseconds its task took to make the picture into its tensor (decode, resize, scale), on
    /// one thread, the mean of 20 runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prepare_ms: Option<f64>,
}

pub fn http_table(reports: &[HttpReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:<9} {:>4} {:>11} {:>11} {:>11} {:>8} {:>8} {:>8} {:>8} {:>7}  errors",
        "model", "protocol", "rows", "load", "req/s", "rows/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "batch"
    );
    for r in reports {
        let load = match (r.concurrency, r.rate) {
            (Some(c), _) => format!("c={c}"),
            (None, Some(rate)) => format!("{rate:.0}/s"),
            _ => "-".into(),
        };
        let errors = if r.errors.is_empty() {
            "0".to_owned()
        } else {
            r.errors.iter().map(|(c, n)| format!("{c}:{n}")).collect::<Vec<_>>().join(" ")
        };
        let l = r.latency_us;
        let _ = writeln!(
            out,
            "{:<14} {:<9} {:>4} {:>11} {:>11.0} {:>11.0} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>7}  {errors}",
            r.model,
            serde_json::to_value(r.protocol).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
            r.rows_per_request,
            load,
            r.throughput_rps,
            r.rows_per_s,
            l.p50 as f64 / 1e3,
            l.p90 as f64 / 1e3,
            l.p99 as f64 / 1e3,
            l.max as f64 / 1e3,
            r.mean_batch_rows.map_or("-".into(), |b| format!("{b:.1}")),
        );
    }
    out
}

pub fn engine_table(reports: &[EngineReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:>6} {:>9} {:>12} {:>9} {:>9} {:>8}",
        "model", "batch", "calls", "rows/s", "p50 ms", "p99 ms", "padding"
    );
    for r in reports {
        let _ = writeln!(
            out,
            "{:<14} {:>6} {:>9} {:>12.0} {:>9.3} {:>9.3} {:>8}",
            r.model,
            r.batch_size,
            r.calls,
            r.rows_per_s,
            r.latency_us.p50 as f64 / 1e3,
            r.latency_us.p99 as f64 / 1e3,
            r.padding_waste.map_or_else(|| "-".to_owned(), |w| format!("{w:.3}"))
        );
    }
    if let Some(ms) = reports.first().and_then(|r| r.prepare_ms) {
        let _ = writeln!(out, "making the picture into its tensor (one thread): {ms:.3} ms");
    }
    out
}

/// Writes `value` as `dir/name.json`.
pub fn write_json(dir: &Path, name: &str, value: &impl Serialize) -> anyhow::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(value)?)?;
    Ok(path)
}

/// A line chart as a self-contained SVG: one or more series, linear or log x axis, labelled axes.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    log_x: bool,
    series: &[(String, Vec<(f64, f64)>)],
) -> String {
    const W: f64 = 720.0;
    const H: f64 = 420.0;
    const LEFT: f64 = 80.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 40.0;
    const BOTTOM: f64 = 60.0;
    const COLOURS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];
    let points: Vec<(f64, f64)> =
        series.iter().flat_map(|(_, p)| p.iter().copied()).filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
    let fx = |x: f64| if log_x { x.max(1e-9).log10() } else { x };
    let (mut x0, mut x1) = points.iter().fold((f64::MAX, f64::MIN), |(a, b), (x, _)| (a.min(fx(*x)), b.max(fx(*x))));
    let y1 = points.iter().fold(0.0f64, |m, (_, y)| m.max(*y)) * 1.08;
    if x1.partial_cmp(&x0) != Some(std::cmp::Ordering::Greater) {
        x0 -= 1.0;
        x1 += 1.0;
    }
    let y1 = if y1 > 0.0 { y1 } else { 1.0 };
    let px = |x: f64| LEFT + (fx(x) - x0) / (x1 - x0) * (W - LEFT - RIGHT);
    let py = |y: f64| H - BOTTOM - y / y1 * (H - TOP - BOTTOM);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        W / 2.0,
        escape(title)
    );
    // Axes, with five ticks on each.
    let _ = writeln!(svg, "<path d=\"M{LEFT} {TOP} V{} H{}\" stroke=\"black\" fill=\"none\"/>", H - BOTTOM, W - RIGHT);
    for i in 0..=5 {
        let t = i as f64 / 5.0;
        let y = y1 * t;
        let _ =
            writeln!(svg, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>", LEFT - 6.0, py(y) + 4.0, tick(y));
        let _ = writeln!(svg, "<path d=\"M{LEFT} {0} H{1}\" stroke=\"#ddd\"/>", py(y), W - RIGHT);
        let xv = x0 + (x1 - x0) * t;
        let x = if log_x { 10f64.powf(xv) } else { xv };
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            px(x),
            H - BOTTOM + 18.0,
            tick(x)
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        (LEFT + W - RIGHT) / 2.0,
        H - 15.0,
        escape(x_label)
    );
    let _ = writeln!(
        svg,
        "<text transform=\"translate(18 {}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        (TOP + H - BOTTOM) / 2.0,
        escape(y_label)
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = pts
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/>",
            path.join(" ")
        );
        if pts.len() <= 16 {
            for (x, y) in pts {
                let _ = writeln!(svg, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/>", px(*x), py(*y));
            }
        }
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" fill=\"{colour}\">{}</text>",
            LEFT + 12.0,
            TOP + 16.0 + 16.0 * i as f64,
            escape(name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn tick(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_places_every_series_and_label() {
        let svg = line_chart(
            "t <1>",
            "clients",
            "req/s",
            true,
            &[("a".into(), vec![(1.0, 10.0), (64.0, 100.0)]), ("b".into(), vec![(1.0, 5.0), (64.0, 50.0)])],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("t &lt;1&gt;"));
        // The largest value sits under the top of the plot, the smallest x at its left edge.
        assert!(svg.contains("<circle cx=\"80.0\""));
    }
}
