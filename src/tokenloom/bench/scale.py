"""``tokenloom bench scale``: the whole pipeline on a synthetic corpus, stage by stage.

A synthetic JSONL corpus is written (words drawn from the bundled corpus's real text by their
frequency, lognormal document lengths around ``mean_tokens``, planted exact and near copies), then
the real commands run on it, each in its own process so that its peak memory is its own:
``ingest`` → ``dedup`` → ``dedup --near`` → ``tokenize`` → ``stats``, then ``bench plan``
(every recipe, each in a fresh process, at ``plan_docs``) and ``bench loader`` (locally, or on a
local S3 server with ``store="s3"``, at ``loader_docs``).

Each stage reports wall time, CPU time (its whole process tree, reaped children included), the
peak RSS summed over the process tree (sampled by :class:`~tokenloom.bench.loader_rss.TreeSampler`),
bytes the table grew by, bytes read from disk (page-cache hits are not counted) and peak bytes per
document. Run at several sizes, each stage's peak RSS at the largest size is compared with the
smallest (goal: at most 1.5x for ten times the documents).
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tokenloom.errors import TokenloomError

__all__ = [
    "PIPELINE_STAGES",
    "STAGES",
    "RSS_GOAL",
    "SEED_000",
    "ScaleConfig",
    "StageRun",
    "ScaleBench",
    "ScaleStageError",
    "write_scale_corpus",
    "run_scale_bench",
    "format_scale_report",
]

PIPELINE_STAGES = ("ingest", "dedup", "dedup-near", "tokenize", "stats")
"""The stages run on the synthetic corpus's table, in order (each needs the ones before)."""
STAGES = (*PIPELINE_STAGES, "plan", "loader")
"""Every stage; ``plan`` and ``loader`` are ``bench plan`` / ``bench loader`` on their own
synthetic token tables (sized by ``plan_docs`` / ``loader_docs``)."""
RSS_GOAL = 1.5
"""A stage's peak RSS at the largest size over its peak at the smallest (ten times fewer docs)."""
TOKENS_PER_WORD = 1.3
"""Rough GPT-2 tokens per English word: turns ``mean_tokens`` into words to draw (the measured
tokens per document are printed after ``tokenize``)."""
SEED_000 = {
    "docs": 17_500_000,
    "tokens": 18_000_000_000,
    "table_bytes": 81_000_000_000,
}
"""What is known of seed 000's corpus (measured on its cluster): documents, tokens, and the size of
its table on the object store, streamed with a fresh global shuffle at the local rate."""

_SHARD_DOCS = 250_000  # documents per JSONL file: a corpus arrives as many files of bounded size
_CHUNK_DOCS = 16_384  # documents generated at once
_SOURCE_TEXT = ("wiki_en", "kjv")  # real English the words are drawn from


@dataclass(frozen=True, kw_only=True)
class ScaleConfig:
    """What ``tokenloom bench scale`` runs."""

    docs: tuple[int, ...] = (2_000_000,)
    """Corpus sizes (documents); the pipeline runs once per size, smallest first."""
    mean_tokens: float = 1030.0
    """Mean document length (tokens, lognormal; seed 000 has ~1,030)."""
    stages: tuple[str, ...] = STAGES
    """Stages to run, a subset of :data:`STAGES` (the pipeline stages need those before them)."""
    workers: int = 2
    """Workers of the backfills (dedup, tokenize); 0 runs them in the stage's own process."""
    tokenizer: str = "gpt2"
    """Tokenizer of the ``tokenize`` stage."""
    plan_docs: int = 17_500_000
    """Documents of the ``plan`` stage (``bench plan --recipe-docs``)."""
    loader_docs: int = 2_000_000
    """Documents of the ``loader`` stage (``bench loader --docs``)."""
    loader_seconds: float = 10.0
    """Measuring budget of each loader in the ``loader`` stage."""
    store: str = "local"
    """``local``, or ``s3``: the loader stage reads from a local S3 server (20 ms latency)."""
    workdir: str | None = None
    """Where the corpus, tables and stage outputs go [default: a temporary folder, removed]."""
    seed: int = 0
    """Seed of the lengths, words and planted copies."""

    def __post_init__(self) -> None:
        if not self.docs or min(self.docs) < 2:
            raise ValueError(f"docs must be sizes >= 2, got {self.docs}")
        unknown = sorted(set(self.stages) - set(STAGES))
        if unknown or not self.stages:
            raise ValueError(
                f"unknown stage(s) {', '.join(unknown) or '(none given)'}; "
                f"choose from {','.join(STAGES)}"
            )
        wanted = [s for s in PIPELINE_STAGES if s in self.stages]
        if wanted and wanted != list(PIPELINE_STAGES[: len(wanted)]):
            missing = [s for s in PIPELINE_STAGES[: PIPELINE_STAGES.index(wanted[-1])]]
            raise ValueError(f"{wanted[-1]} needs the stages before it: add {','.join(missing)}")
        if not math.isfinite(self.mean_tokens) or self.mean_tokens < 2:
            raise ValueError(f"mean_tokens must be a number >= 2, got {self.mean_tokens}")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")
        if self.store not in ("local", "s3"):
            raise ValueError(f"store must be local or s3, got {self.store!r}")


