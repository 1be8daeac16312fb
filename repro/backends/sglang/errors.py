"""What can go wrong running a live cell (planning, start-up, time limit)."""


class OrchestrationError(RuntimeError):
    """The cell could not be run on this node (start-up, time limit, configuration)."""


class ServerStartError(OrchestrationError):
    """A server or the router exited or never became healthy."""


class CellTimeoutError(OrchestrationError):
    """The cell ran past timeouts.cell_s."""


class ServerDiedError(OrchestrationError):
    """A server (or its node's step) that had become healthy exited in the middle of the cell,
    on its own or killed by someone else: the harness had sent it no signal."""
