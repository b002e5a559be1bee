//! What every subcommand shares for its output: the one JSON printer, progress bars, the plot
//! writer, and the BLAS thread default.

use std::path::{Path, PathBuf};

use elm::error::{ElmError, Result};
use indicatif::{ProgressBar, ProgressStyle};
use plotters::coord::Shift;
use plotters::prelude::{
    BitMapBackend, ChartContext, Color, DrawingArea, DrawingBackend, IntoDrawingArea, PathElement,
    SVGBackend, SeriesLabelPosition, ShapeStyle, BLACK, WHITE,
};

/// Prints `value` as one JSON line (what `--json` promises scripts).
pub fn print_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<()> {
    let line = serde_json::to_string(value).map_err(|e| ElmError::Json {
        what: "output".into(),
        msg: e.to_string(),
    })?;
    // A failing stdout is an error of its own (scripts read this line), never a panic.
    use std::io::Write as _;
    writeln!(std::io::stdout(), "{line}")
        .and_then(|()| std::io::stdout().flush())
        .map_err(|e| ElmError::io(Path::new("<stdout>"), e))
}

/// `value` as a JSON value, for reports that a command extends before printing.
pub fn to_json<T: serde::Serialize>(value: &T) -> Result<serde_json::Value> {
    serde_json::to_value(value).map_err(|e| ElmError::Json {
        what: "output".into(),
        msg: e.to_string(),
    })
}

/// A spinner for work of unknown length.
pub fn spinner(msg: &str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb
}

/// A bar with ETA over `len` steps, starting at `pos` (a resumed run).
pub fn bar(len: usize, pos: usize) -> ProgressBar {
    let b = ProgressBar::new(len as u64);
    b.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b.set_position(pos as u64);
    b
}

/// Single-threaded OpenBLAS unless the environment chose: decode's batch-1 matvecs run on the
/// spin team, and batched work runs one batch per core, which beats a 2-thread BLAS on the
/// many small attention GEMMs (see `elm bench`).
pub fn default_blas_threads() {
    if std::env::var_os("OPENBLAS_NUM_THREADS").is_none() {
        elm::model::ops::set_blas_threads(1);
    }
}

fn plot_err(path: &Path, e: impl std::fmt::Display) -> ElmError {
    ElmError::format(path, format!("drawing plot: {e}"))
}

/// What a drawing function returns (plotters' errors differ by backend).
pub type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;
/// A drawing onto a PNG bitmap, for plots that offer one.
pub type DrawPng<'a> = &'a dyn Fn(DrawingArea<BitMapBackend<'_>, Shift>) -> DrawResult;

/// Draws a `size` plot to a temporary file next to `path`, then renames it into place, so a
/// failed or killed draw never leaves half a plot. PNG when `path` ends in `.png`, else SVG.
pub fn write_plot(
    path: &Path,
    size: (u32, u32),
    draw_svg: impl FnOnce(DrawingArea<SVGBackend<'_>, Shift>) -> DrawResult,
    draw_png: Option<DrawPng<'_>>,
) -> Result<()> {
    let tmp = path.with_file_name(format!(
        ".{}.tmp.{}",
        path.file_stem().and_then(|s| s.to_str()).unwrap_or("plot"),
        path.extension().and_then(|s| s.to_str()).unwrap_or("svg")
    ));
    let is_png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    let result = match draw_png {
        Some(draw) if is_png => draw(BitMapBackend::new(&tmp, size).into_drawing_area()),
        _ => draw_svg(SVGBackend::new(&tmp, size).into_drawing_area()),
    };
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(plot_err(path, e));
    }
    std::fs::rename(&tmp, path).map_err(|e| ElmError::io(path, e))
}

/// The legend every CLI plot draws (half-transparent white box, black border; plotters' default
/// corner unless `position` names one), then the finished drawing is written out.
pub fn finish_plot<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: Option<SeriesLabelPosition>,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let mut labels = chart.configure_series_labels();
    if let Some(position) = position {
        labels.position(position);
    }
    labels
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    chart.plotting_area().present()?;
    Ok(())
}

