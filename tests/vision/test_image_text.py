"""The bundled image+text set end to end: ingested with a blob column through the CLI, prompt
and response tokenized by `tokenloom tokenize`, streamed by the row loader with decode in threads
and packed by ImageTextDataset with exact resume across world sizes and workers, bad images
skipped and counted, and a tiny VLM whose loss falls on CPU."""

from __future__ import annotations

import lance
import numpy as np
import pytest

from tests.vision.tables import image_table
from tokenloom.loader.plan.epoch import PlanError
from tokenloom.rows import RowDataset
from tokenloom.vision import ImageTextDataset, ImageTextSpec
from tokenloom.vision.dataset import ImageTextError
from tokenloom.vision.images import IMAGES
from tokenloom.vision.patches import ImageTransform, PatchGrid

GRID = PatchGrid(patch=16, max_side=48)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return image_table(tmp_path_factory.mktemp("img"), bad_images=2)


def spec(table: str, **kw) -> ImageTextSpec:
    base = {"budget": 128, "global_batch": 4, "max_side": 48, "on_error": "skip", "seed": 3}
    return ImageTextSpec(table=table, **{**base, **kw})


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


def _steps(table, world, rank, state=None, steps=None, **kw):
    ds = ImageTextDataset(spec(table, **kw), rank=rank, world_size=world)
    if state is not None:
        ds.load_state_dict(state)
    out = []
    for batch in ds:
        out.append(batch)
        if steps is not None and len(out) == steps:
            break
    return ds, out


def test_blocks_resume_exactly_on_other_world_sizes_and_skips_are_counted(table):
    ref, whole = _steps(table, 1, 0)
    assert len(whole) == ref.steps() >= 3
    planned = ref.plan_ledger(0)
    assert planned["dropped_samples"] == 0 and planned["samples"] > 40
    # every sample of every block is in the trace, in block order, and in the batch's row ids
    for s, batch in enumerate(whole):
        assert [t["row_ids"] for t in ref.trace(s, epoch=0)] == [
            r.tolist() for r in batch["row_ids"]
        ]
    # the two corrupt rows (stored size 0 but bytes there) are skipped, counted, padded over
    led = ref.ledger()
    held = {i for b in whole for r in b["row_ids"] for i in r.tolist()}
    assert led["skipped"] == len({54, 55} & held) == sum(led["skipped_by_reason"].values())
    assert led["samples"] + led["skipped"] == sum(len(r) for b in whole for r in b["row_ids"])
    assert led["padding"] + led["image_tokens"] + led["text_tokens"] == 128 * led["blocks"]
    assert led["padding"] >= planned["padding"]  # a skipped sample's positions are padding
    first, _ = _steps(table, 2, 0, steps=1)
    state = first.state_dict()
    for world in (1, 2, 4):
        parts = [_steps(table, world, r, state)[1] for r in range(world)]
        assert all(len(p) == len(whole) - 1 for p in parts)
        for s in range(len(whole) - 1):
            for key in ("input_ids", "labels", "doc_ids", "image_mask"):
                got = np.concatenate([parts[r][s][key] for r in range(world)])
                assert np.array_equal(got, whole[s + 1][key]), (world, s, key)
            got = np.concatenate([parts[r][s]["patches"] for r in range(world)])
            assert np.array_equal(got, whole[s + 1]["patches"])


def test_labels_are_response_tokens_of_the_token_columns(table):
    ds = ImageTextDataset(spec(table, on_error="raise", filter="width > 0"))
    batch = ds.build_step(0)
    tab = lance.dataset(table).to_table(columns=["id", "response_ids"]).to_pydict()
    resp = dict(zip(tab["id"], tab["response_ids"], strict=True))
    eos = ds.eos_id
    for b, rows in enumerate(batch["row_ids"]):
        want = [t for i in rows.tolist() for t in [*resp[i], eos]]
        got = batch["labels"][b][batch["labels"][b] != -100].tolist()
        assert got == want


def test_workers_split_each_step_and_deliver_the_same_stream(table):
    from tokenloom.vision import ImageTextLoader

    _, whole = _steps(table, 1, 0)
    ds = ImageTextDataset(spec(table), threads=1)
    loader = ImageTextLoader(ds, num_workers=3)  # 4 blocks over 3 workers: unequal parts
    got = list(loader)
    assert len(got) == len(whole)
    for a, b in zip(got, whole, strict=True):
        assert np.array_equal(a["input_ids"], b["input_ids"])
        assert np.array_equal(a["patches"], b["patches"])
    assert ds.cursor == (1, 0) and ds.ledger()["blocks"] == 4 * len(whole)
    assert loader.worker_pool.torch_imported is False  # tokenloom's workers: no torch there


def test_refusals_name_the_fix(tmp_path, table):
    with pytest.raises(ImageTextError, match="tokenloom tokenize .*--text-column prompt"):
        ImageTextDataset(spec(table, prompt_column="prompt"))  # text, not token ids
    with pytest.raises(ImageTextError, match="no prompt token column 'prompt_tok'"):
        ImageTextDataset(spec(table, prompt_column="prompt_tok"))
    with pytest.raises(ImageTextError, match="no image_column 'picture'"):
        ImageTextDataset(spec(table, image_column="picture"))
    with pytest.raises(PlanError, match="4 blocks does not split evenly over 3 ranks"):
        ImageTextDataset(spec(table), world_size=3, rank=0)
    with pytest.raises(ImageTextError, match="fewer than one global batch of 64 with drop_last"):
        ImageTextDataset(spec(table, global_batch=64, drop_last=True)).steps()
    with pytest.raises(Exception, match="pad_to_longest is measured"):
        spec(table, policy="pad_to_longest")


def test_bad_image_raises_naming_the_row_unless_skipped(table):
    from tokenloom.rows import RowTransformError

    bad = {"filter": "width = 0", "global_batch": 1}
    ds = ImageTextDataset(spec(table, on_error="raise", **bad), threads=0)
    with pytest.raises(RowTransformError, match="row id 5[45].*SizeMismatch.*on_error='skip'"):
        ds.build_step(0)
    ds = ImageTextDataset(spec(table, **bad), threads=0)
    batch = ds.build_step(0)
    assert batch["skipped"] == {"SizeMismatch": 2} and batch["counts"]["padding"] == 128


def test_tiny_vlm_loss_falls(table):
    import torch

    from tokenloom.vision.vlm import TinyVLM, VLMConfig, train_steps

    torch.manual_seed(0)
    ds = ImageTextDataset(spec(table, budget=160))
    cfg = VLMConfig(vocab_size=ds.vocab_size, patch_dim=GRID.patch_dim, block_size=160,
                    n_layer=1, n_embd=32)  # fmt: skip
    report = train_steps(TinyVLM(cfg), ds, steps=12, lr=1e-2)
    assert np.mean(report.losses[-3:]) < report.losses[0] - 1.0
