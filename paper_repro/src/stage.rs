//! The stage engine: every expensive step (a training, an evaluation, a pruning) is a stage
//! whose JSON result is cached under `OUT/stages/<name>-<key>.json`, `key` a content hash of
//! the stage's config and of the keys of the stages it reads. A killed run resumes where it
//! stopped (finished stages are read back), a rerun of one table (`--only`) redoes nothing the
//! other tables computed, a changed config or input recomputes exactly what depends on it, and
//! `--force` recomputes the selected tables' stages. Files the stage writes (checkpoints,
//! pruned models) go to `OUT/work/<name>-<key>/`, so they are content-addressed too. Results
//! are written atomically (`elm::io::write_json_atomic`): a killed stage leaves no result and
//! reruns. A stage's recorded seconds are its whole compute: a heartbeat keeps the time spent
//! so far in its work directory, so a killed and resumed stage also counts its earlier runs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use elm::gemm::Precision;
use elm::io::Fnv64;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ReproError;

/// One cached result file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    name: String,
    key: String,
    config: Value,
    seconds: f64,
    result: Value,
}

/// A finished stage: its key (for dependants), result, and whether it was read from cache.
pub struct Done<T> {
    pub key: String,
    pub value: T,
    pub raw: Value,
    pub cached: bool,
    /// Work directory of the stage (checkpoints etc.).
    pub dir: PathBuf,
}

/// One line of `OUT/stages.json`: what ran (or was read), in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageLog {
    pub name: String,
    pub key: String,
    pub cached: bool,
    pub seconds: f64,
}

/// Runs stages, reading cached results, printing one progress line per stage with an ETA.
pub struct Stages {
    out: PathBuf,
    force: bool,
    /// Planned work units (from the tables' plans), done units, seconds spent on computed units.
    planned: f64,
    done_units: f64,
    computed_units: f64,
    computed_seconds: f64,
    start: Instant,
    /// How often a running stage's heartbeat records its time spent (a killed run loses at
    /// most this much of its count).
    beat: Duration,
    pub log: Vec<StageLog>,
    /// The run's precision for model commands (see [`Stages::at_precision`]).
    precision: Precision,
}

/// Seconds a stage spent in invocations that did not finish it, in its work directory.
const SPENT_FILE: &str = "spent_seconds.json";

/// Writes `before + (time since start)` to a stage's [`SPENT_FILE`] every `every` while the
/// stage runs, and once more when dropped (a stage that returns an error keeps an exact count).
struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    write: Arc<dyn Fn() + Send + Sync>,
}

impl Heartbeat {
    fn start(path: PathBuf, before: f64, start: Instant, every: Duration) -> Self {
        let write: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            // Best effort: a count that cannot be written only understates a resumed stage.
            let _ = elm::io::write_json_atomic(&path, &(before + start.elapsed().as_secs_f64()));
        });
        let stop = Arc::new(AtomicBool::new(false));
        let (s, w) = (stop.clone(), write.clone());
        let thread = std::thread::spawn(move || {
            let mut last = Instant::now();
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(every.min(Duration::from_millis(100)));
                if last.elapsed() >= every {
                    w();
                    last = Instant::now();
                }
            }
        });
        Heartbeat {
            stop,
            thread: Some(thread),
            write,
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        (self.write)();
    }
}

/// [`elm::io::atomic::remove_stale_temps`] with the engine's error.
fn remove_stale_temps(dir: &Path) -> Result<usize, ReproError> {
    elm::io::atomic::remove_stale_temps(dir).map_err(|source| ReproError::Elm {
        what: format!("removing a killed run's temporaries in {}", dir.display()),
        source,
    })
}

