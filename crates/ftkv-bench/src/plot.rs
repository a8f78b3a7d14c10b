//! Line charts of a metric against value size, one line per series (SVG, drawn with
//! plotters): the x axis is log2 of the size, the y axis logarithmic.

use anyhow::Result;
use plotters::prelude::*;

/// A chart's texts, size and legend position.
pub struct Chart<'a> {
    pub caption: &'a str,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
    pub size: (u32, u32),
    pub legend: SeriesLabelPosition,
}

impl<'a> Chart<'a> {
    /// A 640×400 chart of `y_desc` against value size, the legend at the upper right.
    pub fn against_size(caption: &'a str, y_desc: &'a str) -> Chart<'a> {
        Chart {
            caption,
            x_desc: "value size",
            y_desc,
            size: (640, 400),
            legend: SeriesLabelPosition::UpperRight,
        }
    }
}

/// One line: its legend, its colour and its points (a size in bytes, the metric).
pub struct Series {
    pub name: String,
    pub color: RGBColor,
    pub points: Vec<(usize, f64)>,
}

/// `chart` with a line per series (points with a positive metric only; a series left without
/// points is not drawn). An empty chart when no series has a point.
pub fn by_size(chart: &Chart<'_>, series: &[Series]) -> Result<String> {
    let lines: Vec<(&Series, Vec<(f64, f64)>)> = series
        .iter()
        .map(|s| {
            let mut points: Vec<(usize, f64)> =
                s.points.iter().copied().filter(|&(_, y)| y > 0.0).collect();
            points.sort_by_key(|&(size, _)| size);
            (s, points.into_iter().map(|(size, y)| ((size as f64).log2(), y)).collect())
        })
        .filter(|(_, points): &(&Series, Vec<(f64, f64)>)| !points.is_empty())
        .collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, chart.size).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        if lines.is_empty() {
            root.present().map_err(plot_error)?;
            drop(root);
            return Ok(svg);
        }
        let all = || lines.iter().flat_map(|(_, p)| p.iter().copied());
        let (x_lo, x_hi) = bounds(all().map(|(x, _)| x));
        let (y_lo, y_hi) = bounds(all().map(|(_, y)| y));
        let mut plotted = ChartBuilder::on(&root)
            .caption(chart.caption, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (x_lo - 0.5)..(x_hi + 0.5),
                ((y_lo / 1.5)..(y_hi * 1.5)).log_scale(),
            )
            .map_err(plot_error)?;
        plotted
            .configure_mesh()
            .x_desc(chart.x_desc)
            .y_desc(chart.y_desc)
            .x_label_formatter(&|log2| size_name(2f64.powf(*log2).round() as usize))
            .draw()
            .map_err(plot_error)?;
        for (series, points) in &lines {
            let color = series.color;
            plotted
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
                .map_err(plot_error)?
                .label(series.name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
        plotted
            .configure_series_labels()
            .position(chart.legend.clone())
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// The smallest and largest of `values` (not empty).
fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

pub(crate) fn plot_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the plot: {e}")
}

/// A size as people write it: `64 KiB`, `1 MiB`, `100 B`.
pub fn size_name(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}
