"""Shared pytest set-up. Under CI=true a skipped test of a required marker fails the run."""