/// The seconds in a stage's [`SPENT_FILE`] (0 when there is none or it does not read).
fn spent_before(dir: &Path) -> f64 {
    std::fs::read_to_string(dir.join(SPENT_FILE))
        .ok()
        .and_then(|t| serde_json::from_str::<f64>(&t).ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(0.0)
}

/// Bumped when the library changes what a stage with an unchanged config computes, so that no
/// cache written before is read as if it were current (2: continuations tokenized with
/// lm-evaluation-harness's split, in training and in every NLL task; 3: GSM8K's validation
/// split carved out of train.jsonl, so no training reads its last 500 problems and every
/// held-out figure during training is scored on them).
const RESULTS_VERSION: u32 = 3;

/// Content key of a stage: FNV-1a of [`RESULTS_VERSION`], its name and canonical config JSON
/// (which holds the keys of the stages it reads).
pub fn key_of(name: &str, config: &Value) -> String {
    let mut h = Fnv64::new();
    h.write(&RESULTS_VERSION.to_le_bytes());
    h.write(name.as_bytes());
    h.write(&[0]);
    h.write(config.to_string().as_bytes());
    format!("{:016x}", h.finish())
}

impl Stages {
    /// The engine over `out`, which the caller holds alone (the study takes its directory
    /// lock first): temporaries a killed run left in `out` and its first-level directories
    /// (the stage records, the tables) are removed here.
    pub fn new(out: &Path, force: bool, planned_units: f64) -> Result<Self, ReproError> {
        Self::at_precision(out, force, planned_units, Precision::F32)
    }

    /// [`Stages::new`] for a run whose model commands use `precision`: every stage config gets
    /// the run's `precision` when it is not f32 (stages that keep f32 products, such as
    /// `spectral`, included), so a bf16 run never reads an f32 run's result or the reverse,
    /// while f32 keys stay those of earlier runs.
    pub fn at_precision(
        out: &Path,
        force: bool,
        planned_units: f64,
        precision: Precision,
    ) -> Result<Self, ReproError> {
        for d in ["stages", "work"] {
            let p = out.join(d);
            std::fs::create_dir_all(&p).map_err(|e| ReproError::io(&p, e))?;
        }
        remove_stale_temps(out)?;
        Ok(Stages {
            out: out.to_path_buf(),
            force,
            planned: planned_units.max(1.0),
            done_units: 0.0,
            computed_units: 0.0,
            computed_seconds: 0.0,
            start: Instant::now(),
            beat: Duration::from_secs(5),
            log: vec![],
            precision,
        })
    }

    /// Seconds since the engine started.
    pub fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Runs `f` (given the stage's work directory) unless a result for `(name, config)` is
    /// cached. `units` is the stage's planned cost (for the ETA). The result must decode as
    /// `T`; a cached file that does not (older schema) is recomputed.
    pub fn run<C, T>(
        &mut self,
        name: &str,
        config: &C,
        units: f64,
        f: impl FnOnce(&Path) -> Result<Value, ReproError>,
    ) -> Result<Done<T>, ReproError>
    where
        C: Serialize,
        T: DeserializeOwned,
    {
        let mut config = serde_json::to_value(config).map_err(|e| {
            ReproError::Setup(format!("stage {name}: config does not serialize: {e}"))
        })?;
        match (self.precision, config.as_object_mut()) {
            (Precision::F32, _) => {}
            (Precision::Bf16, Some(fields)) => {
                fields.insert("precision".into(), serde_json::json!(self.precision));
            }
            (Precision::Bf16, None) => {
                return Err(ReproError::Setup(format!(
                    "stage {name}: config is not a JSON object, so it cannot record its precision"
                )))
            }
        }
        let key = key_of(name, &config);
        let file = self.out.join("stages").join(format!("{name}-{key}.json"));
        let dir = self.out.join("work").join(format!("{name}-{key}"));
        let label = format!("{name} [{key}]");
        if !self.force {
            if let Some(rec) = read_record(&file) {
                if let Ok(value) = T::deserialize(&rec.result) {
                    self.done_units += units;
                    self.progress(&label, "cached", rec.seconds);
                    self.log.push(StageLog {
                        name: name.into(),
                        key: key.clone(),
                        cached: true,
                        seconds: rec.seconds,
                    });
                    return Ok(Done {
                        key,
                        value,
                        raw: rec.result,
                        cached: true,
                        dir,
                    });
                }
            }
        }
        let eta = self.stage_eta(units);
        eprintln!(
            "[{:>5.1}%] {label}: running (expected {})",
            100.0 * self.done_units / self.planned,
            eta.map_or("?".into(), seconds)
        );
        std::fs::create_dir_all(&dir).map_err(|e| ReproError::io(&dir, e))?;
        // A run killed in this stage may have left a temporary (its heartbeat's, a
        // checkpoint's) that nothing would rename now.
        remove_stale_temps(&dir)?;
        let before = spent_before(&dir);
        if before > 0.0 {
            eprintln!("  {label}: {} spent in earlier runs", seconds(before));
        }
        let t0 = Instant::now();
        let result = {
            let _beat = Heartbeat::start(dir.join(SPENT_FILE), before, t0, self.beat);
            f(&dir)
        }?;
        let secs = before + t0.elapsed().as_secs_f64();
        let value = T::deserialize(&result).map_err(|source| ReproError::Schema {
            command: format!("stage {name}"),
            source,
        })?;
        let rec = Record {
            name: name.into(),
            key: key.clone(),
            config,
            seconds: secs,
            result: result.clone(),
        };
        elm::io::write_json_atomic(&file, &rec).map_err(|e| ReproError::writing(&file, e))?;
        // Counted in the record; a forced recomputation starts from zero.
        let _ = std::fs::remove_file(dir.join(SPENT_FILE));
        self.done_units += units;
        self.computed_units += units;
        self.computed_seconds += secs;
        self.progress(&label, "done", secs);
        self.log.push(StageLog {
            name: name.into(),
            key: key.clone(),
            cached: false,
            seconds: secs,
        });
        Ok(Done {
            key,
            value,
            raw: result,
            cached: false,
            dir,
        })
    }

    /// Expected seconds of a stage of `units`, from the rate measured so far.
    fn stage_eta(&self, units: f64) -> Option<f64> {
        (self.computed_units > 0.0).then(|| units * self.computed_seconds / self.computed_units)
    }

    fn progress(&self, label: &str, what: &str, secs: f64) {
        let left = (self.planned - self.done_units).max(0.0);
        let eta = self
            .stage_eta(left)
            .map_or("?".into(), |s| format!("{} left", seconds(s)));
        eprintln!(
            "[{:>5.1}%] {label}: {what} in {} (elapsed {}, ETA {eta})",
            100.0 * self.done_units / self.planned,
            seconds(secs),
            seconds(self.elapsed()),
        );
    }
}

fn read_record(file: &Path) -> Option<Record> {
    let text = std::fs::read_to_string(file).ok()?;
    serde_json::from_str(&text).ok()
}

/// `1h02m03s`-style duration.
pub fn seconds(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec:02}s"),
        (h, m, sec) => format!("{h}h{m:02}m{sec:02}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("repro_stage_{tag}_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn cached_result_is_reused_and_config_change_recomputes() {
        let out = tmp("cache");
        let mut runs = 0;
        let mut st = Stages::new(&out, false, 3.0).unwrap();
        let mut go = |st: &mut Stages, cfg: Value| {
            st.run::<_, u32>("t", &cfg, 1.0, |_| {
                runs += 1;
                Ok(json!(7))
            })
            .unwrap()
        };
        let a = go(&mut st, json!({"steps": 2}));
        assert!(!a.cached);
        // A new engine (a resumed run) reads it back.
        let mut st2 = Stages::new(&out, false, 3.0).unwrap();
        let b = go(&mut st2, json!({"steps": 2}));
        assert!(b.cached);
        assert_eq!((a.key.clone(), b.value), (b.key.clone(), 7));
        let c = go(&mut st2, json!({"steps": 3}));
        assert!(!c.cached);
        assert_ne!(c.key, a.key);
        let mut forced = Stages::new(&out, true, 1.0).unwrap();
        assert!(!go(&mut forced, json!({"steps": 2})).cached);
        assert_eq!(runs, 3);
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn failed_stage_leaves_no_result() {
        let out = tmp("fail");
        let mut st = Stages::new(&out, false, 1.0).unwrap();
        let r = st.run::<_, u32>("t", &json!(1), 1.0, |_| {
            Err(ReproError::Setup("killed".into()))
        });
        assert!(r.is_err());
        let r = st
            .run::<_, u32>("t", &json!(1), 1.0, |_| Ok(json!(1)))
            .unwrap();
        assert!(!r.cached);
        // A result of another shape (older schema) is recomputed, not misread.
        let r = st
            .run::<_, String>("t", &json!(1), 1.0, |_| Ok(json!("x")))
            .unwrap();
        assert!(!r.cached);
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn a_resumed_stage_counts_the_time_of_its_killed_runs() {
        let out = tmp("spent");
        let mut st = Stages::new(&out, false, 1.0).unwrap();
        st.beat = Duration::from_millis(20);
        // A run that fails after 300 ms leaves its time in the work directory.
        let r = st.run::<_, u32>("t", &json!(1), 1.0, |_| {
            std::thread::sleep(Duration::from_millis(300));
            Err(ReproError::Setup("killed".into()))
        });
        assert!(r.is_err());
        let dir = out
            .join("work")
            .join(format!("t-{}", key_of("t", &json!(1))));
        let spent = spent_before(&dir);
        assert!((0.3..1.3).contains(&spent), "{spent}");
        // A killed process leaves the heartbeat's last write: simulate 100 s of earlier runs.
        elm::io::write_json_atomic(&dir.join(SPENT_FILE), &(spent + 100.0)).unwrap();
        let done = st
            .run::<_, u32>("t", &json!(1), 1.0, |_| Ok(json!(1)))
            .unwrap();
        assert!(!done.cached);
        let rec = read_record(&out.join("stages").join(format!("t-{}.json", done.key))).unwrap();
        assert!(
            rec.seconds >= spent + 100.0 && rec.seconds < spent + 102.0,
            "{} vs {spent} + 100",
            rec.seconds
        );
        assert!(!dir.join(SPENT_FILE).exists(), "counted, then cleared");
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn a_killed_runs_temporaries_are_removed_on_resume() {
        let out = tmp("stale");
        let dir = out
            .join("work")
            .join(format!("t-{}", key_of("t", &json!(1))));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(out.join("stages")).unwrap();
        // What a kill inside `write_atomic` leaves: `.<name>.tmp<pid>-<n>`.
        let record_tmp = out.join("stages").join(".t-0.json.tmp4242-0");
        let beat_tmp = dir.join(format!(".{SPENT_FILE}.tmp4242-7"));
        let kept = dir.join("notes.tmp"); // not a temporary of write_atomic
        for f in [&record_tmp, &beat_tmp, &kept] {
            std::fs::write(f, "{").unwrap();
        }
        let mut st = Stages::new(&out, false, 1.0).unwrap();
        assert!(
            !record_tmp.exists(),
            "the records' directory is cleaned on start"
        );
        assert!(
            beat_tmp.exists(),
            "a stage's directory is left until it runs"
        );
        st.run::<_, u32>("t", &json!(1), 1.0, |d| {
            assert!(!d.join(format!(".{SPENT_FILE}.tmp4242-7")).exists());
            Ok(json!(1))
        })
        .unwrap();
        assert!(kept.exists());
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn key_depends_on_name_and_config_only() {
        assert_eq!(key_of("a", &json!({"x": 1})), key_of("a", &json!({"x": 1})));
        assert_ne!(key_of("a", &json!({"x": 1})), key_of("b", &json!({"x": 1})));
        assert_ne!(key_of("a", &json!({"x": 1})), key_of("a", &json!({"x": 2})));
        assert_eq!(seconds(3725.0), "1h02m05s");
        assert_eq!(seconds(65.0), "1m05s");
    }
}
