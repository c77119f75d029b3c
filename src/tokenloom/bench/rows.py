"""``tokenloom bench rows``: the row loader with image decode next to other loaders of the same
images, under the benchmark protocol (:mod:`tokenloom.bench.protocol`), with a model in the loop.

Data: the bundled image+text set (:mod:`tokenloom.vision.images`) repeated ``copies`` times, each
sample numbered (``sample``). Every loader decodes each image with the same function (Pillow,
RGB, resized to :data:`~tokenloom.bench.rows_models.SIDE` pixels square) and each text to its
first :data:`~tokenloom.bench.rows_models.TEXT_LEN` bytes; only the storage and the reading
differ:

- ``tokenloom``: :class:`~tokenloom.rows.RowDataset` on the Lance table (blob column), globally
  shuffled each epoch, decode in its transform threads;
- ``tar shards``: WebDataset's layout (``NNNN.jpg`` + ``NNNN.json`` in tar files of
  ``shard_rows`` samples), read sequentially with :mod:`tarfile`, shards in a random order per
  epoch (no shuffle within a shard);
- ``parquet``: row groups in a random order per epoch, sequential within a group;
- ``mds``: MosaicML ``StreamingDataset(shuffle=True)`` over MDS shards;
- ``ray`` / ``ray-shuffle``: Ray Data ``read_lance`` -> ``randomize_block_order`` (plus a local
  shuffle buffer) or ``random_shuffle`` -> ``map_batches`` (the image blobs taken by row id,
  decoded) -> ``iter_torch_batches``;
- ``litdata``: ``optimize`` then ``StreamingDataset(shuffle=True)`` through
  ``StreamingDataLoader``;
- ``tokenloom blocks`` (``image-text`` only): :class:`~tokenloom.vision.ImageTextDataset`, the
  image+text loader itself: knapsack blocks of 256 positions (at most 8 images) planned from
  stored sizes, prompt and response ids from token columns (gpt2), images decoded and cut into
  patches in ``threads`` threads. It feeds packed blocks to a VLM, not pairs to the dual
  encoder, so it runs without the model; its samples/s counts the samples its blocks hold.

Every loader delivers exactly ``rows // B`` batches of ``B`` samples per epoch (its batches are
re-cut to ``B``, an epoch's tail under one batch dropped), so with the model in the loop every
loader trains the same model (``image``: ResNet-18; ``image-text``: a tiny CLIP-style dual
encoder, :mod:`~tokenloom.bench.rows_models`) the same number of steps. An epoch here is a real
pass over the samples: its rate is one of the protocol's epochs, and the sample ids of the first
two epochs give the shuffle figures. Each loader and batch size runs in its own process
(``python -m tokenloom.bench.rows --case ...``), its CPU and memory sampled over time.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import numpy as np

__all__ = ["prepare", "run_case", "run_rows_bench", "format_report", "CASES", "WORKLOADS"]

CASES = (
    "tokenloom",
    "tokenloom blocks",
    "tar shards",
    "parquet",
    "mds",
    "ray",
    "ray-shuffle",
    "litdata",
)
"""Every loader ``bench rows`` knows, in the order they are measured."""
WORKLOADS = ("image", "image-text")
_COLUMNS = ["sample", "image", "prompt", "response"]


def prepare(folder: str, *, copies: int, shard_rows: int = 256) -> dict[str, str]:
    """Write the same numbered samples as a Lance table, tar shards, Parquet, MDS and a litdata
    copy (the last two when their packages import)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tokenloom.ingest import ingest
    from tokenloom.vision.images import build_image_set

    base = pq.read_table(build_image_set(os.path.join(folder, "src"), max_side=256))
    table = pa.concat_tables([base] * copies)
    rows = table.num_rows
    table = table.append_column("sample", pa.array(np.arange(rows, dtype=np.int64)))
    parquet = os.path.join(folder, "images.parquet")
    pq.write_table(table, parquet, row_group_size=shard_rows)
    lance_uri = os.path.join(folder, "images.lance")
    ingest([parquet], lance_uri, columns="sample:int,prompt,response,width,height", progress=False)
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
                    info = tarfile.TarInfo(f"{i:08d}.{suffix}")  # the name is the sample
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    out = {"lance": lance_uri, "parquet": parquet, "tar": shards, "rows": str(rows)}
    prompts = table.column("prompt").to_pylist()
    responses = table.column("response").to_pylist()
    try:
        from tokenloom.bench.loader_mds import import_streaming

        import_streaming()  # its package __init__ needs torchvision; the MDS writer does not
        from streaming.base.format.mds.writer import MDSWriter

        mds = os.path.join(folder, "mds")
        cols = {"sample": "int64", "image": "bytes", "prompt": "str", "response": "str"}
        with MDSWriter(out=mds, columns=cols, size_limit=1 << 26) as w:
            for i in range(rows):
                w.write(
                    {"sample": i, "image": images[i], "prompt": prompts[i],
                     "response": responses[i]}
                )  # fmt: skip
        out["mds"] = mds
    except Exception as exc:  # noqa: BLE001 - the case is reported as skipped, with why
        out["mds skipped"] = f"{type(exc).__name__}: {exc}"
    try:
        import litdata

        lit = os.path.join(folder, "litdata")
        litdata.optimize(
            fn=_lit_sample,
            inputs=[(i, images[i], prompts[i], responses[i]) for i in range(rows)],
            output_dir=lit,
            chunk_bytes="8MB",
            num_workers=1,
            mode="overwrite",
            verbose=False,
            start_method="spawn",
        )
        out["litdata"] = lit
    except Exception as exc:  # noqa: BLE001 - the case is reported as skipped, with why
        out["litdata skipped"] = f"{type(exc).__name__}: {exc}"
    return out


