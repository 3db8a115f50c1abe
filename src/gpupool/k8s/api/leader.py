"""Leader election on a ``coordination.k8s.io/v1`` Lease, so that only one scheduler replica binds pods.

Same protocol as client-go's ``leaderelection`` package (and so interoperable with it):

* a candidate reads the Lease; if it does not exist it creates it holding it;
* if another holder's record has not changed for ``lease_duration`` seconds *as seen on the local
  clock* (no trust in other machines' clocks), or the holder is empty (released), it takes the Lease
  over with a replace (PUT) that carries the ``resourceVersion`` it read: when two candidates race,
  the API server accepts one write and answers ``409 Conflict`` to the other;
* the leader renews ``renewTime`` every ``retry_period``; when it has not managed to renew for
  ``renew_deadline`` seconds it steps down (``on_stopped_leading``) before anybody else may take over,
  since ``renew_deadline < lease_duration``;
* on a clean stop the leader releases the Lease (empty holder, ``leaseDurationSeconds: 1``), so a
  standby takes over at its next retry instead of waiting out the lease.

The official Python client's ``kubernetes.leaderelection`` cannot be stopped, never releases and runs
its work in an unsupervised thread, hence this implementation on ``CoordinationV1Api``.

Callbacks run on the elector's thread and must return promptly (signal the scheduling loop, e.g. set
an event); a callback that raises is logged.

Every response is read to the end, so the elector reuses one connection; an outage of the API server is
logged once when it starts and once when it ends (with the number of failed rounds), not every round.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.k8s.api.wire import Outage, drain

log = logging.getLogger("gpupool.k8s.leader")


def _log(level: int, event: str, exc_info: bool = False, **fields: Any) -> None:
    """One structured log line: the event as the message, the fields as ``extra``."""
    if log.isEnabledFor(level):
        log.log(level, event, extra={"event": event, **fields}, exc_info=exc_info)

Callback = Callable[[], None]


def _micro_time(t: dt.datetime | str) -> str:
    """A ``metav1.MicroTime`` string: RFC 3339 in UTC with six fraction digits.

    The client (pydantic models since v31) re-serialises times with ``isoformat()``, which drops the
    fraction when it is zero, and the API server's MicroTime parser then rejects the value; a time on an
    exact second is therefore moved by one microsecond.
    """
    if isinstance(t, str):
        t = dt.datetime.fromisoformat(t)
    t = t.astimezone(dt.UTC)
    if t.microsecond == 0:
        t += dt.timedelta(microseconds=1)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What the Lease's ``spec`` says, plus its ``resourceVersion``."""

    holder: str
    lease_duration_seconds: int
    acquire_time: str
    renew_time: str
    transitions: int
    resource_version: str

    @classmethod
    def from_lease(cls, obj: dict) -> LeaseRecord:
        spec = obj.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime") or "",
            renew_time=spec.get("renewTime") or "",
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""),
        )

    def same_as(self, other: LeaseRecord | None) -> bool:
        return other is not None and (self.holder, self.renew_time, self.acquire_time, self.transitions) == (
            other.holder, other.renew_time, other.acquire_time, other.transitions)


