"""``tokenloom bench rows``: the row loader with image decode next to other formats of the same
images, as ratios measured side by side in one run.

Data: the bundled image+text set (:mod:`tokenloom.vision.images`) repeated ``copies`` times.
Every contender decodes every image with the same function (Pillow, resize to the patch grid,
patchify) in ``threads`` threads and, for ``image-text``, encodes prompt and response; only the
storage and the reading differ:

- ``tokenloom``: :class:`~tokenloom.rows.RowDataset` on the Lance table (blob column), globally
  shuffled, chunks read by stable row id;
- ``tokenloom blocks`` (``image-text`` only): :class:`~tokenloom.vision.ImageTextDataset`, the
  image+text loader itself: knapsack blocks of 256 positions (at most 8 images) planned from
  stored sizes, prompt and response ids from token columns (gpt2, so its text tokens are not
  the others' UTF-8 bytes: compare samples/s), images decoded in ``threads`` threads;
- ``tar shards``: WebDataset's layout (``NNNN.jpg`` + ``NNNN.txt`` in tar files of
  ``shard_rows`` samples), read sequentially with :mod:`tarfile`, shards in shuffled order (no
  shuffle within a shard);
- ``parquet``: row groups in shuffled order, sequential within a group;
- ``mds``: MosaicML MDS shards when ``mosaicml-streaming`` is installed
  (``pip install --no-deps -r requirements/bench.txt``), else reported as skipped.

Each contender runs in its own process (``python -m tokenloom.bench.rows --case ...``), so the
peak RSS it reports (``ru_maxrss``) is its own.
"""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["prepare", "run_rows_bench", "CASES"]

CASES = ("tokenloom", "tokenloom blocks", "tar shards", "parquet", "mds")
_GRID = (16, 64)  # patch, max side


