"""Hugging Face dataset folders on local disk, read directly (no ``datasets`` package needed).

Two layouts are understood:

- **``save_to_disk``** (``datasets.Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``): a
  folder with ``state.json`` (its ``_data_files`` list the Arrow IPC stream files, in order),
  ``dataset_info.json`` and ``data-0000i-of-0000n.arrow``; a ``DatasetDict`` is a folder with
  ``dataset_dict.json`` (``{"splits": [...]}``) and one such folder per split. Recognised
  whether or not the path is given as ``hf://``.
- **Hub repository** (a ``huggingface-cli download --repo-type dataset --local-dir DIR`` copy),
  given as ``hf://DIR``: every ``.parquet``, ``.arrow`` and JSONL (``.jsonl``/``.json``, also
  ``.gz``/``.zst``) file under it, hidden folders (``.cache``) and ``README.md`` left out. The
  split of a file follows the Hub's rule: a folder or a file-name word (split at ``-._`` and
  digits) that names one (``train``/``training``; ``validation``/``valid``/``val``/``dev``;
  ``test``/``testing``/``eval``/``evaluation``) gives it, else the file is ``train``
  (``data/train-00000-of-00002.parquet`` and ``test.jsonl`` both work). The ``configs:`` of a
  README's YAML header are not read: every data file of the folder is taken, so pass the
  folder of one configuration. Other files (``.csv``, ``.txt``) are rejected as
  ``unsupported_format``, never silently left out.

``--split NAME`` keeps one split (default: all); a split the folder does not have is a
``missing_split`` rejection naming the splits it does have. Each row's ``meta`` gets ``_split``
(and ``_file``, ``_row``/``_line`` as for any input); the default source is the folder's name.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

from tokenloom.ingest.rejects import Reason, Reject, printable

__all__ = ["HF_SCHEME", "SPLIT_NAMES", "is_saved_dataset", "hf_inputs", "hub_split"]

HF_SCHEME = "hf://"

#: Split keyword → the split it names (the Hub's synonyms).
SPLIT_NAMES: Mapping[str, str] = {
    "train": "train",
    "training": "train",
    "validation": "validation",
    "valid": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
    "testing": "test",
    "eval": "test",
    "evaluation": "test",
}
_ORDER = ("train", "validation", "test")
_WORD = re.compile(r"[-._ 0-9]+")


def is_saved_dataset(path: str) -> bool:
    """Whether ``path`` is a folder written by ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return os.path.isfile(os.path.join(path, "dataset_dict.json")) or (
        os.path.isfile(os.path.join(path, "state.json"))
        and os.path.isfile(os.path.join(path, "dataset_info.json"))
    )


def hub_split(relpath: str) -> str:
    """The split of a file in a Hub repository folder (module rule), from its relative path."""
    parts = relpath.split("/")
    for folder in parts[:-1]:
        if folder.lower() in SPLIT_NAMES:
            return SPLIT_NAMES[folder.lower()]
    for word in _WORD.split(parts[-1].lower()):
        if word in SPLIT_NAMES:
            return SPLIT_NAMES[word]
    return "train"


def hf_inputs(root: str, split: str | None) -> tuple[list[tuple[str, str, str]], list[Reject]]:
    """The data files of a dataset folder.

    Args:
        root: The folder (``hf://`` removed).
        split: Keep only this split (``None``: all).

    Returns:
        ``(path, path relative to root, split)`` per file in reading order (splits in the
        folder's order, files in order within a split), and rejections (a missing split, an
        unreadable ``state.json``, files of a kind not read).
    """
    rejects: list[Reject] = []
    if is_saved_dataset(root):
        found = _saved(root, rejects)
    else:
        found = _hub(root, rejects)
    splits = list(dict.fromkeys(s for _, _, s in found))
    if split is not None:
        if split not in splits:
            have = ", ".join(splits) or "none"
            rejects.append(
                Reject(
                    file=root,
                    reason=Reason.MISSING_SPLIT,
                    detail=f"no split {split!r} (splits: {have}); pass --split with one of them",
                )
            )
        found = [f for f in found if f[2] == split]
    return found, rejects


def _saved(root: str, rejects: list[Reject]) -> list[tuple[str, str, str]]:
    """Files of a ``save_to_disk`` folder, each split's in its ``state.json`` order."""
    dict_file = os.path.join(root, "dataset_dict.json")
    if os.path.isfile(dict_file):
        try:
            with open(dict_file, encoding="utf-8") as fh:
                splits = [str(s) for s in json.load(fh)["splits"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            detail = f"dataset_dict.json is unreadable ({type(exc).__name__}: {exc})"
            rejects.append(Reject(file=dict_file, reason=Reason.UNREADABLE_FILE, detail=detail))
            return []
        out = []
        for name in splits:
            out.extend(
                (path, f"{name}/{rel}", name)
                for path, rel, _ in _saved_split(os.path.join(root, name), name, rejects)
            )
        return out
    return _saved_split(root, None, rejects)


def _saved_split(
    folder: str, name: str | None, rejects: list[Reject]
) -> list[tuple[str, str, str]]:
    state_file = os.path.join(folder, "state.json")
    try:
        with open(state_file, encoding="utf-8") as fh:
            state = json.load(fh)
        files = [str(f["filename"]) for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        detail = f"state.json is unreadable ({type(exc).__name__}: {exc})"
        rejects.append(Reject(file=state_file, reason=Reason.UNREADABLE_FILE, detail=detail))
        return []
    split = name or state.get("_split") or "train"
    return [(os.path.join(folder, f), f, str(split)) for f in files]


def _hub(root: str, rejects: list[Reject]) -> list[tuple[str, str, str]]:
    """Data files of a Hub repository folder (hidden folders and README.md left out)."""
    from tokenloom.ingest.inputs import _classify  # inputs imports this module

    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith(".") or name.lower() in ("readme.md", "license", "license.md"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            kind = _classify(name)
            if kind is not None and kind[0] in ("jsonl", "parquet", "arrow"):
                found.append((path, rel, hub_split(rel)))
            else:
                rejects.append(
                    Reject(
                        file=path,
                        reason=Reason.UNSUPPORTED_FORMAT,
                        detail=f"{printable(rel)}: a dataset folder is read from its .parquet, "
                        ".arrow and .jsonl files",
                    )
                )
    rank = {s: i for i, s in enumerate(_ORDER)}
    found.sort(key=lambda f: (rank.get(f[2], len(rank)), f[2], f[1]))
    return found
