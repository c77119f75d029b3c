"""The bundled image+text set end to end: ingested with a blob column through the CLI, streamed
with decode in threads (bad images skipped and counted), packed with exact resume across world
sizes, and a tiny VLM whose loss falls on CPU."""

from __future__ import annotations

import json

import lance
import numpy as np
import pytest
from click.testing import CliRunner

from tokenloom.cli.main import cli
from tokenloom.rows import RowDataset
from tokenloom.vision.blocks import ImageTextBlocks
from tokenloom.vision.images import IMAGES, build_image_set
from tokenloom.vision.patches import ImageTransform, PatchGrid

GRID = PatchGrid(patch=16, max_side=48)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    d = tmp_path_factory.mktemp("img")
    path = build_image_set(str(d), max_side=96, bad_images=2)
    uri = str(d / "img.lance")
    out = CliRunner().invoke(
        cli,
        ["ingest", path, "--table", uri, "--columns", "prompt,response,width,height", "--json"],
        catch_exceptions=False,
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["rows_written"] == 3 * len(IMAGES) + 2
    return uri


def test_image_is_a_blob_column_and_sizes_are_filterable(table):
    ds = lance.dataset(table)
    assert ds.schema.field("image").metadata[b"lance-encoding:blob"] == b"true"
    assert ds.count_rows("width > 0") == 3 * len(IMAGES)
    first = ds.take_blobs("image", indices=[0])[0].readall()
    assert first[:2] == b"\xff\xd8"  # a JPEG


def test_row_loader_decodes_in_threads_and_skips_bad_images(table):
    ds = RowDataset(
        table,
        columns=["image", "response"],
        global_batch=8,
        transform=ImageTransform(GRID),
        transform_threads=2,
        read_batch_size=4,
        on_error="skip",
    )
    seen = []
    for batch in ds:
        assert len(batch["patches"]) == 8
        assert [len(p) for p in batch["patches"]] == batch["n_image_tokens"].tolist()
        seen += batch["row_id"].tolist()
    assert len(seen) == 7 * 8  # 56 rows, 2 bad ones refilled: still 7 full steps
    assert dict(ds.skipped) == {"UnidentifiedImageError": ds.skipped["UnidentifiedImageError"]}
    assert ds.skipped["UnidentifiedImageError"] >= 2
    assert not {54, 55} & set(seen)  # the two corrupt rows come last in the file


def test_packed_blocks_resume_exactly_on_other_world_sizes(table):
    def run(world, rank, state=None, steps=None):
        b = ImageTextBlocks(
            table,
            budget=160,
            global_batch=4,
            grid=GRID,
            rank=rank,
            world_size=world,
            on_error="skip",
            seed=3,
        )
        if state is not None:
            b.load_state_dict(state)
        out = []
        for batch in b:
            out.append((batch["input_ids"], batch["labels"], batch["patches"]))
            if steps is not None and len(out) == steps:
                break
        return b, out

    ref, whole = run(1, 0)
    ledger = ref.ledger()
    assert ledger["padding_share"] < 0.2 and ledger["dropped_samples"] == 0
    first, _ = run(2, 0, steps=2)
    state = first.state_dict()
    for world in (1, 2, 4):
        per = 4 // world
        parts = [run(world, r, state)[1] for r in range(world)]
        for s in range(len(whole) - 2):
            ids = np.concatenate([parts[r][s][0] for r in range(world)])
            assert np.array_equal(ids, whole[s + 2][0])
            lab = np.concatenate([parts[r][s][1] for r in range(world)])
            assert np.array_equal(lab, whole[s + 2][1])
        assert all(len(p[0][0]) == per for p in parts)
    assert ref.skipped["UnidentifiedImageError"] > 0  # padded over, steps unchanged


def test_tiny_vlm_loss_falls(table):
    import torch

    from tokenloom.vision.vlm import TinyVLM, VLMConfig, train_steps

    torch.manual_seed(0)
    blocks = ImageTextBlocks(table, budget=160, global_batch=4, grid=GRID, on_error="skip")
    model = TinyVLM(VLMConfig(patch_dim=GRID.patch_dim, block_size=160, n_layer=1, n_embd=64))
    report = train_steps(model, blocks, steps=12, lr=1e-2)
    assert np.mean(report.losses[-3:]) < report.losses[0] - 1.0
