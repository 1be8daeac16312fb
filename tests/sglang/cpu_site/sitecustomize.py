"""Put on PYTHONPATH by test_rlt_spawn.py only: every interpreter started with it (the server entry
point AND the processes it spawns, which are fresh interpreters) installs the CPU import shims
before anything imports SGLang -- so the server module itself stays free of test code."""

from repro.backends.sglang import cpu_shims

cpu_shims.install()