/// A legend entry's sample: a 20-pixel line in the series' style.
pub fn legend_line(style: ShapeStyle) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style)
}

/// This command line, as the lock holder a second writer is shown.
fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// How a command that writes one output (`compress`, `prune`, `quantize`, `export-official`)
/// treats what is already at its `--out`, and how it reports.
#[derive(clap::Args, Debug)]
pub struct WriteFlags {
    /// Replace what is already at --out (a non-empty directory, an existing file).
    #[arg(long)]
    pub force: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

impl WriteFlags {
    /// Takes the output directory `out` for a fresh write (see [`lock_out_dir`]).
    pub fn lock_dir(&self, out: &Path) -> Result<elm::io::RunDir> {
        lock_out_dir(out, elm::io::OpenMode::Fresh { force: self.force })
    }
}

/// How a resumable command (`train`, `lora`, `search`) opens its `--out`.
#[derive(clap::Args, Debug)]
pub struct RunFlags {
    /// Continue the run saved in --out.
    #[arg(long)]
    pub resume: bool,
    /// Start a new run in a non-empty --out, replacing what is there.
    #[arg(long, conflicts_with = "resume")]
    pub force: bool,
}

/// Where a training command's text comes from.
#[derive(clap::Args, Debug)]
pub struct DataFlags {
    /// Training data: a .jsonl (question/answer or text) or text file; default GSM8K train.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Data directory holding gsm8k/ (default: $ELM_DATA_DIR or the repo's data/).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

/// A resumable command's run directory, locked, with the model it runs on.
pub struct OpenedRun<R> {
    pub run: elm::io::RunDir,
    pub start: elm::io::RunStart<R>,
    pub dense: elm::model::ModelWeights,
    pub tok: elm::formats::Tokenizer,
}

/// The prologue of a resumable command (`train`, `lora`, `search`): locks `dir` (this command
/// line is the holder a second writer is shown) before loading the model at `model`, then
/// finds how the run starts (`elm::io::RunDir::start`: fresh, resume, or restart from the
/// saved request of `command`, whose committed state is `state_file`). Says on stderr when it
/// takes over a dead holder's lock or starts a run again from its request.
pub fn open_run<R: serde::de::DeserializeOwned>(
    dir: &Path,
    flags: &RunFlags,
    (command, state_file, what): (&str, &str, &str),
    model: &Path,
) -> Result<OpenedRun<R>> {
    let mode = elm::io::OpenMode::from_flags(flags.resume, flags.force);
    let run = elm::io::RunDir::lock(dir, mode, &command_line())?;
    if let Some(note) = run.takeover_note() {
        say_err!("{note}");
    }
    let (dense, tok) = elm::model::load_pretrained(model)?;
    let kind = elm::io::RunKind {
        command,
        state_file,
        what,
        model: &dense.config,
    };
    let start = run.start(&kind)?;
    if let elm::io::RunStart::Restart { note, .. } = &start {
        say_err!("{note}");
    }
    Ok(OpenedRun {
        run,
        start,
        dense,
        tok,
    })
}

/// The prologue of a command that writes a directory it never resumes (`compress`, `prune`,
/// `import`: `OpenMode::Fresh`, refused when not empty unless forced) or adds to
/// (`search --method report`: `OpenMode::Reuse`): the lock and the directory check.
pub fn lock_out_dir(dir: &Path, mode: elm::io::OpenMode) -> Result<elm::io::RunDir> {
    let run = elm::io::RunDir::lock(dir, mode, &command_line())?;
    if let Some(note) = run.takeover_note() {
        say_err!("{note}");
    }
    Ok(run)
}

/// Refuses the command when its memory estimate exceeds what the machine has, and otherwise
/// says the estimate on stderr (under `--json` it goes into the JSON report instead).
pub fn check_memory(estimate: &elm::memory::MemoryEstimate, json: bool) -> Result<()> {
    estimate.check()?;
    if !json {
        say_err!("memory estimate: {}", estimate.summary());
    }
    Ok(())
}
