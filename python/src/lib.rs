//! `elm_solver._native`: the Rust half of the `elm_solver` Python package (the Python half,
//! `python/elm_solver/__init__.py`, checks arguments, builds the result objects and holds the
//! docstrings).
//!
//! A solve runs with the GIL released; each map (or operator) evaluation takes it back to call
//! the user's Python function, then copies that function's output into the solver's buffer. An
//! exception raised inside the function stops the solve and comes back unchanged (the original
//! object, with its traceback): it travels through the solver as the map's own error
//! ([`elm_solver::SolverError::Map`]). Every other error is one of the Python exception classes of
//! `elm_solver.errors`, one per variant of the crate's error enum.

use std::marker::PhantomData;

use elm_solver::problems::Problem;
use elm_solver::{
    Combine, FnMap, FnOperator, FnOperatorPair, LinearOperator, LinearSolverConfig, MapError,
    OutputOptions, ResidualNorm, RowOutcome, RowStatus, SolverConfig, SolverError, SolverFloat,
    StopCriteria,
};
use ndarray::{Array2, ArrayView2, ArrayViewMut2, Axis};
use numpy::{Element, IntoPyArray, PyArray1, PyReadonlyArray2, PyUntypedArrayMethods, ToPyArray};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The crate's error as the matching `elm_solver.errors` class; a map's own error (a Python
/// exception raised by the user's function) comes back as itself.
fn to_py_err(py: Python<'_>, e: SolverError) -> PyErr {
    let class = match e {
        SolverError::Map(inner) => {
            return match inner.downcast::<PyErr>() {
                Ok(err) => *err,
                Err(other) => error_class(py, "SolverError", other.to_string()),
            }
        }
        // Named in Python's spelling: the stopping fields are arguments of `solve` itself.
        SolverError::Config { field, msg } => {
            let argument = field.strip_prefix("stop.").unwrap_or(&field).to_string();
            return error_with_argument(
                py,
                "ConfigError",
                format!("`{argument}`: {msg}"),
                Some(argument),
            );
        }
        SolverError::Shape { .. } => "ShapeError",
        SolverError::InvalidArgument(_) => "InvalidArgumentError",
        SolverError::Budget { .. } => "BudgetError",
        SolverError::Json { .. } => "JsonError",
    };
    error_class(py, class, e.to_string())
}

/// An instance of `elm_solver.errors.<class>` carrying `msg` and the argument at fault, if any.
fn error_with_argument(
    py: Python<'_>,
    class: &str,
    msg: String,
    argument: Option<String>,
) -> PyErr {
    match py
        .import("elm_solver.errors")
        .and_then(|m| m.getattr(class))
        .and_then(|c| c.call1((msg, argument)))
    {
        Ok(instance) => PyErr::from_value(instance),
        Err(import_failed) => import_failed,
    }
}

/// An instance of `elm_solver.errors.<class>` carrying `msg`.
fn error_class(py: Python<'_>, class: &str, msg: String) -> PyErr {
    error_with_argument(py, class, msg, None)
}

/// The user's Python function as a batch map: called on the whole `[B, D]` batch (rows that have
/// stopped are passed frozen and their outputs ignored), or, with `active_only`, on the running
/// rows alone and their indices.
struct PyFunction<T> {
    fun: Py<PyAny>,
    dim: usize,
    active_only: bool,
    what: &'static str,
    _float: PhantomData<T>,
}

impl<T: SolverFloat + Element> PyFunction<T> {
    fn new(fun: Py<PyAny>, dim: usize, active_only: bool, what: &'static str) -> Self {
        PyFunction {
            fun,
            dim,
            active_only,
            what,
            _float: PhantomData,
        }
    }

    fn call(&self, z: ArrayView2<T>, active: &[bool], mut out: ArrayViewMut2<T>) -> PyResult<()> {
        Python::with_gil(|py| {
            let rows: Vec<usize> = if self.active_only {
                (0..active.len()).filter(|&i| active[i]).collect()
            } else {
                (0..active.len()).collect()
            };
            let result = if self.active_only {
                let sub = z.select(Axis(0), &rows).into_pyarray(py);
                let index: Vec<i64> = rows.iter().map(|&i| i as i64).collect();
                self.fun.call1(py, (sub, PyArray1::from_vec(py, index)))?
            } else {
                let full = z.to_pyarray(py);
                // The function sees the solver's state: it may not write into it.
                full.call_method1("setflags", (false,))?;
                self.fun.call1(py, (full,))?
            };
            let want = (rows.len(), self.dim);
            let numpy = py.import("numpy")?;
            if result.is_none(py) {
                return Err(error_class(
                    py,
                    "InvalidArgumentError",
                    format!(
                        "{} returned None, expected an array of shape {want:?}",
                        self.what
                    ),
                ));
            }
            // Real numbers only: NumPy would cast complex values to real with a warning (and
            // drop the imaginary part), and turn objects into whatever they convert to.
            let raw = numpy.call_method1("asarray", (&result,))?;
            let kind: String = raw.getattr("dtype")?.getattr("kind")?.extract()?;
            if !matches!(kind.as_str(), "f" | "i" | "u" | "b") {
                let dtype = raw.getattr("dtype")?.str()?.to_string();
                return Err(error_class(
                    py,
                    "InvalidArgumentError",
                    format!(
                        "{} returned an array of dtype {dtype}, expected real numbers (float32 or float64)",
                        self.what
                    ),
                ));
            }
            let no_copy = PyDict::new(py);
            no_copy.set_item("copy", false)?;
            let arr = raw.call_method("astype", (numpy::dtype::<T>(py),), Some(&no_copy))?;
            let arr: PyReadonlyArray2<T> = arr.extract().map_err(|_| {
                let shape: Vec<usize> = arr
                    .getattr("shape")
                    .and_then(|s| s.extract())
                    .unwrap_or_default();
                error_class(
                    py,
                    "ShapeError",
                    format!(
                        "{} returned an array of shape {shape:?}, expected {want:?}",
                        self.what
                    ),
                )
            })?;
            if arr.shape() != [want.0, want.1] {
                return Err(error_class(
                    py,
                    "ShapeError",
                    format!(
                        "{} returned an array of shape {:?}, expected {want:?}",
                        self.what,
                        arr.shape()
                    ),
                ));
            }
            let view = arr.as_array();
            for (k, &r) in rows.iter().enumerate() {
                if active[r] {
                    out.row_mut(r).assign(&view.row(k));
                }
            }
            Ok(())
        })
    }
}

impl<T: SolverFloat + Element> PyFunction<T> {
    /// The call as the crate's closure form `f(z [B, D], active [B], out [B, D])` (for
    /// `FnMap`, `FnOperator`, `FnOperatorPair`): a Python exception travels as the map's error.
    fn into_closure(
        self,
    ) -> impl FnMut(ArrayView2<T>, &[bool], ArrayViewMut2<T>) -> Result<(), MapError> + Send {
        move |z, active, out| {
            self.call(z, active, out)
                .map_err(|e| Box::new(e) as MapError)
        }
    }
}

/// The stop criteria: the tolerances the caller named (naming one switches the other default
/// off: `StopCriteria::named`), the crate's defaults for the rest.
#[allow(clippy::too_many_arguments)]
fn stop_criteria(
    abs_tol: Option<f64>,
    rel_tol: Option<f64>,
    rel_eps: Option<f64>,
    max_iter: Option<usize>,
    divergence_factor: Option<f64>,
    norm: &str,
    combine: &str,
) -> Result<StopCriteria, SolverError> {
    let d = StopCriteria::named(abs_tol, rel_tol);
    let norm = match norm {
        "l2" => ResidualNorm::L2,
        "max" => ResidualNorm::Max,
        other => {
            return Err(SolverError::config(
                "norm",
                format!("must be \"l2\" or \"max\", got {other:?}"),
            ))
        }
    };
    let combine = match combine {
        "any" => Combine::Any,
        "all" => Combine::All,
        other => {
            return Err(SolverError::config(
                "combine",
                format!("must be \"any\" or \"all\", got {other:?}"),
            ))
        }
    };
    Ok(StopCriteria {
        rel_eps: rel_eps.unwrap_or(d.rel_eps),
        max_iter: max_iter.unwrap_or(d.max_iter),
        divergence_factor: divergence_factor.unwrap_or(d.divergence_factor),
        norm,
        combine,
        ..d
    })
}

/// A built-in solver by name with its parameters (`params_json`: an object of the parameters
/// by their JSON names, each checked by the crate: an unknown one is refused, naming the
/// solvers that have it).
fn solver_config(
    name: &str,
    params_json: &str,
    output: OutputOptions,
) -> Result<SolverConfig, SolverError> {
    let mut cfg = SolverConfig::by_name(name)?.with_output(output);
    let params: serde_json::Map<String, serde_json::Value> = serde_json::from_str(params_json)
        .map_err(|e| SolverError::Json {
            what: "solver parameters".into(),
            msg: e.to_string(),
        })?;
    for (k, v) in params {
        if k == "output" {
            return Err(SolverError::config(
                "output",
                "set return_best / trace as arguments of solve",
            ));
        }
        cfg = cfg.with_param(&k, v)?;
    }
    Ok(cfg)
}

fn status_name(s: RowStatus) -> &'static str {
    match s {
        RowStatus::Converged => "converged",
        RowStatus::MaxIter => "max_iter",
        RowStatus::Diverged => "diverged",
        RowStatus::NonFinite => "non_finite",
    }
}

