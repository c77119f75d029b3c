"""``tokenloom tokenize`` and ``tokenloom tokenizer train``."""

from __future__ import annotations

import click

from tokenloom.cli.options import (
    emit_json,
    filter_option,
    json_option,
    storage_options_option,
    table_option,
    version_option,
    workers_option,
)

__all__ = ["commands"]


@click.command(
    "tokenize",
    epilog="""\b
Examples:
  tokenloom tokenize --table corpus.lance --tokenizer gpt2
  tokenloom tokenize --table corpus.lance --tokenizer bpe16k/ --column input_ids_bpe16k
  tokenloom tokenize --table corpus.lance --tokenizer tiktoken:/path/r50k_base.tiktoken
  tokenloom tokenize --table s3://bucket/corpus.lance --tokenizer gpt2 --layout bytes
  tokenloom tokenize --table img.lance --tokenizer gpt2 --text-column prompt --column prompt_ids

\b
SPEC: gpt2 (offline, from the openai-whisper package), a tokenizer.json file,
a Hugging Face tokenizer directory, or tiktoken:NAME / tiktoken:FILE.
Adds COLUMN (list<uint16> when the vocabulary fits, else list<int32>; with
--layout bytes the same ids as raw bytes, one value per row) and its
count column (input_ids -> n_tokens), with the tokenizer identity pinned in
the column's metadata. A sample of rows is checked for
decode(encode(text)) == text before anything is committed: a lossy
tokenizer (lower-casing, unknown tokens) is refused, exit status 1,
unless --allow-lossy.""",
)
@table_option
@storage_options_option
@click.option("--tokenizer", "spec", required=True, metavar="SPEC", help="Which tokenizer.")
@click.option("--column", default="input_ids", show_default=True, help="The token ids column.")
@workers_option
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Encoding threads per worker.",
)
@click.option(
    "--roundtrip-sample",
    type=click.IntRange(min=0),
    default=256,
    show_default=True,
    help="Rows checked for decode(encode(text)) == text (a failure refuses the commit).",
)
@click.option(
    "--allow-lossy",
    is_flag=True,
    help="Commit the column even if sampled rows do not decode back to their text.",
)
@click.option(
    "--layout",
    type=click.Choice(["list", "bytes"]),
    default=None,
    help="How the ids are stored: list (list<uint16|int32>) or bytes (raw ids, one large_binary "
    "value per row: random reads from an object store fetch ~1.5x the bytes used, not ~4.4x). "
    "Default: the existing column's layout, else list.",
)
@click.option(
    "--boundaries",
    is_flag=True,
    help="Also add the line-break offsets (cut_points) that windows may end at.",
)
@click.option(
    "--structure",
    is_flag=True,
    help="Also add ranked structure boundaries (cut_structure: sections, paragraphs, lines; "
    "never inside a fenced code block) for --long-docs window/units --cut-column cut_structure.",
)
@click.option(
    "--text-column",
    default="text",
    show_default=True,
    help="The text column encoded (e.g. --text-column prompt --column prompt_ids for the "
    "image+text loader); --structure reads it too.",
)
@json_option
def tokenize(
    table: str,
    storage_options: dict,
    spec: str,
    column: str,
    workers: int | None,
    threads: int,
    roundtrip_sample: int,
    allow_lossy: bool,
    layout: str | None,
    boundaries: bool,
    structure: bool,
    text_column: str,
    as_json: bool,
) -> None:
    """Tokenize the text column into token ids and counts (a backfill)."""
    from tokenloom.tokenize.column import tokenize_table

    res = tokenize_table(
        table,
        spec,
        column=column,
        workers=workers,
        threads=threads,
        roundtrip_sample=roundtrip_sample,
        storage_options=storage_options,
        allow_lossy=allow_lossy,
        layout=layout,
        text_column=text_column,
    )
    cuts = None
    if boundaries:
        from tokenloom.tokenize.boundaries import add_boundaries, boundaries_column_for

        added = add_boundaries(table, column, workers=workers, storage_options=storage_options)
        cuts = {"column": boundaries_column_for(column), "version": added.version}
    ranked = None
    if structure:
        from tokenloom.tokenize.structure import add_structure, structure_column_for

        added = add_structure(
            table,
            column,
            text_column=text_column,
            workers=workers,
            storage_options=storage_options,
        )
        ranked = {"column": structure_column_for(column), "version": added.version}
    if as_json:
        extra = {"boundaries": cuts, "structure": ranked}
        emit_json({**res.to_json(), **{k: v for k, v in extra.items() if v}})
        return
    tok = res.tokenizer
    if res.version is None:
        click.echo(f"{column}: every row is already tokenized with {tok['name']}")
    else:
        click.echo(
            f"{column} + {res.count_column}: {res.rows:,} rows, {tok['name']} "
            f"(vocab {tok['vocab_size']:,}, eos {tok['eos_id']}) -> version {res.version}; "
            f"{res.tokens:,} tokens in the column, {res.bytes_added / 1e6:,.1f} MB added, "
            f"{res.tokens_per_second:,.0f} tokens/s"
        )
    if cuts:
        click.echo(f"{cuts['column']}: line-break offsets -> version {cuts['version']}")
    if ranked:
        click.echo(
            f"{ranked['column']}: section/paragraph/line offsets -> version {ranked['version']}"
        )
    bad = res.roundtrip_failed
    click.echo(
        f"round-trip: {res.roundtrip_checked - bad}/{res.roundtrip_checked} sampled rows "
        "decode back to their text"
    )
    for f in res.roundtrip_failures[:5]:
        click.echo(f"  row {f['id']}: at char {f['position']}: {f['expected']!r} -> {f['got']!r}")


