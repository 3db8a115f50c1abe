"""Helpers shared by the commands: fail, parse, load traces, check outputs, progress, run all, print a table.
Imports no other module of :mod:`gpupool.cli`."""

from __future__ import annotations

import inspect
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from gpupool.inputs import out_of_range
from gpupool.model import NodeSpec, PodRequest
from gpupool.policies import BASELINES, DEFAULT_POLICY, REGISTRY
from gpupool.traces import TraceFormatError, load_openb_nodes, load_openb_pods

EMBEDDED_NODES = "openb_node_list_gpu_node.csv"
EMBEDDED_PODS = "openb_pod_list_default.csv"

EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), once the finished runs are written."""

LOG_PROGRESS_INTERVAL_S = 15.0
"""Seconds between two progress lines on stderr when it is not a terminal (the environment variable
``GPUPOOL_PROGRESS_INTERVAL``, seconds > 0, overrides it)."""

PROGRESS_INTERVAL_ENV = "GPUPOOL_PROGRESS_INTERVAL"

# --------------------------------------------------------------------------------------------------
# Helpers


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def in_range(option: str, low: float | None = None, high: float | None = None, *, low_open: bool = False,
             what: str = "") -> Callable[[Any], Any]:
    """A Typer callback for a numeric option: a value outside ``[low, high]`` (``(low, high]`` with ``low_open``),
    NaN or infinite is refused as the option is read, before anything runs: one line naming the option, the
    range and the value (:func:`gpupool.inputs.out_of_range`), exit 2."""

    def check(value: Any) -> Any:
        message = out_of_range(option, value, low, high, low_open=low_open, what=what)
        if message is not None:
            fail(message)
        return value

    return check


def trace_error(exc: TraceFormatError) -> str:
    where = f"{exc.path}:{exc.line}:"
    if exc.column is not None:
        where += f" column {exc.column!r}:"
    return f"{where} {exc.message}"


def split(values: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    for value in values or ():
        out += [v.strip() for v in value.split(",") if v.strip()]
    return out


def parse_seeds(values: Sequence[str] | None) -> list[int]:
    seeds: list[int] = []
    for text in split(values):
        try:
            seed = int(text)
        except ValueError:
            fail(f"--seed: expected an integer, got {text!r}")
        if seed < 0:
            fail(f"--seed: expected a non-negative integer, got {seed}")
        if seed not in seeds:
            seeds.append(seed)
    if values and not seeds:  # the option was given, with nothing in it (--seeds ,)
        fail(f"--seed: no seed in {', '.join(map(repr, values))}")
    return seeds or [42]


def check_policies(names: Sequence[str]) -> list[str]:
    unique: list[str] = []
    for name in names:
        if name not in REGISTRY:
            fail(f"unknown policy {name!r}; known: {', '.join(REGISTRY)}")
        if name not in unique:
            unique.append(name)
    if not unique:
        fail("no policy given")
    return unique


INFERENCE_POLICIES = frozenset({"load-aware"})
"""Placement policies meant for inference replicas (live telemetry), not for training pods."""


def _policy_kind(name: str) -> str:
    if name == DEFAULT_POLICY:
        return "default"
    if name in INFERENCE_POLICIES:
        return "inference"
    return "baseline" if name in BASELINES else "GPU-aware"


def policy_rows() -> list[dict[str, str]]:
    rows = []
    for name, cls in REGISTRY.items():
        desc = cls.description or ""
        for prefix in ("gpupool default:", "baseline:", "GPU-aware:"):
            if desc.startswith(prefix):
                desc = desc[len(prefix):].strip()
        rows.append({"name": name, "kind": _policy_kind(name), "description": desc})
    return rows


@contextmanager
def _trace_path(given: Path | None, embedded: str) -> Iterator[Path]:
    if given is not None:
        yield given
        return
    with resources.as_file(resources.files("gpupool") / "data" / embedded) as path:
        yield path


def load_traces(nodes: Path | None, pods: Path | None) -> tuple[list[NodeSpec], list[PodRequest]]:
    try:
        with _trace_path(nodes, EMBEDDED_NODES) as path:
            node_list = load_openb_nodes(path)
        with _trace_path(pods, EMBEDDED_PODS) as path:
            pod_list = load_openb_pods(path)
    except TraceFormatError as exc:
        fail(trace_error(exc))
    except OSError as exc:
        fail(f"cannot read {exc.filename or ''}: {exc.strerror or exc}")
    if not node_list:
        fail(f"{nodes or EMBEDDED_NODES}: the node list has no nodes")
    if not pod_list:
        fail(f"{pods or EMBEDDED_PODS}: the pod list has no pods")
    return node_list, pod_list


def replay_runner() -> Callable[..., Any]:
    try:
        from gpupool.sim.replay import run_replay
    except ImportError as exc:
        fail(f"replay protocol not available (cannot import gpupool.sim.replay.run_replay: {exc})")
    return run_replay


def accepts_progress(func: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return "progress" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _probe_dir(directory: Path) -> str | None:
    """Why files cannot be created in ``directory`` (created if needed), or None when they can."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".gpupool-write-test-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def check_outputs(out: Path | None, json_file: str | None, plots: Sequence[str]) -> None:
    """Fail (exit 2, one line) before any work when an output path cannot be written.

    ``--out DIR`` is created if needed and must take new files; none of its ``plots`` may be a directory.
    ``--json FILE``: its parent directory is created if needed and must take new files; an existing FILE
    must be a writable regular file. Nothing is left behind but the directories created.
    """
    if json_file and json_file != "-":
        path = Path(json_file)
        if path.is_dir():
            fail(f"--json {path}: is a directory; give a file name")
        why = _probe_dir(path.parent)
        if why is not None:
            fail(f"--json {path}: cannot write in {path.parent}: {why}")
        if path.exists():
            try:
                with path.open("a", encoding="utf-8"):
                    pass
            except OSError as exc:
                fail(f"--json {path}: cannot write: {exc.strerror or exc}")
    if out is not None:
        if out.exists() and not out.is_dir():
            fail(f"--out {out}: exists and is not a directory")
        why = _probe_dir(out)
        if why is not None:
            fail(f"--out {out}: cannot write plots there: {why}")
        for name in plots:
            if (out / name).is_dir():
                fail(f"--out {out}: {name} is a directory; cannot write the plot")


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def progress_interval() -> float:
    """Seconds between progress lines on a non-terminal stderr: ``$GPUPOOL_PROGRESS_INTERVAL`` when it is a number
    > 0 (a bad value is an error naming the variable), else :data:`LOG_PROGRESS_INTERVAL_S`."""
    raw = os.environ.get(PROGRESS_INTERVAL_ENV, "").strip()
    if not raw:
        return LOG_PROGRESS_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400:
        fail(f"{PROGRESS_INTERVAL_ENV}={raw!r}: expected seconds, a number > 0 and <= 86400")
    return value


