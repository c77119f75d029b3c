"""Dependency bounds: pyproject.toml gives users compatible ranges, requirements/pins.txt gives CI
exact versions; every package of the first has one pin in the second, inside its range."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent


def _pins() -> dict[str, Requirement]:
    pins: dict[str, Requirement] = {}
    for line in (ROOT / "requirements" / "pins.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name not in pins, f"{req.name} is pinned twice in requirements/pins.txt"
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"{line!r} is not an exact pin"
        pins[name] = req
    return pins


def _requirements() -> list[tuple[str, Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = [("dependencies", Requirement(r)) for r in project["dependencies"]]
    for extra, reqs in project["optional-dependencies"].items():
        out += [(f"[{extra}]", Requirement(r)) for r in reqs]
    return out


def test_every_dependency_has_an_exact_pin_inside_its_range():
    pins = _pins()
    reqs = _requirements()
    assert len(reqs) > 20
    for where, req in reqs:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} ({where}) has no pin in requirements/pins.txt"
        version = next(iter(pins[name].specifier)).version
        assert req.specifier.contains(version), f"pin {name}=={version} is outside {req} ({where})"
        # a range, not a pin: users may take any compatible release
        assert not any(s.operator == "==" for s in req.specifier), f"{req} ({where}) is exact"
        assert any(s.operator == "<" for s in req.specifier), f"{req} ({where}) has no upper bound"
    # nothing pinned that pyproject does not ask for (a stale pin would hide a removal)
    assert set(pins) == {canonicalize_name(r.name) for _, r in reqs}


def test_make_install_uses_the_pins():
    install = (ROOT / "Makefile").read_text().split("\ninstall:", 1)[1].split("\n\n", 1)[0]
    assert '-e ".[test]" -c requirements/pins.txt' in install
