//! Plots, each written as SVG and PNG: accuracy against budget and against KV memory (the Pareto
//! view), throughput and output length against budget, and heat maps of the positions a policy keeps
//! (from trace files). Text is drawn with DejaVu Sans, embedded in the binary (`assets/fonts`, Bitstream
//! Vera licence), so PNGs render the same on machines without fonts.

use super::{ticks, Row, Summary};
use crate::error::{Error, Result};
use crate::results::trace::TraceLine;
use plotters::coord::Shift;
use plotters::element::ErrorBar;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
const SIZE: (u32, u32) = (960, 640);

/// Registers the embedded font once.
fn fonts() -> Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *ONCE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    ok.then_some(())
        .ok_or_else(|| Error::Input("the embedded plot font could not be read".into()))
}

fn plot_err<E: std::fmt::Debug>(path: &Path) -> impl Fn(E) -> Error + '_ {
    move |e| Error::Input(format!("{}: cannot draw the plot: {e:?}", path.display()))
}

/// Draws `draw` into `stem.svg` and `stem.png`, each written to a temporary file and renamed.
fn both(
    stem: &Path,
    draw: &dyn Fn(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<()>,
    draw_png: &dyn Fn(&DrawingArea<BitMapBackend<'_>, Shift>) -> Result<()>,
) -> Result<Vec<PathBuf>> {
    fonts()?;
    let svg = stem.with_extension("svg");
    let png = stem.with_extension("png");
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err(&svg))?;
        draw(&root)?;
        root.present().map_err(plot_err(&svg))?;
    }
    let mut f = crate::results::AtomicFile::create(&svg)?;
    std::io::Write::write_all(&mut f, text.as_bytes()).map_err(|e| Error::io(&svg, e))?;
    f.commit()?;
    // The bitmap backend picks its encoder by the extension: the temporary file ends in `.png`.
    crate::results::write_through_temp(&png, ".png", |temp| {
        let root = BitMapBackend::new(temp, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err(&png))?;
        draw_png(&root)?;
        root.present().map_err(plot_err(&png))
    })?;
    Ok(vec![svg, png])
}

/// A line chart: one line per series, an optional horizontal reference line.
struct LineChart {
    title: String,
    /// A fixed y range floor and ceiling (accuracy: 0 to at most 100).
    percent: bool,
    x_label: String,
    y_label: String,
    series: Vec<(String, Vec<(f64, f64)>)>,
    /// Interval bars by series label: (x, the point's y, low, high).
    bars: Bars,
    reference: Option<(String, f64)>,
    log_x: bool,
}

/// The colour of series `i`; `full` is always black.
fn color(i: usize, label: &str) -> RGBColor {
    const C: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(23, 190, 207),
        RGBColor(188, 189, 34),
        RGBColor(127, 127, 127),
    ];
    if label == "full" || label == "full cache" {
        return BLACK;
    }
    C[i % C.len()]
}

/// An axis's range around `values`, padded by `pad` of their spread; one value alone (a run at one
/// budget) sits in the middle of an axis half its size either side (an axis a hundredth of it wide
/// labelled its ticks 0.0995, 0.0996, ...).
fn range(values: impl Iterator<Item = f64>, pad: f64) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if lo == hi {
        let half = if hi == 0.0 { 0.5 } else { hi.abs() / 2.0 };
        return (lo - half, hi + half);
    }
    let span = (hi - lo).max(hi.abs() * 0.1).max(1e-9);
    (lo - pad * span, hi + pad * span)
}