/// The per-row outcomes as a dict of lists / arrays (the Python side builds the result object).
fn rows_dict<'py>(py: Python<'py>, rows: &[RowOutcome]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let status: Vec<&str> = rows.iter().map(|r| status_name(r.status)).collect();
    d.set_item("status", status)?;
    let iterations: Vec<i64> = rows.iter().map(|r| r.iterations as i64).collect();
    d.set_item("iterations", PyArray1::from_vec(py, iterations))?;
    let residual: Vec<f64> = rows.iter().map(|r| r.residual).collect();
    d.set_item("residual", PyArray1::from_vec(py, residual))?;
    let rel: Vec<f64> = rows.iter().map(|r| r.rel_residual).collect();
    d.set_item("rel_residual", PyArray1::from_vec(py, rel))?;
    let restarts: Vec<i64> = rows.iter().map(|r| r.restarts as i64).collect();
    d.set_item("restarts", PyArray1::from_vec(py, restarts))?;
    let backtracks: Vec<i64> = rows.iter().map(|r| r.backtracks as i64).collect();
    d.set_item("backtracks", PyArray1::from_vec(py, backtracks))?;
    let rejections: Vec<i64> = rows.iter().map(|r| r.rejections as i64).collect();
    d.set_item("rejections", PyArray1::from_vec(py, rejections))?;
    let spectral: Vec<f64> = rows
        .iter()
        .map(|r| r.spectral_radius.unwrap_or(f64::NAN))
        .collect();
    d.set_item("spectral_radius", PyArray1::from_vec(py, spectral))?;
    if rows.iter().all(|r| r.trace.is_some()) && !rows.is_empty() {
        let traces: Vec<Bound<'py, PyArray1<f64>>> = rows
            .iter()
            .map(|r| PyArray1::from_vec(py, r.trace.clone().unwrap_or_default()))
            .collect();
        d.set_item("trace", traces)?;
    } else {
        d.set_item("trace", py.None())?;
    }
    Ok(d)
}

