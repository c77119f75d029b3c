"""Tokenizer figures on the bundled corpus: encode speed vs the raw library, round-trip, lengths.

``python -m tokenloom.tokenize.bench [--corpus DIR]`` prints, side by side in one run:

- tokens/s of ``Tokenizer.encode_batch`` (ids to one Arrow ``list<uint16>`` array) against the
  raw library's batch call on the same batches (tiktoken ``encode_ordinary_batch``, tokenizers
  ``encode_batch_fast``), taking turns batch by batch, best of ``--repeat``, in this process;
- the GPT-2 round-trip check over the whole corpus;
- GPT-2 length statistics at ``--seq-len``: what pad/truncate keeps against packing.

Timings on a shared machine are noisy: read the ratios, which are measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from tokenloom.tokenize.base import Tokenizer
from tokenloom.tokenize.registry import load_tokenizer

__all__ = ["read_corpus", "throughput", "main"]


def read_corpus(corpus_dir: Path) -> tuple[list[str], np.ndarray]:
    """Texts and source names of every ``*.jsonl`` of a built corpus, in sorted file order."""
    texts: list[str] = []
    sources: list[str] = []
    for path in sorted(corpus_dir.glob("*.jsonl")):
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                record = json.loads(line)
                texts.append(record["text"])
                sources.append(record["source"])
    return texts, np.array(sources)


def _batches(texts: Sequence[str], size: int) -> list[Sequence[str]]:
    return [texts[i : i + size] for i in range(0, len(texts), size)]


def throughput(
    runs: dict[str, Callable[[Sequence[str]], object]],
    batches: list[Sequence[str]],
    tokens: int,
    *,
    repeat: int,
) -> dict[str, float]:
    """Tokens/s of each run over all batches.

    The runs take turns on each batch (in rotating order), and each batch counts its best time
    over ``repeat`` rounds, so a load spike from another process on a shared machine hits all
    runs alike instead of skewing one of them.
    """
    names = list(runs)
    best = np.full((len(names), len(batches)), np.inf)
    for round_ in range(repeat):
        for b, batch in enumerate(batches):
            for k in range(len(names)):
                r = (k + round_ + b) % len(names)
                start = time.perf_counter()
                runs[names[r]](batch)
                best[r, b] = min(best[r, b], time.perf_counter() - start)
    return {name: tokens / float(best[r].sum()) for r, name in enumerate(names)}


class _Timed:
    """Stands in for a library object and adds up the seconds spent in one of its methods."""

    def __init__(self, inner: object, method: str) -> None:
        self.inner, self.method, self.seconds = inner, method, 0.0

    def __getattr__(self, name: str) -> object:
        target = getattr(self.inner, name)
        if name != self.method:
            return target

        def timed(*args: object, **kwargs: object) -> object:
            start = time.perf_counter()
            try:
                return target(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def conversion_share(tok: Tokenizer, attr: str, method: str, batches: list[Sequence[str]]) -> float:
    """Share of ``encode_batch``'s time spent outside the library's own encode call.

    Measured inside one run (the library call timed within ``encode_batch``), so unlike a
    side-by-side ratio it does not move with the load of other processes.
    """
    inner = getattr(tok, attr)
    timed = _Timed(inner, method)
    setattr(tok, attr, timed)
    try:
        start = time.perf_counter()
        for batch in batches:
            tok.encode_batch(batch)
        total = time.perf_counter() - start
    finally:
        setattr(tok, attr, inner)
    return 1.0 - timed.seconds / total


def _print_speed(title: str, rates: dict[str, float], ours: str, raw: str) -> None:
    print(f"\n{title}")
    for name, rate in rates.items():
        print(f"  {name:<44} {rate / 1e6:7.2f} M tokens/s")
    print(f"  ratio ours/raw: {rates[ours] / rates[raw]:.3f}")


def _bench_tiktoken(tok: Tokenizer, texts: list[str], args: argparse.Namespace) -> None:
    enc = tok._enc  # type: ignore[attr-defined]  # the raw tiktoken Encoding
    batches = _batches(texts, args.batch)
    tokens = int(sum(len(x) for x in enc.encode_ordinary_batch(texts)))
    for threads in sorted({1, tok.num_threads}):
        tok.num_threads = threads
        rates = throughput(
            {
                f"tiktoken encode_ordinary_batch (threads={threads})": lambda b, t=threads: (
                    enc.encode_ordinary_batch(list(b), num_threads=t)
                ),
                f"Tokenizer.encode_batch -> list<uint16> (threads={threads})": tok.encode_batch,
            },
            batches,
            tokens,
            repeat=args.repeat,
        )
        names = list(rates)
        _print_speed(f"gpt2, {len(texts):,} docs, {tokens:,} tokens", rates, names[1], names[0])
    tok.num_threads = 1
    share = conversion_share(tok, "_enc", "encode_to_numpy", batches)
    print(f"  outside tiktoken's encode_to_numpy (threads=1): {share:.1%} of encode_batch time")


def _bench_hf(tok: Tokenizer, texts: list[str], args: argparse.Namespace) -> None:
    raw = tok._tok  # type: ignore[attr-defined]  # the raw tokenizers.Tokenizer
    batches = _batches(texts, args.batch)
    tokens = int(tok.encode_batch(texts).value_lengths().to_numpy().sum())
    rates = throughput(
        {
            "tokenizers encode_batch_fast": lambda b: raw.encode_batch_fast(
                list(b), add_special_tokens=False
            ),
            "tokenizers encode_batch_fast + .ids lists": lambda b: [
                e.ids for e in raw.encode_batch_fast(list(b), add_special_tokens=False)
            ],
            "Tokenizer.encode_batch -> list<uint16>": tok.encode_batch,
        },
        batches,
        tokens,
        repeat=args.repeat,
    )
    title = f"{tok.name} (vocab {tok.vocab_size:,}), {len(texts):,} docs, {tokens:,} tokens"
    _print_speed(
        title, rates, "Tokenizer.encode_batch -> list<uint16>", "tokenizers encode_batch_fast"
    )
    share = conversion_share(tok, "_tok", "encode_batch_fast", batches)
    print(f"  outside tokenizers' encode_batch_fast: {share:.1%} of encode_batch time")


def _corpus_figures(tok: Tokenizer, texts: list[str], sources: np.ndarray, seq_len: int) -> None:
    from tokenloom.stats import length_stats
    from tokenloom.tokenize.roundtrip import roundtrip_failures

    start = time.perf_counter()
    failures = roundtrip_failures(tok, texts)
    seconds = time.perf_counter() - start
    print(
        f"\nround-trip ({tok.name}): {len(failures)} failures in {len(texts):,} docs, "
        f"{seconds:.1f} s"
    )
    for failure in failures[:5]:
        print(
            f"  doc {failure.index} @ {failure.position}: {failure.expected!r} -> {failure.got!r}"
        )
    ids = tok.encode_batch(texts)
    stats = length_stats(ids.value_lengths().to_numpy(), seq_len=seq_len, sources=sources)
    p = stats.percentiles
    print(
        f"\nlengths ({tok.name}): {stats.documents:,} docs, {stats.tokens:,} tokens, "
        f"mean {stats.mean:,.0f}; p5 {p.p5:,.0f} p25 {p.p25:,.0f} p50 {p.p50:,.0f} "
        f"p75 {p.p75:,.0f} p95 {p.p95:,.0f} p99 {p.p99:,.0f} max {p.max:,}"
    )
    print(f"  {stats.summary()}")
    for s in stats.by_source:
        print(
            f"  {s.source:<22} {s.docs:>6,} docs {s.tokens:>11,} tokens; pad/truncate keeps "
            f"{s.kept_tokens / s.tokens:6.1%}, cuts {s.truncated_docs:,} docs"
        )


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(prog="python -m tokenloom.tokenize.bench")
    parser.add_argument("--corpus", type=Path, help="a built corpus dir (default: build one)")
    parser.add_argument("--hf", help="tokenizer.json or dir to time (default: train a 32k BPE)")
    parser.add_argument("--batch", type=int, default=1024, help="texts per encode_batch call")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each batch counts its best")
    parser.add_argument("--seq-len", type=int, default=1024, help="block length for the lengths")
    parser.add_argument("--speed-only", action="store_true", help="skip round-trip and lengths")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        corpus_dir = args.corpus
        if corpus_dir is None:
            from tokenloom.corpus import build_corpus

            corpus_dir = Path(tmp) / "corpus"
            build_corpus(corpus_dir)
        texts, sources = read_corpus(corpus_dir)
        print(f"corpus: {len(texts):,} docs, {sum(map(len, texts)):,} chars from {corpus_dir}")

        gpt2 = load_tokenizer("gpt2")
        _bench_tiktoken(gpt2, texts, args)
        if args.hf:
            hf = load_tokenizer(args.hf)
        else:
            from tokenloom.tokenize.train import train_bpe

            start = time.perf_counter()
            hf = train_bpe(texts, vocab_size=32000, out_dir=Path(tmp) / "bpe32k")
            print(
                f"\ntrained a 32k byte-level BPE on the corpus in "
                f"{time.perf_counter() - start:.1f} s"
            )
        _bench_hf(hf, texts, args)
        if args.speed_only:
            return
        gpt2.num_threads = load_tokenizer("gpt2").num_threads
        _corpus_figures(gpt2, texts, sources, args.seq_len)
        _corpus_figures(hf, texts, sources, args.seq_len)


if __name__ == "__main__":
    main()