impl LineChart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, path: &Path) -> Result<()> {
        let err = plot_err(path);
        let xs = self.series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0));
        let tx = |x: f64| if self.log_x { x.max(1e-9).log10() } else { x };
        let (x0, x1) = range(xs.map(tx), 0.05);
        let ys = self
            .series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.1))
            .chain(
                self.bars
                    .iter()
                    .flat_map(|(_, b)| b.iter().flat_map(|q| [q.2, q.3])),
            )
            .chain(self.reference.iter().map(|r| r.1));
        let (mut y0, mut y1) = range(ys, 0.1);
        if y0 < 0.0
            && self
                .series
                .iter()
                .all(|(_, p)| p.iter().all(|q| q.1 >= 0.0))
        {
            y0 = 0.0;
        }
        if self.percent {
            // Accuracy from 0, to a little above the best score (10% at least, 100% at most).
            (y0, y1) = (0.0, (y1 * 1.1).clamp(10.0, 100.0));
        }
        // A long title (a model file's name, a data file's hash) gets a smaller font rather than
        // running off the image: about 0.55 em per character of sans-serif.
        let width = root.dim_in_pixel().0 as f64;
        let chars = self.title.chars().count().max(1) as f64;
        let font = (width * 0.95 / (0.55 * chars)).clamp(12.0, 22.0);
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", font))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(ticks::XAxis::new(x0..x1, self.log_x), y0..y1)
            .map_err(&err)?;
        let log_x = self.log_x;
        // Each tick with the digits that tell it from its neighbours (`ticks`).
        let n = ticks::LABELS;
        chart
            .configure_mesh()
            .x_labels(n)
            .y_labels(n)
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .x_label_formatter(&|&x| match log_x {
                true => ticks::power_of_two(x, x1 - x0, n),
                false => ticks::linear(x, x1 - x0, n),
            })
            .y_label_formatter(&|&y| ticks::linear(y, y1 - y0, n))
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 17))
            .draw()
            .map_err(&err)?;
        if let Some((label, y)) = &self.reference {
            let style = ShapeStyle::from(&BLACK).stroke_width(2);
            chart
                .draw_series(DashedLineSeries::new(vec![(x0, *y), (x1, *y)], 8, 6, style))
                .map_err(&err)?
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        for (i, (label, points)) in self.series.iter().enumerate() {
            let c = color(i, label);
            // With interval bars, series sharing an x are set side by side (1% of the axis apart)
            // so that their bars do not hide each other.
            let n = self.series.len() as f64;
            let dodge = if self.bars.is_empty() {
                0.0
            } else {
                (i as f64 - (n - 1.0) / 2.0) * 0.01 * (x1 - x0)
            };
            let at = |x: f64| tx(x) + dodge;
            let pts: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (at(x), y)).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
                .map_err(&err)?
                .label(label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
                .map_err(&err)?;
            let bars = self.bars.iter().filter(|(l, _)| l == label);
            for (_, b) in bars {
                chart
                    .draw_series(b.iter().map(|&(x, y, lo, hi)| {
                        ErrorBar::new_vertical(at(x), lo, y, hi, c.stroke_width(1), 8)
                    }))
                    .map_err(&err)?;
            }
        }
        chart
            .configure_series_labels()
            // Away from the lines: a falling curve leaves the upper right free, a rising one the lower.
            .position(if self.falling() {
                SeriesLabelPosition::UpperRight
            } else {
                SeriesLabelPosition::UpperLeft
            })
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(&err)?;
        Ok(())
    }

    /// Whether the series mostly end lower than they start.
    fn falling(&self) -> bool {
        let (mut down, mut up) = (0, 0);
        for (_, p) in &self.series {
            if let (Some(a), Some(b)) = (p.first(), p.last()) {
                if b.1 < a.1 {
                    down += 1;
                } else if b.1 > a.1 {
                    up += 1;
                }
            }
        }
        down > up
    }

    fn write(&self, stem: &Path) -> Result<Vec<PathBuf>> {
        let svg = stem.with_extension("svg");
        let png = stem.with_extension("png");
        both(stem, &|root| self.draw(root, &svg), &|root| {
            self.draw(root, &png)
        })
    }
}

/// A line chart of the given series (one line each), written as `stem.svg` and `stem.png`.
pub fn lines(
    stem: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: Vec<(String, Vec<(f64, f64)>)>,
    log_x: bool,
) -> Result<Vec<PathBuf>> {
    LineChart {
        title: title.into(),
        percent: false,
        x_label: x_label.into(),
        y_label: y_label.into(),
        series,
        bars: Vec::new(),
        reference: None,
        log_x,
    }
    .write(stem)
}