#[allow(clippy::too_many_arguments)]
fn solve_typed<'py, T: SolverFloat + Element>(
    py: Python<'py>,
    fun: Py<PyAny>,
    z0: PyReadonlyArray2<'py, T>,
    solver: &str,
    params_json: &str,
    stop: StopCriteria,
    output: OutputOptions,
    active_only: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let cfg = solver_config(solver, params_json, output).map_err(|e| to_py_err(py, e))?;
    let z0: Array2<T> = z0.as_array().to_owned();
    let dim = z0.ncols();
    let function = PyFunction::<T>::new(fun, dim, active_only, "fun");
    let mut map = FnMap::new(dim, function.into_closure());
    let solved = py.allow_threads(move || {
        let solver = cfg.build::<T>();
        solver.solve(&mut map, z0.view(), &stop)
    });
    let sol = solved.map_err(|e| to_py_err(py, e))?;
    let d = rows_dict(py, &sol.rows)?;
    d.set_item("z", sol.z.into_pyarray(py))?;
    d.set_item("map_evals", sol.map_evals)?;
    Ok(d)
}

/// Solves `z = fun(z)` for every row of `z0` (`[B, D]`, float32 or float64, C-contiguous: the
/// Python wrapper makes it so). Returns the fields of `elm_solver.SolveResult` as a dict.
#[pyfunction]
#[pyo3(signature = (fun, z0, solver, params_json, abs_tol, rel_tol, rel_eps, max_iter, divergence_factor, norm, combine, return_best, trace, spectral_radius_iters, active_only))]
#[allow(clippy::too_many_arguments)]
fn solve<'py>(
    py: Python<'py>,
    fun: Py<PyAny>,
    z0: &Bound<'py, PyAny>,
    solver: &str,
    params_json: &str,
    abs_tol: Option<f64>,
    rel_tol: Option<f64>,
    rel_eps: Option<f64>,
    max_iter: Option<usize>,
    divergence_factor: Option<f64>,
    norm: &str,
    combine: &str,
    return_best: bool,
    trace: bool,
    spectral_radius_iters: usize,
    active_only: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let stop = stop_criteria(
        abs_tol,
        rel_tol,
        rel_eps,
        max_iter,
        divergence_factor,
        norm,
        combine,
    )
    .map_err(|e| to_py_err(py, e))?;
    let output = OutputOptions {
        return_best,
        trace,
        spectral_radius_iters,
        ..OutputOptions::default()
    };
    if let Ok(z) = z0.extract::<PyReadonlyArray2<'py, f64>>() {
        solve_typed(py, fun, z, solver, params_json, stop, output, active_only)
    } else if let Ok(z) = z0.extract::<PyReadonlyArray2<'py, f32>>() {
        solve_typed(py, fun, z, solver, params_json, stop, output, active_only)
    } else {
        Err(error_class(
            py,
            "InvalidArgumentError",
            "z0 must be a 2-D float32 or float64 array".into(),
        ))
    }
}

