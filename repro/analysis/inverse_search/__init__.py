"""Inverse search: the settings that maximise each of the paper's headline ratios (issue 31).

    python -m repro.analysis.inverse_search search --claim fig2.p50_latency_vs_ca --trials 30
    python -m repro.analysis.inverse_search report

- claims.py: the searched claims (read from the claims catalogue) and their numbers as advantages.
- space.py: the search space, Optuna parameters -> Hydra overrides of a trial's cells.
- search.py: one Optuna study per claim in a journal file; trials run cells through the harness.
- report.py: report.md (best per claim, Figure 2's co-occurrence) and the figure.
A dedicated command, not Hydra's Optuna sweeper: a trial here is a pair of systems over seeds
(several cells, one ratio), while that sweeper scores one job (one cell) per trial; and its source
for Optuna 4 requires hydra-core 1.4 (this project pins 1.3).
"""