/// Labelled lines of (x, y) points.
type Series = Vec<(String, Vec<(f64, f64)>)>;
/// Labelled interval bars: (x, the point's y, low, high).
type Bars = Vec<(String, Vec<(f64, f64, f64, f64)>)>;
/// Series and their interval bars: one line per policy.
type Lines = (Series, Bars);
/// A summary chart: file stem, title, axis labels, lines, reference line, log x.
type ChartSpec<'a> = (
    &'a str,
    String,
    String,
    String,
    Lines,
    Option<(String, f64)>,
    bool,
);

/// Per policy (other than full), its rows' points; with the budgets the x value of each. `band`
/// gives a point's interval (low, high) in y units, drawn as a bar.
fn series(
    rows: &[&Row],
    y: impl Fn(&Row) -> Option<f64>,
    band: impl Fn(&Row) -> Option<(f64, f64)>,
    x: impl Fn(&Row) -> f64,
) -> Lines {
    let mut by: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut bars: BTreeMap<String, Vec<(f64, f64, f64, f64)>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.policy != "full") {
        if let Some(v) = y(r) {
            let label = if rows
                .iter()
                .any(|o| o.policy == r.policy && o.budget == r.budget && o.config != r.config)
            {
                r.config.clone()
            } else {
                r.policy.clone()
            };
            let label = with_kv_type(rows, r, label);
            if let Some((lo, hi)) = band(r) {
                bars.entry(label.clone())
                    .or_default()
                    .push((x(r), v, lo, hi));
            }
            by.entry(label).or_default().push((x(r), v));
        }
    }
    let series = by
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            (k, v)
        })
        .collect();
    (series, bars.into_iter().collect())
}

/// `label` with the row's cache type and activations' type where the rows differ in them: one line
/// per (policy, types).
fn with_kv_type(rows: &[&Row], r: &Row, label: String) -> String {
    let label = if rows.iter().any(|o| o.kv_type != r.kv_type) {
        format!("{label} [{}]", r.kv_type)
    } else {
        label
    };
    if rows.iter().any(|o| o.activations != r.activations) {
        format!("{label} [{} activations]", r.activations)
    } else {
        label
    }
}

/// A row's paired interval of Δ pass@1, moved onto its own pass@1 (percent): the point plus the
/// interval's distance from the estimate.
fn pass_band(r: &Row) -> Option<(f64, f64)> {
    let (d, lo, hi) = (r.delta_pass?, r.delta_pass_lo?, r.delta_pass_hi?);
    let y = 100.0 * r.pass_at_1?;
    Some((y + 100.0 * (lo - d), y + 100.0 * (hi - d)))
}

/// A row's interval of the length ratio to full, scaled onto its mean length.
fn length_band(r: &Row) -> Option<(f64, f64)> {
    let (c, lo, hi) = (
        r.tokens_change_vs_full?,
        r.tokens_change_lo?,
        r.tokens_change_hi?,
    );
    let scale = r.mean_tokens / (1.0 + c).max(1e-9);
    Some((scale * (1.0 + lo), scale * (1.0 + hi)))
}

