"""Analysis tools above the harness: they build and run cells like the harness does and read
what the routers decided (docs/ARCHITECTURE.md, layering: analysis may import harness and
backends; nothing below imports analysis).

- cells.py: compose a cell config from Hydra overrides; cache a run's summary by its signature.
- decisions.py: `DiagnosticRouter` (records every routing decision and LBGR's estimates) and
  the numbers of the LBGR study computed from those records.
- lbgr_sweep.py: the LBGR design study (variants vs a baseline on the tuning / evaluation cells).
- lbgr_tune.py: the LBGR tuning protocol (free parameters chosen by prediction error).
- lbgr_highload.py: LBGR's prediction parts against the realised queue wait / prefill / decode
  on regime_map cells (why LBGR+RLT loses at high load).
- lbgr_diagnostics.py: the command line of all four (`python -m repro.analysis.lbgr_diagnostics`).
- inverse_search/: the settings that maximise each headline ratio (Optuna; `python -m
  repro.analysis.inverse_search search|report`).
"""
