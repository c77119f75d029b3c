"""The loader's floors and the import layering of the whole package, read statically.

``src/tokenloom/loader/`` holds three floors, one folder each; a module of a floor imports only from
its own floor and the floors below it, never from a floor above nor from the package's front
(``loader/__init__.py``). Each floor also says what else it may import: the pure plan and the
observation floors import nothing that reads files or tables, starts processes or holds shared
memory, and neither Lance nor torch. :data:`FLOORS` is that rule, as data: a new module goes into
one of the folders (a module beside them, or a folder that is no floor, fails
:func:`test_every_loader_module_sits_on_a_floor`), and an exception names its module, what it
imports and why.

Imports are parsed with :mod:`ast`: module level, inside functions and under ``TYPE_CHECKING``
alike (an import that runs late is still an arrow). Across the whole package no two modules may
import each other at module level, directly or round a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import tokenloom

SRC = Path(tokenloom.__file__).parent
LOADER_DIR = SRC / "loader"
LOADER = "tokenloom" + ".loader"  # built, not spelled: module-path rewrites leave it alone

# What a module that neither reads nor writes files or tables, starts no process and holds no
# shared memory has no use for (prefixes of module names).
IO = (
    "lance",
    "pyarrow",
    "torch",
    "multiprocessing",
    "concurrent.futures.process",
    "mmap",
    "fcntl",
    "shutil",
    "tempfile",
    "subprocess",
    "socket",
    "signal",
    "pickle",
    "io",
    "glob",
    "pathlib",
    "sqlite3",
    "urllib",
    "http",
    "requests",
    "fsspec",
    "boto3",
    "PIL",
    "datasets",
    "importlib",  # an import by name is not checked here
)


@dataclass(frozen=True)
class Floor:
    """One floor of the loader: a folder under ``src/tokenloom/loader/``."""

    name: str
    """The folder."""
    rule: str
    """What its modules are, in one line (shown with a failure)."""
    forbidden: tuple[str, ...]
    """Modules (prefixes) its code may not import anywhere."""
    tokenloom: tuple[str, ...]
    """The tokenloom modules outside the loader (prefixes) it may import."""
    exceptions: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """``{module (file stem): {imported prefix: why}}``: imports allowed to that module only."""


FLOORS: tuple[Floor, ...] = (  # bottom first
    Floor(
        name="plan",
        rule="the pure plan: numpy arrays in and out, from stored counts",
        forbidden=IO,
        tokenloom=("tokenloom.errors",),
        exceptions={
            "shuffle": {
                "mmap": "mmap(-1, n): anonymous memory (no file) for the sort's temporaries, "
                "given back to the system as soon as it is freed",
            },
            "spec": {
                "tokenloom.table.storage": "absolute_uri() checks a table URI's spelling "
                "(check_uri, no I/O), imported when a path is made absolute; importing "
                "tokenloom.table loads Lance then",
            },
            "topology": {
                "tokenloom.process": "Topology.of() reads torchrun's RANK and WORLD_SIZE from "
                "the environment (env_topology)",
            },
        },
    ),
    Floor(
        name="observe",
        rule="counters, gauges, the bottleneck verdict and the ledger, from what the pipeline "
        "and the plan hand over",
        forbidden=IO,
        tokenloom=("tokenloom.errors",),
        exceptions={
            "profile": {
                "torch": "simulate() times a GPT-2 step to stand in for the GPU (bench only)",
                "tokenloom.train": "the GPT-2 presets and FLOPs of the step it simulates",
            },
        },
    ),
    Floor(
        name="pipeline",
        rule="materialises the plan: the table, reads, the plan store, workers, shared memory",
        forbidden=("torch",),
        tokenloom=(
            "tokenloom.errors",
            "tokenloom.process",
            "tokenloom.table",
            "tokenloom.tokenize",
            "tokenloom.search",
            "tokenloom.refresh",
        ),
        exceptions={
            "dataloader": {
                "torch": "the torch face of the stream (IterableDataset, tensors)",
                "tokenloom.rows": "the one DataLoader front hands a RowDataset to RowLoader",
            },
        },
    ),
)
FLOOR_OF = {f.name: i for i, f in enumerate(FLOORS)}


@dataclass(frozen=True)
class Import:
    """One import statement's target, as Python resolves it."""

    module: str
    """The importing module."""
    target: str
    """The imported module (a submodule when ``from package import submodule``)."""
    line: int
    where: str
    """``module``, ``function`` or ``type-checking``."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    base = SRC.parent.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports(path: Path, source: str | None = None) -> Iterator[Import]:
    """Every import of a file: at module level, in functions and under ``TYPE_CHECKING``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text() if source is None else source)

    def walk(node: ast.AST, where: str) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                inner = "function"
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inner = "type-checking" if where == "module" else where
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(name, alias.name, child.lineno, inner)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    mod = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    mod = child.module or ""
                subs = [f"{mod}.{a.name}" for a in child.names]
                if all(is_module(s) for s in subs):  # from package import submodule(s)
                    for s in subs:
                        yield Import(name, s, child.lineno, inner)
                else:
                    yield Import(name, mod, child.lineno, inner)
            elif (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Name)
                and child.func.id == "__import__"
            ):
                yield Import(name, "importlib", child.lineno, inner)  # an import by name
            yield from walk(child, inner)

    yield from walk(tree, "module")


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def floor_of(module: str) -> str | None:
    """The floor of a loader module (``None``: the package's front or not in the loader)."""
    parts = module.split(".")
    if module.startswith(LOADER + ".") and len(parts) > 2:
        return parts[2]
    return None