/// Writes the summary plots into `dir`; returns the files written.
pub fn summary_plots(s: &Summary, dir: &Path) -> Result<Vec<PathBuf>> {
    let rows: Vec<&Row> = s.rows.iter().collect();
    let subject = s.subject();
    let full = rows.iter().find(|r| r.policy == "full");
    let budgets: Vec<f64> = rows.iter().filter_map(|r| r.budget).collect();
    // Fractions and entry counts do not share an axis: plot fractions when any are there.
    let fractional = budgets.iter().any(|&b| b <= 1.0);
    let in_axis = |r: &&Row| r.budget.is_some_and(|b| (b <= 1.0) == fractional);
    let on_axis: Vec<&Row> = rows
        .iter()
        .copied()
        .filter(|r| r.policy == "full" || in_axis(r))
        .collect();
    // A fraction is of the full run's mean output length (the papers' rule, `ratio`, and `held`),
    // resolved into entries there; under `seen` it is of the tokens seen, and none is resolved.
    let fractions = on_axis.iter().filter(|r| r.budget.is_some());
    let resolved = fractions
        .clone()
        .filter(|r| r.full_mean_tokens.is_some())
        .count();
    let x_budget = match (fractional, resolved) {
        (false, _) => "KV budget (entries per layer and head)",
        (true, n) if n == fractions.count() => {
            "KV budget (ratio of the full run's mean output length)"
        }
        (true, 0) => "KV budget (fraction of tokens seen)",
        (true, _) => "KV budget (ratio; each row's rule in the table)",
    };
    let log_x = !fractional;
    let budget_of = |r: &Row| r.budget.unwrap_or(1.0);
    let none = |_: &Row| None;
    let mut files = Vec::new();
    let bars_note = "; bars: 95% paired bootstrap interval vs full";
    let memory_lines = {
        let (mut lines, bars) = series(
            &rows,
            // Rows without memory figures are left out, never drawn at zero.
            |r| r.kv_mean_bytes.and(r.pass_at_1).map(|p| 100.0 * p),
            pass_band,
            |r| r.kv_mean_bytes.unwrap_or(0.0) / (1 << 20) as f64,
        );
        // The full cache is a point here (its memory is the point of the comparison), one per cache
        // type: both axes of the memory/accuracy front.
        // A full cache of a coarser type than the reference carries its interval against it.
        let mut bars = bars;
        for f in rows.iter().filter(|r| r.policy == "full") {
            if let (Some(m), Some(pass)) = (f.kv_mean_bytes, f.pass_at_1) {
                let (label, x) = (
                    with_kv_type(&rows, f, "full cache".to_string()),
                    m / (1 << 20) as f64,
                );
                if let Some((lo, hi)) = pass_band(f) {
                    bars.push((label.clone(), vec![(x, 100.0 * pass, lo, hi)]));
                }
                lines.push((label, vec![(x, 100.0 * pass)]));
            }
        }
        (lines, bars)
    };
    let mut charts: Vec<ChartSpec> = vec![
        (
            "accuracy_vs_budget",
            format!("Accuracy vs KV budget: {subject}"),
            x_budget.to_string(),
            format!("pass@1 (%){bars_note}"),
            series(
                &on_axis,
                |r| r.pass_at_1.map(|p| 100.0 * p),
                pass_band,
                budget_of,
            ),
            full.and_then(|f| f.pass_at_1.map(|p| ("full cache".to_string(), 100.0 * p))),
            log_x,
        ),
        (
            "delta_vs_budget",
            format!("Δ pass@1 vs the full cache: {subject}"),
            x_budget.to_string(),
            "Δ pass@1 vs full (points), 95% paired bootstrap interval".to_string(),
            series(
                &on_axis,
                |r| r.delta_pass.map(|d| 100.0 * d),
                |r| Some((100.0 * r.delta_pass_lo?, 100.0 * r.delta_pass_hi?)),
                budget_of,
            ),
            Some(("no difference".to_string(), 0.0)),
            log_x,
        ),
        (
            "accuracy_vs_memory",
            format!("Accuracy vs KV memory: {subject}"),
            "time-averaged KV cache per sequence (MiB)".to_string(),
            format!("pass@1 (%){bars_note}"),
            memory_lines,
            None,
            false,
        ),
        (
            "throughput_vs_budget",
            format!("Decode throughput vs KV budget: {subject}"),
            x_budget.to_string(),
            "decode throughput (tokens/s, all sequences of a batch)".to_string(),
            series(&on_axis, |r| r.decode_tokens_per_s, none, budget_of),
            full.and_then(|f| f.decode_tokens_per_s.map(|t| ("full cache".to_string(), t))),
            log_x,
        ),
        (
            "length_vs_budget",
            format!("Output length vs KV budget: {subject}"),
            x_budget.to_string(),
            format!("mean output length (tokens){bars_note}"),
            series(&on_axis, |r| Some(r.mean_tokens), length_band, budget_of),
            full.map(|f| ("full cache".to_string(), f.mean_tokens)),
            log_x,
        ),
    ];
    // Fidelity by position: one line per (policy, budget) that measured it.
    let fidelity: Vec<(String, Vec<(f64, f64)>)> = rows
        .iter()
        .filter(|r| !r.kl_by_position.is_empty())
        .map(|r| {
            let label = match r.budget {
                Some(b) => format!("{} {b}", r.policy),
                None => r.policy.clone(),
            };
            let w = r.fidelity_bucket as f64;
            let pts = r
                .kl_by_position
                .iter()
                .enumerate()
                .map(|(i, &kl)| ((i as f64 + 0.5) * w, kl))
                .collect();
            (label, pts)
        })
        .collect();
    if !fidelity.is_empty() {
        charts.push((
            "fidelity_vs_position",
            format!("Teacher-forced KL from the full cache by position: {subject}"),
            "output position (tokens)".to_string(),
            "KL(full ‖ policy), nats, mean over samples".to_string(),
            (fidelity, Vec::new()),
            None,
            false,
        ));
    }
    for (stem, title, x_label, y_label, (series, bars), reference, log_x) in charts {
        if series.is_empty() && reference.is_none() {
            continue;
        }
        // The Δ chart has a reference line but nothing to draw without paired rows.
        if stem == "delta_vs_budget" && series.is_empty() {
            continue;
        }
        let chart = LineChart {
            percent: y_label.starts_with("pass@1"),
            title,
            x_label,
            y_label,
            series,
            bars,
            reference,
            log_x,
        };
        files.extend(chart.write(&dir.join(stem))?);
    }
    Ok(files)
}

