"""How service/cli/ is laid out (docs: /work/shared/conventions.md, "the CLI as service/cli/, one module
per command ... the CLI never imports a router"): one module per command, each under 400 lines, and no
import of a router (service.api.*)."""

from __future__ import annotations

import ast
from pathlib import Path

import service.cli
from service.cli import COMMANDS

CLI = Path(service.cli.__file__).parent

#: Router imports still there, each marked where it moves; the lay-sim merge redirects them to
#: service.simulations.service and service.backtests.service, and empties this set.
PENDING = {
    ("simulate.py", "service.api.simulations", ("ballast_of", "pool_of")),
    ("backtest.py", "service.api.simulations", ("param_sets",)),
}


def _imports(path: Path) -> list[tuple[str, tuple[str, ...], int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, tuple(a.name for a in node.names), node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, (), node.lineno) for a in node.names)
    return found


def test_one_module_per_command_and_none_too_long() -> None:
    names = {p.name for p in CLI.glob("*.py")}
    assert names == {"__init__.py", "common.py"} | {f"{c.__name__.rsplit('.', 1)[1]}.py" for c in COMMANDS}
    for path in CLI.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path.name


def test_the_cli_imports_no_router() -> None:
    routers = set()
    for path in CLI.glob("*.py"):
        lines = path.read_text().splitlines()
        for module, names, lineno in _imports(path):
            if module == "service.api" or module.startswith("service.api."):
                assert "(lay-sim)" in lines[lineno - 1], f"{path.name}:{lineno} imports a router"
                routers.add((path.name, module, names))
    assert routers == PENDING
