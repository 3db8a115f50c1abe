"""Writes a :class:`~gpupool.k8s.objects.agent_report.NodeReport` onto the agent's own Node, and only what changed.

* **Labels**: the agent owns the keys listed in the Node's :data:`~gpupool.k8s.objects.agent_report.ANN_OWNED_LABELS`
  annotation (comma-separated). It sets and updates those, and removes an owned key the report no longer has.
  Only keys under ``nvidia.com/`` and ``gpupool.io/`` (:data:`AGENT_PREFIXES`) are ever set or removed: a key
  with another prefix in the annotation (corrupted, or edited by hand) is not the agent's and is left alone
  (and dropped from the annotation); a report label with another prefix is dropped as invalid.
  A key the report has that is already on the Node but *not* owned (GPU Feature Discovery set it, or a person)
  is left as it is, value included, and not claimed: the agent never duplicates or overrides another owner.
* **Annotations**: :data:`~gpupool.k8s.objects.agent_report.ANN_GPU_INVENTORY`
  (:func:`~gpupool.k8s.objects.agent_report.inventory_json`,
  compact with sorted keys; an inventory that differs from the Node's only in its top-level ``time`` is not
  written, so ``time`` says when the inventory last changed), the owned-labels list and
  :data:`~gpupool.k8s.objects.agent_report.ANN_POD_DEVICES` (the kubelet's pod -> GPU map, written the same way;
  removed when the report has none, so that a map never outlives the socket it came from).
  Both go in one JSON merge patch on ``/api/v1/nodes/NAME`` with ``metadata.resourceVersion`` as a
  precondition: when someone else wrote the Node since it was read, the server answers 409 and the patch is
  computed again from a fresh read (a GFD label that appeared in between is then respected).
* **Conditions** (``GpuHealthy``, ``GpuStackReady``): a strategic merge patch of ``status.conditions`` on the
  ``nodes/NAME/status`` subresource (NodeCondition lists merge by ``type``: the kubelet's own conditions are
  untouched). A condition is written when its status, reason or message changed, or when its
  ``lastHeartbeatTime`` is older than ``heartbeat_s``; ``lastTransitionTime`` is kept while the status is
  unchanged (:meth:`~gpupool.k8s.objects.agent_report.Condition.to_api`).

Errors: 409, 429, 5xx answers and transport errors (refused, reset, timeout) are retried with exponential
backoff and jitter (``retries`` attempts in all; urllib3 also retries connection errors underneath, see
:func:`gpupool.k8s.api.wire.configure`); 403 / 404 / 422 are not retried. :meth:`NodePublisher.publish` never
raises: a failed publish is logged, counted in :attr:`NodePublisher.failures` and returns False, and the
agent loop tries again next round. A refused metadata patch (403 from an admission policy, 422 for an
annotation too large) does not hold back the conditions: the status patch is still sent (the publish counts
as a failure, :attr:`NodePublisher.last_error` says why).
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpupool.k8s.api import wire
from gpupool.k8s.objects.agent_report import (
    ANN_GPU_INVENTORY,
    ANN_OWNED_LABELS,
    ANN_POD_DEVICES,
    NodeReport,
    inventory_json,
)

__all__ = ["AGENT_PREFIXES", "NodePublisher", "Plan", "agent_label", "plan_patches", "rfc3339", "valid_label"]

log = logging.getLogger("gpupool.agent.publisher")

NODE_PATH = "/api/v1/nodes/{name}"
STATUS_PATH = "/api/v1/nodes/{name}/status"
RUNTIME_CLASSES_PATH = "/apis/node.k8s.io/v1/runtimeclasses"
RETRY_STATUS = frozenset({409, 429, 500, 502, 503, 504})

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_NAME})?$")


def rfc3339(t: float) -> str:
    """``2026-11-30T22:53:20Z`` for ``t`` seconds since the epoch (second precision, as NodeCondition keeps)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def valid_label(key: str, value: str) -> bool:
    """True when the API server would accept ``key: value`` as a label (prefix <= 253 chars, name and value
    <= 63 chars of ``[A-Za-z0-9-_.]`` starting and ending alphanumeric; an empty value is allowed)."""
    prefix, _, _ = key.rpartition("/")
    return (len(prefix) <= 253 and bool(_LABEL_KEY.match(key)) and isinstance(value, str)
            and bool(_LABEL_VALUE.match(value)))


