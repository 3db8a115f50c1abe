"""Every command line in the ```sh blocks of README.md and docs/*.md runs as written (issue 13).

The blocks are parsed here (backslash continuations joined, comments stripped) and each command is
either

* run: ``gpupool ...`` in a subprocess with this venv's entry point, from the repository root, with
  the heavy arguments made small (``--max-jobs 200`` for job traces, ``--ratio 0.2`` and at most two
  seeds for openb, ``--out`` / ``--json`` into ``tmp_path``); ``make TARGET`` runs the target's
  ``$(BIN)/gpupool`` recipe line the same way; ``kubectl kustomize`` renders without a cluster;
  the exit code must be 0 (or the one a ``# ... exit code N`` comment documents); or
* skipped for a reason listed in ``SKIP`` (a cluster, docker, a GPU, the real API server).

A documented command that is neither fails ``test_every_documented_command_is_classified``, so the
documentation cannot drift from what is tested. A command naming a ``../shared/`` path that is
absent (a fresh clone elsewhere) is skipped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(sh|bash|shell)\s*$")

# Small inputs: what a documented command is rewritten to before it runs.
MAX_JOBS = 200
OPENB_RATIO = "0.2"
MAX_SEEDS = 2
TIMEOUT_S = 120

# Documented commands that are not run here: (regex on the command, reason). Add a row when a new
# command cannot run in CI; a command that matches no row and cannot be run fails the test.
SKIP: list[tuple[str, str]] = [
    (r"^make test\b", "the whole lint + test suite, this file included (CI runs it)"),
    (r"^make e2e\b", "needs kube-apiserver and etcd binaries (tests/e2e, marker real_apiserver)"),
    (r"kube-control-plane/build\.sh\b", "builds kube-apiserver/etcd from a Git checkout (GITDIR), minutes"),
    (r"^docker\b", "needs a docker daemon, the network and a registry (REGISTRY/TAG placeholders)"),
    (r"\bkustomize edit\b", "edits deploy/kustomization.yaml in place (REGISTRY/TAG placeholders)"),
    (r"^kubectl (?!kustomize\b)", "needs a Kubernetes cluster"),
    (r"^gpupool scheduler\b(?!.*--dry-run)", "the live scheduler: needs a cluster and binds pods"),
    (r"^gpupool extender\b", "an HTTP server for kube-scheduler, runs until stopped (tests/test_k8s_extender.py)"),
    (r"(^|/)scripts/gpu-check\.sh\b", "needs a GPU node"),
    (r"^(openssl|printf) ", "writes certificate files into the current directory; the same openssl steps make "
                            "the certificates tests/test_k8s_extender_http.py serves and presents"),
]

EXIT_COMMENT = re.compile(r"\bexit(?:s)?(?: with)?(?: code)? (\d+)\b", re.IGNORECASE)


@dataclass(frozen=True)
class DocCommand:
    where: str  # "README.md:25"
    text: str  # the command with the comment stripped, continuations joined
    comment: str

    @property
    def tokens(self) -> list[str]:
        return shlex.split(self.text)


def _strip_comment(line: str) -> tuple[str, str]:
    """The command and its trailing ``# comment`` (a '#' outside quotes, at a word start)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def documented_commands() -> list[DocCommand]:
    out: list[DocCommand] = []
    for doc in DOCS:
        lines = doc.read_text(encoding="utf-8").splitlines()
        in_block = False
        pending: list[str] = []
        comments: list[str] = []
        start = 0
        for n, raw in enumerate(lines, 1):
            if not in_block:
                in_block = bool(FENCE.match(raw.strip()))
                continue
            if raw.strip().startswith("```"):
                in_block = False
                continue
            code, comment = _strip_comment(raw)
            if not pending:
                start = n
            if comment:
                comments.append(comment)
            if code.endswith("\\"):
                pending.append(code[:-1].strip())
                continue
            pending.append(code.strip())
            text = " ".join(p for p in pending if p)
            if text:
                out.append(DocCommand(f"{doc.relative_to(ROOT)}:{start}", text, " ".join(comments)))
            pending, comments = [], []
    return out


