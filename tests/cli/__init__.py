"""The ``ci-sizer`` command (service/cli/), one test module per command; test_entry_points.py checks
that ``python -m service`` and the installed ``ci-sizer`` script behave the same for each."""