def loader_files() -> list[Path]:
    return sorted(p for p in LOADER_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def violations(floor: Floor, files: list[Path]) -> tuple[list[str], set[tuple[str, str]]]:
    """What the floor's modules import against its rule, and the exceptions that were used."""
    bad, used = [], set()
    for path in files:
        short = path.stem
        allowed = floor.exceptions.get(short, {})
        for imp in imports(path):
            target = imp.target
            if under(target, "tokenloom"):
                if under(target, LOADER):
                    continue  # the order of the floors: test_loader_floors_import_downward
                ok = any(under(target, t) for t in floor.tokenloom)
                bad_here = not ok
            else:
                bad_here = any(under(target, f) for f in floor.forbidden)
            if not bad_here:
                continue
            granted = [p for p in allowed if under(target, p)]
            if granted:
                used.add((short, granted[0]))
                continue
            bad.append(f"{path.relative_to(SRC.parent)}:{imp.line} imports {target} ({imp.where})")
    return bad, used


@pytest.mark.parametrize("floor", FLOORS, ids=[f.name for f in FLOORS])
def test_each_floor_imports_only_what_its_rule_allows(floor: Floor) -> None:
    files = sorted((LOADER_DIR / floor.name).rglob("*.py"))
    assert files, f"the floor {floor.name}/ has no module"
    bad, used = violations(floor, files)
    assert not bad, f"{floor.name}/ is {floor.rule}; against that:\n" + "\n".join(bad)
    present = {p.stem for p in files}  # an exception may wait for its module's branch
    granted = {(m, p) for m, imps in floor.exceptions.items() if m in present for p in imps}
    stale = sorted(granted - used)
    assert not stale, (
        f"exceptions of {floor.name}/ no longer needed (delete them from FLOORS): {stale}"
    )


def test_every_loader_module_sits_on_a_floor() -> None:
    loose = [
        str(p.relative_to(LOADER_DIR))
        for p in loader_files()
        if p != LOADER_DIR / "__init__.py" and floor_of(module_name(p)) not in FLOOR_OF
    ]
    assert not loose, (
        f"modules on no floor: {loose}; move each into one of "
        f"{[f.name + '/' for f in FLOORS]} by what it imports (or add a floor to FLOORS in "
        "tests/loader/test_layering.py)"
    )


def test_loader_floors_import_downward() -> None:
    """No arrow up a floor, and no floor imports the package's front (its ``__init__``)."""
    up = []
    for path in loader_files():
        here = floor_of(module_name(path))
        if here not in FLOOR_OF:
            continue  # the front imports every floor
        for imp in imports(path):
            if not under(imp.target, LOADER):
                continue
            there = floor_of(imp.target)
            if there is None or FLOOR_OF.get(there, len(FLOORS)) > FLOOR_OF[here]:
                up.append(
                    f"{path.relative_to(SRC.parent)}:{imp.line} ({here}/) imports "
                    f"{imp.target} ({(there or 'the package front') + '/'}, {imp.where})"
                )
    assert not up, (
        "imports up a floor (floors bottom first: "
        + ", ".join(f.name for f in FLOORS)
        + "):\n"
        + "\n".join(up)
    )


def module_graph() -> dict[str, set[str]]:
    """Module-level imports between tokenloom's modules (what runs when a module is imported)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        name = module_name(path)
        graph.setdefault(name, set())
        for imp in imports(path):
            if imp.where == "module" and under(imp.target, "tokenloom") and imp.target != name:
                graph[name].add(imp.target)
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def test_no_module_level_import_circle_in_tokenloom() -> None:
    found = circles(module_graph())
    assert not found, "modules importing each other at module level: " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_the_checks_see_late_and_type_only_imports_and_circles(tmp_path: Path) -> None:
    """The reader itself: imports in functions and under TYPE_CHECKING are arrows; a circle is
    found; ``from package import submodule`` points at the submodule."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "import numpy as np\n"
        "if TYPE_CHECKING:\n"
        "    from tokenloom.loader.pipeline.planner import Planner\n"
        "def f():\n"
        "    import lance\n"
        "    from tokenloom.loader.pipeline import buffers\n"
        "    return __import__('torch')\n"
    )
    path = LOADER_DIR / "plan" / "example.py"  # never written: the source is given
    got = {(i.target, i.where) for i in imports(path, source)}
    assert got == {
        ("typing", "module"),
        ("numpy", "module"),
        (f"{LOADER}.pipeline.planner", "type-checking"),
        ("lance", "function"),
        (f"{LOADER}.pipeline.buffers", "function"),
        ("importlib", "function"),
    }
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
