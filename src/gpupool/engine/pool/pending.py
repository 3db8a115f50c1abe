"""The pool scheduler's waiting lists: :class:`Pending` (a queue's jobs in key order, indexed by shape),
:class:`Reservation` and :func:`fails_like` (the failed-shape test). Imports the job only."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from gpupool.engine.pool.job import PoolJob

__all__ = ["Pending", "Reservation", "fails_like"]


class Pending:
    """Jobs of one queue kept sorted by ``job.key``, and the keys of each job shape ((GPUs per pod, minimum pods,
    required topology tier), :meth:`PoolScheduler._shape`) sorted the same way: where the next waiting job of a
    shape that has not failed is, without passing over every job of the shapes that have.

    ``jobs``, ``keys`` and ``by_shape`` read the live lists. For speed, a job removed from the front of a list (the
    usual case: the first waiting job starts) is only counted off (``_head``, ``_shape_lo``) and the lists are cut
    now and then, or when read: deleting the first of thousands of waiting jobs moved every other one each time.
    The scheduler's own loop reads the underlying lists at offset ``_head`` (:meth:`_next_live`)."""

    __slots__ = ("_jobs", "_keys", "_head", "_by_shape", "_shape_lo", "n_jobs")

    def __init__(self) -> None:
        self._keys: list[tuple] = []
        self._jobs: list[PoolJob] = []
        self._head = 0  # entries before it in _jobs / _keys left the queue
        self._by_shape: dict[tuple, list[tuple]] = {}
        self._shape_lo: dict[tuple, int] = {}  # the same per shape list (only shapes with such entries)
        self.n_jobs = 0  # len(jobs), kept: read where only whether jobs wait matters (no call)

    def _compact(self) -> None:
        """Cut the entries of jobs that left from the front of every list."""
        head = self._head
        if head:
            del self._jobs[:head]
            del self._keys[:head]
            self._head = 0
        if self._shape_lo:
            for shape, lo in self._shape_lo.items():
                del self._by_shape[shape][:lo]
            self._shape_lo.clear()

    @property
    def jobs(self) -> list[PoolJob]:
        """The waiting jobs in key order."""
        if self._head or self._shape_lo:
            self._compact()
        return self._jobs

    @property
    def keys(self) -> list[tuple]:
        """Their keys, as inserted (the same order)."""
        if self._head or self._shape_lo:
            self._compact()
        return self._keys

    @property
    def by_shape(self) -> dict[tuple, list[tuple]]:
        """The keys of each shape's waiting jobs, in key order (shapes without any are absent)."""
        if self._head or self._shape_lo:
            self._compact()
        return self._by_shape

    def insert(self, job: PoolJob, shape: tuple) -> None:
        key = job.key
        self.n_jobs += 1
        all_keys = self._keys
        if len(all_keys) == self._head or not key < all_keys[-1]:  # bisect_right's answer (a new job: the last)
            all_keys.append(key)
            self._jobs.append(job)
        else:
            i = bisect.bisect_right(all_keys, key, self._head)
            all_keys.insert(i, key)
            self._jobs.insert(i, job)
        keys = self._by_shape.get(shape)
        if keys is None:
            self._by_shape[shape] = [key]
        elif not key < keys[-1]:  # (never empty)
            keys.append(key)
        else:
            bisect.insort_right(keys, key, self._shape_lo.get(shape, 0))

    def remove(self, job: PoolJob, shape: tuple) -> None:
        jobs, head = self._jobs, self._head
        if head < len(jobs) and jobs[head] is job:  # the first one (the usual case): bisect_left's answer
            i = head
        else:
            i = bisect.bisect_left(self._keys, job.key, head)
            if i >= len(jobs) or jobs[i] is not job:
                i = jobs.index(job, head)
        key = self._keys[i]  # the key it was inserted with
        self.n_jobs -= 1
        if i == head:  # the first one: counted off, cut later
            head += 1
            if head == len(jobs):
                jobs.clear()
                self._keys.clear()
                head = 0
            elif head >= 32 and 4 * head >= len(jobs):
                del jobs[:head]
                del self._keys[:head]
                head = 0
            self._head = head
        else:
            del self._keys[i]
            del jobs[i]
        keys = self._by_shape[shape]
        lo = self._shape_lo.get(shape, 0)
        j = lo if keys[lo] == key else bisect.bisect_left(keys, key, lo)  # lo: bisect_left's answer then
        if j == lo:
            lo += 1
            if lo == len(keys):
                del self._by_shape[shape]
                self._shape_lo.pop(shape, None)
            elif lo >= 32 and 4 * lo >= len(keys):
                del keys[:lo]
                self._shape_lo.pop(shape, None)
            else:
                self._shape_lo[shape] = lo
        else:
            del keys[j]

    def resort(self, shape_of) -> None:
        """Sort again after the jobs' keys changed (``shape_of(job)``: its shape)."""
        self._compact()
        self._jobs.sort(key=lambda j: j.key)
        self._keys[:] = [j.key for j in self._jobs]
        self._by_shape = {}
        for job in self._jobs:  # in key order: every shape's list comes out sorted
            self._by_shape.setdefault(shape_of(job), []).append(job.key)

    def next_live(self, i: int, dead) -> int:
        """Index of the first job after ``i`` whose shape is not ``dead(shape)`` (``len(jobs)`` if none)."""
        head = self._head
        return self._next_live(i + head, dead) - head

    def _next_live(self, i: int, dead) -> int:
        """:meth:`next_live` for an index ``i`` into the underlying list (offset ``_head``), the same way."""
        after = self._keys[i]
        best = None
        shape_lo = self._shape_lo
        for shape, keys in self._by_shape.items():
            if dead(shape):
                continue
            j = bisect.bisect_right(keys, after, shape_lo.get(shape, 0))
            if j < len(keys) and (best is None or keys[j] < best):
                best = keys[j]
        return len(self._jobs) if best is None else bisect.bisect_left(self._keys, best, self._head)

    def __len__(self) -> int:
        return self.n_jobs


@dataclass
class Reservation:
    job: PoolJob
    mask: np.ndarray  # (n_nodes,) bool, reserved nodes
    since: float


def fails_like(memo: dict[int, int] | None, g: int, n: int) -> bool:
    """A shape of ``n`` pods of ``g`` GPUs fails as one already failed: ``memo`` ({GPUs per pod: fewest pods
    that failed}, None or empty: nothing failed) holds a shape no bigger in both."""
    if memo:
        for g2, n2 in memo.items():  # a loop, not any() over a generator: called millions of times per trace
            if g2 <= g and n2 <= n:
                return True
    return False