/// One column of a heat map: the event's step and, per position, the share of cache heads keeping it.
struct Column {
    seen: usize,
    kept: Vec<f32>,
}

/// The most columns a heat map draws: a policy that evicts every step (H2O) has an event a token, and
/// a column for each event of a 32K-token output took 32K columns of 32K shares (4 GB) and an SVG to
/// match; past this many, evenly spaced events stand for the rest (the title says how many).
const MAX_HEAT_COLUMNS: usize = 1_000;

/// The most shares a heat map's columns hold together (256 MiB of f32): fewer columns than
/// [`MAX_HEAT_COLUMNS`] where each is longer than 65,536 tokens (at least two, the first and last).
const MAX_HEAT_CELLS: usize = 1 << 26;

/// Heat-map columns of one sequence, built a trace line at a time: per `seen`, how many of the
/// event's heads keep each position, and how many heads there were.
#[derive(Default)]
struct ColumnBuilder {
    counts: BTreeMap<usize, (Vec<f32>, usize)>,
}

impl ColumnBuilder {
    fn add(&mut self, l: &TraceLine) {
        let (kept, heads) = self
            .counts
            .entry(l.seen)
            .or_insert_with(|| (vec![0f32; l.seen], 0));
        for &p in &l.kept {
            if let Some(k) = kept.get_mut(p as usize) {
                *k += 1.0;
            }
        }
        *heads += 1;
    }

    /// One column per distinct `seen`, in order, each position's count over the event's heads.
    fn finish(self) -> Vec<Column> {
        self.counts
            .into_iter()
            .map(|(seen, (mut kept, heads))| {
                let n = heads as f32;
                kept.iter_mut().for_each(|k| *k /= n);
                Column { seen, kept }
            })
            .collect()
    }
}

/// Which of a sequence's events (their `seen`, ascending and distinct) its heat map draws: all of
/// them up to `most`, else `most` evenly spaced, the first and the last among them.
fn chosen_events(seen: &[usize], most: usize) -> Vec<usize> {
    if seen.len() <= most || most < 2 {
        return seen.iter().copied().take(most.max(1)).collect();
    }
    (0..most)
        .map(|i| seen[i * (seen.len() - 1) / (most - 1)])
        .collect()
}

/// A trace checked and ready to draw: its file, the most tokens its sample saw, the label of its row,
/// and each traced sequence's events (their `seen`, ascending).
pub struct TracePlan {
    path: PathBuf,
    most_seen: usize,
    label: String,
    events: BTreeMap<String, Vec<usize>>,
}

