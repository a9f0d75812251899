"""What every command group shares: the root command class (errors -> `Error:`/`Hint:` + exit code),
the --json/-q options, and building the one Settings object. Imports nothing heavy."""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, Optional, Sequence

import typer
from typer.core import TyperGroup

from engramctl.cli import failure, flags
from engramctl.cli.output import EXIT_USAGE, Output, output_for
from engramctl.errors import UsageError

PROG = "engramctl"


class EngramGroup(TyperGroup):
    """The root command. Runs the app in non-standalone mode and turns every failure into
    `Error: ...` / `Hint: ...` on stderr and the documented exit code."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        from typer import exceptions as typer_exc
        from typer._click import exceptions as click_exc

        out = Output()
        try:
            rv = super().main(args, prog_name or PROG, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0
        except click_exc.NoArgsIsHelpError as e:  # `engramctl` or a group alone: help, as a usage error
            out.stderr.write(e.format_message() + "\n")
            code = EXIT_USAGE
        except click_exc.UsageError as e:
            cmd = e.ctx.command_path if e.ctx is not None else PROG
            out.error(failure.sentence(e.format_message()), f"{cmd} --help")
            code = EXIT_USAGE
        except click_exc.ClickException as e:  # BadParameter and friends are UsageErrors; the rest
            out.error(failure.sentence(e.format_message()))
            code = e.exit_code
        except typer_exc.Abort:
            out.stderr.write("\n")
            code = 130
        except BaseException as e:  # EngramError, KeyboardInterrupt and the rest: failure.py's, as shortcut.py's
            code = failure.exit_code(e, out)
            if code is None:
                raise
        if standalone_mode:
            sys.exit(code)
        return code


# -- output mode options ------------------------------------------------------------------------------
JsonOpt = typer.Option(False, *flags.JSON, help=flags.JSON_HELP)
QuietOpt = typer.Option(False, *flags.QUIET, help=flags.QUIET_HELP)
output = output_for  # the Output of a command's --json/--quiet


def counts(text: str, flag: str, example: str) -> tuple[int, ...]:
    """A flag's comma-separated whole numbers, each at least 1 ("256,1_024"): sorted, each once."""
    try:
        values = {int(x.replace("_", "")) for x in text.split(",") if x.strip()}
    except ValueError:
        raise UsageError(
            f"{flag} {text!r} is not a comma-separated list of numbers.", hint=f"for example: {flag} {example}"
        ) from None
    if not values or min(values) < 1:
        raise UsageError(f"every {flag} value must be at least 1.", hint=f"for example: {flag} {example}")
    return tuple(sorted(values))


# -- settings -----------------------------------------------------------------------------------------
def settings(**flags: Any):
    """The one frozen Settings of this invocation: defaults < config.toml < ENGRAM_* env < flags."""
    from engramctl.settings import load_settings

    return load_settings({k: v for k, v in flags.items() if v is not None})


_OPTION_TYPES = {"str": str, "bytes": str, "int": int, "float": float, "bool": bool}  # bytes: parsed by Settings


def daemon_setting_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command one option per daemon setting (engramctl.settings.SPECS with a flag), before its own
    options; the command receives those given on the command line as `flags: dict`. The options carry
    no defaults or choices of their own: load_settings applies both, so a flag, ENGRAM_* and config.toml
    are checked and worded the same way."""
    from engramctl.settings import SPECS

    sig = inspect.signature(command, eval_str=True)
    own = [p for p in sig.parameters.values() if p.name != "flags"]
    added = []
    for s in SPECS:
        if not (s.daemon and s.flag):
            continue
        decls = [f"{s.flag}/{s.off_flag}" if s.off_flag else s.flag] + ([s.short] if s.short else [])
        metavar = s.metavar or ("|".join(s.choices) if s.choices else None)
        help = f"{s.help[:1].upper()}{s.help[1:]} (default {s.shown_default}; env {s.env})."
        option = typer.Option(None, *decls, metavar=metavar, show_default=False, help=help)
        annotation = Optional[_OPTION_TYPES[s.kind]]
        added.append(inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))
    names = {p.name for p in added}

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        flags = {k: v for k in names if (v := kwargs.pop(k, None)) is not None}
        return command(flags=flags, **kwargs)

    run.__signature__ = sig.replace(parameters=added + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own])
    run.__annotations__ = {p.name: p.annotation for p in own + added}
    return run
