"""The layers contract: imports point one way (docs/architecture.md), and a wrong-way import fails `make test`.

    .venv/bin/pytest -q tests/test_layers.py

Every simplan package belongs to one layer; a module may import its own package and the layers below it, never a
layer above nor a sibling of its own layer. Imports inside functions count as much as those at the top: a lazy
import is still a dependency. The check reads the source with `ast`, so it sees every import whatever runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. Packages in one layer are independent of each other.
LAYERS: list[tuple[str, ...]] = [
    ("core",),
    ("envs", "models"),
    ("data",),
    ("training", "inference.engines"),
    ("inference.planning", "inference.serving"),
    ("evaluation",),
    ("workflows",),
    ("scripts",),
]
PACKAGES = [p for layer in LAYERS for p in layer]
# Folders that only hold layered packages: their __init__.py is a docstring and imports nothing.
CONTAINERS = ("inference",)


def package_of(module: str) -> str:
    """The layered package a dotted module (without the `simplan.` prefix) belongs to; the longest match wins."""
    matches = [p for p in PACKAGES if module == p or module.startswith(p + ".")]
    if not matches:
        raise AssertionError(f"module simplan.{module} belongs to no layer of tests/test_layers.py LAYERS")
    return max(matches, key=len)


def layer_of(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, layered package) of every simplan package an import statement of `tree` reaches, once per statement.

    `from simplan.inference import engines` reaches inference.engines, as `import simplan.inference.engines` does."""
    out = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        packages = {resolve(n.removeprefix("simplan.")) for n in names if n.startswith("simplan.")}
        out.extend((node.lineno, p) for p in sorted(packages - {None}))
    return out


def resolve(name: str) -> str | None:
    """The layered package a dotted name lies in; None for a container folder itself (`simplan.inference`)."""
    if name in CONTAINERS:
        return None
    return package_of(name)


def violations(source: str, module: str) -> list[str]:
    tree = ast.parse(source)
    if module in CONTAINERS:
        return [
            f"simplan/{module}/__init__.py:{line}: imports {t}; a container holds packages only"
            for line, t in imported(tree)
        ]
    own = package_of(module)
    out = []
    for line, target in imported(tree):
        if target == own or own.startswith(target + "."):
            continue  # its own package, or a package that holds it (inference.engines.x -> inference.engines)
        if layer_of(target) >= layer_of(own):
            kind = "a sibling in its own layer" if layer_of(target) == layer_of(own) else "a layer above it"
            out.append(f"simplan/{module.replace('.', '/')}.py:{line}: {own} imports {target}, {kind}")
    return out


def library_files() -> list[Path]:
    tops = sorted({p.split(".")[0] for p in PACKAGES})
    return [f for top in tops for f in sorted((ROOT / top).rglob("*.py"))]


def test_every_import_points_down() -> None:
    problems = [v for f in library_files() for v in violations(f.read_text(), module_name(f))]
    assert not problems, "wrong-way imports (see docs/architecture.md):\n" + "\n".join(problems)


def test_every_module_has_a_layer() -> None:
    for f in library_files():
        if module_name(f) not in CONTAINERS:
            package_of(module_name(f))  # raises naming the module


@pytest.mark.parametrize(
    "module, source",
    [
        ("data.build", "from simplan.scripts.config import comma_list\n"),  # library code importing the CLI
        ("envs.bfcl", "def f():\n    from simplan.data.format import render_action\n"),  # a lazy upward import
        ("training.trainer", "import simplan.inference.engines.hf_peft\n"),  # siblings of one layer
        ("inference.planning.judge", "from simplan.evaluation import metrics\n"),
    ],
)
def test_a_wrong_way_import_is_caught(module: str, source: str) -> None:
    (problem,) = violations(source, module)
    assert f"{module.replace('.', '/')}.py:" in problem


def test_downward_and_own_package_imports_pass() -> None:
    source = (
        "from simplan.core.io import write_json\nfrom simplan.data.format import decider_messages\n"
        "from simplan.inference.planning.judge import Judge\nfrom simplan.inference.engines.base import Engine\n"
    )
    assert violations(source, "inference.planning.planner") == []
    assert violations("from simplan.inference.engines import make_engine\n", "inference.engines.merged") == []
