"""The row loader behaves as the packed one: a script without a ``__main__`` guard, the one
``tokenloom.loader.DataLoader`` front, and a wrong keyword named with the valid ones."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.rows.tables import row_table
from tokenloom.loader import DataLoader
from tokenloom.rows import RowDataset, RowLoader, RowLoaderError, RowMapDataset


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return row_table(tmp_path_factory.mktemp("front"), n=30)


def _readme_example() -> str:
    """The row loader's example in the README's "Rows and images" section."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    section = text[text.index("## Rows and images") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs_as_a_script_without_a_main_guard(tmp_path, table):
    code = _readme_example()
    assert "__main__" not in code and "num_workers=2" in code
    script = tmp_path / "rows_example.py"
    script.write_text(code.replace('"rows.lance"', repr(table)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    ds = RowDataset(table, columns=["text", "label"], filter="label != 'L0'", global_batch=8)
    assert got == [b["row_id"].tolist() for b in RowLoader(ds, num_workers=0)]
    assert len(got) == 3 and all(len(ids) == 8 for ids in got)  # 20 rows: the last step refilled


def test_the_one_dataloader_front_takes_a_row_dataset(table):
    ds = RowDataset(table, columns=["k"], global_batch=6, seed=2)
    loader = DataLoader(ds)
    assert isinstance(loader, RowLoader)
    got = [b["row_id"].tolist() for b in loader]
    ref = RowDataset(table, columns=["k"], global_batch=6, seed=2)
    assert got == [b["row_id"].tolist() for b in ref] and len(got) == 5
    assert (loader.state_dict()["epoch"], loader.state_dict()["step"]) == (1, 0)
    with pytest.raises(RowLoaderError, match="batch_size"):
        DataLoader(ds, batch_size=4)
    with pytest.raises(TypeError, match="RowMapDataset .*torch.utils.data.DataLoader"):
        DataLoader(RowMapDataset(table, columns=["k"]))


@pytest.mark.parametrize("cls", [RowDataset, RowMapDataset])
def test_a_wrong_keyword_names_the_valid_ones(table, cls):
    with pytest.raises(RowLoaderError) as err:
        cls(table, columns=["k"], batch_size=4)
    message = str(err.value)
    assert f"{cls.__name__}() got unknown keyword(s) batch_size" in message
    assert "pass global_batch=" in message and "transform" in message and "seed" in message
    with pytest.raises(RowLoaderError, match="unknown keyword.*num_workers.*RowLoader"):
        cls(table, columns=["k"], num_workers=2)