/// Reads the trace at `path` once through ([`crate::results::trace::visit_trace`], which refuses a
/// damaged line by file and line) for the events of each sequence, holding no kept list.
pub fn plan_heatmaps(path: &Path, most_seen: usize, label: String) -> Result<TracePlan> {
    let mut events: BTreeMap<String, std::collections::BTreeSet<usize>> = BTreeMap::new();
    crate::results::trace::visit_trace(path, most_seen, |t| {
        events.entry(t.sequence).or_default().insert(t.seen);
    })?;
    Ok(TracePlan {
        path: path.to_path_buf(),
        most_seen,
        label,
        events: events
            .into_iter()
            .map(|(s, e)| (s, e.into_iter().collect()))
            .collect(),
    })
}

fn draw_heatmap<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    path: &Path,
    title: &str,
    cols: &[Column],
) -> Result<()> {
    let err = plot_err(path);
    let max_seen = cols.iter().map(|c| c.seen).max().unwrap_or(1);
    let first = cols.first().map_or(0, |c| c.seen.saturating_sub(1));
    let (x0, x1, y1) = (first as f64, max_seen as f64 + 1.0, max_seen as f64);
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x0..x1, 0f64..y1)
        .map_err(&err)?;
    // Token counts and positions: ticks on whole numbers only.
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(ticks::whole(x1 - x0))
        .y_labels(ticks::whole(y1))
        .x_desc(
            "tokens seen at each compression event (shade: share of cache heads keeping an entry)",
        )
        .y_desc("original position of a cache entry")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(&err)?;
    chart
        .draw_series(spans(cols, max_seen).into_iter().map(|(x0, x1, p, shade)| {
            Rectangle::new(
                [(x0, p as f64), (x1, p as f64 + 1.0)],
                RGBColor(shade, shade, 255).filled(),
            )
        }))
        .map_err(&err)?;
    Ok(())
}

/// The shade of a kept share: white (kept by no head, `None`) to dark blue (kept by every head).
fn shade(k: f32) -> Option<u8> {
    (k > 0.0).then(|| (255.0 * (1.0 - f64::from(k))) as u8)
}

/// The heat map as rectangles `(x0, x1, position, shade)`: each position's consecutive columns of one
/// shade merged into one span (an event's column lasts until the next event), white left out. The
/// same picture as a rectangle per cell, in a fraction of the SVG: an H2O trace of 640 steps drew
/// 9.8 MB that way, most positions keeping one shade from entry to eviction.
fn spans(cols: &[Column], max_seen: usize) -> Vec<(f64, f64, usize, u8)> {
    let edges: Vec<(f64, f64)> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let x0 = c.seen as f64 - if i == 0 { 1.0 } else { 0.0 };
            let x1 = cols
                .get(i + 1)
                .map_or(max_seen as f64 + 1.0, |n| n.seen as f64);
            (x0, x1)
        })
        .collect();
    let positions = cols.iter().map(|c| c.kept.len()).max().unwrap_or(0);
    let mut out = Vec::new();
    for p in 0..positions {
        let mut open: Option<(f64, f64, u8)> = None;
        for (c, &(x0, x1)) in cols.iter().zip(&edges) {
            let here = c.kept.get(p).copied().and_then(shade);
            match (open.as_mut(), here) {
                (Some((_, end, s)), Some(h)) if *s == h => *end = x1,
                (_, here) => {
                    if let Some((a, b, s)) = open.take() {
                        out.push((a, b, p, s));
                    }
                    open = here.map(|h| (x0, x1, h));
                }
            }
        }
        if let Some((a, b, s)) = open {
            out.push((a, b, p, s));
        }
    }
    out
}

