"""Side by side with the Tiresias simulator: the same jobs, the same cluster, JCT = end - submit in both.

    make bench-tiresias                       # = .venv/bin/python benchmarks/tiresias/run.py
    .venv/bin/python benchmarks/tiresias/run.py --offset 5000 --name tiresias_peer_w5000
    .venv/bin/python benchmarks/tiresias/run.py --first 1000 --gpus 384 --out /tmp/peer   # a trial

Steps (all cached under ``~/.cache/gpupool-tiresias``, or ``$GPUPOOL_TIRESIAS_CACHE``):

1. **Peer source**: ``git clone`` of ``SymbioticLab/Tiresias`` (or of ``$TIRESIAS_SRC`` / ``--tiresias-src``:
   an existing clone or git directory, for machines without GitHub) checked out at the pinned commit
   :data:`TIRESIAS_COMMIT`; the run refuses a checkout whose HEAD differs or whose files were changed.
   The peer's code is run from there, unmodified, never copied into this repository.
2. **Python 2.7 environment**: Tiresias needs Python 2.7 and NumPy < 1.17; ``python2.7 -m pip install
   --target`` puts NumPy from PyPI in the cache once (``--python2`` / ``$TIRESIAS_PYTHON2`` names the
   interpreter; default: ``python2.7`` on PATH, then pyenv's 2.7).
3. **Jobs**: ``--first`` jobs after ``--offset`` of the trace (default: the first 5,000 Philly jobs),
   converted by ``convert.py`` (whole seconds, rebased to the window's first submission, one queue).
4. **Peer runs**: ``run_sim.py`` with ``--schedule`` fifo, dlas-gpu (Tiresias-L) and dlas-gpu-gittins
   (Tiresias-G; see :data:`PEER_SCHEDULES` for why not ``gittins``), cluster spec of 8-GPU nodes for
   each ``--gpus``; fifo uses the ``yarn`` (node-aware) placement, the others ``count`` (their
   schedulers count GPUs whatever the scheme). Its constants
   are its own: 2D-LAS thresholds, Gittins quantum and the job-size prior ``yarn-gput1000.csv``.
5. **gpupool runs**: :func:`gpupool.sim.jobs.run_jobs` on the same jobs, its model matched to the peer's:
   no restart overhead, no topology slowdown (every tier's speed factor 1.0), one queue, no failures.
   ``--gpupool`` lists the job policies (:data:`gpupool.engine.pool.scheduler.JOB_POLICIES`), each
   optionally with scheduler-config overrides: ``gpupool+thresholds=3250`` runs the ``gpupool``
   preset with ``PoolConfig.thresholds=(3250,)``.
6. **Results**: ``<--out>/<--name>.{json,md}``, by default ``benchmarks/results/tiresias_peer.{json,md}``
   (the committed first window: another window should use ``--name tiresias_peer_wN``): per policy and
   cluster mean / p95 / p99 / max JCT and makespan (h), preemptions, the window's statistics, the machine,
   the peer's commit.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import fields, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from convert import (  # noqa: E402
    jct_summary,
    read_job_log,
    select_window,
    trace_stats,
    write_cluster_spec,
    write_tiresias_trace,
)

from _common import int_at_least, int_list, json_safe, machine_info  # noqa: E402

TIRESIAS_REPO = "https://github.com/SymbioticLab/Tiresias"
TIRESIAS_COMMIT = "959f9b08f44fa1b4f2b3aed79b01e4d439264a94"
"""Pinned peer commit ("add Apache license", the repository's HEAD when this benchmark was written)."""
NUMPY_SPEC = "numpy<1.17"
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "philly_pollux" / "philly.csv"
PEER_SCHEDULES = {"fifo": ("Tiresias fifo (yarn placement)", "yarn"),
                  "dlas-gpu": ("Tiresias-L (dlas-gpu, discretized 2D-LAS)", "count"),
                  "dlas-gpu-gittins": ("Tiresias-G (dlas-gpu-gittins, discretized 2D-Gittins)", "count")}
"""Tiresias ``--schedule`` -> (label, ``--scheme``). Tiresias-G is ``dlas-gpu-gittins`` (Gittins index
within the 2D-LAS queues, the paper's discretized 2D-Gittins): at the pinned commit ``--schedule=gittins``
crashes at its first job (``main`` passes the size prior to ``gittins_sim_jobs`` but never sets
``JOBS.job_dist_data``, which ``get_gittins_index`` reads)."""
ISSUE_SWITCHES = {384: 3, 320: 5}
"""Tiresias switches per cluster size (GPUs) in issue 14's table; its fifo figures are reproduced with these
(with one switch, yarn placement is slightly looser: fifo mean JCT 138.7 h instead of 139.7 h at 384 GPUs).
The switch count matters only to the ``yarn`` scheme (fifo); dlas-gpu and dlas-gpu-gittins count GPUs."""
PEER_SCHEMES = ("yarn", "count")
"""Placement schemes ``--peer SCHEDULE:SCHEME`` may name (Tiresias ``--scheme``)."""
GPU_MODEL = "V100M16"
DEFAULT_GPUPOOL = ("fifo", "gpupool", "gpupool+thresholds=(3250,7200)+promote_knob=None", "gpupool+order=gittins")
"""gpupool rows by default: the fifo baseline, the default policy, its 2D-LAS core given Tiresias-L's levels
(``jobs.py``: 3,250 and 7,200 GPU-seconds; ``dlas-gpu`` never promotes a starving job) and the Gittins
order (``PoolConfig(order="gittins")``, its own defaults)."""


def cache_dir() -> Path:
    return Path(os.environ.get("GPUPOOL_TIRESIAS_CACHE") or Path.home() / ".cache" / "gpupool-tiresias")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def fetch_tiresias(source: str, commit: str, cache: Path) -> tuple[Path, str]:
    """A checkout of the peer at ``commit`` under ``cache`` (cloned from ``source`` once); returns its
    ``simulator/`` folder and the source it was actually cloned from (a cached checkout keeps its own
    origin, whatever ``source`` says). Raises RuntimeError when the checkout is not exactly that commit,
    unchanged."""
    dest = cache / f"Tiresias-{commit[:12]}"
    if (dest / ".git").exists():
        try:
            origin = _git("config", "--get", "remote.origin.url", cwd=dest)
        except subprocess.CalledProcessError:
            origin = "unknown"
        used = f"{origin} (cached checkout {dest})"
        if origin != source:
            log(f"using the cached checkout {dest} (cloned from {origin}), not {source}")
    else:
        used = source
        tmp = Path(tempfile.mkdtemp(prefix="Tiresias-", dir=cache))
        log(f"cloning {source} -> {dest}")
        try:
            _git("clone", "--quiet", "--no-checkout", source, str(tmp / "repo"))
            _git("checkout", "--quiet", "--detach", commit, cwd=tmp / "repo")
        except subprocess.CalledProcessError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"cannot get Tiresias {commit} from {source}: {exc.stderr.strip()}\n"
                               "(no access to it? set TIRESIAS_SRC to a clone or git dir of Tiresias)") from None
        (tmp / "repo").rename(dest)
        tmp.rmdir()
    head = _git("rev-parse", "HEAD", cwd=dest)
    if head != commit:
        raise RuntimeError(f"{dest} is at {head}, not the pinned {commit}; remove it and rerun")
    dirty = _git("status", "--porcelain", "--untracked-files=no", cwd=dest)
    if dirty:
        raise RuntimeError(f"{dest} has local changes (the peer must run unmodified):\n{dirty}")
    return dest / "simulator", used


