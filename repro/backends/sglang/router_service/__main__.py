"""python -m repro.backends.sglang.router_service --config router.json --host H --port P (cli.py)."""

import sys

from repro.backends.sglang.router_service.cli import main

sys.exit(main())