@dataclass
class Plan:
    """What a publish would write: a merge patch of the Node's metadata and a strategic merge patch of its
    status (None each when nothing there changed); ``skipped``: report labels left alone because another
    owner has them on the Node (key -> that owner's value); ``invalid``: labels dropped as unacceptable."""

    metadata: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.metadata is None and self.status is None


AGENT_PREFIXES = ("nvidia.com", "gpupool.io")
"""The only label prefixes the agent ever sets or removes (GFD's ``nvidia.com/`` labels and its own)."""


def agent_label(key: str) -> bool:
    """True for a label key under one of :data:`AGENT_PREFIXES` (``nvidia.com/gpu.product``), the only keys
    the agent may set or remove."""
    prefix, slash, _ = key.partition("/")
    return bool(slash) and prefix in AGENT_PREFIXES


def owned_labels(annotations: Mapping[str, str] | None) -> set[str]:
    """The label keys the agent set, from the :data:`ANN_OWNED_LABELS` annotation (empty when absent). A key
    outside :data:`AGENT_PREFIXES` (a corrupted or edited annotation naming ``kubernetes.io/hostname``) is
    never the agent's: left out."""
    raw = (annotations or {}).get(ANN_OWNED_LABELS) or ""
    if not isinstance(raw, str):
        return set()
    return {k.strip() for k in raw.split(",") if k.strip() and agent_label(k.strip())}


def plan_patches(node: Mapping[str, Any], report: NodeReport, now: float, heartbeat_s: float = 300.0) -> Plan:
    """The patches that bring ``node`` (a Node as read, a dict) to ``report`` at ``now`` (epoch seconds).

    Pure: reads nothing, writes nothing. See the module docstring for the ownership rules.
    """
    meta = node.get("metadata") or {}
    labels: dict[str, str] = dict(meta.get("labels") or {})
    annotations: dict[str, str] = dict(meta.get("annotations") or {})
    owned = owned_labels(annotations)
    plan = Plan()

    label_patch: dict[str, str | None] = {}
    owned_after: set[str] = set()
    for key, value in report.labels.items():
        value = str(value)
        if not valid_label(key, value) or not agent_label(key):
            plan.invalid[key] = value
            continue
        if key in labels and key not in owned:
            plan.skipped[key] = labels[key]  # GFD's (or a person's): never touched, never claimed
            continue
        owned_after.add(key)
        if labels.get(key) != value:
            label_patch[key] = value
    for key in sorted(owned - owned_after):
        if key in labels:
            label_patch[key] = None  # ours, and the report no longer has it: remove

    ann_patch: dict[str, str | None] = {}
    owned_text = ",".join(sorted(owned_after))
    if owned_text != (annotations.get(ANN_OWNED_LABELS) or ""):
        ann_patch[ANN_OWNED_LABELS] = owned_text or None
    if report.inventory:
        inv = inventory_json(report.inventory)
        if annotations.get(ANN_GPU_INVENTORY) != inv and _without_time(report.inventory) != _without_time(
                _loads(annotations.get(ANN_GPU_INVENTORY))):
            ann_patch[ANN_GPU_INVENTORY] = inv
    if report.pod_devices is not None:
        text = inventory_json(report.pod_devices)
        if annotations.get(ANN_POD_DEVICES) != text and _without_time(report.pod_devices) != _without_time(
                _loads(annotations.get(ANN_POD_DEVICES))):
            ann_patch[ANN_POD_DEVICES] = text
    elif ANN_POD_DEVICES in annotations:
        ann_patch[ANN_POD_DEVICES] = None  # no map now (socket gone): a stale one must not stay

    if label_patch or ann_patch:
        md: dict[str, Any] = {"resourceVersion": meta.get("resourceVersion")}
        if md["resourceVersion"] is None:
            del md["resourceVersion"]
        if label_patch:
            md["labels"] = label_patch
        if ann_patch:
            md["annotations"] = ann_patch
        plan.metadata = {"metadata": md}

    current = {c.get("type"): c for c in ((node.get("status") or {}).get("conditions") or [])}
    stamp = rfc3339(now)
    changed = []
    for cond in report.conditions:
        prev = current.get(cond.type)
        if prev is not None and (prev.get("status"), prev.get("reason"), prev.get("message")) == (
                cond.status, cond.reason, cond.message):
            beat = _parse_time(prev.get("lastHeartbeatTime"))
            if beat is not None and now - beat < heartbeat_s:
                continue
        changed.append(cond.to_api(stamp, prev))
    if changed:
        plan.status = {"status": {"conditions": changed}}
    return plan


