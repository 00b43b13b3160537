"""Backtests (``/api/v1/backtests``): how good the recommendations would have been on stored
history. ``service`` walks the runs under each policy, ``router`` serves them as background analyses."""
