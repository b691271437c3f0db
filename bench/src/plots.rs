//! The SVG plots of `make bench`, drawn with `plotters` (SVG backend) into
//! `<report dir>/benchmarks/` and linked from the report: per-change agent CPU and bytes sent vs
//! pods on the node (Delta vs SotW; docs/benchmarks.md, section 3e, "One policy change on the live
//! agent"), live agent RSS vs pods (section 3d, "The running agent's resident size per pod").
//! Written only when the report is.

use std::ops::Range;
use std::path::Path;

use anyhow::Context;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use crate::Report;
use crate::ads_mode::Mode;

/// One node size × ADS mode of section 3e, "One policy change on the live agent".
pub(crate) struct ChangePoint {
    pub pods: usize,
    pub mode: Mode,
    /// Agent CPU per policy change (p50), seconds.
    pub cpu_s: f64,
    /// CDS bytes sent per policy change (p50).
    pub bytes: f64,
}

/// One node size of section 3d, "The running agent's resident size per pod", KiB.
pub(crate) struct RssPoint {
    pub pods: usize,
    /// The agent with no pods.
    pub baseline_kib: u64,
    pub listed_kib: u64,
    pub relisted_kib: u64,
}

/// What the sections measured for the plots.
#[derive(Default)]
pub(crate) struct Data {
    pub per_change: Vec<ChangePoint>,
    pub rss: Vec<RssPoint>,
}

/// A named line: (x, y) points in drawing order.
type Series = (String, Vec<(f64, f64)>);

/// The points of `mode`, (pods, `value`), sorted by pods, keeping only values a log axis can show
/// (finite and > 0: a CPU figure less its idle baseline can come out ≤ 0).
fn change_series(points: &[ChangePoint], mode: Mode, value: impl Fn(&ChangePoint) -> f64) -> Series {
    let mut xy: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.mode == mode)
        .map(|p| (p.pods as f64, value(p)))
        .filter(|(_, y)| y.is_finite() && *y > 0.0)
        .collect();
    xy.sort_by(|a, b| a.0.total_cmp(&b.0));
    (mode.name().to_owned(), xy)
}

/// RSS in MiB after the list and after the relist, from the no-pod baseline (at 0 pods), and the
/// issue's bound (baseline + 8 KiB per pod).
fn rss_series(points: &[RssPoint]) -> Vec<Series> {
    let mut sorted: Vec<&RssPoint> = points.iter().collect();
    sorted.sort_by_key(|p| p.pods);
    let Some(first) = sorted.first() else { return Vec::new() };
    let mib = |kib: u64| kib as f64 / 1024.0;
    let base = (0.0, mib(first.baseline_kib));
    let line = |name: &str, f: &dyn Fn(&RssPoint) -> u64| {
        let mut xy = vec![base];
        xy.extend(sorted.iter().map(|p| (p.pods as f64, mib(f(p)))));
        (name.to_owned(), xy)
    };
    vec![
        line("after the initial list", &|p| p.listed_kib),
        line("after a forced relist", &|p| p.relisted_kib),
        line("target: baseline + 8 KiB/pod", &|p| first.baseline_kib + 8 * p.pods as u64),
    ]
}

/// The smallest and largest x and y over `series`.
fn bounds(series: &[Series]) -> Option<(Range<f64>, Range<f64>)> {
    let points = || series.iter().flat_map(|(_, xy)| xy.iter());
    let fold = |f: fn(&(f64, f64)) -> f64| {
        points()
            .map(f)
            .fold(None, |acc: Option<(f64, f64)>, v| Some(acc.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v)))))
    };
    let (x, y) = (fold(|p| p.0)?, fold(|p| p.1)?);
    Some((x.0..x.1, y.0..y.1))
}

/// A log range around `r` (a factor 2 of room each side).
fn log_room(r: &Range<f64>) -> Range<f64> {
    r.start / 2.0..r.end * 2.0
}

const COLORS: [RGBColor; 3] = [RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(120, 120, 120)];

/// Draws `series` as lines with points on a log x axis (pods) and the `y` axis.
fn draw<Y>(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    x: Range<f64>,
    y: Y,
) -> anyhow::Result<()>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    draw_on(path, title, x_desc, y_desc, series, x.log_scale(), y)
}

