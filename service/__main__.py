"""``python -m service``: the ``ci-sizer`` command (service/cli/)."""

from service.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
