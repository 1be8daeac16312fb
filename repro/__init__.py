"""repro: reproduction harness for RLT eviction and LBGR routing (see README.md)."""

__version__ = "0.1.0"
