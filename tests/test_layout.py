"""Issue 19 and docs/architecture.md: the layout's rules, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import service

ROOT = Path(service.__file__).parent
TWIN_CORES = {ROOT / "core" / "_reference.py"}  # and core/_sizing.pyx, which is not a .py module


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if ".venv" not in p.parts)


def _imported(path: Path) -> set[str]:
    """Every module a file imports, with ``from a import b`` counted as ``a`` and ``a.b``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _name(path: Path) -> str:
    return ".".join(("service", *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")


def test_no_module_over_400_lines_except_the_twin_cores() -> None:
    long = {_name(p): n for p in _modules() if p not in TWIN_CORES and (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def test_a_router_never_imports_another_router() -> None:
    routers = {_name(p) for p in _modules() if p.name == "router.py"} | {"service.routers", "service.ui.routes"}
    for path in _modules():
        if _name(path) in ("service.routers", "service.main"):
            continue  # the one aggregator, and the app factory that mounts it
        others = (_imported(path) & routers) - {_name(path)}
        assert others == set(), f"{_name(path)} imports {others}"


def test_services_import_neither_routers_nor_request_dependencies() -> None:
    for path in _modules():
        if (
            path.name not in ("service.py", "schemas.py", "history.py", "answer.py", "params.py")
            and path.parent.name != "core"
        ):
            continue
        bad = {m for m in _imported(path) if m.endswith(".router") or m in ("service.routers", "service.deps")}
        assert bad == set(), f"{_name(path)} imports {bad}"


def test_every_resource_has_its_package() -> None:
    for resource in (
        "runs",
        "sizing",
        "overrides",
        "stages",
        "placement",
        "simulations",
        "backtests",
        "ballast",
        "jobs",
    ):
        package = ROOT / resource
        assert (package / "router.py").is_file(), resource
        assert (package / "service.py").is_file(), resource