def _makefile_gpupool(target: str) -> list[str] | None:
    """The arguments of the ``$(BIN)/gpupool`` recipe line of a Makefile target (None if none)."""
    lines = (ROOT / "Makefile").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"^{re.escape(target)}\s*:", line):
            recipe = []
            for body in lines[i + 1:]:
                if not body.startswith("\t"):
                    break
                recipe.append(body.strip())
            if len(recipe) == 1 and recipe[0].startswith("$(BIN)/gpupool "):
                return shlex.split(recipe[0])[1:]
            return None
    return None


def _skip_reason(text: str) -> str | None:
    for pattern, reason in SKIP:
        if re.search(pattern, text):
            return reason
    return None


def classify(cmd: DocCommand) -> tuple[str, object]:
    """("skip", reason) | ("gpupool", args) | ("kustomize", argv) | ("unknown", why)."""
    reason = _skip_reason(cmd.text)
    if reason:
        return "skip", reason
    tokens = cmd.tokens
    if tokens[0] == "gpupool":
        return "gpupool", tokens[1:]
    if tokens[0] == "make" and len(tokens) == 2:
        args = _makefile_gpupool(tokens[1])
        if args is not None:
            return "gpupool", args
        return "unknown", f"make {tokens[1]}: no single $(BIN)/gpupool recipe line to run"
    if tokens[:2] == ["kubectl", "kustomize"]:
        return "kustomize", tokens
    return "unknown", "neither run by this test nor in its SKIP table"


def _option_value_index(args: list[str], name: str) -> int | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return i + 1
    return None


def small(args: list[str], tmp: Path) -> list[str]:
    """The documented arguments with heavy inputs made small and outputs moved into ``tmp``."""
    args = [a for tok in args for a in (tok.split("=", 1) if tok.startswith("--") and "=" in tok else [tok])]
    sub = args[0] if args else ""
    # Outputs go to tmp_path (never into the checkout).
    i = _option_value_index(args, "--out")
    if i is not None:
        args[i] = str(tmp / "out")
    i = _option_value_index(args, "--json")
    if i is not None and args[i] != "-" and not args[i].startswith("-"):
        args[i] = str(tmp / "result.json")
    if sub in ("simulate", "compare"):
        # At most MAX_SEEDS seeds.
        seeds: list[str] = []
        rest: list[str] = []
        it = iter(args)
        for a in it:
            if a in ("--seed", "--seeds"):
                seeds += [s for s in next(it, "").split(",") if s]
            else:
                rest.append(a)
        args = rest + [x for s in dict.fromkeys(seeds[:MAX_SEEDS]) for x in ("--seed", s)]
        if "--jobs" in args:
            i = _option_value_index(args, "--max-jobs")
            if i is None:
                args += ["--max-jobs", str(MAX_JOBS)]
            else:
                args[i] = str(min(int(args[i]), MAX_JOBS))
        else:
            i = _option_value_index(args, "--ratio")
            if i is None:
                args += ["--ratio", OPENB_RATIO]
            else:
                args[i] = str(min(float(args[i]), float(OPENB_RATIO)))
    return args


def _missing_shared(tokens: list[str]) -> str | None:
    for tok in tokens:
        value = tok.split("=", 1)[-1]
        if value.startswith("../shared/") and not (ROOT / value).exists():
            return value
    return None


def _gpupool_exe() -> str:
    exe = Path(sys.executable).parent / "gpupool"
    if exe.exists():
        return str(exe)
    found = shutil.which("gpupool")
    assert found, "no gpupool entry point next to this Python or on PATH (pip install -e .)"
    return found


def _expected_rc(cmd: DocCommand) -> int:
    m = EXIT_COMMENT.search(cmd.comment)
    return int(m.group(1)) if m else 0


COMMANDS = documented_commands()


def test_docs_have_commands() -> None:
    """The parser finds the documented commands (it cannot silently find none)."""
    texts = [c.text for c in COMMANDS]
    assert len(COMMANDS) >= 10, texts
    assert any(t.startswith("gpupool compare --jobs") for t in texts), texts
    assert any(t.startswith("gpupool scheduler --dry-run") for t in texts), texts


def test_every_documented_command_is_classified() -> None:
    """A new documented command must be runnable here or listed in SKIP with a reason."""
    unknown = [f"{c.where}: {c.text} ({why})" for c in COMMANDS
               for kind, why in [classify(c)] if kind == "unknown"]
    assert not unknown, "documented commands neither run nor skipped:\n" + "\n".join(unknown)