class RunProgress:
    """Progress of ``total`` runs: a rich bar with ETA when stderr is a terminal, else one line on stderr every
    ``interval`` seconds (what, runs done/total, elapsed, ETA) while inside ``with``, whether or not a run reported
    progress since the last line (a heartbeat thread writes it: a long run without ticks is not silent); nothing
    when ``quiet``. ``interval``: seconds, default :data:`LOG_PROGRESS_INTERVAL_S` or ``$GPUPOOL_PROGRESS_INTERVAL``;
    0 = a line at every update and no heartbeat."""

    def __init__(self, total: int, *, quiet: bool, interval: float | None = None,
                 clock: Callable[[], float] | None = None, tty: bool | None = None) -> None:
        self.total = total
        self.clock = clock or time.monotonic
        self.interval = progress_interval() if interval is None else interval
        clock = self.clock
        self.start = self.last_line = clock()
        self.description = "simulating"
        self.done = 0.0
        tty = sys.stderr.isatty() if tty is None else tty
        self.bar = not quiet and tty
        self.lines = not quiet and not tty
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=Console(stderr=True), transient=True, disable=not self.bar,
        )
        self.task = self.progress.add_task(self.description, total=total)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __enter__(self) -> RunProgress:
        self.progress.__enter__()
        if self.lines and self.interval > 0:
            self._heartbeat = threading.Thread(target=self._beat, name="gpupool-progress", daemon=True)
            self._heartbeat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_heartbeat()
        self.progress.__exit__(None, None, None)

    def stop(self) -> None:
        self._stop_heartbeat()
        self.progress.stop()

    def _stop_heartbeat(self) -> None:
        self._stopped.set()
        if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
            self._heartbeat.join()
        self._heartbeat = None

    def _beat(self) -> None:
        # wake at least every second, so a line follows `interval` after the last one (an update's or ours)
        while not self._stopped.wait(min(self.interval, 1.0)):
            self._line_if_due()

    def _line_if_due(self) -> None:
        with self._lock:
            now = self.clock()
            if now - self.last_line >= self.interval and not self._stopped.is_set():
                self.last_line = now
                sys.stderr.write(self.line(now) + "\n")
                sys.stderr.flush()

    def begin(self, k: int, description: str) -> None:
        """Run ``k`` (0-based) starts."""
        self.description = f"{description} [{k + 1}/{self.total}]"
        self.update(k, description=self.description)

    def update(self, done: float, description: str | None = None) -> None:
        """``done`` runs (fractional) are finished."""
        self.done = done
        if self.bar:
            if description is None:
                self.progress.update(self.task, completed=done)
            else:
                self.progress.update(self.task, completed=done, description=description)
        if self.lines:
            self._line_if_due()

    def line(self, now: float) -> str:
        elapsed = now - self.start
        fraction = self.done / self.total if self.total else 1.0
        eta = _duration(elapsed * (1 - fraction) / fraction) if fraction > 0 else "unknown"
        return (f"progress: {self.description}: {self.done:.1f}/{self.total} runs ({fraction:.0%}), "
                f"elapsed {_duration(elapsed)}, ETA {eta}")