fn draw_on<X, Y>(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    x: X,
    y: Y,
) -> anyhow::Result<()>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw().map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, (name, xy)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(xy.iter().copied(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(xy.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}")).with_context(|| format!("writing {}", path.display()))
}

/// Writes the plots whose data the run has into `<dir of out>/benchmarks/` and adds a "Plots"
/// section linking them to the report.
///
/// # Errors
/// When the directory or an SVG cannot be written.
pub(crate) fn section(r: &mut Report, out: &Path) -> anyhow::Result<()> {
    let dir = out.parent().unwrap_or(Path::new(".")).join("benchmarks");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut links = Vec::new();
    let per_change = &r.plots.per_change;
    let cpu: Vec<Series> = [Mode::Delta, Mode::Sotw]
        .map(|m| change_series(per_change, m, |p| p.cpu_s * 1e3))
        .into_iter()
        .filter(|(_, xy)| !xy.is_empty())
        .collect();
    if let Some((x, y)) = bounds(&cpu) {
        let file = "per-change-cpu.svg";
        draw(
            &dir.join(file),
            "Agent CPU per policy change (p50)",
            "pods on the node",
            "ms",
            &cpu,
            log_room(&x),
            log_room(&y).log_scale(),
        )?;
        links.push(("Per-change agent CPU vs pods, Delta vs SotW (section 3e)", file));
    }
    let bytes: Vec<Series> = [Mode::Delta, Mode::Sotw]
        .map(|m| change_series(per_change, m, |p| p.bytes))
        .into_iter()
        .filter(|(_, xy)| !xy.is_empty())
        .collect();
    if let Some((x, y)) = bounds(&bytes) {
        let file = "per-change-bytes.svg";
        draw(
            &dir.join(file),
            "CDS bytes sent per policy change (p50)",
            "pods on the node",
            "bytes (log)",
            &bytes,
            log_room(&x),
            log_room(&y).log_scale(),
        )?;
        links.push(("Per-change bytes sent to Envoy vs pods, Delta vs SotW (section 3e)", file));
    }
    let rss = rss_series(&r.plots.rss);
    if let Some((x, y)) = bounds(&rss) {
        let file = "rss-per-pod.svg";
        draw_on(
            &dir.join(file),
            "Live agent RSS vs pods",
            "pods on the node",
            "MiB",
            &rss,
            0.0..x.end * 1.05,
            0.0..y.end * 1.1,
        )?;
        links.push(("Live agent RSS vs pods, after the list and after a relist (section 3d)", file));
    }
    if links.is_empty() {
        return Ok(());
    }
    r.line("## Plots\n");
    for (alt, file) in links {
        r.line(&format!("![{alt}](benchmarks/{file})\n"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(pods: usize, mode: Mode, cpu_s: f64) -> ChangePoint {
        ChangePoint { pods, mode, cpu_s, bytes: 10.0 * pods as f64 }
    }

    #[test]
    fn change_series_sorts_by_pods_keeps_its_mode_and_drops_what_log_cannot_show() {
        let points = [
            point(10_000, Mode::Delta, 0.002),
            point(110, Mode::Delta, 0.001),
            point(1_000, Mode::Sotw, 0.02),
            point(1_000, Mode::Delta, -0.0001),
            point(5, Mode::Delta, f64::NAN),
        ];
        let (name, xy) = change_series(&points, Mode::Delta, |p| p.cpu_s);
        assert_eq!(name, "Delta");
        assert_eq!(xy, vec![(110.0, 0.001), (10_000.0, 0.002)]);
        let (_, bytes) = change_series(&points, Mode::Sotw, |p| p.bytes);
        assert_eq!(bytes, vec![(1_000.0, 10_000.0)]);
    }

    #[test]
    fn rss_series_start_at_the_baseline_and_bound_it_by_8_kib_per_pod() {
        let points = [
            RssPoint { pods: 10_000, baseline_kib: 10_240, listed_kib: 92_160, relisted_kib: 94_208 },
            RssPoint { pods: 1_000, baseline_kib: 10_240, listed_kib: 18_432, relisted_kib: 19_456 },
        ];
        let s = rss_series(&points);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].1, vec![(0.0, 10.0), (1_000.0, 18.0), (10_000.0, 90.0)]);
        assert_eq!(s[1].1[2], (10_000.0, 92.0));
        assert_eq!(s[2].1, vec![(0.0, 10.0), (1_000.0, 10.0 + 8_000.0 / 1024.0), (10_000.0, 10.0 + 80_000.0 / 1024.0)]);
        assert!(rss_series(&[]).is_empty());
    }

    #[test]
    fn bounds_span_every_series() {
        let s: Vec<Series> = vec![("a".into(), vec![(1.0, 5.0), (3.0, 2.0)]), ("b".into(), vec![(2.0, 9.0)])];
        assert_eq!(bounds(&s), Some((1.0..3.0, 2.0..9.0)));
        assert_eq!(bounds(&[]), None);
    }

    #[test]
    fn section_writes_svgs_and_links_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Report::default();
        for (pods, d, s) in [(110, 0.001, 0.002), (1_000, 0.0011, 0.01), (10_000, 0.0012, 0.1)] {
            r.plots.per_change.push(point(pods, Mode::Delta, d));
            r.plots.per_change.push(point(pods, Mode::Sotw, s));
        }
        r.plots.rss.push(RssPoint { pods: 1_000, baseline_kib: 10_000, listed_kib: 18_000, relisted_kib: 18_500 });
        section(&mut r, &dir.path().join("benchmarks.md")).unwrap();
        for file in ["per-change-cpu.svg", "per-change-bytes.svg", "rss-per-pod.svg"] {
            let svg = std::fs::read_to_string(dir.path().join("benchmarks").join(file)).unwrap();
            assert!(svg.starts_with("<svg"), "{file}: {svg:.200}");
            let legend = if file.starts_with("rss") { "after a forced relist" } else { "SotW" };
            assert!(svg.contains(legend), "{file} has the legend {legend}");
            assert!(r.text.contains(&format!("](benchmarks/{file})")), "{file} is linked");
        }
    }
}