def _is_python27(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import sys; sys.exit(sys.version_info[:2] != (2, 7))"],
                              capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def find_python2(explicit: str | None) -> str:
    """The Python 2.7 to run the peer with: ``explicit`` (``--python2``), else ``$TIRESIAS_PYTHON2``, else
    ``python2.7`` on PATH, else pyenv's newest 2.7. Raises RuntimeError when an interpreter named by the
    option or the variable is missing or not 2.7 (it is never silently replaced), or when none is found."""
    for what, named in (("--python2", explicit), ("$TIRESIAS_PYTHON2", os.environ.get("TIRESIAS_PYTHON2"))):
        if named:
            path = shutil.which(named) or named
            if not Path(path).exists():
                raise RuntimeError(f"{what} {named}: no such interpreter")
            if not _is_python27(path):
                raise RuntimeError(f"{what} {named}: not a working Python 2.7")
            return path
    candidates = [shutil.which("python2.7")]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates += [str(p / "bin" / "python2.7") for p in sorted(pyenv.glob("2.7*"), reverse=True)]
    for c in candidates:  # a pyenv shim may exist and still fail: ask each one for its version
        if c and Path(c).exists() and _is_python27(c):
            return c
    raise RuntimeError("no Python 2.7 found: install one (e.g. `pyenv install 2.7.18`) or pass --python2")


def py2_env(python2: str, cache: Path) -> dict[str, str]:
    """Environment for running the peer: ``PYTHONPATH`` = a ``pip install --target`` of NumPy < 1.17
    (installed once). Returns the environment and records the versions in ``env['_VERSIONS']``."""
    site = cache / "py27-site"
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    probe = "import sys, numpy; print(sys.version.split()[0] + ' ' + numpy.__version__)"
    ok = subprocess.run([python2, "-c", probe], env=env, capture_output=True, text=True)
    if ok.returncode != 0:
        log(f"installing {NUMPY_SPEC} for {python2} into {site}")
        subprocess.run([python2, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--only-binary=:all:", "--target", str(site), NUMPY_SPEC], check=True, env=env)
        ok = subprocess.run([python2, "-c", probe], env=env, capture_output=True, text=True, check=True)
    env["_VERSIONS"] = ok.stdout.strip()
    return env


def run_peer(sim_dir: str, python2: str, env: dict[str, str], trace: str, gpus: int, gpus_per_node: int,
             switches: int, schedule: str, work: str) -> dict:
    """One ``run_sim.py`` run; returns its summary (raises RuntimeError when it fails or loses jobs)."""
    item = schedule
    schedule, _, scheme = item.partition(":")
    label, default_scheme = PEER_SCHEDULES[schedule]
    scheme = scheme or default_scheme
    if scheme != default_scheme:
        label = f"{label} [{scheme} placement]"
    run_dir = Path(work) / f"tiresias-{gpus}-{schedule}-{scheme}"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = write_cluster_spec(run_dir / "cluster_spec.csv", gpus // gpus_per_node, gpus_per_node, switches)
    cmd = [python2, "run_sim.py", f"--cluster_spec={spec}", f"--scheme={scheme}", f"--trace_file={trace}",
           f"--schedule={schedule}", f"--log_path={run_dir / 'log'}"]
    t0 = time.perf_counter()
    with (run_dir / "stdout.txt").open("w") as out:  # cwd: run_sim.py reads yarn-gput1000.csv from there
        rc = subprocess.run(cmd, cwd=sim_dir, env={k: v for k, v in env.items() if not k.startswith("_")},
                            stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        tail = (run_dir / "stdout.txt").read_text()[-2000:]
        raise RuntimeError(f"Tiresias {schedule} at {gpus} GPUs failed (exit {rc}):\n{tail}")
    done = read_job_log(run_dir / "log" / "job.csv")
    row = {"simulator": "tiresias", "policy": item, "label": label, "scheme": scheme, "gpus": gpus,
           "switches": switches,
           "wall_s": wall, "command": " ".join(cmd[1:]), "finished_jobs": len(done),
           "job_ids": sorted(j.job_id for j in done)}
    row.update(jct_summary([j.jct for j in done], [j.submit for j in done], [j.end for j in done]))
    pre = [j.preemptions for j in done]
    row.update({"preemptions": int(sum(pre)), "max_preemptions_per_job": int(max(pre))})
    return row


def parse_gpupool_spec(spec: str) -> tuple[str, dict]:
    """``"name+key=value+..."`` -> (job policy name, PoolConfig overrides); values are Python literals
    (a number for ``thresholds`` becomes a one-element tuple). Raises ValueError for an unknown field."""
    from gpupool.engine.pool.scheduler import PoolConfig

    name, *pairs = spec.split("+")
    known = {f.name for f in fields(PoolConfig)}
    over = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or key not in known:
            raise ValueError(f"--gpupool {spec!r}: {pair!r} is not KEY=VALUE with KEY one of {sorted(known)}")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        if key == "thresholds":
            if not isinstance(value, tuple | list):
                value = (value,)
            if not value or any(isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < float("inf")
                                for v in value):
                raise ValueError(f"--gpupool {spec!r}: thresholds={text} is not positive finite numbers "
                                 "(e.g. thresholds=3250 or thresholds=(3250,7200))")
            value = tuple(value)
        over[key] = value
    return name, over


def split_specs(text: str) -> list[str]:
    """Split a ``--gpupool`` list at the commas outside brackets: ``"fifo,gpupool+thresholds=(3250,7200)"``
    -> ``["fifo", "gpupool+thresholds=(3250,7200)"]``."""
    return [s for s in re.split(r",(?![^(\[]*[)\]])", text) if s]


def matched_config(policy: str, overrides: dict):
    """gpupool's simulator config matched to the peer: no restart overhead, no topology slowdown."""
    from gpupool.engine.pool.scheduler import job_policy
    from gpupool.sim.jobs import JobSimConfig
    from gpupool.topology import TIERS, TopologyConfig

    _, pool = job_policy(policy)
    return JobSimConfig(pool=replace(pool, **overrides) if overrides else None, restart_overhead_s=0.0,
                        topology=TopologyConfig(factors={t: 1.0 for t in TIERS}))


def run_gpupool(spec: str, jobs: list, gpus: int, gpus_per_node: int, nodes_per_rack: int = 0,
                racks_per_switch: int = 0) -> dict:
    from gpupool.clusterspec import cluster_from_dict
    from gpupool.sim.jobs import run_jobs

    policy, over = parse_gpupool_spec(spec)
    pool = {"name": "g8", "count": gpus // gpus_per_node, "gpuModel": GPU_MODEL, "gpusPerNode": gpus_per_node,
            "cpuCores": 128, "memoryGiB": 1024, "nvlink": True}
    if nodes_per_rack:
        pool["nodesPerRack"] = nodes_per_rack
        if racks_per_switch:
            pool["racksPerSwitch"] = racks_per_switch
    nodes = cluster_from_dict({"apiVersion": "gpupool.io/v1alpha1", "kind": "Cluster",
                               "metadata": {"name": f"peer-{gpus}"}, "spec": {"nodePools": [pool]}})
    t0 = time.perf_counter()
    res = run_jobs(nodes, jobs, policy, config=matched_config(policy, over))
    wall = time.perf_counter() - t0
    done = [j for j in res.jobs if j["status"] == "finished"]
    row = {"simulator": "gpupool", "policy": spec, "label": f"gpupool {spec}", "gpus": gpus, "wall_s": wall,
           "finished_jobs": len(done), "unfinished_jobs": len(res.jobs) - len(done),
           "job_ids": sorted(j["job_id"] for j in done)}
    row.update(jct_summary([j["jct"] for j in done], [j["submit"] for j in done], [j["end"] for j in done]))
    pre = [j["preemptions"] for j in done]
    row.update({"preemptions": int(sum(pre)), "max_preemptions_per_job": int(max(pre))})
    return row


def gpupool_revision() -> str:
    """This checkout's commit, with ``+dirty`` when tracked files under src/ differ from it."""
    try:
        head = _git("rev-parse", "--short=12", "HEAD", cwd=ROOT)
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", "src", cwd=ROOT)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _switches(n: int) -> str:
    return f"{n} switch" if n == 1 else f"{n} switches"


def _f(x: float, digits: int) -> str:
    return f"{x:,.{digits}f}"


def markdown(report: dict) -> str:
    sizes = report["gpus"]
    w = report["window"]
    t = report["tiresias"]
    peer_env = f"Python {t['python2']} / NumPy {t['numpy']}" if "python2" in t else "not run"
    m = report["machine"]
    lines = [
        "# gpupool vs the Tiresias simulator (same jobs, same cluster)",
        "",
        f"Jobs: {w['trace']} jobs {w['offset']:,}..{w['offset'] + w['jobs'] - 1:,} in submission order "
        f"({w['jobs']:,} jobs, {w['min_gpus']}-{w['max_gpus']} GPUs, {w['gpu_hours']:,.0f} GPU-hours, mean "
        f"duration {w['mean_duration_h']:.2f} h = the lower bound on mean JCT, submitted over "
        f"{w['submit_span_h']:,.1f} h). Clusters of {report['gpus_per_node']}-GPU nodes: "
        + ", ".join(f"{g} GPUs (offered load {w['offered_load'][str(g)]:.2f}; Tiresias: "
                    f"{_switches(report['tiresias_switches'][str(g)])})" for g in sizes) + ".",
        f"Peer: Tiresias `simulator/` at {report['tiresias']['commit']} ({report['tiresias']['repo']}), "
        f"unmodified, {peer_env}. "
        f"gpupool {report['gpupool_revision']}: matched model (no restart overhead, no topology slowdown, one queue, "
        f"no failures; racks of {report['gpupool_model']['nodes_per_rack']} nodes, "
        f"{report['gpupool_model']['racks_per_switch']} racks per switch).",
        "JCT = end - submit in both; p95/p99 by linear interpolation; makespan = last end - first submission.",
        f"Machine: {m['cpu']}, {m['cores']} cores; Python {m['python']}, NumPy {m['numpy']}; {m['date']}.",
        f"Command: `{report['command']}`.",
        "",
        "| policy | " + " | ".join(f"{g} GPUs mean / p95 / p99 JCT (h), makespan (h)" for g in sizes)
        + " | preemptions (max per job) |",
        "|---|" + "---:|" * len(sizes) + "---:|",
    ]
    by = {(r["simulator"], r["policy"], r["gpus"]): r for r in report["results"]}
    keys = list(dict.fromkeys((r["simulator"], r["policy"]) for r in report["results"]))
    for key in keys:
        cells, pre, label = [], [], key[1]
        for g in sizes:
            r = by.get((*key, g))
            if r is None:
                cells.append("—")
                continue
            label = r["label"]
            cells.append(f"{_f(r['mean_jct_h'], 2)} / {_f(r['p95_jct_h'], 2)} / {_f(r['p99_jct_h'], 0)}, "
                         f"{_f(r['makespan_h'], 0)}")
            pre.append(f"{r['preemptions']:,} ({r['max_preemptions_per_job']})")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {' / '.join(pre)} |")
    lines += ["", "Wall time per run (s): " + ", ".join(
        f"{r['label']} @{r['gpus']}: {r['wall_s']:.0f}" for r in report["results"]) + "."]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py", description="gpupool beside the Tiresias simulator: the same jobs "
                                "and cluster, JCT = end - submit in both (see the module docstring).")
    p.add_argument("--trace", default=str(DEFAULT_TRACE), help="job trace CSV (Philly or ITP format)")
    p.add_argument("--first", type=int_at_least(1), default=5000, help="jobs in the window (default 5000)")
    p.add_argument("--offset", type=int_at_least(0), default=0, help="jobs skipped before the window (default 0)")
    p.add_argument("--max-gpus", type=int_at_least(1), default=None,
                   help="drop jobs larger than this before windowing (default: keep all)")
    p.add_argument("--gpus", default="384,320", help="cluster sizes in GPUs, comma list (default 384,320)")
    p.add_argument("--gpus-per-node", type=int_at_least(1), default=8, help="GPUs per node on both sides (default 8)")
    p.add_argument("--switches", default=None,
                   help="Tiresias switches per cluster size, comma list aligned with --gpus or one value for all "
                        "(yarn placement keeps a job under one switch); default: the layout of issue 14's "
                        "table, 3 at 384 GPUs and 5 at 320 (16 and 8 nodes per switch), else 1")
    p.add_argument("--nodes-per-rack", type=int_at_least(0), default=8,
                   help="gpupool cluster: nodes per rack (0: no racks); default 8, as examples/clusters/philly.yaml "
                        "and issue 14's table. No slowdown either way, but it steers topology-aware placement")
    p.add_argument("--racks-per-switch", type=int_at_least(0), default=4,
                   help="gpupool cluster: racks per leaf switch (default 4)")
    p.add_argument("--peer", default=",".join(PEER_SCHEDULES),
                   help=f"Tiresias schedules, comma list of {', '.join(PEER_SCHEDULES)}, each optionally "
                        f"SCHEDULE:SCHEME with a placement scheme of {', '.join(PEER_SCHEMES)} ('' for none; "
                        f"default {','.join(PEER_SCHEDULES)})")
    p.add_argument("--gpupool", default=",".join(DEFAULT_GPUPOOL),
                   help="gpupool job policies, comma list, each NAME[+KEY=VALUE...] with PoolConfig overrides "
                        f"(default {','.join(DEFAULT_GPUPOOL)}; '' for none)")
    p.add_argument("--tiresias-src", default=os.environ.get("TIRESIAS_SRC") or TIRESIAS_REPO,
                   help="where to clone Tiresias from: URL, clone or git dir (default $TIRESIAS_SRC or GitHub); "
                        "unused when the cache already holds the checkout (the results record its origin)")
    p.add_argument("--tiresias-commit", default=TIRESIAS_COMMIT,
                   help=f"peer commit to check out (default the pinned {TIRESIAS_COMMIT[:12]})")
    p.add_argument("--python2", default=None, help="Python 2.7 interpreter (default: $TIRESIAS_PYTHON2, PATH, pyenv)")
    p.add_argument("--parallel", type=int_at_least(1), default=1, help="runs at once (default 1)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"),
                   help="folder for the json and md (default benchmarks/results: overwrites the committed "
                        "results of --name)")
    p.add_argument("--name", default="tiresias_peer", help="file name stem of the results (default tiresias_peer)")
    p.add_argument("--render", metavar="JSON", default=None,
                   help="only rewrite the .md next to JSON from that results file (no runs)")
    p.add_argument("--keep", default=None, help="keep the converted trace and the peer's logs in this folder")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def _looks_local(source: str) -> bool:
    return "://" not in source and not re.match(r"^[\w.-]+@[\w.-]+:", source)


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.render:
        src = Path(args.render)
        try:
            md = markdown(json.loads(src.read_text()))
        except OSError as exc:
            p.error(f"argument --render: {exc}")
        except ValueError as exc:
            p.error(f"argument --render: {src}: not JSON ({exc})")
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            p.error(f"argument --render: {src} is not a results file of this benchmark "
                    f"({type(exc).__name__}: {exc})")
        src.with_suffix(".md").write_text(md)
        return 0
    from gpupool.traces import load_jobs

    sizes = int_list(p, "--gpus", args.gpus, allow_empty=True)
    if not sizes:
        p.error(f"argument --gpus: no cluster size in {args.gpus!r}")
    if any(g <= 0 or g % args.gpus_per_node for g in sizes):
        p.error(f"argument --gpus: every size must be a positive multiple of --gpus-per-node "
                f"{args.gpus_per_node}, got {args.gpus!r}")
    if args.switches is None:
        switches = [ISSUE_SWITCHES.get(g, 1) for g in sizes]
    else:
        switches = int_list(p, "--switches", args.switches, allow_empty=True)
        switches = switches * len(sizes) if len(switches) == 1 else switches
    if len(switches) != len(sizes) or any(
            x < 1 or (g // args.gpus_per_node) % x for x, g in zip(switches, sizes, strict=False)):
        p.error(f"argument --switches: one count per --gpus size (or one for all), each dividing the node count; "
                f"got {args.switches!r} for {sizes}")
    switches_of = dict(zip(sizes, switches, strict=True))
    peer = [s for s in args.peer.split(",") if s]
    unknown = {s for s in peer if s.partition(":")[0] not in PEER_SCHEDULES
               or s.partition(":")[2] not in ("", *PEER_SCHEMES)}
    if unknown:
        p.error(f"argument --peer: unknown {sorted(unknown)}; known: {', '.join(PEER_SCHEDULES)}, each optionally "
                f":{' or :'.join(PEER_SCHEMES)}")
    ours = split_specs(args.gpupool)
    from gpupool.engine.pool.scheduler import JOB_POLICIES
    for s in ours:
        try:
            name, over = parse_gpupool_spec(s)
            if name not in JOB_POLICIES:
                raise ValueError(f"--gpupool: unknown policy in {s!r}; known: {', '.join(JOB_POLICIES)}")
            matched_config(name, over)
        except (ValueError, TypeError) as exc:
            msg = str(exc).removeprefix("--gpupool: ").removeprefix("--gpupool ")
            p.error(f"argument --gpupool: {msg}")
    if not peer and not ours:
        p.error("nothing to run: --peer and --gpupool are both empty")
    if peer:
        if _looks_local(args.tiresias_src) and not Path(args.tiresias_src).exists():
            p.error(f"argument --tiresias-src: {args.tiresias_src} does not exist")
        try:
            find_python2(args.python2)
        except RuntimeError as exc:
            p.error(f"argument --python2: {exc}" if args.python2 else str(exc))

    try:
        jobs = select_window(load_jobs(args.trace), args.first, args.offset, args.max_gpus)
    except (OSError, ValueError) as exc:  # TraceFormatError names file, line and column
        if "empty window" in str(exc) and args.max_gpus is not None:
            p.error(f"argument --offset: {exc} left by --max-gpus {args.max_gpus}")
        p.error(f"argument {'--offset' if 'empty window' in str(exc) else '--trace'}: {exc}")
    stats = trace_stats(jobs)
    stats["offered_load"] = {str(g): trace_stats(jobs, g)["offered_load"] for g in sizes}
    stats.update({"trace": Path(args.trace).name, "offset": args.offset, "max_gpus_filter": args.max_gpus})
    log(f"window: {stats['jobs']} jobs, {stats['gpu_hours']:,.0f} GPU-h, mean {stats['mean_duration_h']:.2f} h")

    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tiresias-run-"))
    work.mkdir(parents=True, exist_ok=True)
    trace_csv = write_tiresias_trace(jobs, work / "jobs_tiresias.csv")
    tiresias = {"repo": TIRESIAS_REPO, "source": args.tiresias_src, "commit": args.tiresias_commit}
    sim_dir = python2 = env = None
    if peer:
        sim_dir, tiresias["source"] = fetch_tiresias(args.tiresias_src, args.tiresias_commit, cache)
        python2 = find_python2(args.python2)
        env = py2_env(python2, cache)
        tiresias["python2"], tiresias["numpy"] = env["_VERSIONS"].split()
        tiresias["checkout"] = str(sim_dir.parent)

    tasks = [("peer", s, g) for g in sizes for s in peer] + [("gpupool", s, g) for g in sizes for s in ours]
    results = []
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(max_workers=max(1, args.parallel)) as ex:
        futs = {}
        for kind, s, g in tasks:
            if kind == "peer":
                f = ex.submit(run_peer, str(sim_dir), python2, env, str(trace_csv.resolve()), g,
                              args.gpus_per_node, switches_of[g], s, str(work.resolve()))
            else:
                f = ex.submit(run_gpupool, s, jobs, g, args.gpus_per_node, args.nodes_per_rack,
                              args.racks_per_switch)
            futs[f] = (kind, s, g)
        for f in cf.as_completed(futs):
            kind, s, g = futs[f]
            r = f.result()
            log(f"{kind} {s} @{g} GPUs: mean {r['mean_jct_h']:.2f} h, p95 {r['p95_jct_h']:.2f} h, "
                f"p99 {r['p99_jct_h']:.1f} h, makespan {r['makespan_h']:.0f} h ({r['wall_s']:.0f} s)")
            results.append(r)
    want = sorted(int(j.line) for j in jobs)
    for r in results:  # the same jobs finished on both sides
        ids = [int(str(i).rsplit("-", 1)[-1]) for i in r.pop("job_ids")]
        r["same_jobs_as_window"] = sorted(ids) == want
    order = {t: i for i, t in enumerate(tasks)}
    results.sort(key=lambda r: order[("peer" if r["simulator"] == "tiresias" else "gpupool", r["policy"], r["gpus"])])
    cmd = "python benchmarks/tiresias/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    report = {"benchmark": "tiresias_peer", "command": cmd.strip(), "machine": machine_info(), "window": stats,
              "gpus": sizes, "gpus_per_node": args.gpus_per_node,
              "tiresias_switches": {str(g): x for g, x in switches_of.items()},
              "tiresias": tiresias, "gpupool_revision": gpupool_revision(),
              "gpupool_model": {"restart_overhead_s": 0.0, "topology_speed_factors": 1.0, "queues": 1,
                                "failures": None, "gpu_model": GPU_MODEL, "nodes_per_rack": args.nodes_per_rack,
                                "racks_per_switch": args.racks_per_switch},
              "total_wall_s": time.perf_counter() - t0, "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(json_safe(report), indent=2) + "\n")
    (out / f"{args.name}.md").write_text(markdown(report))
    log(f"wrote {out / (args.name + '.json')} and .md")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    bad = [r["label"] for r in results if not r["same_jobs_as_window"]]
    if bad:
        log(f"WARNING: not every job of the window finished in: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, ValueError, OSError, subprocess.CalledProcessError) as exc:  # one clear line
        print(f"{Path(__file__).name}: error: {exc}", file=sys.stderr)
        sys.exit(2)
