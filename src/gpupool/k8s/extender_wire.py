"""The kube-scheduler extender's wire format (``k8s.io/kube-scheduler/extender/v1``): fields read as Go's
encoding/json decodes them, the candidate nodes of ``ExtenderArgs``, ``ExtenderBindingArgs``, and scores onto the
extender's 0..10 range. Imports nothing of gpupool."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

MAX_EXTENDER_PRIORITY = 10
"""``extenderv1.MaxExtenderPriority``: extender scores run 0..10."""


def field_of(obj: Mapping[str, Any] | None, name: str) -> Any:
    """``obj[name]`` matched case-insensitively, as Go's encoding/json decodes struct fields."""
    if not obj:
        return None
    if name in obj:
        return obj[name]
    lower = name.lower()
    for key, value in obj.items():
        if key.lower() == lower:
            return value
    return None


def candidate_nodes(args: Mapping[str, Any]) -> tuple[list[str], list[dict] | None]:
    """(node names, the Node objects when the request carried a NodeList). Raises ValueError naming the field
    when ``Nodes`` / ``NodeNames`` is not what kube-scheduler sends."""
    node_list = field_of(args, "Nodes")
    if node_list:
        items = field_of(node_list, "items") if isinstance(node_list, Mapping) else None
        if isinstance(node_list, Mapping) and items is None:  # Go's encoding of an empty list: no nodes
            items = []
        if not isinstance(items, list) or not all(isinstance(n, Mapping) for n in items):
            raise ValueError(f"ExtenderArgs.Nodes: expected a NodeList {{items: [Node, ...]}}, got "
                             f"{str(node_list)[:80]!r}")
        names = [(n.get("metadata") if isinstance(n.get("metadata"), Mapping) else {}).get("name", "") for n in items]
        return [str(n) for n in names], items
    raw = field_of(args, "NodeNames") or []
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise ValueError(f"ExtenderArgs.NodeNames: expected a list of node names, got {str(raw)[:80]!r}")
    return list(raw), None


def scale_scores(scores: np.ndarray) -> np.ndarray:
    """Scores onto 0..MAX_EXTENDER_PRIORITY (best = 10); all equal -> all 10."""
    scores = np.asarray(scores, dtype=np.float64)
    finite = np.isfinite(scores)
    if not finite.any():
        return np.full(len(scores), float(MAX_EXTENDER_PRIORITY))
    lo, hi = float(scores[finite].min()), float(scores[finite].max())
    # +inf ranks above every finite score, -inf and NaN below: one step beyond the finite range.
    step = max(hi - lo, 1.0)
    scores = np.where(finite, scores, np.where(scores > 0, hi + step, lo - step))
    lo, hi = float(scores.min()), float(scores.max())
    if hi - lo < 1e-12:
        return np.full(len(scores), float(MAX_EXTENDER_PRIORITY))
    return (scores - lo) / (hi - lo) * MAX_EXTENDER_PRIORITY


def binding_args(args: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(PodName, PodNamespace, PodUID, Node) of ``ExtenderBindingArgs``; ValueError naming a field that is missing
    or not a string."""
    values = []
    for field, required in (("PodName", True), ("PodNamespace", False), ("PodUID", False), ("Node", True)):
        value = field_of(args, field)
        if value is None or value == "":
            if required:
                raise ValueError(f"ExtenderBindingArgs.{field}: required")
            value = "default" if field == "PodNamespace" else ""
        if not isinstance(value, str):
            raise ValueError(f"ExtenderBindingArgs.{field}: expected a string, got {str(value)[:80]!r}")
        values.append(value)
    return values[0], values[1], values[2], values[3]
