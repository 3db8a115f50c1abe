"""GPU use per gpupool Queue and the limit check (:class:`QueueBook`), built from the Queue objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpupool.k8s import QUEUE_API
from gpupool.k8s.objects.fields import RequestParseError, object_key
from gpupool.k8s.objects.pods import QueueSpec, parse_queue
from gpupool.model import MILLI


# ------------------------------------------------------------------ queues (seam for the pool layer)
class QueueBook:
    """GPU use per gpupool Queue (milli-GPU, a queue's use includes its children's), the limit check and, in pool
    mode, the quota check of non-preemptible pods.

    The pool layer's quota / fair-share logic can replace :meth:`admit`; the planner only asks it
    whether a unit of pods may start, and tells it with :meth:`charge` what started.
    ``nonpreemptible_priority``: pods at or above this priority are non-preemptible (the pool's
    ``nonPreemptiblePriority``): they start only while the non-preemptible pods of every queue on their path
    that has a quota (above 0) hold no more than it, counted as what each pod holds (milli-GPU x devices, a
    memory-sized share as its fraction of the card); None (the placement-only scheduler): no such check.
    """

    def __init__(self, specs: Mapping[str, QueueSpec], errors: Mapping[str, str] | None = None,
                 known: bool = True, blocked: str = "", nonpreemptible_priority: int | None = None) -> None:
        self.specs = dict(specs)
        self.errors = dict(errors or {})
        self.known = known  # False: no Queue CRD; queue names are not checked and nothing is limited
        self.blocked = blocked  # why Queues cannot be read (403): pods of a queue wait, no limit is skipped
        self.nonpreemptible_priority = nonpreemptible_priority
        self.used: dict[str, int] = {}
        self.np_used: dict[str, int] = {}  # milli-GPU of non-preemptible pods, children included

    def nonpreemptible(self, priority: int) -> bool:
        """Is a pod of ``priority`` non-preemptible here (held to quota)?"""
        return self.nonpreemptible_priority is not None and priority >= self.nonpreemptible_priority

    def chain(self, queue: str) -> list[str]:
        out, seen = [], set()
        q: str | None = queue
        while q and q not in seen and q in self.specs:
            seen.add(q)
            out.append(q)
            q = self.specs[q].parent or None
        return out

    def charge(self, queue: str | None, milli: int, nonpreemptible: int = 0) -> None:
        """Charge ``milli`` milli-GPU to ``queue`` and its parents, ``nonpreemptible`` of them held by
        non-preemptible pods."""
        if queue:
            for q in self.chain(queue) or [queue]:
                self.used[q] = self.used.get(q, 0) + milli
                if nonpreemptible:
                    self.np_used[q] = self.np_used.get(q, 0) + nonpreemptible

    def admit(self, demands: Mapping[str, int], nonpreemptible: Mapping[str, int] | None = None) -> str:
        """Why ``demands`` ({queue: milli}) would break a queue's (or a parent's) limit, or their
        ``nonpreemptible`` part ({queue: milli} of non-preemptible pods) a quota; "" if they fit."""
        if self.blocked and demands:
            return (f"queue {next(iter(demands))}: Queue objects cannot be read ({self.blocked}); pods of a queue "
                    "wait until they can, so that no limit is skipped")
        if not self.known:
            return ""
        extra: dict[str, int] = {}
        np_extra: dict[str, int] = {}
        for queue, milli in demands.items():
            if queue in self.errors:
                return f"queue {queue}: {self.errors[queue]}"
            if queue not in self.specs:
                return f"queue {queue} not found (no Queue {queue} in group {QUEUE_API[0]})"
            np_milli = (nonpreemptible or {}).get(queue, 0)
            for q in self.chain(queue):
                extra[q] = extra.get(q, 0) + milli
                if np_milli:
                    np_extra[q] = np_extra.get(q, 0) + np_milli
        for q, milli in extra.items():
            limit = self.specs[q].limit_milli
            if limit is not None and self.used.get(q, 0) + milli > limit:
                return (f"queue {q} would exceed its limit: {gpus(self.used.get(q, 0))} of {gpus(limit)} GPU "
                        f"in use, {gpus(milli)} more asked")
        for q, milli in np_extra.items():
            quota = self.specs[q].quota_milli
            if quota > 0 and self.np_used.get(q, 0) + milli > quota:
                return (f"non-preemptible pods (priority {self.nonpreemptible_priority} or above, the pool's "
                        f"nonPreemptiblePriority) run only within quota: queue {q} holds "
                        f"{gpus(self.np_used.get(q, 0))} of its quota {gpus(quota)} GPU in non-preemptible pods, "
                        f"{gpus(milli)} more asked")
        return ""


def gpus(milli: int) -> str:
    return f"{milli / MILLI:g}"


def queue_book(queues: Sequence[Mapping[str, Any]] | None) -> QueueBook:
    if queues is None:
        return QueueBook({}, known=False)
    specs: dict[str, QueueSpec] = {}
    errors: dict[str, str] = {}
    for obj in queues:
        name = str(object_key(obj).split("/", 1)[1])
        try:
            specs[name] = parse_queue(obj)
        except RequestParseError as exc:
            errors[name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - one unreadable Queue never stops the cycle
            errors[name] = f"Queue {name}: invalid object: {type(exc).__name__}: {exc}"
    return QueueBook(specs, errors)
