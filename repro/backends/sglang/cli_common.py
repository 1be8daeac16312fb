"""The command line shared by the servers a cell starts: `--config FILE --host H --port P`.

    python -m repro.backends.sglang.router_service --config router.json --port 30000
    python -m repro.backends.sglang.emulated_worker --config worker0.json --port 30001

Both raise their open-file limit, log to stderr, exit 2 on a bad config (before serving), and
serve until SIGTERM / SIGINT (how the orchestration stops them).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any, Awaitable, Callable

from repro.backends.sglang import protocol


def server_main(
    argv: list[str] | None,
    *,
    module: str,
    what: str,
    description: str,
    config_help: str,
    load: Callable[[str], Any],
    serve: Callable[[Any, str, int], Awaitable[int | None]],
) -> int:
    """Parse the command line, `load(config_path)`, then run `serve(loaded, host, port)`; its
    return value (None = 0) is the exit code."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    ap.add_argument("--config", required=True, help=config_help)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    protocol.raise_open_file_limit()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        loaded = load(args.config)
    except Exception as exc:
        print(f"ERROR: {what}: bad config {args.config}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    return asyncio.run(serve(loaded, args.host, args.port)) or 0


def stop_event() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (call inside the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


__all__ = ["server_main", "stop_event"]