def _lit_sample(item: tuple) -> Iterator[dict]:
    """litdata ``optimize``'s ``fn``: one sample as it is stored."""
    i, image, prompt, response = item
    yield {"sample": i, "image": image, "prompt": prompt, "response": response}


def decode(image: bytes, prompt: str, response: str) -> tuple[np.ndarray, np.ndarray]:
    """One sample as every loader delivers it: ``(3, S, S)`` uint8 pixels (RGB, resized) and
    the first ``TEXT_LEN`` bytes of prompt, newline, response (``int64``, 0-padded)."""
    from PIL import Image

    from tokenloom.bench.rows_models import SIDE, TEXT_LEN

    with Image.open(io.BytesIO(image)) as im:
        pixels = np.asarray(im.convert("RGB").resize((SIDE, SIDE)), dtype=np.uint8)
    text = np.zeros(TEXT_LEN, dtype=np.int64)
    raw = np.frombuffer(f"{prompt}\n{response}".encode()[:TEXT_LEN], dtype=np.uint8)
    text[: raw.shape[0]] = raw
    return pixels.transpose(2, 0, 1), text


def decode_columns(samples: list, images: list, prompts: list, responses: list) -> dict:
    """Decode parallel column lists into one batch dict (``sample``, ``image``, ``text``)."""
    out = [decode(i, p, r) for i, p, r in zip(images, prompts, responses, strict=True)]
    return {
        "sample": np.asarray(samples, dtype=np.int64),
        "image": np.stack([o[0] for o in out]),
        "text": np.stack([o[1] for o in out]),
    }


def _decoded_in_threads(items: Iterator[tuple], batch: int, threads: int) -> Iterator[dict]:
    """``(sample, image, prompt, response)`` items -> decoded batches, ``threads`` decoding."""
    with ThreadPoolExecutor(threads) as pool:
        while True:
            chunk = [x for _, x in zip(range(batch), items, strict=False)]
            if not chunk:
                return
            parts = max(1, min(threads, len(chunk)))
            cut = [chunk[k::parts] for k in range(parts)]
            done = list(pool.map(lambda c: decode_columns(*map(list, zip(*c, strict=True))), cut))
            yield {k: np.concatenate([d[k] for d in done]) for k in done[0]}


