"""Cluster state as NumPy arrays, so that filters and scores run vectorized over all nodes.

Every array is indexed by node (``n_nodes``) and, for per-GPU arrays, by device index (``max_gpus``,
the most GPUs any node has). Device slots beyond a node's ``gpu_count`` do not exist
(``gpu_exists`` is False there) and hold zero capacity.

The state is changed only through :meth:`ClusterState.allocate`, :meth:`ClusterState.release` and
:meth:`ClusterState.set_gpu_health`; each bumps ``version[node]``, which the engine's score cache uses
to know which nodes changed since it last looked. Writing to the arrays directly bypasses that and
is not supported.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from gpupool.catalog import get_model
from gpupool.model import MILLI, AllocationError, Assignment, NodeSpec, PodRequest


def gpu_memory_of(spec: NodeSpec) -> int:
    """Memory of each GPU of ``spec`` (MiB): ``spec.gpu_memory_mib`` (what the node reports, e.g. GFD's
    ``nvidia.com/gpu.memory``) when set, else the catalog's figure for ``spec.gpu_model``; 0 when neither is
    known (an opaque model without a node figure) or the node has no GPU."""
    if spec.gpu_count <= 0:
        return 0
    if spec.gpu_memory_mib > 0:
        return spec.gpu_memory_mib
    return get_model(spec.gpu_model).memory_mib


def slice_ask(requested_milli: int, effective_milli: int, gpu_memory_mib: int) -> bool:
    """True when a GPU ask is in device-plugin units: a whole GPU each (``requested_milli`` and
    ``effective_milli`` both 1000) with no amount of GPU memory. On a time-sliced node (replicas > 1) such
    an ask of ``N`` is ``N`` replicas, each one replica's share (``1000 // replicas`` milli) of a distinct
    GPU; elsewhere it is ``N`` whole GPUs."""
    return requested_milli == MILLI and effective_milli == MILLI and not gpu_memory_mib


class ClusterState:
    """Per-node and per-GPU capacity and free resources.

    Arrays (all public, read-only for callers):

    * ``cpu_cap``, ``cpu_free``: (n_nodes,) int64 milli-CPU
    * ``mem_cap``, ``mem_free``: (n_nodes,) int64 MiB
    * ``gpu_count``: (n_nodes,) int64 GPUs on the node
    * ``gpu_exists``: (n_nodes, max_gpus) bool
    * ``gpu_model``: (n_nodes, max_gpus) int16 index into ``model_names`` (-1: no GPU)
    * ``node_model``: (n_nodes,) int16 model of the node's GPUs (-1: CPU-only node)
    * ``gpu_free``: (n_nodes, max_gpus) int32 free milli-GPU (1000 = whole GPU free)
    * ``gpu_mem_cap``, ``gpu_mem_free``: (n_nodes, max_gpus) int64 GPU memory (MiB; 0 = unknown: no
      ``NodeSpec.gpu_memory_mib`` and a model the catalog does not know); ``node_gpu_mem``: (n_nodes,) the same
      per node
    * ``gpu_replicas``: (n_nodes,) int64 time-slicing replicas per GPU (1 = not shared); ``slice_milli``:
      (n_nodes,) int64 milli-GPU of one replica (``1000 // gpu_replicas``). On a node with replicas > 1 a
      whole-GPU ask is in replicas: see :func:`slice_ask` and :meth:`share_on`
    * ``gpu_healthy``: (n_nodes, max_gpus) bool; an unhealthy GPU is never chosen; ``gpu_marked``: the same
      shape, True where the node itself (gpupool's node agent) marked the GPU unhealthy: telemetry never
      marks such a GPU healthy again (only the node can, by clearing its mark)
    * ``version``: (n_nodes,) int64, bumped on every change of the node
    * ``changes``: int, bumped on every change of any node (a cache that saw the same count is current);
      :meth:`changed_since` lists the nodes changed since a past count (a log, not a scan of ``version``;
      :meth:`log_tail` gives the log itself, an int64 array)
    * ``loosened``: int, bumped only by changes that may let more in (a release, a GPU repaired, a node
      touched); a pod that did not fit cannot fit while it stays the same
    """

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        if not nodes:
            raise ValueError("a cluster needs at least one node")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            seen: set[str] = set()
            dup = next(x for x in names if x in seen or seen.add(x))  # type: ignore[func-returns-value]
            raise ValueError(f"duplicate node name {dup!r}")
        self.nodes: tuple[NodeSpec, ...] = tuple(nodes)
        self.node_names: tuple[str, ...] = tuple(names)
        self.node_index: dict[str, int] = {name: i for i, name in enumerate(names)}
        n = len(nodes)
        g = max(1, max(spec.gpu_count for spec in nodes))
        self.n_nodes = n
        self.max_gpus = g

        self.model_names: tuple[str, ...] = tuple(sorted({s.gpu_model for s in nodes if s.gpu_count > 0}))
        self.model_index: dict[str, int] = {m: i for i, m in enumerate(self.model_names)}

        self.cpu_cap = np.array([s.cpu_milli for s in nodes], dtype=np.int64)
        self.mem_cap = np.array([s.memory_mib for s in nodes], dtype=np.int64)
        self.gpu_count = np.array([s.gpu_count for s in nodes], dtype=np.int64)
        self.gpu_exists = np.arange(g)[None, :] < self.gpu_count[:, None]
        self.node_model = np.array(
            [self.model_index[s.gpu_model] if s.gpu_count > 0 else -1 for s in nodes], dtype=np.int16
        )
        self.gpu_model = np.where(self.gpu_exists, self.node_model[:, None], -1).astype(np.int16)
        # GPU memory per GPU: the node's own figure (GFD nvidia.com/gpu.memory) wins over the catalog's;
        # 0 = unknown (neither the node nor the catalog says), never "unlimited"
        self.node_gpu_mem = np.array([gpu_memory_of(s) for s in nodes], dtype=np.int64)
        self.gpu_mem_cap = np.where(self.gpu_exists, self.node_gpu_mem[:, None], 0).astype(np.int64)
        # time-slicing / MPS replicas per GPU (1 = not shared) and the share one replica is (milli-GPU)
        self.gpu_replicas = np.array([max(1, s.gpu_replicas) for s in nodes], dtype=np.int64)
        self.slice_milli = (MILLI // self.gpu_replicas).astype(np.int64)

        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.gpu_free = np.where(self.gpu_exists, MILLI, 0).astype(np.int32)
        self.gpu_mem_free = self.gpu_mem_cap.copy()
        self.gpu_healthy = self.gpu_exists.copy()
        self.gpu_marked = np.zeros_like(self.gpu_exists)  # marked unhealthy by the node itself (its agent)
        self.version = np.zeros(n, dtype=np.int64)
        self.changes = 0
        self.health_changes = 0  # set_gpu_health calls: caches of the healthy capacity key on it
        # change log: the node of every change, in order (_log[i] is change number _log_base + i, for i below
        # _log_len), so that a cache that saw ``changes == c`` finds the nodes changed since without scanning
        # ``version``; an int64 array that compiled code reads as it is (see :meth:`log_tail`)
        self._log = np.empty(2 * max(n, self.LOG_KEEP) + 1, dtype=np.int64)
        self._log_len = 0
        self._log_base = 0
        self.loosened = 0  # bumped when something is freed or may admit more (release, repair, touch)
        # free milli-GPU on healthy GPUs (0 on unhealthy or absent ones), kept in step with gpu_free and
        # gpu_healthy by allocate / release / set_gpu_health; read through usable_gpu_free()
        self._usable = self.gpu_free.copy()
        self._sliced = tuple((self.gpu_replicas > 1).tolist())  # per node, as Python bools: gpu_replicas never changes
        self.assignments: dict[str, Assignment] = {}

        self.total_gpus = int(self.gpu_count.sum())
        self.total_gpu_milli = self.total_gpus * MILLI
        self.node_domain = tuple(s.nvlink_domain for s in nodes)
        self.node_rack = tuple(s.rack for s in nodes)
        self.node_switch = tuple(s.switch for s in nodes)

    # ------------------------------------------------------------------ queries
    def usable_gpu_free(self, nodes: np.ndarray | None = None) -> np.ndarray:
        """(n_nodes, max_gpus) int32 free milli-GPU on healthy GPUs (0 on unhealthy or absent ones).

        With ``nodes`` (an index array), only those rows: (len(nodes), max_gpus).
        """
        if nodes is None:
            return self._usable.copy()
        return self._usable[nodes]

    def allocated_gpu_milli(self) -> int:
        """milli-GPU held by placed pods (what the devices have handed out)."""
        return int(self.total_gpu_milli - self.gpu_free[self.gpu_exists].sum())

    def share_on(self, req: PodRequest, node: int, gpu_milli: int | None = None) -> int:
        """milli-GPU each device of ``node`` gives ``req`` when it is handed ``gpu_milli`` per GPU (default: the
        ask): one replica's share (``slice_milli[node]``) for a whole-GPU ask (:func:`slice_ask`) on a
        time-sliced node, else ``gpu_milli`` as given."""
        milli = req.gpu_milli if gpu_milli is None else int(gpu_milli)
        if self.gpu_replicas[node] > 1 and slice_ask(req.gpu_milli, milli, req.gpu_memory_mib):
            return int(self.slice_milli[node])
        return milli

    def gpu_memory_for(self, req: PodRequest, node: int, gpu: int, milli: int) -> int:
        """GPU memory (MiB) a pod takes on one GPU: its explicit ask, else its share of the GPU's memory."""
        if req.gpu_memory_mib:
            return req.gpu_memory_mib
        return int(self.gpu_mem_cap[node, gpu]) * milli // MILLI

    LOG_KEEP = 4096
    """The change log keeps at least this many of the latest changes (and up to twice ``max(n_nodes, LOG_KEEP)``)."""

    def log_tail(self, seen: int) -> tuple[np.ndarray, int, int] | None:
        """``(log, start, end)``: the nodes of changes ``seen`` to ``changes - 1`` are ``log[start:end]`` (int64
        node indices in change order, repeats included; the array is the live log, read it before the next
        change); ``None`` when the log no longer reaches back that far or ``seen`` is not a past count."""
        start = seen - self._log_base
        if start < 0 or seen > self.changes:
            return None
        return self._log, start, self._log_len

    def changed_since(self, seen: int) -> list[int] | None:
        """Nodes changed since ``changes`` was ``seen``, each once, lowest index first; ``None`` when the log no
        longer reaches back that far (the caller scans ``version`` instead) or ``seen`` is not a past count."""
        start = seen - self._log_base
        if start < 0 or seen > self.changes:
            return None
        return sorted(set(self._log[start:self._log_len].tolist()))

    # ------------------------------------------------------------------ changes
    def _bump(self, node: int) -> None:
        """Record a change of ``node``: its ``version``, the ``changes`` count and the change log."""
        self.version[node] += 1
        self.changes += 1
        log, end = self._log, self._log_len
        if end == len(log):  # only when LOG_KEEP was raised after the state was built
            self._log = log = np.concatenate([log, np.empty_like(log)])
        log[end] = node
        end += 1
        keep = max(self.n_nodes, self.LOG_KEEP)
        if end > 2 * keep:  # keep the latest ``keep`` changes
            drop = end - keep
            log[:keep] = log[drop:end].copy()
            end = keep
            self._log_base += drop
        self._log_len = end

    def allocate(
        self,
        req: PodRequest,
        node: int,
        gpus: Iterable[int],
        gpu_milli: int | None = None,
    ) -> Assignment:
        """Place ``req`` on ``node`` using device indices ``gpus``, each giving ``gpu_milli`` (default: the ask).

        Raises :class:`AllocationError` (state unchanged) if the pod is already placed, a device is absent,
        unhealthy or repeated, or any CPU, memory, GPU share or GPU memory would be over-allocated.
        """
        if req.name in self.assignments:
            raise AllocationError(f"pod {req.name} is already placed on {self.assignments[req.name].node_name}")
        if not 0 <= node < self.n_nodes:
            raise AllocationError(f"node index {node} out of range 0..{self.n_nodes - 1}")
        gpu_list = tuple(map(int, gpus))
        milli = req.gpu_milli if gpu_milli is None else int(gpu_milli)
        requested = req.gpu_milli
        # share_on gives ``milli`` back unless the node is time-sliced (replicas > 1): ask it only there
        if req.num_gpu and self._sliced[node] and (shared := self.share_on(req, node, milli)) != milli:
            milli = requested = shared  # a whole-GPU ask on a time-sliced node: replicas
        name = self.node_names[node]
        if len(gpu_list) != req.num_gpu:
            raise AllocationError(f"pod {req.name} asks for {req.num_gpu} GPU(s), got devices {gpu_list}")
        if len(set(gpu_list)) != len(gpu_list):
            raise AllocationError(f"pod {req.name}: device list {gpu_list} repeats a GPU")
        if req.num_gpu and not requested <= milli <= MILLI:
            raise AllocationError(f"pod {req.name}: share {milli} outside {requested}..{MILLI}")
        if self.cpu_free[node] < req.cpu_milli:
            raise AllocationError(f"pod {req.name}: insufficient cpu on {name}")
        if self.mem_free[node] < req.memory_mib:
            raise AllocationError(f"pod {req.name}: insufficient memory on {name}")
        mem_each = 0
        gpu_mem: list[int] = []  # GPU memory taken on each of gpu_list (MiB)
        if gpu_list:
            # the node's rows as Python ints: one conversion instead of a NumPy scalar access per check
            n_gpus = int(self.gpu_count[node])  # gpu_exists[node, g] is g < gpu_count[node]
            free = self.gpu_free[node].tolist()
            healthy = self.gpu_healthy[node].tolist()
            mem_cap = self.gpu_mem_cap[node].tolist()
            mem_free = self.gpu_mem_free[node].tolist()
            for gpu in gpu_list:
                if not 0 <= gpu < n_gpus:
                    raise AllocationError(f"pod {req.name}: node {name} has no GPU {gpu}")
                if not healthy[gpu]:
                    raise AllocationError(f"pod {req.name}: GPU {gpu} on {name} is unhealthy")
                if free[gpu] < milli:
                    raise AllocationError(
                        f"pod {req.name}: GPU {gpu} on {name} has {free[gpu]} milli free, needs {milli}"
                    )
                mem_each = req.gpu_memory_mib or mem_cap[gpu] * milli // MILLI  # as gpu_memory_for
                if mem_cap[gpu] and mem_free[gpu] < mem_each:
                    raise AllocationError(f"pod {req.name}: GPU {gpu} on {name} lacks {mem_each} MiB of memory")
                if not mem_cap[gpu] and req.gpu_memory_mib:
                    raise AllocationError(f"pod {req.name}: GPU {gpu} on {name} has unknown memory size")
                gpu_mem.append(mem_each if mem_cap[gpu] else 0)
        self.cpu_free[node] -= req.cpu_milli
        self.mem_free[node] -= req.memory_mib
        if gpu_list:
            gpu_free_row, usable_row, mem_free_row = self.gpu_free[node], self._usable[node], self.gpu_mem_free[node]
            for gpu, mem in zip(gpu_list, gpu_mem, strict=True):
                left = free[gpu] - milli
                gpu_free_row[gpu] = left
                usable_row[gpu] = left  # the GPU is healthy (checked above)
                if mem:
                    mem_free_row[gpu] = mem_free[gpu] - mem
        self._bump(node)
        assignment = Assignment(
            pod=req.name,
            node=node,
            node_name=name,
            gpus=gpu_list,
            gpu_milli=milli if gpu_list else 0,
            gpu_memory_mib=mem_each,
            requested_gpu_milli=requested,
            cpu_milli=req.cpu_milli,
            memory_mib=req.memory_mib,
        )
        self.assignments[req.name] = assignment
        return assignment

    def release(self, pod: str) -> Assignment:
        """Give back everything pod ``pod`` holds; raises :class:`AllocationError` if it is not placed."""
        assignment = self.assignments.pop(pod, None)
        if assignment is None:
            raise AllocationError(f"pod {pod} is not placed")
        node = assignment.node
        self.cpu_free[node] += assignment.cpu_milli
        self.mem_free[node] += assignment.memory_mib
        if assignment.gpus:
            # the node's rows (views): one 2-D index per row instead of one per GPU and access
            gpu_free, usable, mem_free = self.gpu_free[node], self._usable[node], self.gpu_mem_free[node]
            healthy, mem_cap = self.gpu_healthy[node].tolist(), self.gpu_mem_cap[node].tolist()
            milli, mem = assignment.gpu_milli, assignment.gpu_memory_mib
            for gpu in assignment.gpus:
                gpu_free[gpu] += milli
                if healthy[gpu]:
                    usable[gpu] = gpu_free[gpu]
                if mem_cap[gpu]:
                    mem_free[gpu] += mem
        self._bump(node)
        self.loosened += 1
        return assignment

    def touch(self, node: int) -> None:
        """Mark ``node`` changed without changing its resources (its taints, cordon or labels changed), so that
        caches keyed by ``version`` recompute it; raises :class:`AllocationError` for an index out of range."""
        if not 0 <= node < self.n_nodes:
            raise AllocationError(f"node index {node} out of range 0..{self.n_nodes - 1}")
        self._bump(node)
        self.loosened += 1

    def set_gpu_health(self, node: int, gpu: int, healthy: bool) -> None:
        """Mark one GPU healthy or not; pods already on it stay until a driver moves them.

        Raises :class:`AllocationError` for a node or device index that does not exist.
        """
        if not 0 <= node < self.n_nodes:
            raise AllocationError(f"node index {node} out of range 0..{self.n_nodes - 1}")
        if not 0 <= gpu < self.max_gpus or not self.gpu_exists[node, gpu]:
            raise AllocationError(f"node {self.node_names[node]} has no GPU {gpu}")
        self.gpu_healthy[node, gpu] = healthy
        self._usable[node, gpu] = self.gpu_free[node, gpu] if self.gpu_healthy[node, gpu] else 0
        self._bump(node)
        self.health_changes += 1
        if healthy:
            self.loosened += 1

    def check_invariants(self) -> None:
        """Raise AssertionError if any resource is over-allocated or the books do not balance."""
        assert (self.cpu_free >= 0).all() and (self.cpu_free <= self.cpu_cap).all(), "cpu out of range"
        assert (self.mem_free >= 0).all() and (self.mem_free <= self.mem_cap).all(), "memory out of range"
        assert (self.gpu_free >= 0).all() and (self.gpu_free <= MILLI).all(), "gpu share out of range"
        assert (self.gpu_free[~self.gpu_exists] == 0).all(), "absent GPU has capacity"
        assert (self.gpu_mem_free >= 0).all() and (self.gpu_mem_free <= self.gpu_mem_cap).all(), "gpu memory"
        cpu = self.cpu_cap.copy()
        mem = self.mem_cap.copy()
        gpu = np.where(self.gpu_exists, MILLI, 0).astype(np.int64)
        gmem = self.gpu_mem_cap.copy()
        for a in self.assignments.values():
            cpu[a.node] -= a.cpu_milli
            mem[a.node] -= a.memory_mib
            for g in a.gpus:
                gpu[a.node, g] -= a.gpu_milli
                if self.gpu_mem_cap[a.node, g]:
                    gmem[a.node, g] -= a.gpu_memory_mib
        assert (cpu == self.cpu_free).all(), "cpu books do not balance"
        assert (mem == self.mem_free).all(), "memory books do not balance"
        assert (gpu == self.gpu_free).all(), "gpu share books do not balance"
        assert (gmem == self.gpu_mem_free).all(), "gpu memory books do not balance"