#[allow(clippy::too_many_arguments)]
fn linear_typed<'py, T: SolverFloat + Element>(
    py: Python<'py>,
    matvec: Py<PyAny>,
    rmatvec: Option<Py<PyAny>>,
    b: PyReadonlyArray2<'py, T>,
    x0: Option<PyReadonlyArray2<'py, T>>,
    config_json: &str,
    stop: StopCriteria,
    active_only: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let cfg = LinearSolverConfig::from_json(config_json).map_err(|e| to_py_err(py, e))?;
    let b: Array2<T> = b.as_array().to_owned();
    let x0: Array2<T> = match x0 {
        Some(x) => x.as_array().to_owned(),
        None => Array2::zeros(b.raw_dim()),
    };
    let dim = b.ncols();
    let function = |fun, what| PyFunction::<T>::new(fun, dim, active_only, what).into_closure();
    let a = function(matvec, "matvec");
    // CGNR needs `Aᵀ v`: without rmatvec the crate refuses it, naming the solvers that do not.
    let mut op: Box<dyn LinearOperator<T> + Send> = match rmatvec {
        Some(f) => Box::new(FnOperatorPair::new(dim, a, function(f, "rmatvec"))),
        None => Box::new(FnOperator::new(dim, a)),
    };
    let solved = py.allow_threads(move || cfg.solve(op.as_mut(), b.view(), x0.view(), &stop));
    let sol = solved.map_err(|e| to_py_err(py, e))?;
    let d = rows_dict(py, &sol.rows)?;
    d.set_item("x", sol.x.into_pyarray(py))?;
    d.set_item("applications", sol.applications)?;
    Ok(d)
}