class LeaderElector:
    """Contends for the Lease ``namespace/name`` as ``identity``.

    ``api``: a ``CoordinationV1Api`` or an ``ApiClient`` (default: a new client from the loaded
    kube config). Times in seconds; constraints as in client-go:
    ``lease_duration > renew_deadline > retry_period > 0``.

    Use :meth:`start` (background thread) or :meth:`run` (blocks), then :meth:`stop`. The elector keeps
    contending after losing the lead; a process that prefers to exit then does so in
    ``on_stopped_leading``.
    """

    def __init__(
        self,
        api: client.CoordinationV1Api | client.ApiClient | None = None,
        *,
        name: str = "gpupool-scheduler",
        namespace: str = "gpupool-system",
        identity: str | None = None,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started_leading: Callback | None = None,
        on_stopped_leading: Callback | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        release_on_stop: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (lease_duration > renew_deadline > retry_period > 0):
            raise ValueError(
                f"need lease_duration > renew_deadline > retry_period > 0, got "
                f"{lease_duration}, {renew_deadline}, {retry_period}"
            )
        if isinstance(api, client.CoordinationV1Api):
            self.api = api
        else:
            self.api = client.CoordinationV1Api(api)
        self.name = name
        self.namespace = namespace
        self.identity = identity or f"{socket.gethostname()}_{uuid.uuid4()}"
        self.lease_duration = float(lease_duration)
        self.renew_deadline = float(renew_deadline)
        self.retry_period = float(retry_period)
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.on_new_leader = on_new_leader
        self.release_on_stop = release_on_stop
        self.clock = clock
        self.observed: LeaseRecord | None = None
        self.observed_at = 0.0
        self._leading = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_leader = ""
        self._timeout = max(0.5, min(self.renew_deadline, 5.0))  # per API request
        self._last_renew = -math.inf
        self._outage = Outage(_log, "lease", lease=f"{self.namespace}/{self.name}", identity=self.identity)

    # ------------------------------------------------------------------ state
    @property
    def is_leader(self) -> bool:
        """True while this candidate holds the Lease *and* renewed it less than ``renew_deadline`` ago.

        The second half holds even while a renewal request hangs, so a replica cut off from the API server
        stops binding before the Lease can expire for the others (``renew_deadline < lease_duration``).
        """
        return self._leading.is_set() and self.clock() - self._last_renew < self.renew_deadline

    @property
    def leader(self) -> str:
        """The holder of the Lease as last observed ("" when none or unknown)."""
        return self.observed.holder if self.observed is not None else ""

    def wait_for_leadership(self, timeout: float | None = None) -> bool:
        return self._leading.wait(timeout)

    # ------------------------------------------------------------------ one round
    def _record_body(self, now: dt.datetime, acquire: str, transitions: int, rv: str | None,
                     holder: str | None = None, duration: int | None = None) -> dict:
        meta: dict = {"name": self.name, "namespace": self.namespace}
        if rv:
            meta["resourceVersion"] = rv
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity if holder is None else holder,
                "leaseDurationSeconds": duration or max(1, math.ceil(self.lease_duration)),
                "acquireTime": acquire,
                "renewTime": _micro_time(now),
                "leaseTransitions": transitions,
            },
        }

    def _get(self, timeout: float) -> dict | None:
        try:
            resp = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                  _request_timeout=timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(drain(resp))

    def _observe(self, record: LeaseRecord) -> None:
        if not record.same_as(self.observed):
            self.observed_at = self.clock()
        self.observed = record
        if record.holder and record.holder != self._last_leader:
            self._last_leader = record.holder
            if self.on_new_leader is not None:
                self._call(self.on_new_leader, record.holder)

    def try_acquire_or_renew(self, timeout: float | None = None) -> bool:
        """One attempt to take or keep the Lease; True when this candidate holds it afterwards.

        ``timeout``: seconds each API request may take (default: ``renew_deadline``, at most 5).
        """
        timeout = self._timeout if timeout is None else max(0.05, timeout)
        now_wall = dt.datetime.now(dt.UTC)
        try:
            current = self._get(timeout)
            if current is None:
                body = self._record_body(now_wall, _micro_time(now_wall), 0, None)
                created = self.api.create_namespaced_lease(self.namespace, body, _preload_content=False,
                                                           _request_timeout=timeout)
                self._observe(LeaseRecord.from_lease(json.loads(drain(created))))
                self._outage.success()
                return True
            record = LeaseRecord.from_lease(current)
            self._observe(record)
            self._outage.success()
            mine = record.holder == self.identity
            if record.holder and not mine and self.observed_at + self.lease_duration > self.clock():
                return False  # held by someone else and not expired
            if mine:
                acquire = _micro_time(record.acquire_time) if record.acquire_time else _micro_time(now_wall)
                transitions = record.transitions
            else:
                acquire, transitions = _micro_time(now_wall), record.transitions + 1
            body = self._record_body(now_wall, acquire, transitions, record.resource_version)
            replaced = self.api.replace_namespaced_lease(self.name, self.namespace, body, _preload_content=False,
                                                         _request_timeout=timeout)
            self._observe(LeaseRecord.from_lease(json.loads(drain(replaced))))
            return True
        except ApiException as exc:
            if exc.status == 409:
                _log(logging.DEBUG, "lease_race_lost", lease=self.name, identity=self.identity)
            else:
                self._outage.failure(status=exc.status, reason=exc.reason)
            return False
        except Exception as exc:  # network errors, timeouts, bad payloads: just a failed round
            self._outage.failure(error=type(exc).__name__, detail=str(exc)[:200])
            return False

    def release(self) -> bool:
        """Give the Lease up if this candidate holds it (empty holder, 1 s duration); True on success."""
        try:
            current = self._get(self._timeout)
            if current is None:
                return False
            record = LeaseRecord.from_lease(current)
            if record.holder != self.identity:
                return False
            now_wall = dt.datetime.now(dt.UTC)
            body = self._record_body(now_wall, _micro_time(now_wall), record.transitions, record.resource_version,
                                     holder="", duration=1)
            drain(self.api.replace_namespaced_lease(self.name, self.namespace, body, _preload_content=False,
                                                    _request_timeout=self._timeout))
            return True
        except Exception as exc:
            log.warning("lease release failed", extra={"lease": self.name, "error": repr(exc)})
            return False

    # ------------------------------------------------------------------ loop
    def _call(self, fn: Callable, *args) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("leader election callback failed")

    def _become_leader(self) -> None:
        self._leading.set()
        log.info("started leading", extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity})
        if self.on_started_leading is not None:
            self._call(self.on_started_leading)

    def _step_down(self, why: str) -> None:
        if not self._leading.is_set():
            return
        self._leading.clear()
        log.warning("stopped leading", extra={"lease": f"{self.namespace}/{self.name}",
                                              "identity": self.identity, "why": why})
        if self.on_stopped_leading is not None:
            self._call(self.on_stopped_leading)

    def run(self) -> None:
        """Contend (and lead) until :meth:`stop`."""
        while not self._stop.is_set():
            if not self._leading.is_set():
                started = self.clock()
                if self.try_acquire_or_renew():
                    self._last_renew = started
                    self._become_leader()
                    self._stop.wait(self.retry_period)
                else:
                    self._stop.wait(self.retry_period * random.uniform(1.0, 1.2))
                continue
            started = self.clock()
            # No request may outlast the renew deadline: a hung call must not keep a stale leader leading.
            left = self._last_renew + self.renew_deadline - started
            if left > 0 and self.try_acquire_or_renew(timeout=min(self._timeout, left)):
                self._last_renew = started
            elif self.observed is not None and self.observed.holder not in ("", self.identity):
                self._step_down(f"lease taken by {self.observed.holder}")
                continue
            elif self.clock() - self._last_renew >= self.renew_deadline:
                self._step_down(f"could not renew for {self.renew_deadline:g}s")
                continue
            self._stop.wait(self.retry_period)
        if self._leading.is_set():
            if self.release_on_stop and self.is_leader:
                self.release()
            self._step_down("stopped")

    def start(self) -> LeaderElector:
        """Run on a daemon thread; returns self."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self.run, name=f"gpupool-leader-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop contending; a leader releases the Lease (unless ``release_on_stop`` is False) and steps down."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else self._timeout * 3 + self.retry_period)
            self._thread = None


__all__ = ["LeaderElector", "LeaseRecord"]
