"""CEL selectors of DRA DeviceClasses and ResourceClaim requests, evaluated against :class:`Device` records.

The library is ``cel-expr-python`` (the CEL project's Python binding of cel-cpp, Apache-2.0): a real parser and
type checker whose error texts have cel-go's shape (``ERROR: <input>:1:4: Syntax error: ...``), optionals
(``.?name``, ``[?"key"]``, ``orValue``), ``cel.bind`` and the strings extension. Kubernetes' own types are
declared on top of it: ``kubernetes.Quantity`` (``quantity()``, ``isQuantity()``, ``sign``, ``isInteger``,
``asInteger``, ``asApproximateFloat``, ``add``, ``sub``, ``isLessThan``, ``isGreaterThan``, ``compareTo``) and
``kubernetes.Semver`` (``semver(s[, normalize])``, ``isSemver``, ``major``, ``minor``, ``patch`` and the three
comparisons), as ``k8s.io/apiserver/pkg/cel/library/{quantity,semverlib}.go`` define them. cel-cpp's Python
binding has no opaque types, so both are protobuf messages of a private descriptor pool with one canonical
field; equality (``==``) therefore compares values as Kubernetes' ``Equal`` does (``1Gi == 1024Mi``).

The environment, as ``k8s.io/dynamic-resource-allocation/cel/compile.go`` (v0.36) builds it:
``device.driver`` (string), ``device.attributes`` (map domain -> map name -> bool | int | string | Semver),
``device.capacity`` (map domain -> map name -> Quantity), ``device.allowMultipleAllocations`` (bool, false when
unset; declared while the DRAConsumableCapacity gate is on: beta and on by default since 1.36,
``pkg/features/kube_features.go``). List-valued attributes and ``includes()`` (DRAListTypeAttributes, alpha and
off in 1.36) are absent. An unqualified attribute or capacity name belongs to the driver's domain
(``parseQualifiedName``). A compiled expression must have type bool or dyn, else compile error "must evaluate
to bool or the unknown type, not int". The allocator compiles each expression again (``celCache``) and treats a
compile error as it treats a runtime error (b).

Semantics found in the Kubernetes source (k8s.io/dynamic-resource-allocation v0.36.2):

(a) Missing keys (``cel/compile.go``, ``newStringInterfaceMapWithDefault`` and ``mapper.Find``; cases
    ``runtime-error-lookup-identifier``, ``domain-check-negative`` and ``check-negative`` of
    ``cel/compile_test.go``): ``device.attributes[d]`` and ``device.capacity[d]`` for a domain the device does
    not have yield an EMPTY MAP, while ``d in device.attributes`` is false and ``size``/``exists`` see only the
    real domains. A missing NAME inside a domain is a runtime error ("no such key: name"), so the idioms are
    ``"name" in device.attributes[d] && ...``, ``device.attributes[d].?name.orValue(x)`` or ``[?"name"]``.
    Here the domain lookup is rewritten before compilation to
    ``cel.bind(k, d, k in device.attributes ? device.attributes[k] : <empty map>)`` (the checked expression is
    the user's own, so compile errors and positions are unchanged); as the wrapper's ``Find`` always answers
    "found", ``device.attributes[?d]`` and ``.?d`` give ``optional.of({})`` and ``has(device.attributes.d)``
    is true for any ``d`` (cel-go ``interpreter/attributes.go`` ``refQualify`` asks ``Find``).
    A ``version`` attribute that is not semantic version 2.0 fails every selector on that device
    ("attribute X: parse semantic version: ..."), as ``DeviceMatches`` converts all attributes first.
(b) Runtime errors (``structured/internal/stable/allocator_stable.go`` ``selectorsMatch``/``isSelectable``;
    the same in ``incubating`` and ``experimental``): class selectors are evaluated first, then the request's;
    all must be true; the first false stops with "no match"; an error for ANY device is not a "no match":
    it is returned as "class NAME: selector #i: CEL runtime error: ..." (resp. "claim NS/NAME: ...") through
    ``Allocate`` unwrapped (not ``ErrFailedAllocationOnNode``), and kube-scheduler's dynamicresources plugin
    (``pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go``, Filter) answers
    ``statusError``: the pod's whole scheduling attempt is aborted and retried with backoff, on every node.
    A non-bool result is such an error ("CEL result of type string could not be converted to bool").
    ``&&``/``||`` absorb errors as CEL specifies (``false && error`` is false), so guarded forms never error.

Also there, as in Kubernetes' base environment (``k8s.io/apiserver/pkg/cel/environment/base.go``): the strings
extension at version 2 (``lowerAscii``, ``upperAscii``, ``split``, ``substring``, ``indexOf``, ``replace``,
``trim``, ``join``, ``format``...), ``math.*`` and ``base64.*``; ``matches`` is RE2 in both. Known library
deviation: cel-expr-python 0.1.3 errors on ``s.substring(i, size(s))`` (end == size), which cel-go accepts. Not provided
(compile error "undeclared reference", where Kubernetes would accept): the libraries rarely seen in selectors
(regex ``find``/``findAll``, Kubernetes lists ``sum``/``min``/``isSorted``..., the ``lists`` and ``sets``
extensions, ``url``, ``ip``, ``cidr``, named ``format`` checks) and the whole ``device`` value
(``cel.bind(d, device, ...)``): each field is declared as a qualified variable of its own, which also makes
``device.vendor`` an "undeclared reference" where Kubernetes says "undefined field". Not enforced: the runtime
cost limit (``CELSelectorExpressionMaxCost``; the API server rejects expressions whose estimated cost exceeds it).
``quantity("1").value`` / ``semver("1.0.0").version`` compile here (message fields), not in Kubernetes.

Speed (warm, best of 5 x 5,000, 2-core x86_64 development VM under load, Python 3.11, cel-expr-python 0.1.3,
``benchmarks/dra_cel_eval.py``): the NVIDIA ``gpu.nvidia.com`` class selector costs 2.3 µs per device once the
device's input exists (kept per Device object), the gpu-test4 regex selector 12 µs, the MIG quantity selector
14-18 µs and a semver comparison 9 µs (the Kubernetes functions are Python callbacks); building the input on a
device's first evaluation adds about 20-30 µs. The pure-Python cel-python 0.5.0 took 335 µs for the class
selector on the same machine, and has no type checker, optionals nor ``cel.bind``.

Imports nothing of gpupool.k8s above ``objects``.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_encoders, ext_math, ext_optional, ext_strings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from kubernetes.utils.quantity import parse_quantity

from gpupool.k8s.objects.dra import Device, DeviceClass, DraParseError, SemVer

__all__ = [
    "CelSelectorError",
    "CompiledSelector",
    "SelectorInput",
    "compile_selector",
    "device_matches",
    "request_matches",
    "selector_input",
]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class CelSelectorError(DraParseError):
    """A selector that does not compile (``line``/``column`` of the first error, 1-based) or fails at run time
    (``line``/``column`` None). The message names the expression; ``detail`` is the message without it."""

    def __init__(self, expression: str, detail: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(f"CEL selector {expression!r}: {detail}")
        self.expression = expression
        self.detail = detail
        self.line = line
        self.column = column

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across process pools despite the extra arguments
        return (type(self), (self.expression, self.detail, self.line, self.column))


# ------------------------------------------------------------------ Kubernetes types as messages
def _message_types() -> tuple[Any, Any, descriptor_pool.DescriptorPool]:
    fdp = descriptor_pb2.FileDescriptorProto(name="gpupool/k8s_cel_types.proto", package="kubernetes", syntax="proto3")
    for msg, fld in (("Quantity", "value"), ("Semver", "version")):
        m = fdp.message_type.add(name=msg)
        m.field.add(name=fld, number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    quantity_msg, semver_msg = (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"kubernetes.{n}")) for n in ("Quantity", "Semver")
    )
    return quantity_msg, semver_msg, pool


_QuantityMsg, _SemverMsg, _POOL = _message_types()
QUANTITY = cel.Type("kubernetes.Quantity")
SEMVER = cel.Type("kubernetes.Semver")

# resource.Quantity's accepted shape (k8s.io/apimachinery/pkg/api/resource/quantity.go, splitREString)
_QUANTITY_RE = re.compile(r"[+-]?[0-9.]+[eEinumkKMGTP]*[-+]?[0-9]*", re.ASCII)


@functools.lru_cache(maxsize=4096)
def _parse_quantity(text: str) -> Decimal:
    if not _QUANTITY_RE.fullmatch(text):
        raise ValueError(
            f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    try:
        value = Decimal(parse_quantity(text))
    except (ValueError, InvalidOperation):
        raise ValueError(f"unable to parse quantity's suffix: {text!r}") from None
    return value


def _canonical(d: Decimal) -> str:
    return "0" if d == 0 else format(d.normalize(), "f")


def _q(d: Decimal) -> Any:
    return _QuantityMsg(value=_canonical(d))


def _qv(msg: Any) -> Decimal:
    return Decimal(msg.value)


def _quantity(text: str) -> Any:
    return _q(_parse_quantity(text))


def _is_quantity(text: str) -> bool:
    try:
        _parse_quantity(text)
    except ValueError:
        return False
    return True


def _as_integer(msg: Any) -> int:
    d = _qv(msg)
    if d != d.to_integral_value() or not INT64_MIN <= d <= INT64_MAX:
        raise ValueError("cannot convert value to integer")
    return int(d)


def _cmp(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


# blang/semver v4 Parse: M.m.p, no leading zeros, optional -pre and +build (dot-separated [0-9A-Za-z-]+)
_SEMVER_RE = re.compile(
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?",
    re.ASCII,
)


@functools.lru_cache(maxsize=4096)
def _parse_semver(text: str) -> tuple[int, int, int, tuple[int | str, ...]]:
    """(major, minor, patch, pre-release identifiers); build metadata is dropped (it does not order)."""
    m = _SEMVER_RE.fullmatch(text)
    if not m:
        raise ValueError(f"invalid semantic version {text!r}")
    pre: list[int | str] = []
    for ident in (m.group(4) or "").split(".") if m.group(4) else ():
        if ident.isdigit():
            if len(ident) > 1 and ident[0] == "0":
                raise ValueError(f"invalid semantic version {text!r}: numeric pre-release part with a leading zero")
            pre.append(int(ident))
        else:
            pre.append(ident)
    major, minor, patch = (int(m.group(i)) for i in (1, 2, 3))
    if max(major, minor, patch) >= 2**64:
        raise ValueError(f"invalid semantic version {text!r}: number out of range")
    return major, minor, patch, tuple(pre)


def _normalize_semver(text: str) -> str:
    """``normalizeAndParse`` of semverlib.go: drop a leading "v", fill missing minor/patch, drop leading zeros."""
    parts = text.removeprefix("v").split(".", 2)
    for i, p in enumerate(parts):
        if len(p) > 1:
            p = p.lstrip("0")
            if not p or not p[0].isdigit():
                p = "0" + p
            parts[i] = p
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise ValueError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


def _sv(text: str) -> Any:
    major, minor, patch, pre = _parse_semver(text)
    core = f"{major}.{minor}.{patch}"
    return _SemverMsg(version=core + ("-" + ".".join(str(p) for p in pre) if pre else ""))


def _semver(text: str, normalize: bool = False) -> Any:
    return _sv(_normalize_semver(text) if normalize else text)


def _is_semver(text: str, normalize: bool = False) -> bool:
    try:
        _semver(text, normalize)
    except ValueError:
        return False
    return True


def _semver_key(msg: Any) -> tuple[int, int, int, tuple[int | str, ...]]:
    return _parse_semver(msg.version)


def _semver_cmp(a: Any, b: Any) -> int:
    ma, mb = _semver_key(a), _semver_key(b)
    if ma[:3] != mb[:3]:
        return _cmp(ma[:3], mb[:3])
    pa, pb = ma[3], mb[3]
    if not pa or not pb:  # a release is greater than any of its pre-releases
        return _cmp(not pa, not pb)
    for x, y in zip(pa, pb, strict=False):
        if x == y:
            continue
        if isinstance(x, int) != isinstance(y, int):
            return -1 if isinstance(x, int) else 1  # numeric identifiers sort before alphanumeric ones
        return _cmp(x, y)
    return _cmp(len(pa), len(pb))


def _compare(a: Any, b: Any) -> int:
    """compareTo for two Quantities or two Semvers. cel-cpp dispatches Python implementations on argument
    kinds, and both types are messages, so one implementation serves both overloads."""
    if type(a) is not type(b):  # reachable through dyn attributes: semver attribute vs quantity()
        raise TypeError(f"no such overload: {a.DESCRIPTOR.full_name}, {b.DESCRIPTOR.full_name}")
    if isinstance(a, _SemverMsg):
        return _semver_cmp(a, b)
    return _cmp(_qv(a), _qv(b))


def _overloads(with_impl: bool) -> list[Any]:
    T = cel.Type
    # name -> [(overload id as in Kubernetes, result, parameters, member, implementation or None)]; an overload
    # whose argument kinds repeat an earlier one's has None (the earlier implementation dispatches).
    table: dict[str, list[tuple[str, Any, list[Any], bool, Callable[..., Any] | None]]] = {
        "quantity": [("string_to_quantity", QUANTITY, [T.STRING], False, _quantity)],
        "isQuantity": [("is_quantity_string", T.BOOL, [T.STRING], False, _is_quantity)],
        "sign": [("quantity_get_sign", T.INT, [QUANTITY], True, lambda q: _cmp(_qv(q), 0))],
        "isInteger": [("quantity_is_integer", T.BOOL, [QUANTITY], True,
                       lambda q: _qv(q) == _qv(q).to_integral_value() and INT64_MIN <= _qv(q) <= INT64_MAX)],
        "asInteger": [("quantity_get_int", T.INT, [QUANTITY], True, _as_integer)],
        "asApproximateFloat": [("quantity_get_float", T.DOUBLE, [QUANTITY], True, lambda q: float(_qv(q)))],
        "add": [("quantity_add", QUANTITY, [QUANTITY, QUANTITY], True, lambda a, b: _q(_qv(a) + _qv(b))),
                ("quantity_add_int", QUANTITY, [QUANTITY, T.INT], True, lambda a, b: _q(_qv(a) + b))],
        "sub": [("quantity_sub", QUANTITY, [QUANTITY, QUANTITY], True, lambda a, b: _q(_qv(a) - _qv(b))),
                ("quantity_sub_int", QUANTITY, [QUANTITY, T.INT], True, lambda a, b: _q(_qv(a) - b))],
        "isLessThan": [("quantity_is_less_than", T.BOOL, [QUANTITY, QUANTITY], True, lambda a, b: _compare(a, b) < 0),
                       ("semver_is_less_than", T.BOOL, [SEMVER, SEMVER], True, None)],
        "isGreaterThan": [
            ("quantity_is_greater_than", T.BOOL, [QUANTITY, QUANTITY], True, lambda a, b: _compare(a, b) > 0),
            ("semver_is_greater_than", T.BOOL, [SEMVER, SEMVER], True, None)],
        "compareTo": [("quantity_compare_to", T.INT, [QUANTITY, QUANTITY], True, _compare),
                      ("semver_compare_to", T.INT, [SEMVER, SEMVER], True, None)],
        "semver": [("string_to_semver", SEMVER, [T.STRING], False, _semver),
                   ("string_bool_to_semver", SEMVER, [T.STRING, T.BOOL], False, _semver)],
        "isSemver": [("is_semver_string", T.BOOL, [T.STRING], False, _is_semver),
                     ("is_semver_string_bool", T.BOOL, [T.STRING, T.BOOL], False, _is_semver)],
        "major": [("semver_major", T.INT, [SEMVER], True, lambda s: _semver_key(s)[0])],
        "minor": [("semver_minor", T.INT, [SEMVER], True, lambda s: _semver_key(s)[1])],
        "patch": [("semver_patch", T.INT, [SEMVER], True, lambda s: _semver_key(s)[2])],
    }
    return [
        cel.FunctionDecl(name, [
            cel.Overload(oid, ret, params, is_member=member, **({"impl": impl} if with_impl and impl else {}))
            for oid, ret, params, member, impl in ovs
        ])
        for name, ovs in table.items()
    ]


_DEVICE_VARS = {
    "device.driver": cel.Type.STRING,
    "device.attributes": cel.Type.Map(cel.Type.STRING, cel.Type.Map(cel.Type.STRING, cel.Type.DYN)),
    "device.capacity": cel.Type.Map(cel.Type.STRING, cel.Type.Map(cel.Type.STRING, QUANTITY)),
    "device.allowMultipleAllocations": cel.Type.BOOL,
}
_EMPTY = {"attributes": "gpupool_empty_attributes", "capacity": "gpupool_empty_capacity"}
_BIND_VAR = "gpupool_domain"


def _env(extra: Mapping[str, Any], with_impl: bool) -> Any:
    return cel.NewEnv(
        descriptor_pool=_POOL,
        variables={**_DEVICE_VARS, **extra},
        extensions=[  # Kubernetes' base environment has the strings extension at version 2, math, encoders
            ext_bindings.ExtBindings(), ext_optional.ExtOptional(), ext_strings.ExtStrings(2), ext_math.ExtMath(),
            ext_encoders.ExtEncoders(),
        ],
        functions=_overloads(with_impl),
    )


# The check environment is Kubernetes' (what users may write; declarations only, as cel-cpp registers each
# Python implementation once); the run environment adds the empty maps the rewritten domain lookups fall back to.
_CHECK_ENV = _env({}, with_impl=False)
_RUN_ENV = _env({
    _EMPTY["attributes"]: cel.Type.Map(cel.Type.STRING, cel.Type.DYN),
    _EMPTY["capacity"]: cel.Type.Map(cel.Type.STRING, QUANTITY),
}, with_impl=True)


# ------------------------------------------------------------------ missing-domain rewrite
_TOKEN_RE = re.compile(
    r"""(?P<ws>\s+|//[^\n]*)
    |(?P<str>(?:[rR][bB]?|[bB][rR])(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'[^'\n]*'|"[^"\n]*")
            |[bB]?(?:'''(?:\\[\s\S]|[^\\])*?'''|\"\"\"(?:\\[\s\S]|[^\\])*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
    |(?P<id>[_a-zA-Z][_a-zA-Z0-9]*)
    |(?P<num>[0-9][0-9a-zA-Z_.]*)
    |(?P<p>.)""",
    re.VERBOSE | re.DOTALL,
)


def _tokens(src: str) -> list[tuple[str, str]]:
    return [(m.lastgroup or "p", m.group()) for m in _TOKEN_RE.finditer(src)]


def _closing(toks: list[tuple[str, str]], sig: list[int], open_k: int) -> int | None:
    """Index in ``sig`` of the bracket closing the one at ``sig[open_k]``, None if unbalanced."""
    depth = 0
    for j in range(open_k, len(sig)):
        kind, text = toks[sig[j]]
        if kind == "p" and text in "[({":
            depth += 1
        elif kind == "p" and text in "])}":
            depth -= 1
        if depth == 0:
            return j
    return None


def _lookup(field: str, key: str) -> str:
    return (
        f"(cel.bind({_BIND_VAR}, ({key}), {_BIND_VAR} in device.{field} ? "
        f"device.{field}[{_BIND_VAR}] : {_EMPTY[field]}))"
    )


def _rewrite(src: str) -> str:
    """Domain lookups on ``device.attributes`` / ``device.capacity`` -> lookups that yield an empty map for a
    missing domain, as the DRA environment's map does (its ``Find`` always answers found): ``[X]`` and ``.name``
    give the map, ``[?X]`` and ``.?name`` give ``optional.of`` it, ``has(device.attributes.name)`` is true.
    Method calls on the maps (``device.attributes.exists(...)``), ``in`` and ``size`` see the real domains."""
    toks = _tokens(src)
    sig = [i for i, (kind, _) in enumerate(toks) if kind != "ws"]

    def text(k: int) -> str:
        return toks[sig[k]][1] if 0 <= k < len(sig) else ""

    out: list[str] = []
    pos = 0  # next token index not yet copied
    k = 0
    while k < len(sig):
        if not (
            text(k) == "device" and text(k - 1) != "." and text(k + 1) == "."
            and text(k + 2) in _EMPTY and toks[sig[k + 2]][0] == "id"
        ):
            k += 1
            continue
        field, start, nxt = text(k + 2), sig[k], k + 3
        if text(nxt) == "[":
            close = _closing(toks, sig, nxt)
            if close is None:  # unbalanced: the checked compile has already failed
                break
            optional = text(nxt + 1) == "?"
            inner = _rewrite("".join(t for _, t in toks[sig[nxt + 1 + optional] : sig[close]]))
            replacement, last = _lookup(field, inner), close
        elif text(nxt) == ".":
            optional = text(nxt + 1) == "?"
            name_k = nxt + 1 + optional
            if name_k >= len(sig) or toks[sig[name_k]][0] != "id" or text(name_k + 1) == "(":
                k += 1  # a method call on the map (exists, all, size, ...) sees the real domains
                continue
            replacement, last = _lookup(field, f'"{text(name_k)}"'), name_k
            if not optional and text(k - 1) == "(" and text(k - 2) == "has" and text(k - 3) != "." \
                    and text(name_k + 1) == ")":
                start, replacement, last = sig[k - 2], "true", name_k + 1  # has(device.attributes.name)
        else:
            k += 1
            continue
        out.append("".join(t for _, t in toks[pos:start]))
        out.append(f"optional.of{replacement}" if optional else replacement)
        pos = sig[last] + 1
        k = last + 1
    out.append("".join(t for _, t in toks[pos:]))
    return "".join(out)


# ------------------------------------------------------------------ compile
_ISSUE_RE = re.compile(r"ERROR: <input>:(\d+):(\d+): ([^\n]*)")
_STATUS_RE = re.compile(r"^[A-Z_]+: ")


def _compile_error(expression: str, exc: Exception) -> CelSelectorError:
    issues = _ISSUE_RE.findall(str(exc))
    if not issues:
        return CelSelectorError(expression, f"compilation failed: {_STATUS_RE.sub('', str(exc))}")
    text = "; ".join(f"ERROR: <input>:{ln}:{col}: {msg.strip()}" for ln, col, msg in issues)
    return CelSelectorError(expression, f"compilation failed: {text}", int(issues[0][0]), int(issues[0][1]))


_NO_KEY_RE = re.compile(r'Key not found in map : "(.*)"')


def _runtime_detail(value: Any) -> str:
    """cel-cpp's error text in cel-go's words where they differ ("no such key: name")."""
    return _NO_KEY_RE.sub(r"no such key: \1", _STATUS_RE.sub("", str(value)))


@dataclass(frozen=True)
class SelectorInput:
    """The ``device`` variable of one device, built once and shared by all selectors evaluated on it.
    ``error`` is set when the device itself cannot be presented to CEL (a version attribute that is not
    semantic version 2.0): every selector then fails with it, as in Kubernetes."""

    activation: Any
    error: str | None = None


_INPUTS: dict[int, SelectorInput] = {}  # id(device) -> its input, dropped when the device is collected


def selector_input(device: Device) -> SelectorInput:
    """The CEL input of ``device`` (attribute versions as Semver, capacities as Quantity), built once per
    :class:`Device` object (records are immutable: a changed slice is parsed into new ones)."""
    key = id(device)
    cached = _INPUTS.get(key)
    if cached is None:
        cached = _INPUTS[key] = _build_input(device)
        weakref.finalize(device, _INPUTS.pop, key, None)
    return cached


def _build_input(device: Device) -> SelectorInput:
    attributes: dict[str, dict[str, Any]] = {}
    error = None
    for domain, names in device.attributes.items():
        values: dict[str, Any] = {}
        for name, value in names.items():
            if isinstance(value, SemVer):
                try:
                    value = _sv(str(value))
                except ValueError as exc:
                    error = error or f"attribute {domain}/{name}: parse semantic version: {exc}"
                    continue
            values[name] = value
        attributes[domain] = values
    capacity = {d: {n: _q(v) for n, v in names.items()} for d, names in device.capacity.items()}
    data = {
        "device.driver": device.driver,
        "device.attributes": attributes,
        "device.capacity": capacity,
        "device.allowMultipleAllocations": bool(device.allow_multiple),
        _EMPTY["attributes"]: {},
        _EMPTY["capacity"]: {},
    }
    return SelectorInput(_RUN_ENV.Activation(data), error)


@dataclass(frozen=True, eq=False)
class CompiledSelector:
    """One compiled selector; get it from :func:`compile_selector` (cached by expression text)."""

    expression: str
    _program: Any

    def matches(self, device: Device | SelectorInput) -> bool:
        """Whether ``device`` satisfies the selector. Raises :class:`CelSelectorError` on a runtime error (a
        missing attribute name, a failing function) or a non-bool result, where Kubernetes' allocator errors."""
        inp = device if isinstance(device, SelectorInput) else selector_input(device)
        if inp.error is not None:
            raise CelSelectorError(self.expression, inp.error)
        result = self._program.eval(inp.activation)
        kind = result.type()
        if kind == cel.Type.BOOL:
            return bool(result.value())
        if kind == cel.Type.ERROR:
            raise CelSelectorError(self.expression, _runtime_detail(result.value()))
        raise CelSelectorError(
            self.expression, f"CEL result of type {kind.name().lower()} could not be converted to bool"
        )


@functools.lru_cache(maxsize=4096)
def _compile(expression: str) -> CompiledSelector | CelSelectorError:
    try:
        checked = _CHECK_ENV.compile(expression)
    except RuntimeError as exc:
        return _compile_error(expression, exc)
    out = checked.return_type()
    if out not in (cel.Type.BOOL, cel.Type.DYN):
        return CelSelectorError(expression, f"must evaluate to bool or the unknown type, not {out.name().lower()}")
    rewritten = _rewrite(expression)
    try:
        program = _RUN_ENV.compile(rewritten)
    except RuntimeError as exc:  # a defect of _rewrite, not of the user's expression
        return CelSelectorError(expression, f"internal error after the domain rewrite: {exc}")
    return CompiledSelector(expression, program)


def compile_selector(expression: str) -> CompiledSelector:
    """Compile (once per expression text, errors included) or raise :class:`CelSelectorError` with the
    position, in the API server's words ("compilation failed: ERROR: <input>:1:4: Syntax error: ...")."""
    result = _compile(expression)
    if isinstance(result, CelSelectorError):
        raise CelSelectorError(expression, result.detail, result.line, result.column)
    return result


def device_matches(
    selectors: Iterable[str | CompiledSelector], device: Device | SelectorInput, owner: str = ""
) -> tuple[bool, str | None]:
    """What the allocator's ``selectorsMatch`` does for one device: every selector must be true, in order; the
    first false answers (False, None); the first compile or runtime error answers (False, reason), reason
    "OWNER: selector #i: CEL runtime error: ..." (``owner`` like "class gpu.nvidia.com" or "claim ns/name").
    A reason is not a "no match": Kubernetes aborts the pod's scheduling attempt on it (module docstring, b)."""
    inp = device if isinstance(device, SelectorInput) else selector_input(device)
    prefix = f"{owner}: " if owner else ""
    for i, sel in enumerate(selectors):
        try:
            compiled = sel if isinstance(sel, CompiledSelector) else compile_selector(sel)
        except CelSelectorError as exc:
            return False, f"{prefix}selector #{i}: CEL compile error: {exc.detail}"
        try:
            if not compiled.matches(inp):
                return False, None
        except CelSelectorError as exc:
            return False, f"{prefix}selector #{i}: CEL runtime error: {exc.detail}"
    return True, None


def request_matches(
    device_class: DeviceClass | None, request_selectors: Iterable[str], device: Device | SelectorInput, claim: str
) -> tuple[bool, str | None]:
    """The allocator's ``isSelectable`` for one (sub)request and device: the class's selectors first (reasons
    "class NAME: selector #i: ..."), then the request's ("claim NS/NAME: selector #i: ..."); answers as
    :func:`device_matches`."""
    if device_class is not None:
        ok, reason = device_matches(device_class.selectors, device, f"class {device_class.name}")
        if not ok:
            return ok, reason
    return device_matches(request_selectors, device, f"claim {claim}")