def warm_engine(quiet: bool) -> None:
    """Compile the engine's numba kernels (the first run on a machine: numba's disk cache is empty) or load them
    from the cache, once, before any run, so that no run's decisions/s carries the compilation; when it takes more
    than two seconds (a first run), a line on stderr says what the wait is."""
    from gpupool.engine import kernels

    if not kernels.enabled():
        return
    note = threading.Timer(2.0, lambda: print("compiling the engine's kernels (numba; once per machine, later runs "
                                              "load them from its cache)...", file=sys.stderr, flush=True))
    note.daemon = True
    if not quiet:
        note.start()
    try:
        kernels.warm_up()
    finally:
        note.cancel()


def run_all(items: Sequence[tuple[str, int]], run_one: Callable[[str, int, Callable[[int, int], None]], Any],
            *, quiet: bool, errors: tuple[type[BaseException], ...], workers: int | None = 1,
            executor: str = "local") -> tuple[list[Any], bool]:
    """``run_one(policy, seed, tick)`` for every item, with progress. Returns the finished results and
    whether Ctrl-C stopped the loop (the results then hold only the runs that finished). ``workers`` >1
    (None: all cores) or ``executor="ray"``: in parallel (:mod:`gpupool.sweep`), same results."""
    from gpupool import sweep

    warm_engine(quiet)
    if workers is not None and workers < 1:
        fail(f"--jobs-parallel must be >= 1, got {workers}")
    if executor not in sweep.EXECUTORS:
        fail(f"--executor must be one of {', '.join(sweep.EXECUTORS)}, got {executor!r}")
    if executor == "ray" or (len(items) > 1 and (workers or sweep.default_workers()) > 1):
        with RunProgress(len(items), quiet=quiet) as progress:
            n_done = [0]
            progress.begin(0, f"{len(items)} runs, {executor}")

            def on_done(k: int, result: Any) -> None:
                n_done[0] += 1
                progress.update(n_done[0], description=f"{items[k][0]} (seed {items[k][1]}) done "
                                f"[{n_done[0]}/{len(items)}]")

            try:
                return sweep.run_sweep(items, run_one, workers=workers, executor=executor, on_done=on_done), False
            except sweep.SweepInterrupted as exc:
                progress.stop()
                return exc.results, True
            except sweep.SweepError as exc:
                progress.stop()
                fail(str(exc))
            except errors as exc:
                progress.stop()
                fail(f"{exc}", code=1)
    results: list[Any] = []
    with RunProgress(len(items), quiet=quiet) as progress:
        try:
            for k, (name, s) in enumerate(items):
                progress.begin(k, f"{name} (seed {s})")

                def tick(done: int, total: int, k: int = k) -> None:
                    progress.update(k + (done / total if total else 1.0))

                try:
                    results.append(run_one(name, s, tick))
                except errors as exc:
                    progress.stop()
                    fail(f"{name} (seed {s}): {exc}", code=1)
                progress.update(k + 1)
        except KeyboardInterrupt:
            progress.stop()
            return results, True
    return results, False


def exit_interrupted(done: int, total: int, wrote: bool) -> NoReturn:
    if done:
        what = "the table and the outputs above hold" if wrote else "the table above holds"
        typer.echo(f"interrupted (Ctrl-C) after {done} of {total} runs: {what} only the finished runs",
                   err=True)
    else:
        typer.echo(f"interrupted (Ctrl-C) before the first of {total} runs finished: nothing written", err=True)
    raise typer.Exit(EXIT_INTERRUPTED)


def table_kwargs(func: Callable[..., Any], wide: bool) -> dict[str, Any]:
    try:
        accepts = "wide" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        accepts = False
    return {"wide": wide} if accepts else {}


def print_table(console: Console, table: Any, wide: bool) -> None:
    if not wide:
        console.print(table)
        return
    narrow = console.width  # as wide as the table wants, even past the terminal (measured without the
    # terminal's cap: console.measure alone clamps to console.width and never widens)
    console.width = max(narrow, console.measure(table, options=console.options.update_width(100_000)).maximum)
    try:
        console.print(table)
    finally:
        console.width = narrow



def table_console(piped_width: int) -> Console:
    """The tables' console: ``COLUMNS`` columns where it is a whole number >= 40, else the terminal's width, or
    ``piped_width`` when stdout is no terminal (so that a table piped to a file keeps its columns). Width and
    height are always given, so Rich reads neither ``COLUMNS`` nor ``LINES`` itself (it raises on a value
    such as "²")."""

    def whole(name: str, least: int) -> int | None:
        value = os.environ.get(name, "")
        return int(value) if value.isascii() and value.isdigit() and int(value) >= least else None

    width = whole("COLUMNS", 40)
    if width is None:
        try:
            width = os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else piped_width
        except (OSError, ValueError, AttributeError):  # no real file descriptor (e.g. a test's captured stdout)
            width = piped_width
    return Console(width=max(width, 40), height=whole("LINES", 1) or 25)

