//! What every subcommand shares for its output: the one JSON printer, progress bars, the plot
//! writer, and the BLAS thread default.

use std::path::Path;

use elm::error::{ElmError, Result};
use indicatif::{ProgressBar, ProgressStyle};
use plotters::coord::Shift;
use plotters::prelude::{BitMapBackend, DrawingArea, IntoDrawingArea, SVGBackend};

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

/// Locks the run directory `dir` for this command's whole life (one writer per directory;
/// `elm::io::DirLock`), saying so when it takes over from a dead holder.
pub fn lock_run_dir(dir: &Path, resume: bool) -> Result<Option<elm::io::DirLock>> {
    // Nothing to lock where the command's own check refuses the path (a file, or a missing
    // run to resume): it then names what is wrong.
    if (resume || dir.exists()) && !dir.is_dir() {
        return Ok(None);
    }
    let command: Vec<String> = std::env::args().collect();
    let lock = elm::io::DirLock::acquire(dir, &command.join(" "))?;
    if let Some(note) = lock.takeover_note() {
        say_err!("{note}");
    }
    Ok(Some(lock))
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

/// Writes a fresh run's request (`run_request.json`) into its run directory, created here if
/// it is not yet, once the run has passed every check and before its first save.
pub fn write_request<T: serde::Serialize>(
    dir: &Path,
    command: &str,
    model: &elm::model::ModelConfig,
    request: &T,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ElmError::io(dir, e))?;
    // A killed earlier attempt's temporaries (this command holds the directory's lock).
    elm::io::atomic::remove_stale_temps(dir)?;
    elm::equilibrium::checkpoint::write_run_request(dir, command, model, request)
}

/// `--resume` of a run `dir` that holds no checkpoint (`state_file`): the request the fresh run
/// saved, to start the `what` (run, search, ...) again as it was asked, since nothing of it was
/// trained; the dead attempt's temporaries are removed. Without a request: an error saying
/// there is nothing to resume.
pub fn restart_request<T: serde::de::DeserializeOwned>(
    dir: &Path,
    command: &str,
    model: &elm::model::ModelConfig,
    state_file: &str,
    what: &str,
) -> Result<T> {
    use elm::equilibrium::checkpoint::{read_run_request, RUN_REQUEST_FILE};
    let request = read_run_request(dir, command, model)?.ok_or_else(|| {
        ElmError::config(
            "resume",
            format!(
                "no {state_file} or {RUN_REQUEST_FILE} in {}: the run saved nothing, not even its \
                 request, so there is nothing to resume; start it again (with --force if the \
                 directory holds other files)",
                dir.display()
            ),
        )
    })?;
    say_err!(
        "{}: no checkpoint was completed; starting the {what} again as it was requested",
        dir.display()
    );
    elm::io::atomic::remove_stale_temps(dir)?;
    Ok(request)
}
