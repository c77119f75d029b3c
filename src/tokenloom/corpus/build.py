"""Build the bundled corpus: one JSONL file per source plus ``manifest.json``.

Every file is written to a temporary name in the output directory and renamed into place, so a
reader never sees half a file and an interrupted build leaves the previous files intact. The
output is byte-for-byte the same on every run with the same packages and interpreter: readers
iterate in sorted order and each line is ``json.dumps(record, ensure_ascii=False,
sort_keys=True)``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from tokenloom.corpus.document import CorpusDocument
from tokenloom.corpus.locate import Origin
from tokenloom.corpus.manifest import MANIFEST_NAME, CorpusManifest, SourceManifest
from tokenloom.corpus.sources import SourceSpec, resolve_sources
from tokenloom.errors import CorpusError

__all__ = ["build_corpus", "atomic_writer"]


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """Open a temporary file beside ``path``; rename it onto ``path`` when the block succeeds.

    On an exception the temporary file is removed and ``path`` is left as it was.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _write_source(
    out_dir: Path, spec: SourceSpec, origin: Origin, max_docs: int | None
) -> SourceManifest:
    """Write ``<out_dir>/<name>.jsonl`` from the source's reader and describe it."""
    from tokenloom.progress import progress  # lazily: `import tokenloom.corpus` stays light

    file_name = f"{spec.name}.jsonl"
    digest = hashlib.sha256()
    docs = chars = size = 0
    reasons: Counter[str] = Counter()
    bar = progress(f"corpus {spec.name}", total=max_docs, unit="docs")
    with bar, atomic_writer(out_dir / file_name) as f:
        records = spec.read()
        try:
            for record in records:
                if not isinstance(record, CorpusDocument):
                    reasons[record.reason] += 1
                    continue
                obj = record.to_record(spec.name)
                try:
                    line = (json.dumps(obj, ensure_ascii=False, sort_keys=True) + "\n").encode()
                except UnicodeEncodeError:  # a lone surrogate, from a JSON \ud8xx escape
                    reasons["unencodable"] += 1
                    continue
                f.write(line)
                digest.update(line)
                docs += 1
                chars += len(record.text)
                size += len(line)
                bar.update()
                if docs == max_docs:
                    break
        finally:
            close = getattr(records, "close", None)
            if close is not None:
                close()  # releases the reader's open database or file at once
    return SourceManifest(
        name=spec.name,
        file=file_name,
        docs=docs,
        skipped=sum(reasons.values()),
        skip_reasons=dict(sorted(reasons.items())),
        bytes=size,
        chars=chars,
        sha256=digest.hexdigest(),
        package=origin.package,
        version=origin.version,
        licence=spec.licence,
        package_licence=origin.package_licence,
        description=spec.description,
    )


def build_corpus(
    out_dir: str | os.PathLike[str],
    *,
    sources: Sequence[str] | None = None,
    max_docs_per_source: int | None = None,
) -> CorpusManifest:
    """Write the bundled corpus of real text to ``out_dir``.

    Writes ``<out_dir>/<source>.jsonl`` for each source, one ``{"text", "source", ...meta}``
    object per line, and ``<out_dir>/manifest.json``. Files of sources not built this time are
    left alone, but the manifest lists only the sources built.

    Args:
        out_dir: Output directory, created when missing.
        sources: Source names to build (see ``DEFAULT_SOURCES``); all when ``None``. Always
            built and listed in canonical order.
        max_docs_per_source: Keep only the first N documents of each source (in its sorted
            order); ``skipped`` then counts only the records read before stopping.

    Returns:
        The manifest, as written to ``manifest.json``.

    Raises:
        CorpusError: An unknown source name or a limit below 1.
        MissingDependencyError: A source's package is not installed; raised before any file is
            written, and naming the install command.
    """
    if max_docs_per_source is not None and (
        isinstance(max_docs_per_source, bool)
        or not isinstance(max_docs_per_source, int)
        or max_docs_per_source < 1
    ):
        raise CorpusError(
            f"max_docs_per_source must be a positive integer or None, not {max_docs_per_source!r}"
        )
    specs = resolve_sources(sources)
    origins = {spec.name: spec.origin() for spec in specs}  # every package checked up front
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    entries = tuple(
        _write_source(out, spec, origins[spec.name], max_docs_per_source) for spec in specs
    )
    manifest = CorpusManifest(sources=entries, max_docs_per_source=max_docs_per_source)
    with atomic_writer(out / MANIFEST_NAME) as f:
        f.write(manifest.dumps().encode())
    return manifest
