"""The root ``gpupool`` Typer app and its callback (``--version``); the command modules add their commands
to it. Imports no other module of :mod:`gpupool.cli`."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool import __version__

app = typer.Typer(
    name="gpupool",
    help=(
        "GPU pool orchestrator for shared Kubernetes clusters: compare GPU placement policies on "
        "public cluster traces (by default the embedded Alibaba openb trace, Weng et al., ATC'23)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click help: wrapped to the terminal (at most 100 columns), nothing cut with "…", no <bool>
    # placeholders for flags. The commands added by EXTENSION_MODULES inherit these settings.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


# --------------------------------------------------------------------------------------------------
# Commands


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpupool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """GPU pool orchestrator: compare GPU placement policies on public cluster traces."""