def prepare(folder: str, *, copies: int, shard_rows: int = 256) -> dict[str, str]:
    """Write the same samples as a Lance table, tar shards, Parquet (and MDS if available)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tokenloom.ingest import ingest
    from tokenloom.vision.images import build_image_set

    base = pq.read_table(build_image_set(os.path.join(folder, "src"), max_side=256))
    table = pa.concat_tables([base] * copies)
    rows = table.num_rows
    parquet = os.path.join(folder, "images.parquet")
    pq.write_table(table, parquet, row_group_size=shard_rows)
    lance_uri = os.path.join(folder, "images.lance")
    ingest([parquet], lance_uri, columns="prompt,response,width,height", progress=False)
    from tokenloom.tokenize.column import tokenize_table

    for text in ("prompt", "response"):  # the image+text loader reads token columns
        tokenize_table(lance_uri, "gpt2", column=f"{text}_ids", text_column=text, workers=0,
                       roundtrip_sample=0, progress=False)  # fmt: skip
    shards = os.path.join(folder, "tar")
    os.makedirs(shards, exist_ok=True)
    images = table.column("image").to_pylist()
    texts = [
        json.dumps({"prompt": p, "response": r})
        for p, r in zip(
            table.column("prompt").to_pylist(), table.column("response").to_pylist(), strict=True
        )
    ]
    for s in range(0, rows, shard_rows):
        with tarfile.open(os.path.join(shards, f"shard-{s // shard_rows:05d}.tar"), "w") as tar:
            for i in range(s, min(s + shard_rows, rows)):
                for suffix, data in (("jpg", images[i]), ("json", texts[i].encode())):
                    info = tarfile.TarInfo(f"{i:08d}.{suffix}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    out = {"lance": lance_uri, "parquet": parquet, "tar": shards, "rows": str(rows)}
    try:
        from streaming import MDSWriter  # type: ignore[import-not-found]

        mds = os.path.join(folder, "mds")
        cols = {"image": "bytes", "prompt": "str", "response": "str"}
        with MDSWriter(out=mds, columns=cols, size_limit=1 << 26) as w:
            for i in range(rows):
                p, r = json.loads(texts[i]).values()
                w.write({"image": images[i], "prompt": p, "response": r})
        out["mds"] = mds
    except ImportError:
        pass
    return out


def _decode(item: tuple[bytes, str, str], text: bool) -> int:
    """Decode one sample; return its tokens (patches, plus prompt/response bytes + EOS)."""
    from tokenloom.vision.patches import PatchGrid, decode_image, patchify

    grid = PatchGrid(patch=_GRID[0], max_side=_GRID[1])
    data, prompt, response = item
    n = len(patchify(decode_image(data, grid), grid.patch))
    if text:
        n += len(prompt.encode()) + len(response.encode()) + 1
    return n


def _samples(case: str, paths: dict, seed: int) -> Iterator[tuple[bytes, str, str]]:
    rng = np.random.default_rng(seed)
    if case == "tar shards":
        names = sorted(os.listdir(paths["tar"]))
        for j in rng.permutation(len(names)):
            with tarfile.open(os.path.join(paths["tar"], names[j])) as tar:
                image = None
                for member in tar:
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    if member.name.endswith(".jpg"):
                        image = data
                    else:
                        meta = json.loads(data)
                        yield image, meta["prompt"], meta["response"]  # type: ignore[misc]
    elif case == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(paths["parquet"])
        for g in rng.permutation(pf.num_row_groups):
            t = pf.read_row_group(int(g), columns=["image", "prompt", "response"])
            yield from zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True)
    elif case == "mds":
        from streaming import StreamingDataset  # type: ignore[import-not-found]

        ds = StreamingDataset(local=paths["mds"], shuffle=True, shuffle_seed=seed, batch_size=64)
        for s in ds:
            yield s["image"], s["prompt"], s["response"]
    else:
        raise ValueError(case)


def run_case(case: str, paths: dict, *, workload: str, threads: int, batch: int) -> dict:
    """One contender in this process: samples/s, tokens/s, peak RSS."""
    text = workload == "image-text"
    started = time.perf_counter()
    samples = tokens = 0
    extra: dict = {}
    first: float | None = None  # steady rates count from the first batch (imports, opening)
    if case == "tokenloom":
        from tokenloom.rows import RowDataset

        def transform(b):  # noqa: ANN001, ANN202 - a RecordBatch in, token counts out
            items = zip(*(b.column(c).to_pylist() for c in b.schema.names), strict=True)
            return {"tokens": np.array([_decode(i, text) for i in items], dtype=np.int64)}

        ds = RowDataset(
            paths["lance"],
            columns=["image", "prompt", "response"],
            global_batch=batch,
            transform=transform,
            transform_threads=threads,
            read_batch_size=max(1, batch // threads),
        )
        for out in ds:
            if first is None:
                first = time.perf_counter()
                skip_s, skip_t = len(out["row_id"]), int(out["tokens"].sum())
            samples += len(out["row_id"])
            tokens += int(out["tokens"].sum())
    elif case == "tokenloom blocks":
        from tokenloom.vision import ImageTextDataset, ImageTextSpec

        spec = ImageTextSpec(table=paths["lance"], budget=256, image_cap=8,
                             global_batch=max(1, batch // 8), patch=_GRID[0],
                             max_side=_GRID[1])  # fmt: skip
        ds = ImageTextDataset(spec, threads=threads)
        for out in ds:
            c = out["counts"]
            n, t = c["samples"], c["image_tokens"] + c["text_tokens"]
            if first is None:
                first = time.perf_counter()
                skip_s, skip_t = n, t
            samples += n
            tokens += t
        led = ds.ledger()
        extra = {"padding_share": led["padding"] / max(led["blocks"] * 256, 1)}
    else:
        with ThreadPoolExecutor(threads) as pool:
            it = _samples(case, paths, seed=0)
            while True:
                chunk = [x for _, x in zip(range(batch), it, strict=False)]
                if not chunk:
                    break
                counts = list(pool.map(lambda x: _decode(x, text), chunk))
                if first is None:
                    first = time.perf_counter()
                    skip_s, skip_t = len(counts), sum(counts)
                samples += len(counts)
                tokens += sum(counts)
    end = time.perf_counter()
    assert first is not None, "no sample was read"
    steady = max(end - first, 1e-9)
    return {
        "case": case,
        "samples": samples,
        "tokens": tokens,
        "seconds": end - started,
        "first_batch_s": first - started,
        "samples_per_s": (samples - skip_s) / steady,
        "tokens_per_s": (tokens - skip_t) / steady,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **extra,
    }


def run_rows_bench(
    folder: str, *, workload: str = "image", copies: int = 10, threads: int = 2, batch: int = 32
) -> list[dict]:
    """Prepare the data once, run every contender in its own process, return their reports."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # in a process of its own: a child keeps its parent's peak RSS across exec (ru_maxrss), so
    # what preparing (tokenizers, ingest) held would be every contender's floor
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as ex:
        paths = ex.submit(prepare, folder, copies=copies).result()
    reports = []
    for case in CASES:
        if case == "tokenloom blocks" and workload != "image-text":
            continue
        if case == "mds" and "mds" not in paths:
            reports.append({"case": case, "skipped": "mosaicml-streaming is not installed"})
            continue
        cmd = [sys.executable, "-m", "tokenloom.bench.rows", "--case", case]
        arg = json.dumps({"paths": paths, "workload": workload, "threads": threads, "batch": batch})
        proc = subprocess.run([*cmd, arg], capture_output=True, text=True, check=False)
        if proc.returncode:
            reports.append({"case": case, "skipped": proc.stderr.strip().splitlines()[-1:]})
            continue
        reports.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return reports


def format_report(reports: list[dict], workload: str) -> str:
    """A table with each contender's throughput and tokenloom's ratio to it."""
    ours = next((r for r in reports if r["case"] == "tokenloom" and "skipped" not in r), None)
    unit = "tokens/s" if workload == "image-text" else "samples/s"
    key = "tokens_per_s" if workload == "image-text" else "samples_per_s"
    lines = [
        f"{'loader':<16} {unit:>12} {'tokenloom / this':>17} {'samples/s':>10} "
        f"{'first batch':>12} {'peak RSS MB':>12}"
    ]
    for r in reports:
        if "skipped" in r:
            lines.append(f"{r['case']:<16} skipped: {r['skipped']}")
            continue
        ratio = ours[key] / r[key] if ours else float("nan")
        pad = f"  (padding {r['padding_share']:.1%})" if "padding_share" in r else ""
        lines.append(
            f"{r['case']:<16} {r[key]:>12,.0f} {ratio:>16.2f}x {r['samples_per_s']:>10,.0f} "
            f"{r['first_batch_s']:>11.2f}s {r['peak_rss_mb']:>12,.0f}{pad}"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # one contender, in its own process
    if len(sys.argv) != 4 or sys.argv[1] != "--case":
        raise SystemExit("usage: python -m tokenloom.bench.rows --case NAME JSON")
    args = json.loads(sys.argv[3])
    print(
        json.dumps(
            run_case(
                sys.argv[2],
                args["paths"],
                workload=args["workload"],
                threads=args["threads"],
                batch=args["batch"],
            )
        )
    )