@click.group(
    "tokenizer",
    epilog="""\b
Examples:
  tokenloom tokenizer train --table corpus.lance --vocab-size 16384 --out bpe16k/
  tokenloom tokenize --table corpus.lance --tokenizer bpe16k/ --column input_ids_bpe16k""",
)
def tokenizer() -> None:
    """Tokenizers: train your own byte-level BPE on the table."""


@tokenizer.command(
    "train",
    epilog="""\b
Examples:
  tokenloom tokenizer train --table corpus.lance --vocab-size 16384 --out bpe16k/
  tokenloom tokenizer train --table corpus.lance --vocab-size 8000 --out bpe8k/ \\
      --filter "NOT is_dup AND id % 100 != 0"
  tokenloom tokenize --table corpus.lance --tokenizer bpe16k/ --column input_ids_bpe16k""",
)
@table_option
@storage_options_option
@click.option("--vocab-size", type=click.IntRange(min=260), required=True)
@click.option("--out", "out_dir", required=True, metavar="DIR", help="Where tokenizer.json goes.")
@filter_option("Train on these rows only.")
@version_option()
@click.option("--min-frequency", type=click.IntRange(min=1), default=2, show_default=True)
@json_option
def train(
    table: str,
    storage_options: dict,
    vocab_size: int,
    out_dir: str,
    filter: str | None,
    table_version: int | None,
    min_frequency: int,
    as_json: bool,
) -> None:
    """Train a byte-level BPE on the table's text (streamed, in id order)."""
    from tokenloom.table import Table
    from tokenloom.table.filters import validate_filter
    from tokenloom.tokenize import train_bpe

    ds = Table.open(table, version=table_version, storage_options=storage_options).dataset
    filter = validate_filter(ds, filter)

    def texts():
        for batch in ds.to_batches(columns=["text"], filter=filter, batch_size=1024):
            yield from batch.column(0).to_pylist()

    tok = train_bpe(texts(), vocab_size=vocab_size, out_dir=out_dir, min_frequency=min_frequency)
    if as_json:
        emit_json({"out": out_dir, **tok.identity()})
    else:
        click.echo(
            f"trained {tok.vocab_size:,}-token byte-level BPE -> {out_dir} "
            f"(eos {tok.eos_id}, pad {tok.pad_id}, hash {tok.vocab_hash[:12]})"
        )
        click.echo(
            f"next: tokenloom tokenize --table {table} --tokenizer {out_dir} --column input_ids_bpe"
        )


commands = [tokenize, tokenizer]