/// Solves `A x = b` for every row of `b` with a matrix-free `A` (`matvec`, and `rmatvec` for
/// `Aᵀ` where the solver needs it). `config_json`: the linear solver's JSON config.
#[pyfunction]
#[pyo3(signature = (matvec, b, x0, rmatvec, config_json, abs_tol, rel_tol, rel_eps, max_iter, divergence_factor, norm, combine, active_only))]
#[allow(clippy::too_many_arguments)]
fn linear_solve<'py>(
    py: Python<'py>,
    matvec: Py<PyAny>,
    b: &Bound<'py, PyAny>,
    x0: Option<&Bound<'py, PyAny>>,
    rmatvec: Option<Py<PyAny>>,
    config_json: &str,
    abs_tol: Option<f64>,
    rel_tol: Option<f64>,
    rel_eps: Option<f64>,
    max_iter: Option<usize>,
    divergence_factor: Option<f64>,
    norm: &str,
    combine: &str,
    active_only: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let stop = stop_criteria(
        abs_tol,
        rel_tol,
        rel_eps,
        max_iter,
        divergence_factor,
        norm,
        combine,
    )
    .map_err(|e| to_py_err(py, e))?;
    let bad = || {
        error_class(
            py,
            "InvalidArgumentError",
            "b (and x0) must be 2-D arrays of one dtype, float32 or float64".into(),
        )
    };
    if let Ok(bb) = b.extract::<PyReadonlyArray2<'py, f64>>() {
        let x0 = x0.map(|x| x.extract()).transpose().map_err(|_| bad())?;
        linear_typed(py, matvec, rmatvec, bb, x0, config_json, stop, active_only)
    } else if let Ok(bb) = b.extract::<PyReadonlyArray2<'py, f32>>() {
        let x0 = x0.map(|x| x.extract()).transpose().map_err(|_| bad())?;
        linear_typed(py, matvec, rmatvec, bb, x0, config_json, stop, active_only)
    } else {
        Err(bad())
    }
}

/// The built-in fixed-point solvers and linear solvers, by name.
#[pyfunction]
fn solver_names() -> (Vec<&'static str>, Vec<&'static str>) {
    (
        elm_solver::BUILTIN_SOLVERS.to_vec(),
        elm_solver::BUILTIN_LINEAR_SOLVERS.to_vec(),
    )
}

/// The default parameters of a built-in solver, as JSON (`{"kind": ..., ...}`).
#[pyfunction]
fn default_params(py: Python<'_>, solver: &str) -> PyResult<String> {
    let cfg = SolverConfig::by_name(solver).map_err(|e| to_py_err(py, e))?;
    serde_json::to_string(&cfg).map_err(|e| error_class(py, "JsonError", e.to_string()))
}

/// One of the crate's canonical problems (`elm_solver.problems`), evaluated by the crate's own
/// map: `problem(z)` is `f(z)` on every row. `solve_native` runs the whole solve in Rust, which
/// the tests hold the Python path to (same answers, same iteration counts).
#[pyclass(unsendable, module = "elm_solver._native")]
struct CanonicalProblem {
    problem: Problem,
}

#[pymethods]
impl CanonicalProblem {
    #[new]
    #[pyo3(signature = (name, rho=0.9, seed=0))]
    fn new(py: Python<'_>, name: &str, rho: f64, seed: u64) -> PyResult<Self> {
        let problem = Problem::by_name(name, rho, seed).map_err(|e| to_py_err(py, e))?;
        Ok(CanonicalProblem { problem })
    }
    #[getter]
    fn name(&self) -> &'static str {
        self.problem.name()
    }
    /// The starting point `[B, D]` (zeros).
    #[getter]
    fn z0<'py>(&self, py: Python<'py>) -> Bound<'py, numpy::PyArray2<f64>> {
        self.problem.z0().into_pyarray(py)
    }
    /// The exact solution when known.
    #[getter]
    fn exact<'py>(&self, py: Python<'py>) -> Option<Bound<'py, numpy::PyArray2<f64>>> {
        self.problem.exact().map(|e| e.into_pyarray(py))
    }
    /// `f(z)` for every row of `z` `[B, D]` (float64).
    fn __call__<'py>(
        &mut self,
        py: Python<'py>,
        z: PyReadonlyArray2<'py, f64>,
    ) -> PyResult<Bound<'py, numpy::PyArray2<f64>>> {
        let z = z.as_array();
        let mut out = Array2::<f64>::zeros(z.raw_dim());
        let active = vec![true; z.nrows()];
        let map = self.problem.map();
        if map.dim() != z.ncols() {
            return Err(error_class(
                py,
                "ShapeError",
                format!("z has {} columns, the problem {}", z.ncols(), map.dim()),
            ));
        }
        map.eval(z, &active, out.view_mut())
            .map_err(|e| to_py_err(py, SolverError::Map(e)))?;
        Ok(out.into_pyarray(py))
    }
    /// The same solve entirely in Rust: `(z, status, iterations, map_evals)`.
    #[pyo3(signature = (solver, params_json, abs_tol=None, rel_tol=None, max_iter=None))]
    #[allow(clippy::type_complexity)]
    fn solve_native<'py>(
        &mut self,
        py: Python<'py>,
        solver: &str,
        params_json: &str,
        abs_tol: Option<f64>,
        rel_tol: Option<f64>,
        max_iter: Option<usize>,
    ) -> PyResult<(
        Bound<'py, numpy::PyArray2<f64>>,
        Vec<&'static str>,
        Vec<usize>,
        usize,
    )> {
        let stop = stop_criteria(abs_tol, rel_tol, None, max_iter, None, "l2", "any")
            .map_err(|e| to_py_err(py, e))?;
        let cfg = solver_config(solver, params_json, OutputOptions::default())
            .map_err(|e| to_py_err(py, e))?;
        let z0 = self.problem.z0();
        let sol = cfg
            .build::<f64>()
            .solve(self.problem.map(), z0.view(), &stop)
            .map_err(|e| to_py_err(py, e))?;
        Ok((
            sol.z.into_pyarray(py),
            sol.rows.iter().map(|r| status_name(r.status)).collect(),
            sol.rows.iter().map(|r| r.iterations).collect(),
            sol.map_evals,
        ))
    }
}

