"""`python -m engramctl.daemon [--model M] [--host H] [--port P] ...`: the daemon in the foreground.

Options override ENGRAM_* variables and config.toml like the CLI's. `--no-reuse` (benchmarks only)
makes every anonymous request prefill from scratch.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engramctl.daemon", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory, .gguf file or hub id (default: ENGRAM_MODEL or the default model)")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 11535; 0 = any free port, see daemon.json)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--allow-remote", action="store_true", default=None, help="allow a non-loopback --host")
    parser.add_argument("--max-queue", type=int, help="requests that may wait for the model before 429")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--no-reuse", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    from engramctl.daemon.runner import serve
    from engramctl.errors import EngramError
    from engramctl.settings import load_settings

    flags = {"model": args.model, "host": args.host, "port": args.port, "device": args.device, "dtype": args.dtype,
             "allow_remote": args.allow_remote, "max_queue": args.max_queue}  # fmt: skip
    try:
        settings = load_settings(flags)
        return serve(settings, reuse=not args.no_reuse, log_level=args.log_level)
    except EngramError as e:
        print(f"error: {e.message}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
