"""A local ``lm-eval`` task from a table's held-out rows: perplexity of a model on them.

The task is a YAML file and a JSONL file of the rows' ``id`` and ``text`` side by side, read
with the ``datasets`` JSON builder (no hub, no network). Its ``output_type`` is
``loglikelihood_rolling``: every text is scored whole (in windows of the model's length), as
lm-eval's own wikitext task does, giving word and byte perplexity and bits per byte. Pure: no
torch.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from tokenloom.errors import TokenloomError

__all__ = [
    "EvalTaskError",
    "OFFLINE",
    "TASK_NAME",
    "write_eval_task",
    "lm_eval_argv",
    "lm_eval_command",
]

TASK_NAME = "tokenloom_heldout"
"""The task name unless one is given."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class EvalTaskError(TokenloomError):
    """The held-out rows cannot make a task (no rows, a bad task name)."""


OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
"""The environment that keeps ``lm_eval`` (transformers, datasets) off the network."""


def lm_eval_argv(model_dir: str, task_dir: str, name: str = TASK_NAME) -> list[str]:
    """``lm_eval``'s arguments that score ``model_dir`` on the task (run with :data:`OFFLINE`)."""
    return [
        "lm_eval",
        "--model", "hf",
        "--model_args", f"pretrained={model_dir},dtype=float32",
        "--tasks", name,
        "--include_path", task_dir,
        "--device", "cpu",
        "--batch_size", "1",
    ]  # fmt: skip


def lm_eval_command(model_dir: str, task_dir: str, name: str = TASK_NAME) -> str:
    """The one shell command that scores ``model_dir`` on the task, offline."""
    import shlex

    env = " ".join(f"{k}={v}" for k, v in OFFLINE.items())
    return f"{env} {shlex.join(lm_eval_argv(model_dir, task_dir, name))}"


def write_eval_task(
    table: str,
    *,
    filter: str,
    out: str,
    name: str = TASK_NAME,
    limit: int | None = None,
    version: int | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Write ``out/NAME.yaml`` and ``out/NAME.jsonl`` from the rows of ``table`` under ``filter``.

    Args:
        filter: The held-out rows (say a run's ``--val-filter``, ``id % 100 = 0``).
        limit: At most this many rows, the lowest ids first.
        version: The table version read [latest].

    Returns:
        ``{"task", "yaml", "data", "rows", "empty_left_out", "table", "version", "command"}``.

    Raises:
        EvalTaskError: No non-empty row under the filter, or a task name lm-eval cannot take.
        FilterError: The filter does not fit the table.
    """
    from tokenloom.loader.pipeline.take import take
    from tokenloom.rows.read import scan_selection
    from tokenloom.table import Table

    if not _NAME.fullmatch(name):
        raise EvalTaskError(
            f"task name {name!r} must be letters, digits and '_' (not starting with a digit)"
        )
    ds = Table.open(table, version=version, storage_options=storage_options).dataset
    selection = scan_selection(ds, filter=filter, columns=["id", "text"])
    rowids = selection.rowids if limit is None else selection.rowids[:limit]
    rows = take(ds, rowids.tolist(), ["id", "text"]).to_pylist()
    rows.sort(key=lambda r: r["id"])
    kept = [r for r in rows if r["text"].strip()]
    if not kept:
        raise EvalTaskError(
            f"no non-empty text under filter {filter!r} in {table} (version {ds.version}); "
            "pass the held-out filter the run used (its --val-filter)"
        )
    os.makedirs(out, exist_ok=True)
    out = os.path.abspath(out)
    data = os.path.join(out, f"{name}.jsonl")
    with open(data, "w", encoding="utf-8") as fh:
        for row in kept:
            fh.write(json.dumps({"id": row["id"], "text": row["text"]}, ensure_ascii=False) + "\n")
    yaml = os.path.join(out, f"{name}.yaml")
    with open(yaml, "w", encoding="utf-8") as fh:  # JSON strings are YAML strings
        fh.write(
            f"# {len(kept)} held-out rows of {table} v{ds.version} under {filter!r}\n"
            f"task: {name}\n"
            "dataset_path: json\n"
            "dataset_kwargs:\n"
            f"  data_files:\n    test: {json.dumps(data)}\n"
            "test_split: test\n"
            "output_type: loglikelihood_rolling\n"
            'doc_to_text: ""\n'
            'doc_to_target: "{{text}}"\n'
            "metric_list:\n"
            "  - {metric: word_perplexity, aggregation: weighted_perplexity, "
            "higher_is_better: false}\n"
            "  - {metric: byte_perplexity, aggregation: weighted_perplexity, "
            "higher_is_better: false}\n"
            "  - {metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}\n"
            "metadata:\n  version: 1.0\n"
        )
    return {
        "task": name,
        "yaml": yaml,
        "data": data,
        "rows": len(kept),
        "empty_left_out": len(rows) - len(kept),
        "table": table,
        "version": ds.version,
        "command": lm_eval_command("MODEL_DIR", out, name),
    }