/// A problem of the solver benchmark (`elm_solver::benchmark`): `problem(x)` is its fixed-point
/// map `g(x) = x + α F(x)`, `problem.root(x)` its root function `F`, both on every row.
#[pyclass(unsendable, module = "elm_solver._native")]
struct BenchmarkProblem {
    problem: elm_solver::benchmark::BenchmarkProblem,
}

#[pymethods]
impl BenchmarkProblem {
    #[new]
    fn new(py: Python<'_>, name: &str) -> PyResult<Self> {
        let problem =
            elm_solver::benchmark::BenchmarkProblem::by_name(name).map_err(|e| to_py_err(py, e))?;
        Ok(BenchmarkProblem { problem })
    }
    #[getter]
    fn name(&self) -> &'static str {
        self.problem.kind().name()
    }
    /// The step `α` of `g = x + αF`.
    #[getter]
    fn alpha(&self) -> f64 {
        self.problem.alpha()
    }
    /// How the problem is stated, in one line.
    #[getter]
    fn description(&self) -> String {
        self.problem.description()
    }
    /// The starting point `[B, D]`.
    #[getter]
    fn x0<'py>(&self, py: Python<'py>) -> Bound<'py, numpy::PyArray2<f64>> {
        self.problem.x0().into_pyarray(py)
    }
    /// The root function `F` on every row of `x` `[B, D]`.
    fn root<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f64>,
    ) -> PyResult<Bound<'py, numpy::PyArray2<f64>>> {
        let f = self
            .problem
            .root(x.as_array())
            .map_err(|e| to_py_err(py, e))?;
        Ok(f.into_pyarray(py))
    }
    /// `g(x) = x + α F(x)` on every row of `x` `[B, D]`.
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f64>,
    ) -> PyResult<Bound<'py, numpy::PyArray2<f64>>> {
        let x = x.as_array();
        let f = self.problem.root(x).map_err(|e| to_py_err(py, e))?;
        Ok((&x + &(f * self.problem.alpha())).into_pyarray(py))
    }
}

/// The benchmark's problem names.
#[pyfunction]
fn benchmark_names() -> Vec<&'static str> {
    elm_solver::benchmark::BENCHMARK_PROBLEMS.to_vec()
}

/// The canonical problems' names.
#[pyfunction]
fn problem_names() -> Vec<&'static str> {
    elm_solver::problems::PROBLEM_NAMES.to_vec()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(solve, m)?)?;
    m.add_function(wrap_pyfunction!(linear_solve, m)?)?;
    m.add_function(wrap_pyfunction!(solver_names, m)?)?;
    m.add_function(wrap_pyfunction!(default_params, m)?)?;
    m.add_function(wrap_pyfunction!(problem_names, m)?)?;
    m.add_class::<CanonicalProblem>()?;
    m.add_class::<BenchmarkProblem>()?;
    m.add_function(wrap_pyfunction!(benchmark_names, m)?)?;
    Ok(())
}