@dataclass(frozen=True, kw_only=True)
class StageRun:
    """One stage, measured in its own process tree."""

    stage: str
    docs: int
    """Documents the stage worked on."""
    wall_seconds: float
    cpu_seconds: float
    """User + system time of the stage's processes (all of them, reaped children included)."""
    peak_rss_bytes: int
    """Sampled peak of RSS summed over the process tree."""
    peak_processes: int
    written_bytes: int
    """Bytes the table (or the bench's work folder) grew by."""
    disk_read_bytes: int
    """Bytes read from the disk (``getrusage`` blocks in; page-cache hits are not counted)."""
    load_average: tuple[float, float, float]
    detail: dict[str, Any] = field(default_factory=dict)
    """Figures the stage's command printed (its ``--json``) worth reporting beside ours."""

    @property
    def peak_bytes_per_doc(self) -> float:
        return self.peak_rss_bytes / self.docs

    @property
    def docs_per_cpu_second(self) -> float:
        """Throughput per core: documents per CPU second."""
        return self.docs / self.cpu_seconds if self.cpu_seconds > 0 else float("inf")


@dataclass(kw_only=True)
class ScaleBench:
    """Everything one ``bench scale`` run measured."""

    config: ScaleConfig
    corpus: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Per size: documents, files, bytes and words of the synthetic corpus, and its build time."""
    runs: list[StageRun] = field(default_factory=list)

    def ratios(self) -> dict[str, tuple[int, int, float]]:
        """Per stage run at several sizes: (smallest, largest, peak RSS largest / smallest)."""
        out: dict[str, tuple[int, int, float]] = {}
        for stage in PIPELINE_STAGES:
            runs = sorted((r for r in self.runs if r.stage == stage), key=lambda r: r.docs)
            if len(runs) >= 2:
                lo, hi = runs[0], runs[-1]
                out[stage] = (lo.docs, hi.docs, hi.peak_rss_bytes / lo.peak_rss_bytes)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "seed_000": SEED_000,
            "corpus": {str(k): v for k, v in self.corpus.items()},
            "runs": [
                {
                    **asdict(r),
                    "peak_bytes_per_doc": round(r.peak_bytes_per_doc, 1),
                    "docs_per_cpu_second": round(r.docs_per_cpu_second, 1),
                }
                for r in self.runs
            ],
            "rss_ratios": {
                s: {
                    "docs": [a, b],
                    "ratio": round(x, 3),
                    "goal": RSS_GOAL,
                    "status": "PASS" if x <= RSS_GOAL else "MISS",
                }
                for s, (a, b, x) in self.ratios().items()
            },  # fmt: skip
        }


class ScaleStageError(TokenloomError):
    """A stage's command failed; the message carries its command line and its last words."""


# -- the synthetic corpus ---------------------------------------------------------------------