def _tar_items(paths: dict, epoch: int) -> Iterator[tuple]:
    names = sorted(os.listdir(paths["tar"]))
    for j in np.random.default_rng([epoch, 1]).permutation(len(names)):
        with tarfile.open(os.path.join(paths["tar"], names[j])) as tar:
            image = None
            for member in tar:
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                if member.name.endswith(".jpg"):
                    image = data
                else:
                    meta = json.loads(data)
                    yield int(member.name.split(".")[0]), image, meta["prompt"], meta["response"]


def _parquet_items(paths: dict, epoch: int) -> Iterator[tuple]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(paths["parquet"])
    for g in np.random.default_rng([epoch, 2]).permutation(pf.num_row_groups):
        t = pf.read_row_group(int(g), columns=_COLUMNS)
        yield from zip(*(t.column(c).to_pylist() for c in _COLUMNS), strict=True)


class _Source:
    """One loader: ``epoch(e)`` yields its decoded batches of epoch ``e`` (any sizes)."""

    def __init__(self, case: str, paths: dict, *, batch: int, threads: int) -> None:
        self.case, self.paths, self.batch, self.threads = case, paths, batch, threads
        self.notes = ""
        self._ray_temp: str | None = None
        self._state: dict = {}

    def epoch(self, e: int) -> Iterator[dict]:
        return getattr(self, "_" + self.case.replace(" ", "_").replace("-", "_"))(e)

    def _tokenloom(self, e: int) -> Iterator[dict]:
        from tokenloom.rows import RowDataset

        if "ds" not in self._state:

            def transform(b):  # noqa: ANN001, ANN202 - a RecordBatch in, a batch dict out
                return decode_columns(*(b.column(c).to_pylist() for c in _COLUMNS))

            self._state["ds"] = RowDataset(
                self.paths["lance"],
                columns=_COLUMNS,
                global_batch=self.batch,
                transform=transform,
                transform_threads=self.threads,
                read_batch_size=max(1, self.batch // self.threads),
                drop_last=True,
                seed=0,
            )
            self.notes = f"RowDataset, {self.threads} transform threads, global shuffle"
        ds = self._state["ds"]
        ds.set_epoch(e)
        for out in ds:
            yield {k: out[k] for k in ("sample", "image", "text")}

    def _tar_shards(self, e: int) -> Iterator[dict]:
        self.notes = f"tar shards in a random order, decode in {self.threads} threads"
        return _decoded_in_threads(_tar_items(self.paths, e), self.batch, self.threads)

    def _parquet(self, e: int) -> Iterator[dict]:
        self.notes = f"row groups in a random order, decode in {self.threads} threads"
        return _decoded_in_threads(_parquet_items(self.paths, e), self.batch, self.threads)

    def _mds(self, e: int) -> Iterator[dict]:
        if "ds" not in self._state:
            from tokenloom.bench.loader_mds import import_streaming

            import_streaming()
            from streaming.base.dataset import StreamingDataset

            self._state["ds"] = StreamingDataset(
                local=self.paths["mds"], shuffle=True, shuffle_seed=0, batch_size=self.batch
            )
            self.notes = f"StreamingDataset(shuffle=True), decode in {self.threads} threads"
        items = (
            (s["sample"], s["image"], s["prompt"], s["response"]) for s in self._state["ds"]
        )  # the dataset moves to its next epoch (reshuffled) on each new iteration
        return _decoded_in_threads(items, self.batch, self.threads)

    def _litdata(self, e: int) -> Iterator[dict]:
        if "dl" not in self._state:
            import litdata

            ds = litdata.StreamingDataset(self.paths["litdata"], shuffle=True, seed=0)
            self._state["dl"] = litdata.StreamingDataLoader(
                ds, batch_size=self.batch, num_workers=0, collate_fn=_as_list
            )
            self.notes = f"StreamingDataset(shuffle=True), decode in {self.threads} threads"
        items = (
            (s["sample"], s["image"], s["prompt"], s["response"])
            for b in self._state["dl"]
            for s in b
        )  # StreamingDataLoader moves the dataset to its next epoch on each iteration
        return _decoded_in_threads(items, self.batch, self.threads)

    def _ray(self, e: int, shuffle: str = "block") -> Iterator[dict]:
        from tokenloom.bench.loader_ray import _import_ray

        ray = _import_ray()
        if "source" not in self._state:
            import logging
            import tempfile

            self._ray_temp = tempfile.mkdtemp(prefix="tl-ray-")
            ray.init(
                num_cpus=self.threads,
                object_store_memory=512 * 2**20,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
                _temp_dir=self._ray_temp,
            )
            ray.data.DataContext.get_current().enable_progress_bars = False
            logging.getLogger("ray.data").setLevel(logging.WARNING)
            # the image is a Lance blob column: read_lance gives its (position, size), so the
            # rows come with their row ids and the decode step takes the blobs (take_blobs)
            self._state["source"] = ray.data.read_lance(
                self.paths["lance"],
                columns=["sample", "prompt", "response"],
                scanner_options={"with_row_id": True},
            )
            how = "randomize_block_order + local buffer" if shuffle == "block" else "random_shuffle"
            self.notes = f"read_lance, {how}, map_batches decode, {self.threads} CPUs"
        src = self._state["source"]
        ds = src.randomize_block_order(seed=e) if shuffle == "block" else src.random_shuffle(seed=e)
        ds = ds.map_batches(
            _ray_decode,
            batch_format="pyarrow",
            batch_size=max(self.batch, 16),
            fn_kwargs={"uri": self.paths["lance"]},
        )
        local = 4 * self.batch if shuffle == "block" else None
        for b in ds.iter_torch_batches(
            batch_size=self.batch,
            drop_last=True,
            local_shuffle_buffer_size=local,
            local_shuffle_seed=e if local else None,
        ):
            yield {k: b[k].numpy() for k in ("sample", "image", "text")}

    def _ray_shuffle(self, e: int) -> Iterator[dict]:
        return self._ray(e, shuffle="global")

    def close(self) -> None:
        if self._ray_temp is not None:
            import shutil

            import ray

            ray.shutdown()
            shutil.rmtree(self._ray_temp, ignore_errors=True)


def _as_list(samples: list) -> list:
    """litdata's collate: the samples as they are (decoded after)."""
    return samples


_LANCE: dict = {}


def _ray_decode(table, uri: str) -> dict:  # noqa: ANN001 - a pyarrow Table from Ray
    """Ray's ``map_batches`` step: take the rows' image blobs, then decode as every loader."""
    import lance

    if uri not in _LANCE:  # one open dataset per Ray worker process
        _LANCE[uri] = lance.dataset(uri)
    blobs = _LANCE[uri].take_blobs("image", ids=table.column("_rowid").to_pylist())
    images = [b.readall() for b in blobs]
    cols = [table.column(c).to_pylist() for c in ("sample", "prompt", "response")]
    return decode_columns(cols[0], images, cols[1], cols[2])


def _exact_batches(batches: Iterator[dict], size: int, limit: int) -> Iterator[dict]:
    """Re-cut ``batches`` into ``limit`` batches of exactly ``size`` rows (the tail dropped)."""
    held: list[dict] = []
    rows = done = 0
    for b in batches:
        if done >= limit:
            break
        held.append(b)
        rows += len(b["sample"])
        while rows >= size and done < limit:
            joined = {k: np.concatenate([h[k] for h in held]) for k in held[0]}
            yield {k: v[:size] for k, v in joined.items()}
            rest = {k: v[size:] for k, v in joined.items()}
            held, rows, done = [rest], rows - size, done + 1


def run_case(
    case: str,
    paths: dict,
    *,
    workload: str,
    threads: int,
    batch: int,
    epochs: int = 1,
    model: bool = False,
) -> dict:
    """One loader at one batch size in this process, ``epochs`` passes over the samples.

    Returns:
        Per epoch: samples/s, data stall % (with the model: waiting for data / wall), the
        sample ids delivered (``ids``, per batch); the first-batch latency and the model's name.
    """
    if case == "tokenloom blocks":
        return _run_blocks(paths, threads=threads, batch=batch, epochs=epochs)
    step: Callable[[dict], float] | None = None
    model_name = ""
    if model:
        from tokenloom.bench.rows_models import build_step

        step, model_name = build_step(workload)
    rows = int(paths["rows"])
    per_epoch = rows // batch
    if per_epoch < 1:
        raise ValueError(f"batch {batch} is larger than the {rows} samples; lower --batch-sizes")
    started = time.perf_counter()
    source = _Source(case, paths, batch=batch, threads=threads)
    first_s: float | None = None
    epochs_out, losses = [], []
    try:
        for e in range(epochs):
            ids: list[list[int]] = []
            wait = 0.0
            t0 = time.perf_counter()
            it = _exact_batches(source.epoch(e), batch, per_epoch)
            while True:
                a = time.perf_counter()
                b = next(it, None)
                if b is None:
                    break
                if first_s is None:
                    first_s = time.perf_counter() - started
                    t0 = time.perf_counter()  # epoch 0 counts from its first batch
                else:
                    wait += time.perf_counter() - a
                ids.append(b["sample"].tolist())
                if step is not None:
                    losses.append(step(b))
            wall = time.perf_counter() - t0
            n = len(ids) * batch
            epochs_out.append(
                {
                    "samples": n,
                    "seconds": wall,
                    "samples_per_s": (n - (batch if e == 0 else 0)) / wall if wall > 0 else 0.0,
                    "stall_pct": 100.0 * wait / wall if wall > 0 else 0.0,
                    "ids": ids,
                }
            )
    finally:
        source.close()
    return {
        "case": case,
        "batch_size": batch,
        "first_batch_s": first_s,
        "epochs": epochs_out,
        "model": model_name,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "notes": source.notes,
    }


def _run_blocks(paths: dict, *, threads: int, batch: int, epochs: int) -> dict:
    """``tokenloom blocks``: the image+text loader's packed blocks, ``epochs`` passes, without
    a model (its blocks are a VLM's input); a block's samples are its "ids"."""
    from tokenloom.vision import ImageTextDataset, ImageTextSpec

    spec = ImageTextSpec(table=paths["lance"], budget=256, image_cap=8,
                         global_batch=max(1, batch // 8), patch=16, max_side=64)  # fmt: skip
    ds = ImageTextDataset(spec, threads=threads)
    started = time.perf_counter()
    first_s: float | None = None
    epochs_out = []
    for e in range(epochs):
        ds.set_epoch(e)
        ids: list[list[int]] = []
        t0 = time.perf_counter()
        n = skip = 0
        for out in ds:
            got = int(out["counts"]["samples"])
            if first_s is None:
                first_s = time.perf_counter() - started
                t0, skip = time.perf_counter(), got  # epoch 0 counts from its first batch
            n += got
            ids.append([int(i) for r in out["row_ids"] for i in r])
        wall = time.perf_counter() - t0
        epochs_out.append(
            {
                "samples": n,
                "seconds": wall,
                "samples_per_s": (n - (skip if e == 0 else 0)) / wall if wall > 0 else 0.0,
                "stall_pct": 0.0,
                "ids": ids,
            }
        )
    led = ds.plan_ledger(0)
    return {
        "case": "tokenloom blocks",
        "batch_size": batch,
        "first_batch_s": first_s,
        "epochs": epochs_out,
        "model": "",
        "loss_first": None,
        "loss_last": None,
        "notes": f"ImageTextDataset, knapsack blocks of 256 positions, {spec.global_batch} per "
        f"step, padding {led['padding_share']:.1%}, no model (a VLM's input)",
    }


def _child(case: str, args: dict, timeout_s: float) -> tuple[dict, list[dict]]:
    """Run one case in its own process, its process tree sampled over time."""
    from tokenloom.bench.loader_rss import TreeSampler

    cmd = [sys.executable, "-m", "tokenloom.bench.rows", "--case", case, json.dumps(args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with TreeSampler(proc.pid) as sampler:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err = f"stopped: no result within {timeout_s:.0f}s"
    series = [asdict(p) for p in sampler.series]
    peak = {"peak_rss_mb": sampler.peak_rss / 2**20, "peak_pss_mb": None}
    if sampler.peak_pss is not None:
        peak["peak_pss_mb"] = sampler.peak_pss / 2**20
    if proc.returncode:
        tail = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or ["no output"]
        return {"case": case, "batch_size": args["batch"], "error": tail[0], **peak}, series
    return {**json.loads(out.strip().splitlines()[-1]), **peak}, series


def run_rows_bench(
    folder: str,
    *,
    workload: str = "image",
    copies: int = 10,
    threads: int = 2,
    batch_sizes: tuple[int, ...] = (32,),
    epochs: int = 1,
    model: bool = False,
    only: tuple[str, ...] = CASES,
    shard_rows: int = 64,
    timeout_s: float = 1800.0,
    log: Callable[[str], None] = lambda _msg: None,
) -> tuple[list, dict, dict]:
    """Prepare the data once, run every loader at every batch size in its own process.

    Returns:
        The protocol's rows (:class:`~tokenloom.bench.protocol.ProtocolRow`, with the shuffle
        figures of each loader's first two epochs), each loader's usage series by batch size,
        and what the run used (``rows``, the ``model``'s name, each loader's ``notes``).
    """
    from tokenloom.bench.loader_shuffle import shuffle_figures
    from tokenloom.bench.protocol import ProtocolRow, usage_summary

    log(f"preparing {copies} copies of the bundled image set ...")
    paths = prepare(folder, copies=copies, shard_rows=shard_rows)
    rows_n = int(paths["rows"])
    out, series = [], {}
    meta: dict = {"rows": rows_n, "model": "", "notes": {}}
    for case in only:
        if case == "tokenloom blocks" and workload != "image-text":
            continue
        for size in batch_sizes:
            skipped = paths.get(f"{case.split('-')[0]} skipped")
            log(f"{case}, B={size} ...")
            if skipped:
                report, points = {"error": f"skipped: {skipped}"}, []
            else:
                args = {"paths": paths, "workload": workload, "threads": threads, "batch": size}
                args.update(epochs=epochs, model=model)
                report, points = _child(case, args, timeout_s)
            row = ProtocolRow(workload=workload, loader=case, batch_size=size)
            usage = usage_summary(points)
            row.cpu_mean_pct = usage["cpu_mean_pct"]
            row.peak_rss_mb, row.peak_pss_mb = report.get("peak_rss_mb"), report.get("peak_pss_mb")
            row.error = report.get("error")
            if not row.error:
                ep = report["epochs"]
                row.first_batch_s = report["first_batch_s"]
                row.samples_per_s = [x["samples_per_s"] for x in ep]
                if model:
                    row.stall_pct = [x["stall_pct"] for x in ep]
                    row.model_samples_per_s = list(row.samples_per_s)
                if len(ep) >= 2 and ep[0]["ids"] and ep[1]["ids"]:
                    q = shuffle_figures(
                        [np.asarray(b) for x in ep[:2] for b in x["ids"]],
                        rows_n,
                        shard_docs=shard_rows,
                    )
                    row.movement, row.batch_shards = q.movement, q.batch_shards
                    row.batch_shards_uniform = q.batch_shards_uniform
                log(f"  {row.rate.cell(1) if row.rate else 'n/a'} samples/s")
            else:
                log(f"  FAILED: {row.error}")
            out.append(row)
            series.setdefault(case, {})[size] = points
            meta["model"] = meta["model"] or report.get("model", "")
            meta["notes"][case] = report.get("notes", "")
    return out, series, meta


def format_report(rows: list, workload: str) -> str:
    """The protocol's table of a ``bench rows`` run (Markdown)."""
    from tokenloom.bench.protocol_output import markdown_table

    return markdown_table(rows, header=f"bench rows, workload {workload}")


if __name__ == "__main__":  # one loader at one batch size, in its own process
    if len(sys.argv) != 4 or sys.argv[1] != "--case":
        raise SystemExit("usage: python -m tokenloom.bench.rows --case NAME JSON")
    args = json.loads(sys.argv[3])
    report = run_case(
        sys.argv[2],
        args["paths"],
        workload=args["workload"],
        threads=args["threads"],
        batch=args["batch"],
        epochs=args.get("epochs", 1),
        model=args.get("model", False),
    )
    print(json.dumps(report))
    sys.stdout.flush()
    os._exit(0)  # a library's exit hook (Ray's) must not hang or fail the finished case