/// Writes one heat map per traced sequence of `plan` into `dir`, named after its label: the trace
/// read a second time, only the chosen events' lists counted (at most 1,000 columns and 2^26
/// shares per map: `MAX_HEAT_COLUMNS`, `MAX_HEAT_CELLS`).
pub fn heatmaps(plan: &TracePlan, subject: &str, dir: &Path) -> Result<Vec<PathBuf>> {
    let chosen: BTreeMap<&str, std::collections::HashSet<usize>> = plan
        .events
        .iter()
        .map(|(s, e)| {
            let longest = e.last().copied().unwrap_or(1).max(1);
            let most = MAX_HEAT_COLUMNS.min(MAX_HEAT_CELLS / longest).max(2);
            let keep = chosen_events(e, most);
            (s.as_str(), keep.into_iter().collect())
        })
        .collect();
    let mut builders: BTreeMap<String, ColumnBuilder> = BTreeMap::new();
    crate::results::trace::visit_trace(&plan.path, plan.most_seen, |t| {
        if chosen
            .get(t.sequence.as_str())
            .is_some_and(|c| c.contains(&t.seen))
        {
            builders.entry(t.sequence.clone()).or_default().add(&t);
        }
    })?;
    let mut files = Vec::new();
    for (seq, builder) in builders {
        let cols = builder.finish();
        if cols.is_empty() {
            continue;
        }
        let all = plan.events.get(&seq).map_or(cols.len(), Vec::len);
        let shown = match all > cols.len() {
            true => format!(" ({} of {all} events)", cols.len()),
            false => String::new(),
        };
        let label = &plan.label;
        let title = format!("Kept KV positions: {label}, {seq}, {subject}{shown}");
        // File names keep letters, digits and '-' only (a '.' would read as an extension).
        let slug: String = format!("keep_{label}_{seq}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let stem = dir.join(slug);
        let (svg, png) = (stem.with_extension("svg"), stem.with_extension("png"));
        files.extend(both(
            &stem,
            &|root| draw_heatmap(root, &svg, &title, &cols),
            &|root| draw_heatmap(root, &png, &title, &cols),
        )?);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    #[test]
    fn heat_map_cells_of_one_shade_merge_into_spans_over_events() {
        let col = |seen: usize, kept: &[f32]| super::Column {
            seen,
            kept: kept.to_vec(),
        };
        // Position 0 kept by every head throughout; 1 by half the heads, then evicted; 2 enters
        // at the second event.
        let cols = [
            col(10, &[1.0, 0.5]),
            col(20, &[1.0, 0.5, 1.0]),
            col(30, &[1.0, 0.0, 1.0]),
        ];
        assert_eq!(
            super::spans(&cols, 40),
            vec![(9.0, 41.0, 0, 0), (9.0, 30.0, 1, 127), (20.0, 41.0, 2, 0),]
        );
        assert!(super::spans(&[col(5, &[0.0, 0.0])], 5).is_empty());
    }

    use super::*;

    #[test]
    fn heat_map_columns_are_shares_of_heads() {
        let line = |seen, head, kept: &[u32]| TraceLine {
            sequence: "p#0".into(),
            generated: 0,
            seen,
            layer: 0,
            head,
            kept: kept.to_vec(),
        };
        let mut b = ColumnBuilder::default();
        for l in [line(4, 0, &[0, 3]), line(4, 1, &[0, 2]), line(6, 0, &[5])] {
            b.add(&l);
        }
        let cols = b.finish();
        assert_eq!(cols.len(), 2);
        assert_eq!(cols[0].kept, vec![1.0, 0.0, 0.5, 0.5]);
        assert_eq!(cols[1].seen, 6);
        assert_eq!(cols[1].kept[5], 1.0);
    }

    #[test]
    fn a_long_trace_draws_evenly_spaced_events_first_and_last_included() {
        let seen: Vec<usize> = (100..5_100).collect();
        let c = chosen_events(&seen, 1_000);
        assert_eq!(c.len(), 1_000);
        assert_eq!((c[0], c[999]), (100, 5_099));
        assert!(
            c.windows(2).all(|w| w[0] < w[1] && w[1] - w[0] <= 6),
            "evenly spaced"
        );
        assert_eq!(chosen_events(&seen[..10], 1_000), &seen[..10]);
        assert!(chosen_events(&[], 1_000).is_empty());
    }
}
