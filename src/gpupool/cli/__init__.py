"""The ``gpupool`` command line: list the placement policies, simulate one, compare several.

    gpupool policies [--json]
    gpupool simulate [--policy gpupool] [common options]
    gpupool compare  [--policies a,b,c] [common options]

Common options: ``--nodes FILE --pods FILE`` (openb CSVs; default: the embedded Alibaba openb trace),
``--protocol inflation|replay``, ``--seed N`` (repeatable, or ``--seeds 42,43``), ``--ratio 1.3``,
``--out DIR`` (PNG plots), ``--json FILE`` (``-`` for stdout), ``--quiet``.

Job traces (the pool scheduler, :mod:`gpupool.sim.jobs`): ``--jobs FILE [--format philly|itp]
--cluster FILE.yaml [--queues FILE.yaml]`` replays a Philly or ITP job trace on the cluster file's nodes
with the job-level policies ``fifo``, ``round-robin`` and ``gpupool`` (default), plus the failure,
checkpoint, elastic and GPU-speed options listed in ``--help``.

Exit codes: 0 success; 2 bad usage, unknown policy, unreadable or malformed trace (the message names
the file, the line and the column), or an unavailable protocol.
"""

from __future__ import annotations

from gpupool.agent import cli as agent_cli
from gpupool.cli import (
    autoscale,
    placement,  # noqa: F401  (its decorators add policies, simulate and compare to app, first)
)
from gpupool.cli.root import app
from gpupool.k8s import extender_cli, scheduler_cli
from gpupool.k8s.autoscaler import cli as autoscaler_cli

__all__ = ["EXTENSION_MODULES", "app", "main"]

EXTENSION_MODULES = (scheduler_cli, extender_cli, agent_cli, autoscaler_cli)
"""Modules that add commands to the CLI, in this order; each defines ``register(app: typer.Typer) -> None``.
All are in the tree: one that cannot be imported is an error."""


def _register_extensions() -> None:
    for module in EXTENSION_MODULES:
        module.register(app)


_register_extensions()
app.add_typer(autoscale.app, name="autoscale")


def main() -> None:
    """Console-script entry point (``gpupool``)."""
    app(prog_name="gpupool")
