"""Input files read the same way everywhere: one-line YAML errors, and unknown keys refused with "did you mean".

Every loader of a user's YAML (or JSON) file goes through this module:

* :func:`load_yaml` parses the text; a syntax error is one line ``FILE:LINE:COLUMN: invalid YAML: what`` (not
  PyYAML's multi-line dump with the offending text and a caret);
* :func:`unknown_keys` checks the parsed document against a pydantic *key schema* (models with
  ``extra="forbid"``, as the cluster file's and the queue file's): a key the schema does not know is refused
  with the file, the key's line and column, and the closest known key (``did you mean 'maxReplicas'?``).
  Only unknown keys are reported here; the values are checked by the loader, which knows their units;
* :func:`known_keys` and :func:`did_you_mean` serve loaders that report pydantic errors their own way
  (:mod:`gpupool.clusterspec`, :mod:`gpupool.engine.pool.queues`);
* :func:`out_of_range` words the error of a numeric command-line option outside its bounds, the same way in
  every command (``--ratio must be within (0, 10] ..., got 1e+09``).

Lines and columns are 1-based, as editors count them.
"""

from __future__ import annotations

import difflib
import math
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from gpupool.model import GpupoolError

__all__ = [
    "InputFileError",
    "did_you_mean",
    "key_position",
    "known_keys",
    "load_yaml",
    "out_of_range",
    "unknown_keys",
    "yaml_error_message",
    "yaml_root",
]

Loc = Sequence[str | int]


class InputFileError(GpupoolError, ValueError):
    """An input file that cannot be used; the message is one line starting with the file (and line:column)."""


def yaml_error_message(exc: yaml.YAMLError, source: str) -> str:
    """``FILE:LINE:COLUMN: invalid YAML: what`` for a PyYAML error (``FILE: invalid YAML: what`` when PyYAML gives
    no position); a block-structure error (a bad indent) says so."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or ""
    context = getattr(exc, "context", None) or ""
    what = problem if problem else (str(exc).splitlines() or [type(exc).__name__])[0]
    if context and problem:
        what = f"{problem} ({context})"
    what = " ".join(what.split())
    if "<block" in problem:  # PyYAML's words for a line indented unlike its siblings
        what += "; check the indentation of this line against the lines above"
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    return f"{where}: invalid YAML: {what}"


def load_yaml(text: str, source: str, error: type[Exception] = InputFileError) -> Any:
    """The document in ``text`` (``yaml.safe_load``).

    Raises:
        error (default :class:`InputFileError`): a YAML syntax error, as one line
            ``FILE:LINE:COLUMN: invalid YAML: what`` (:func:`yaml_error_message`); ``source`` names the file.
    """
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(yaml_error_message(exc, source)) from None
    except RecursionError:
        raise error(f"{source}: invalid YAML: nested too deeply") from None


def yaml_root(text: str | None) -> yaml.Node | None:
    """The composed node tree of ``text`` (for positions), or None when it cannot be composed."""
    if text is None:
        return None
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return None


def key_position(root: yaml.Node | None, loc: Loc) -> tuple[int, int] | None:
    """1-based (line, column) of the last key (or item) of ``loc`` in the node tree, or of its deepest
    ancestor that exists; None without a tree."""
    if root is None:
        return None
    node: yaml.Node = root
    pos = (root.start_mark.line + 1, root.start_mark.column + 1)
    for part in loc:
        nxt: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    nxt, pos = value, (key.start_mark.line + 1, key.start_mark.column + 1)
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            nxt = node.value[part]
            pos = (nxt.start_mark.line + 1, nxt.start_mark.column + 1)
        if nxt is None:
            break
        node = nxt
    return pos


def did_you_mean(word: str, choices: Iterable[str], *, known: bool = True) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices`` (difflib), else ``" (known: a, b, ...)"`` (nothing
    with ``known=False``, when the message lists the choices already)."""
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f" (known: {', '.join(choices)})" if choices and known else ""


