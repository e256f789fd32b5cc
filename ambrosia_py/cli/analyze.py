"""``ambrosia-py analyze DATA_DIR --out DIR``: a report over every recorded log.

The report is Spark's (``spark/analyze.py``); this is its command line and its progress
bar. PySpark, PyArrow, pandas and matplotlib are the ``spark`` extra: the command checks
for them (and for Java) before anything else and says in one line what to install
(:mod:`ambrosia_py.extras`). They are imported only once it runs: ``--help`` needs none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..extras import EXTRAS, require
from ..spark.analyze import STEPS, build_report, method_names
from ..spark.errors import NoLogsError
from ..spark.layout import find_logs

__all__ = ["analyze"]


def _session(cores: int) -> tuple[Any, bool]:
    """A local session, and whether this command owns it (and so stops it)."""
    from ..spark import local_session

    spark = local_session(cores, app_name="ambrosia-py analyze")
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True


@click.command()
@click.argument("data_dir", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the report goes: index.html, its PNGs, tables/*.parquet.",
)
@click.option(
    "--service",
    "services",
    multiple=True,
    metavar="FILE|module[:Class]",
    help="Name method ids after this service's @rpc methods (repeatable); else #id.",
)
@click.option(
    "--decode-services/--no-decode-services",
    default=None,
    help="Unpickle the calls the services' report plug-ins read (here: the Ockam hub's and "
    "the Wallaroo worker's and connector's frames) to count their streams (for logs you "
    "trust). Default: only if every log file is this user's own.",
)
@click.option(
    "--log-trigger-mb",
    type=click.FloatRange(min=0, min_open=True),
    envvar="AMBROSIA_LOG_TRIGGER_MB",  # as `run` and `coordinator` take it
    show_envvar=True,
    help="The --log-trigger-mb the logs' coordinators ran with (default: theirs): a new "
    "log after a smaller one is a restart.",
)
@click.option("--cores", default=2, show_default=True, help="Spark local[N].")
def analyze(
    data_dir: Path,
    out: Path,
    services: tuple[str, ...],
    decode_services: bool | None,
    log_trigger_mb: float | None,
    cores: int,
) -> None:
    """Write a report (HTML, PNG charts, Parquet tables) over the logs in DATA_DIR."""
    require(*EXTRAS["spark"])
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..spark.session import java_problem

    problem = java_problem()
    if problem is not None:
        raise click.ClickException(problem)
    try:
        find_logs(data_dir)
    except NoLogsError as exc:
        raise click.ClickException(str(exc)) from None
    names = method_names(services)
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task("starting Spark", total=len(STEPS) + 1)
        spark, owned = _session(cores)

        def step(name: str) -> None:
            progress.update(task, description=name, advance=1)

        try:
            report = build_report(
                spark,
                data_dir,
                out,
                names=names,
                decode_services=decode_services,
                log_trigger_mb=log_trigger_mb,
                step=step,
            )
        finally:
            if owned:
                spark.stop()
        progress.update(task, description="done", advance=1)
    click.echo(f"report: {report.page}")