@pytest.mark.parametrize("cmd", COMMANDS, ids=[f"{c.where} {c.text[:60]}" for c in COMMANDS])
def test_documented_command_runs(cmd: DocCommand, tmp_path: Path) -> None:
    kind, detail = classify(cmd)
    if kind == "skip":
        pytest.skip(f"{cmd.text}: {detail}")
    if kind == "unknown":
        pytest.fail(f"{cmd.where}: {cmd.text}: {detail}")
    missing = _missing_shared(cmd.tokens)
    if missing:
        pytest.skip(f"{missing} is absent (../shared is not checked out beside this repository)")
    env = {**os.environ, "MPLBACKEND": "Agg", "COLUMNS": "200"}
    if kind == "kustomize":
        if shutil.which("kubectl") is None:
            pytest.skip("kubectl is not installed")
        argv = list(detail)  # type: ignore[arg-type]
    else:
        args = small(list(detail), tmp_path)  # type: ignore[arg-type]
        argv = [_gpupool_exe(), *args]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    want = _expected_rc(cmd)
    assert proc.returncode == want, (
        f"{cmd.where}: {cmd.text}\nran: {shlex.join(argv)}\nexit {proc.returncode}, want {want}\n"
        f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    if want == 0 and kind == "gpupool":
        if "--json" in argv:
            i = argv.index("--json") + 1
            if i < len(argv) and argv[i] == "-":
                json.loads(proc.stdout)
            elif i < len(argv) and not argv[i].startswith("-"):
                assert Path(argv[i]).stat().st_size > 0, f"{argv[i]} not written"
        if "--out" in argv:
            out = Path(argv[argv.index("--out") + 1])
            assert any(out.glob("*.png")), f"no plots under {out}"


def test_small_rewrites_heavy_arguments(tmp_path: Path) -> None:
    jobs = small(["compare", "--jobs", "j.csv", "--cluster", "c.yaml", "--max-jobs", "2000",
                  "--out", "results/x", "--json=results/x.json"], tmp_path)
    assert jobs[jobs.index("--max-jobs") + 1] == str(MAX_JOBS)
    assert jobs[jobs.index("--out") + 1] == str(tmp_path / "out")
    assert jobs[jobs.index("--json") + 1] == str(tmp_path / "result.json")
    openb = small(["compare", "--seed", "42", "--seeds", "43,44", "--json", "-"], tmp_path)
    assert openb[openb.index("--ratio") + 1] == OPENB_RATIO
    assert openb.count("--seed") == MAX_SEEDS and "-" in openb
    assert small(["policies", "--json"], tmp_path) == ["policies", "--json"]


def test_parser_joins_continuations_and_strips_comments() -> None:
    assert _strip_comment("make run    # compare # all") == ("make run", "compare # all")
    assert _strip_comment("kubectl get x -o jsonpath='{.a#b}'")[1] == ""
    assert _expected_rc(DocCommand("x:1", "gpupool x", "a bad row exits with code 2")) == 2
    compare = next(c for c in COMMANDS if c.text.startswith("gpupool compare --policies"))
    assert "\\" not in compare.text and "--json" in compare.text


def test_new_commands_must_be_run_or_skipped() -> None:
    assert classify(DocCommand("x:1", "helm install gpupool ./chart", ""))[0] == "unknown"
    assert classify(DocCommand("x:1", "make bench", ""))[0] == "unknown"
    assert classify(DocCommand("x:1", "make run", ""))[0] == "gpupool"
    assert classify(DocCommand("x:1", "gpupool scheduler --leader-elect", ""))[0] == "skip"
    assert classify(DocCommand("x:1", "gpupool scheduler --dry-run --snapshot s.yaml", ""))[0] == "gpupool"
    assert _missing_shared(["--jobs", "../shared/no/such/trace.csv"]) == "../shared/no/such/trace.csv"
    assert _missing_shared(["--jobs", "examples/clusters/philly.yaml"]) is None


def test_readme_is_short_and_every_relative_link_resolves() -> None:
    """The README reads in five minutes (under 250 lines: the details live in docs/), and no relative link of
    the README or docs/ points at a file that is not there (sections moved between them keep working links)."""
    assert len((ROOT / "README.md").read_text().splitlines()) < 250
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    broken = []
    for doc in DOCS:
        for target in link.findall(doc.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert broken == []
