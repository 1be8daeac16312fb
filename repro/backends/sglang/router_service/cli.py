"""The router service's process: config file -> RouterService, served until SIGTERM.

    python -m repro.backends.sglang.router_service --config router.json --host 127.0.0.1 --port 30000

router.json: {"router": <cfg.router>, "model": <cfg.model>, "hardware": <cfg.hardware>,
"service": <RouterServiceConfig keys>} (written by orchestrate.plan_cell). Exit code 2: a bad
config, or no healthy worker at start (NoHealthyWorkersError).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from repro.backends.sglang import cli_common as cli
from repro.backends.sglang.config import RouterServiceConfig
from repro.backends.sglang.router_service.health import NoHealthyWorkersError
from repro.backends.sglang.router_service.service import RouterService

log = logging.getLogger("repro.router_service")


def build_router(router_cfg: dict) -> Any:
    """The router object from a conf/router/<name>.yaml mapping, built by the cell assembly (the
    one place routers are built, for the simulator too)."""
    from repro.backends.assembly import build_router as assemble_router

    return assemble_router(router_cfg)


def service_from_file(path: str) -> RouterService:
    """RouterService from a router.json (see the module docstring)."""
    with open(path) as fh:
        spec = json.load(fh)
    missing = [k for k in ("router", "service") if k not in spec]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    cost_model = None
    if spec.get("model") is not None and spec.get("hardware") is not None:
        from repro.costmodel import StepCostModel

        cost_model = StepCostModel.from_config(spec["model"], spec["hardware"])
    known = set(RouterServiceConfig.__dataclass_fields__)
    unknown = sorted(set(spec["service"]) - known)
    if unknown:
        raise ValueError(f"{path}: unknown router service keys {unknown}; known: {sorted(known)}")
    return RouterService(build_router(spec["router"]), RouterServiceConfig(**spec["service"]), cost_model)


async def _serve(service: RouterService, host: str, port: int) -> int:
    stop = cli.stop_event()
    try:
        bound = await service.start(host, port)
    except NoHealthyWorkersError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 2
    except OSError as exc:  # the orchestrator reads "address already in use" and moves the router
        print(f"ERROR: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 3
    service.warm_parser()
    log.info(
        "router service (%s) on http://%s:%d in front of %d workers",
        type(service.router).__name__,
        host,
        bound,
        len(service.workers),
    )
    await stop.wait()
    log.info("router service stopping: %s", json.dumps({k: v for k, v in service.stats().items() if k != "workers"}))
    await service.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli.server_main(
        argv,
        module="repro.backends.sglang.router_service",
        what="router service",
        description="repro router service (SGLang /generate proxy with repro routers)",
        config_help="JSON: router, model, hardware, service",
        load=service_from_file,
        serve=_serve,
    )


__all__ = ["build_router", "main", "service_from_file"]
