"""Shared object builders for the engine, policy, fragmentation and simulator tests.

In the style of kube-scheduler's ``st.MakeNode()`` / ``st.MakePod()`` wrappers: tiny functions with
defaults that keep table-driven test cases to one readable line each.

    node("n0", cpu=32000, mem=65536, gpus=4, model="V100M16")
    pod("p", cpu=1000, gpus=1, milli=500)
    state = cluster(node("n0", gpus=2), node("n1"))
    eng = engine(state, "best-fit")
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pytest

from gpupool.cluster import ClusterState
from gpupool.engine.core import Engine, Policy
from gpupool.frag import TypicalPods
from gpupool.model import MILLI, NodeSpec, PodRequest
from gpupool.policies import make_policy


@pytest.fixture(autouse=True)
def _root_logger_restored():
    """A test that runs a component's CLI installs its log handler on the root logger (``logging_setup``) at INFO;
    undo that after the test, so that a later test's output (a CliRunner mixes stderr into ``output``) holds only
    what that test wrote."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(h)
    root.setLevel(level)

ALL_POLICIES = (
    "round-robin", "single-node", "lowest-power", "random", "k8s-default", "best-fit", "spread",
    "dot-product", "gpu-packing", "gpu-clustering", "fgd", "gpupool", "gpupool-combined", "load-aware",
)


def bench_module(relpath: str, name: str | None = None):
    """The script ``benchmarks/<relpath>`` loaded as a module named ``name`` (default: its file's stem),
    registered in ``sys.modules`` (dataclasses look their module up there) with its folder on ``sys.path``
    (the scripts import ``_common``)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / relpath
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def argparse_error(main, capsys, argv: list[str]) -> str:
    """The last stderr line of ``main(argv)`` exiting 2 without a traceback (a benchmark script's argparse-style
    refusal); fails the test otherwise."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def openb_header_folder(tmp_path: Path) -> Path:
    """An openb trace folder with the node list and the default pod list, headers only: what a benchmark
    script's argument checks need before any run."""
    traces = tmp_path / "openb"
    traces.mkdir()
    (traces / "openb_node_list_gpu_node.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n")
    (traces / "openb_pod_list_default.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n")
    return traces


def node(name: str, cpu: int = 32000, mem: int = 65536, gpus: int = 0, model: str | None = None,
         domain: str = "", rack: str = "") -> NodeSpec:
    """A node; ``model`` defaults to V100M16 when it has GPUs (16160 MiB, 300 W peak)."""
    if model is None:
        model = "V100M16" if gpus else ""
    return NodeSpec(name, cpu_milli=cpu, memory_mib=mem, gpu_count=gpus, gpu_model=model,
                    nvlink_domain=domain, rack=rack)


def pod(name: str, cpu: int = 0, mem: int = 0, gpus: int = 0, milli: int | None = None,
        spec: Iterable[str] = (), gpu_mem: int = 0, priority: int = 0) -> PodRequest:
    """A pod; ``milli`` (share of each GPU) defaults to a whole GPU when ``gpus`` > 0."""
    if milli is None:
        milli = MILLI if gpus else 0
    return PodRequest(name, cpu_milli=cpu, memory_mib=mem, num_gpu=gpus, gpu_milli=milli,
                      gpu_spec=tuple(spec), gpu_memory_mib=gpu_mem, priority=priority)


def cluster(*nodes: NodeSpec) -> ClusterState:
    return ClusterState(list(nodes))


def policy_of(p: str | Policy) -> Policy:
    return make_policy(p) if isinstance(p, str) else p


def engine(state: ClusterState, p: str | Policy, seed: int = 0,
           workload: Sequence[PodRequest] | None = None) -> Engine:
    return Engine(state, policy_of(p), seed=seed, workload=workload)


def typical(*shapes: tuple) -> TypicalPods:
    """TypicalPods from ``(cpu, num_gpu, gpu_milli, prob[, gpu_spec[, memory]])`` tuples, in order."""
    rows = [tuple(s) + ((), 0)[len(s) - 4:] for s in shapes]
    return TypicalPods(
        cpu_milli=np.array([r[0] for r in rows], dtype=np.int64),
        memory_mib=np.array([r[5] for r in rows], dtype=np.int64),
        num_gpu=np.array([r[1] for r in rows], dtype=np.int64),
        gpu_milli=np.array([r[2] for r in rows], dtype=np.int64),
        gpu_spec=tuple(tuple(r[4]) for r in rows),
        prob=np.array([r[3] for r in rows], dtype=np.float64),
    )


def occupy(state: ClusterState, node_index: int, shares: Sequence[int], prefix: str = "fill") -> None:
    """Pre-load GPU ``g`` of node ``node_index`` with one pod of ``shares[g]`` milli (0: leave idle)."""
    for g, share in enumerate(shares):
        if share:
            state.allocate(pod(f"{prefix}-{node_index}-{g}", gpus=1, milli=share), node_index, [g])


def placed(decision) -> tuple[str, tuple[int, ...]]:
    """(node name, device indices) of a scheduled decision; fails the test if it was not scheduled."""
    assert decision.assignment is not None, decision.reason
    return decision.assignment.node_name, decision.assignment.gpus


@pytest.fixture
def v100_pair() -> ClusterState:
    """Two identical 4 x V100M16 nodes with 32 cores and 64 GiB each."""
    return cluster(node("n0", gpus=4), node("n1", gpus=4))
