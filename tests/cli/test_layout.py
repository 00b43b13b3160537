"""How service/cli/ is laid out (docs: /work/shared/conventions.md, "the CLI as service/cli/, one module
per command ... the CLI never imports a router"): one module per command, each under 400 lines, and no
import of a router (service.routers, service.<resource>.router)."""

from __future__ import annotations

import ast
from pathlib import Path

import service.cli
from service.cli import COMMANDS

CLI = Path(service.cli.__file__).parent


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
    """Issue 19: the CLI calls services; a router is a web concern (``service.routers`` or any
    ``service.<resource>.router``)."""
    for path in CLI.glob("*.py"):
        for module, names, lineno in _imports(path):
            imported = [module] + [f"{module}.{n}" for n in names]
            for name in imported:
                assert name != "service.routers", f"{path.name}:{lineno}"
                assert not name.endswith(".router"), f"{path.name}:{lineno} imports {name}"