def _members(annotation: Any) -> tuple[Any, ...]:
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return tuple(m for a in get_args(annotation) for m in _members(a))
    return (annotation,)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    for member in _members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
        if get_origin(member) in (list, tuple, Sequence):
            found = _model_in(get_args(member)[0]) if get_args(member) else None
            if found is not None:
                return found
    return None


def _dict_value(annotation: Any) -> Any:
    for member in _members(annotation):
        if get_origin(member) in (dict, Mapping) and len(get_args(member)) == 2:
            return get_args(member)[1]
    return None


def known_keys(schema: type[BaseModel], loc: Loc) -> list[str]:
    """The keys the schema allows in the mapping at ``loc`` (list indices and the keys of free-form mappings,
    such as policy names, are stepped over); [] when ``loc`` leads out of the schema."""
    annotation: Any = schema
    for part in loc:
        if isinstance(part, int):
            continue
        model = _model_in(annotation)
        field = None
        if model is not None:
            field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is not None:
            annotation = field.annotation
        elif _dict_value(annotation) is not None:
            annotation = _dict_value(annotation)
        else:
            return []
    model = _model_in(annotation)
    return [f.alias or n for n, f in model.model_fields.items()] if model is not None else []


def _path(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def unknown_keys(data: Any, schema: type[BaseModel], source: str, text: str | None = None,
                 error: type[Exception] = InputFileError) -> None:
    """Refuse the keys of ``data`` that the key schema ``schema`` does not know.

    ``schema`` is a pydantic model with ``extra="forbid"`` at every level; only its ``extra_forbidden`` errors
    count (values of the wrong type are left to the loader, which names their units). ``text`` (the file's
    YAML or JSON) gives the key's line and column.

    Raises:
        error (default :class:`InputFileError`): one line, ``FILE:LINE:COLUMN: unknown field 'key' in path;
            did you mean 'other'?`` (and how many more unknown fields there are).
    """
    if not isinstance(data, Mapping):
        return
    try:
        schema.model_validate(data)
    except ValidationError as exc:
        unknown = [tuple(e["loc"]) for e in exc.errors(include_url=False) if e["type"] == "extra_forbidden"]
        if not unknown:
            return
        loc = unknown[0]
        pos = key_position(yaml_root(text), loc)
        where = f"{source}:{pos[0]}:{pos[1]}" if pos is not None else source
        more = f" ({len(unknown) - 1} more unknown field{'s' if len(unknown) > 2 else ''})" if len(unknown) > 1 else ""
        at = f" in {_path(loc[:-1])}" if len(loc) > 1 else " at the top level"
        raise error(f"{where}: unknown field {str(loc[-1])!r}{at}"
                    f"{did_you_mean(str(loc[-1]), known_keys(schema, loc[:-1]))}{more}") from None


def out_of_range(option: str, value: float | None, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, what: str = "") -> str | None:
    """The error for ``value`` of ``option`` when it is NaN, infinite or outside ``[low, high]`` (``(low, high]``
    with ``low_open``; None: no bound on that side), else None (also for a value not given, None).

    The message is one line naming the option, the range (with ``what``, e.g. the unit) and the value:
    ``--ratio must be within (0, 10] (a multiple of the cluster's GPU capacity), got 1e+09``.
    """
    if value is None:
        return None
    ok = (math.isfinite(value) and (low is None or (value > low if low_open else value >= low))
          and (high is None or value <= high))
    if ok:
        return None
    if low is not None and high is not None:
        bounds = f"within {'(' if low_open else '['}{low:g}, {high:g}]"
    elif low is not None:
        bounds = f"{'>' if low_open else '>='} {low:g}"
    else:
        bounds = f"<= {high:g}" if high is not None else "finite"  # no bound: only NaN and infinities are refused
    finite = "" if math.isfinite(value) or bounds == "finite" else "a finite number "
    return f"{option} must be {finite}{bounds}{f' ({what})' if what else ''}, got {value:g}"
