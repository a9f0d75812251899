"""What the benches show on the terminal while they run: rich progress bars and notes on stderr, and the
warning about a daemon competing for the same cores."""

from __future__ import annotations

from typing import Any


class RichProgress:
    """Progress bars on stderr (rich draws nothing when stderr is not a terminal)."""

    def __init__(self, quiet: bool = False) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.quiet = quiet
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self.tasks: dict[str, Any] = {}
        self.names: dict[str, str] = {}

    def __enter__(self) -> "RichProgress":
        self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.stop()

    def phase(self, key: str, description: str, total: int) -> None:
        self.names[key] = description
        self.tasks[key] = self.bar.add_task(description, total=total)

    def advance(self, key: str, description: str | None = None) -> None:
        task = self.tasks.get(key)
        if task is None:
            return
        desc = f"{self.names[key]}: {description}" if description else None
        self.bar.update(task, advance=1, **({"description": desc} if desc else {}))

    def note(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)


def warn_daemon(settings, out) -> None:
    """The bench runs in this process; a daemon with a model loaded competes for the same cores."""
    try:
        from engramctl.cli.connect import running

        info = running(settings)
    except Exception:  # noqa: BLE001 - a status probe must never stop a benchmark
        return
    if info:
        out.warn(
            "an engramctl daemon is running; the bench runs in this process and competes with it "
            "for CPU and memory. Stop it for clean figures: engramctl daemon stop"
        )