def _word_stream(tmp: str) -> np.ndarray:
    """The bundled corpus's words in order (repeats kept, so a uniform draw follows their
    frequencies), as a numpy array of ``str``."""
    from tokenloom.corpus import build_corpus

    build_corpus(tmp, sources=_SOURCE_TEXT)
    words: list[str] = []
    for name in _SOURCE_TEXT:
        with open(os.path.join(tmp, f"{name}.jsonl"), encoding="utf-8") as fh:
            for line in fh:
                words.extend(json.loads(line)["text"].split())
    return np.array(words)


def _scale_chunks(
    docs: int, mean_tokens: float, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(rows, source, n_words)`` a chunk at a time: each row's planted source (itself, or the
    group head it copies) and its length in words (a copy has its source's length)."""
    from tokenloom.bench.loader_data import CorpusSpec, doc_lengths
    from tokenloom.bench.near_dedup import plant_groups

    mean_words = max(mean_tokens / TOKENS_PER_WORD, 2.0)
    # The loader bench's shape (median / mean = 450 / 800), scaled to this mean.
    spec = CorpusSpec(docs=docs, seed=seed, median=mean_words * 450 / 800, mean=mean_words)
    n_words = np.maximum(doc_lengths(spec), 1)
    source, _ = plant_groups(docs, dup_fraction=0.1, max_group=1000, seed=seed)
    for lo in range(0, docs, _CHUNK_DOCS):
        hi = min(docs, lo + _CHUNK_DOCS)
        src = source[lo:hi]
        yield np.arange(lo, hi, dtype=np.int64), src, n_words[src]


def write_scale_corpus(
    out_dir: str, docs: int, *, mean_tokens: float = 1030.0, seed: int = 0
) -> dict[str, Any]:
    """Write ``docs`` synthetic documents as JSONL files of at most 250,000 documents.

    Words are drawn by frequency from real English (the bundled corpus's Wikipedia summaries and
    King James Bible), lengths are lognormal around ``mean_tokens``. About 10% of the documents
    are copies of a group head (:func:`~tokenloom.bench.near_dedup.plant_groups`): a third of
    them exact, the rest with their last word changed (near duplicates).

    Returns:
        ``{"docs", "files", "bytes", "words", "seconds"}``.
    """
    from tokenloom.bench.near_dedup import _mix

    started = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tokenloom-words-") as tmp:
        stream = _word_stream(tmp)
    n_stream = np.uint64(stream.size)
    salt = np.uint64(seed) * np.uint64(0x2545F4914F6CDD1D)
    files, total_bytes, total_words = [], 0, 0
    fh = None
    try:
        for rows, src, n_words in _scale_chunks(docs, mean_tokens, seed):
            ends = np.cumsum(n_words)
            starts = ends - n_words
            pos = np.arange(int(ends[-1]), dtype=np.uint64) - np.repeat(starts, n_words).astype(
                np.uint64
            )
            key = np.repeat(src.astype(np.uint64), n_words) * np.uint64(1 << 20) + pos
            pick = _mix(key ^ salt) % n_stream
            # Near copies (two in three copies) get their own last word.
            near = (src != rows) & (rows % 3 != 0)
            last = ends[near] - 1
            pick[last] = _mix(rows[near].astype(np.uint64) ^ ~salt) % n_stream
            words = stream[pick]
            for i, row in enumerate(rows.tolist()):
                if row % _SHARD_DOCS == 0:
                    if fh is not None:
                        fh.close()
                    path = os.path.join(out_dir, f"part-{row // _SHARD_DOCS:05d}.jsonl")
                    files.append(path)
                    fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed above/below
                text = " ".join(words[starts[i] : ends[i]].tolist())
                line = json.dumps({"text": text, "source": "scale"}, ensure_ascii=False) + "\n"
                total_bytes += fh.write(line)  # type: ignore[union-attr]
            total_words += int(ends[-1])
    finally:
        if fh is not None:
            fh.close()
    return {
        "docs": docs,
        "files": len(files),
        "bytes": total_bytes,
        "words": total_words,
        "seconds": round(time.perf_counter() - started, 1),
    }


# -- one stage in its own process ----------------------------------------------------------------


def _children_usage() -> tuple[float, int]:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime, ru.ru_inblock * 512


def _run_stage(
    stage: str, docs: int, args: Sequence[str], grows: str, log: Callable[[str], None]
) -> tuple[StageRun, dict[str, Any]]:
    """Run ``tokenloom ARGS --json`` in a subprocess; measure its process tree."""
    from tokenloom.bench.loader_rss import TreeSampler, allocated_bytes

    src_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src_root = os.path.dirname(src_root)  # the folder holding the tokenloom package
    path = os.pathsep.join(p for p in (src_root, os.environ.get("PYTHONPATH", "")) if p)
    # A plan store of the run's own: a stage builds its plan inputs (no earlier run's cache).
    plans = os.path.join(os.path.dirname(os.path.abspath(grows)), "plan-store")
    env = {**os.environ, "PYTHONPATH": path, "TOKENLOOM_QUIET": "1", "TOKENLOOM_PLAN_CACHE": plans}
    cmd = [sys.executable, "-m", "tokenloom.cli.main", *args, "--json"]
    shown = [a for a in args if not a.endswith(".jsonl")]
    files = len(args) - len(shown)
    if files:  # the corpus's files, counted rather than listed
        shown.insert(1, f"<{files} JSONL files>")
    log(f"[{stage}] {docs:,} docs: tokenloom {' '.join(shown)}")
    before = allocated_bytes(grows) if os.path.exists(grows) else 0
    cpu0, read0 = _children_usage()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    with TreeSampler(proc.pid, interval_s=0.05, refresh_s=0.25) as sampler:
        out, err = proc.communicate()
    wall = time.perf_counter() - started
    cpu1, read1 = _children_usage()
    if proc.returncode != 0:
        tail = "\n".join(err.strip().splitlines()[-8:])
        raise ScaleStageError(
            f"stage {stage} at {docs:,} docs failed with exit status {proc.returncode}: "
            f"tokenloom {' '.join(shown)}\n{tail}\n"
            "rerun that command to see the whole output"
        )
    try:
        result = json.loads(out)
    except json.JSONDecodeError:
        result = {}
    run = StageRun(
        stage=stage,
        docs=docs,
        wall_seconds=round(wall, 2),
        cpu_seconds=round(cpu1 - cpu0, 2),
        peak_rss_bytes=sampler.peak_rss,
        peak_processes=sampler.peak_processes,
        written_bytes=max(allocated_bytes(grows) - before, 0) if os.path.exists(grows) else 0,
        disk_read_bytes=read1 - read0,
        load_average=tuple(round(x, 2) for x in os.getloadavg()),  # type: ignore[arg-type]
    )
    log(
        f"[{stage}] {docs:,} docs: wall {run.wall_seconds:.1f} s, CPU {run.cpu_seconds:.1f} s, "
        f"peak RSS {_mib(run.peak_rss_bytes)} ({run.peak_processes} processes), "
        f"load {run.load_average[0]:.2f}"
    )
    return run, result


def _pipeline(
    config: ScaleConfig, docs: int, root: str, bench: ScaleBench, log: Callable[[str], None]
) -> None:
    corpus = os.path.join(root, f"corpus-{docs}")
    log(f"writing {docs:,} synthetic documents (mean ~{config.mean_tokens:g} tokens) ...")
    bench.corpus[docs] = write_scale_corpus(
        corpus, docs, mean_tokens=config.mean_tokens, seed=config.seed
    )
    files = sorted(os.path.join(corpus, f) for f in os.listdir(corpus) if f.endswith(".jsonl"))
    table = os.path.join(root, f"t-{docs}.lance")
    workers = str(config.workers)
    commands = {
        "ingest": ["ingest", *files, "--table", table],
        "dedup": ["dedup", "--table", table, "--workers", workers],
        "dedup-near": ["dedup", "--near", "--table", table, "--workers", workers],
        "tokenize": ["tokenize", "--table", table, "--tokenizer", config.tokenizer,
                     "--workers", workers],
        "stats": ["stats", "--table", table],
    }  # fmt: skip
    for stage in PIPELINE_STAGES:
        if stage not in config.stages:
            continue
        run, result = _run_stage(stage, docs, commands[stage], table, log)
        if stage == "stats":
            run = _with_detail(run, _stats_detail(result))
        bench.runs.append(run)
    shutil.rmtree(corpus, ignore_errors=True)
    shutil.rmtree(table, ignore_errors=True)


def _with_detail(run: StageRun, detail: dict[str, Any]) -> StageRun:
    return StageRun(**{**asdict(run), "detail": detail})


def _stats_detail(result: dict[str, Any]) -> dict[str, Any]:
    """Documents and tokens as ``stats --json`` counted them."""
    docs, tokens = result.get("documents"), result.get("tokens")
    if not docs or tokens is None:
        return {}
    return {"documents": docs, "tokens": tokens, "tokens/doc": round(tokens / docs, 1)}


def _plan_stage(config: ScaleConfig, root: str, log: Callable[[str], None]) -> StageRun:
    work = os.path.join(root, "plan")
    os.makedirs(work, exist_ok=True)
    args = ["bench", "plan", "--docs", "0", "--recipe-docs", str(config.plan_docs),
            "--recipes", "concat,window,best_fit,mixture,rows", "--workdir", work]  # fmt: skip
    run, result = _run_stage("plan", config.plan_docs, args, work, log)
    detail = {
        r["name"]: {
            "wall_s": round(r["seconds"], 1),
            "cpu_s": round(r["cpu_seconds"], 1),
            "peak_bytes_per_doc": round(r["peak_bytes_per_doc"], 1),
            "status": "PASS" if r["passed"] else "MISS",
        }
        for r in result.get("recipes", [])
    }
    return _with_detail(run, detail)


def _loader_stage(config: ScaleConfig, root: str, log: Callable[[str], None]) -> StageRun:
    work = os.path.join(root, "loader")
    args = ["bench", "loader", "--docs", str(config.loader_docs), "--only", "tokenloom",
            "--seconds", f"{config.loader_seconds:g}", "--workdir", work]  # fmt: skip
    if config.store == "s3":
        args += ["--store", "s3", "--latency-ms", "20"]
    run, result = _run_stage("loader", config.loader_docs, args, work, log)
    detail: dict[str, Any] = {}
    for g in result.get("goals", []):  # local: the loader bench's goals it could judge
        if g.get("value") is not None:
            detail[g["name"]] = {"value": g["value"], "status": g.get("status")}
    for r in result.get("ratios", []):  # s3: ratios against their goals
        if r.get("value") is not None:
            detail[f"{r['name']} ({r['store']})"] = {"value": r["value"], "goal": r["goal"]}
    for label, row in result.get("io", {}).items():  # s3: bytes fetched from the store
        for name, io in row.items():
            if isinstance(io, dict) and io.get("body_bytes"):
                detail[f"{name} {label} bytes fetched"] = {"value": io["body_bytes"]}
    for label, res in result.get("results", {}).items() if config.store == "s3" else ():
        for name, case in res.items():
            if isinstance(case, dict) and "tokens_per_s" in case:
                detail[f"{name} {label} tokens/s"] = {"value": case["tokens_per_s"]}
    if config.store == "local":
        for case in result.get("results", []):
            if "tokens_per_s" in case:
                detail[f"{case.get('label')} tokens/s"] = {"value": case["tokens_per_s"]}
    return _with_detail(run, detail)


def run_scale_bench(config: ScaleConfig, *, log: Callable[[str], None] = print) -> ScaleBench:
    """Run every configured stage at every size (smallest first), then the plan and loader
    stages once."""
    bench = ScaleBench(config=config)
    root = tempfile.mkdtemp(prefix="tokenloom-scale-", dir=config.workdir)
    try:
        for docs in sorted(set(config.docs)):
            if any(s in config.stages for s in PIPELINE_STAGES):
                _pipeline(config, docs, root, bench, log)
        if "plan" in config.stages:
            bench.runs.append(_plan_stage(config, root, log))
        if "loader" in config.stages:
            bench.runs.append(_loader_stage(config, root, log))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return bench


# -- the report ----------------------------------------------------------------------------------


def _num(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:,}" if isinstance(v, int) else f"{v:,.4g}"


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _seed_note(run: StageRun, bench: ScaleBench) -> str:
    """Seed 000's figure for this stage where one is known (its cluster), else ``-``."""
    per_doc_table = SEED_000["table_bytes"] / SEED_000["docs"]
    if run.stage == "ingest":
        return f"seed 000: {SEED_000['docs'] / 1e6:.1f}M docs"
    if run.stage == "tokenize":
        mean = SEED_000["tokens"] / SEED_000["docs"]
        return f"seed 000: {mean:,.0f} tok/doc, table {per_doc_table:,.0f} B/doc"
    if run.stage == "loader":
        return "seed 000: object store at the local rate (1.0x)"
    return "seed 000: -"


def format_scale_report(bench: ScaleBench) -> str:
    """Per stage and size: wall, CPU, docs per CPU second, peak RSS, B/doc, bytes written and
    read, load; then the peak RSS ratio per stage with PASS/MISS."""
    c = bench.config
    pipeline = any(s in c.stages for s in PIPELINE_STAGES)
    sizes = ", ".join(f"{d:,}" for d in sorted(set(c.docs)))
    lines = [
        f"bench scale: {sizes} docs, mean ~{c.mean_tokens:g} tokens/doc (lognormal), {c.workers} "
        "workers; every stage in its own process tree, peak RSS sampled over the tree"
        if pipeline
        else "bench scale: every stage in its own process tree, peak RSS sampled over the tree",
    ]
    if pipeline and c.mean_tokens < 200:
        lines.append(
            "  short documents: the document COUNT grows, not the bytes of text; the flatness "
            "check measures per-document memory"
        )
    for docs, meta in sorted(bench.corpus.items()):
        lines.append(
            f"  corpus {docs:,} docs: {meta['files']} JSONL files, {meta['bytes'] / 1e6:,.1f} MB, "
            f"{meta['words'] / docs:,.1f} words/doc, written in {meta['seconds']:.1f} s"
        )
    head = (
        f"  {'stage':<11}{'docs':>12}{'wall s':>9}{'CPU s':>9}{'docs/CPU-s':>12}"
        f"{'peak RSS':>12}{'B/doc':>10}{'written':>11}{'disk read':>11}  load"
    )
    lines.append(head)
    for r in bench.runs:
        lines.append(
            f"  {r.stage:<11}{r.docs:>12,}{r.wall_seconds:>9.1f}{r.cpu_seconds:>9.1f}"
            f"{r.docs_per_cpu_second:>12,.0f}{_mib(r.peak_rss_bytes):>12}"
            f"{r.peak_bytes_per_doc:>10,.0f}{r.written_bytes / 1e6:>9,.1f}MB"
            f"{r.disk_read_bytes / 1e6:>9,.1f}MB  {r.load_average[0]:.2f}"
            f"   ({_seed_note(r, bench)})"
        )
        plain = {k: v for k, v in r.detail.items() if not isinstance(v, dict)}
        if plain:
            lines.append("      " + ", ".join(f"{k} {_num(v)}" for k, v in plain.items()))
        for name, d in r.detail.items():
            if isinstance(d, dict):
                lines.append(f"      {name}: " + ", ".join(f"{k} {_num(v)}" for k, v in d.items()))
    for stage, (lo, hi, ratio) in bench.ratios().items():
        verdict = "PASS" if ratio <= RSS_GOAL else "MISS"
        lines.append(
            f"peak RSS {stage:<11} {hi:,} / {lo:,} docs: {ratio:.2f}x  (<= {RSS_GOAL}x {verdict})"
        )
    return "\n".join(lines)
