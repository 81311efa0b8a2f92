"""The closing table a run or a stage prints: its stages, their figures and outputs, the
registered model and where its MLflow runs are. Printed by the command's own process (a finished
root's run, ``flows.finished``) and by the worker after a flow (``flows.worker``)."""

from __future__ import annotations


def print_summary(summary: dict, file=None) -> None:
    """The closing table on stdout (or ``file``): on a terminal as wide as the window, with long
    cells folded; written to a file or a pipe, as wide as its cells need, so no path is cut."""
    from rich.console import Console

    fold = Console(file=file).is_terminal
    if fold:
        console = Console(file=file, width=max(120, Console(file=file).width))
    else:  # a log file: no window to fit, and a path cut in two (`.../runs/tiny/cor` + `pus`) is unreadable
        console = Console(file=file, width=100_000, soft_wrap=True)
    _summary_lines(console, summary, fold)


def _summary_lines(console, summary: dict, fold: bool) -> None:
    from rich.table import Table

    from flows.figures import format_figure

    table = Table(title=f"bertflow {summary['preset']}: {summary['seconds']:.0f} s")
    for col in ("stage", "status", "time (s)", "key figures", "output"):
        table.add_column(col, overflow="fold" if fold else "ignore", no_wrap=not fold)
    for s in summary["stages"]:
        figs = "\n".join(f"{k}={format_figure(v)}" for k, v in s["figures"].items())
        table.add_row(s["stage"], s["status"], f"{s['seconds']:.1f}", figs, s["url"])
    console.print(table)
    console.print(f"results: {summary['root']}")
    if summary.get("model_version"):
        console.print(
            f"registered model: {summary['model_name']} version {summary['model_version']} "
            f"(alias {summary.get('model_alias')}): models:/{summary['model_name']}@{summary.get('model_alias')}"
        )
    from flows.tracking import ui_url

    uri = summary["tracking_uri"]
    if not uri.startswith(("http://", "https://")):
        console.print(f"MLflow: mlflow ui --backend-store-uri {uri}")
    if summary.get("experiment_id"):
        console.print(f"MLflow runs: {ui_url(uri, summary['experiment_id'])}")
