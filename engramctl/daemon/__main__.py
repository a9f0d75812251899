"""`python -m engramctl.daemon [--model M] [--host H] [--port P] ...`: the daemon in the foreground.

Options override ENGRAM_* variables and config.toml like the CLI's. `--no-reuse` (benchmarks only)
makes every anonymous request prefill from scratch.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from engramctl.daemon.runner import add_setting_arguments, serve, setting_flags

    parser = argparse.ArgumentParser(prog="python -m engramctl.daemon", description=__doc__.splitlines()[0])
    add_setting_arguments(parser)  # one per daemon setting (engramctl.settings)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--no-reuse", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    from engramctl.errors import EngramError
    from engramctl.settings import load_settings

    try:
        settings = load_settings(setting_flags(args))
        return serve(settings, reuse=not args.no_reuse, log_level=args.log_level)
    except EngramError as e:
        print(f"error: {e.message}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    status = main()
    # Everything is closed and written by now. Without this the interpreter's last collection walks every object
    # torch and transformers made (1.3-1.7 s of CPU, 5 s of wall on a busy 2-core machine) before the process ends.
    import gc

    gc.freeze()
    sys.exit(status)