def _loads(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _without_time(inventory: Any) -> Any:
    """The inventory without its top-level ``time`` (when it was built): a new time alone is no change."""
    return {k: v for k, v in inventory.items() if k != "time"} if isinstance(inventory, dict) else inventory


class NodePublisher:
    """Publishes :class:`NodeReport` objects on Node ``node_name`` through ``api_client`` (the official
    ``kubernetes.client.ApiClient``; requests go through :func:`gpupool.k8s.api.wire.call`).

    ``retries``: attempts per publish (>= 1); ``backoff_s`` / ``max_backoff_s``: the first wait and the cap
    (seconds; doubled each attempt, +-50 % jitter); ``heartbeat_s``: rewrite an unchanged condition this
    often (seconds) so that a stale agent shows; ``timeout_s``: per request (seconds); ``sleep`` / ``clock``:
    injectable for tests (``clock()`` returns epoch seconds).
    """

    def __init__(self, api_client: Any, node_name: str, *, retries: int = 5, backoff_s: float = 0.2,
                 max_backoff_s: float = 5.0, heartbeat_s: float = 300.0, timeout_s: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time) -> None:
        if not node_name:
            raise ValueError("node name is empty (set --node-name or $NODE_NAME)")
        self.api = api_client
        self.node_name = node_name
        self.retries = max(1, int(retries))
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.heartbeat_s = heartbeat_s
        self.timeout_s = timeout_s
        self.sleep, self.clock = sleep, clock
        self.node: dict[str, Any] | None = None  # the Node as last read or written
        self.writes = 0  # successful PATCH requests
        self.failures = 0  # publishes that gave up
        self.last_error: str = ""
        self.last_plan: Plan | None = None
        self._warned_skips: set[str] = set()

    # ------------------------------------------------------------------ reads
    def read_node(self) -> dict[str, Any]:
        """GET the Node (one request, no retry); caches it in :attr:`node`. Raises ApiException / transport
        errors."""
        raw = wire.call(self.api, "GET", NODE_PATH, path_params={"name": self.node_name}, timeout=self.timeout_s)
        self.node = json.loads(raw)
        return self.node

    def refresh(self) -> dict[str, Any] | None:
        """The Node read now, with retries; None (logged) when it cannot be read. Never raises."""
        result = self._with_retries("read", self.read_node)
        return result if isinstance(result, dict) else None

    def allocatable(self, node: Mapping[str, Any] | None = None) -> dict[str, str]:
        """``status.allocatable`` of ``node`` (default: the Node as last read); empty when unknown."""
        node = node if node is not None else self.node
        return dict(((node or {}).get("status") or {}).get("allocatable") or {})

    def runtime_classes(self) -> list[dict[str, Any]] | None:
        """The cluster's RuntimeClasses (``node.k8s.io/v1`` objects as dicts: ``metadata.name``, ``handler``; the
        stack check looks for handler ``nvidia``); None when they cannot be listed (logged)."""
        def read() -> list[dict[str, Any]]:
            raw = wire.call(self.api, "GET", RUNTIME_CLASSES_PATH, timeout=self.timeout_s)
            return list(json.loads(raw).get("items") or [])

        return self._with_retries("list runtimeclasses", read)

    # ------------------------------------------------------------------ writes
    def publish(self, report: NodeReport, node: Mapping[str, Any] | None = None) -> bool:
        """Write what differs between the Node and ``report``; True when something was written.

        ``node``: the Node as just read (saves the GET of the first attempt; :meth:`refresh`); after a 409
        the Node is read again. Never raises: errors are logged and give False.
        """
        first = [dict(node)] if node is not None else []
        refused: list[ApiException] = []  # the metadata patch of the last attempt, refused (403, 422...)

        def attempt() -> bool:
            refused.clear()
            current = first.pop() if first else self.read_node()
            plan = plan_patches(current, report, self.clock(), self.heartbeat_s)
            self.last_plan = plan
            self._note(plan)
            wrote = False
            if plan.metadata is not None:
                try:
                    raw = wire.call(self.api, "PATCH", NODE_PATH, plan.metadata, content_type=wire.MERGE_PATCH,
                                    path_params={"name": self.node_name}, timeout=self.timeout_s)
                except ApiException as exc:
                    if exc.status in RETRY_STATUS or exc.status == 404:
                        raise
                    refused.append(exc)  # the conditions still go out (GpuHealthy must reach the Node)
                else:
                    self.node = json.loads(raw)
                    self.writes += 1
                    wrote = True
            if plan.status is not None:
                raw = wire.call(self.api, "PATCH", STATUS_PATH, plan.status, content_type=wire.STRATEGIC_PATCH,
                                path_params={"name": self.node_name}, timeout=self.timeout_s)
                self.node = json.loads(raw)
                self.writes += 1
                wrote = True
            return wrote

        result = self._with_retries("publish", attempt)
        if result is not None and refused:
            exc = refused[0]
            self.failures += 1
            self.last_error = f"{exc.status} {exc.reason}: {_message(exc)}"
            log.warning("node %s: metadata patch (labels, inventory) refused: %s; the conditions were still "
                        "published", self.node_name, self.last_error)
        return bool(result) if result is not None else False

    # ------------------------------------------------------------------ helpers
    def _note(self, plan: Plan) -> None:
        for key, value in plan.invalid.items():
            if key not in self._warned_skips:
                self._warned_skips.add(key)
                log.warning("label dropped: not a valid label: %s=%r", key, value)
        for key, value in plan.skipped.items():
            if key not in self._warned_skips:
                self._warned_skips.add(key)
                log.info("label %s left to its owner (value %r on the node; not in %s)", key, value,
                         ANN_OWNED_LABELS)

    def _with_retries(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` with exponential backoff on retryable errors; None when it gave up (logged)."""
        delay = self.backoff_s
        for attempt in range(1, self.retries + 1):
            try:
                result = fn()
                self.last_error = ""
                return result
            except ApiException as exc:
                retry = exc.status in RETRY_STATUS
                self.last_error = f"{exc.status} {exc.reason}: {_message(exc)}"
            except Exception as exc:  # transport (urllib3 / OSError) or a bad answer: retried, never raised
                retry = True
                self.last_error = f"{type(exc).__name__}: {exc}"
            if not retry or attempt == self.retries:
                break
            log.debug("node %s: %s failed (attempt %d/%d): %s", self.node_name, what, attempt, self.retries,
                      self.last_error)
            self.sleep(min(self.max_backoff_s, delay) * random.uniform(0.5, 1.5))  # noqa: S311 - jitter
            delay *= 2
        self.failures += 1
        log.warning("node %s: %s failed: %s", self.node_name, what, self.last_error)
        return None


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.body)
    except (TypeError, ValueError):
        return str(exc.body)
