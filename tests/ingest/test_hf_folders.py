"""Hugging Face dataset folders on disk: what ``datasets.save_to_disk`` writes (Arrow IPC
streams + ``state.json``) and a Hub repository copy (``data/{split}-*.parquet``), read with
pyarrow alone; ``--split`` picks one split, a missing split is a counted rejection."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import run_cli
from tokenloom.table import Table

_FEATURES = {
    "text": {"dtype": "string", "_type": "Value"},
    "label": {"dtype": "int64", "_type": "Value"},
}


def _save_split(folder: Path, split: str, texts: list[str], shards: int) -> None:
    """One split as ``Dataset.save_to_disk`` lays it out (``datasets`` 2.x/3.x)."""
    folder.mkdir(parents=True)
    schema = pa.schema(
        [("text", pa.string()), ("label", pa.int64())],
        metadata={"huggingface": json.dumps({"info": {"features": _FEATURES}})},
    )
    names = []
    per = -(-len(texts) // shards)
    for i in range(shards):
        name = f"data-{i:05d}-of-{shards:05d}.arrow"
        part = texts[i * per : (i + 1) * per]
        table = pa.table({"text": part, "label": list(range(len(part)))}, schema=schema)
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
            for batch in table.to_batches(max_chunksize=3):
                w.write_batch(batch)
        names.append({"filename": name})
    (folder / "dataset_info.json").write_text(json.dumps({"features": _FEATURES}))
    state = {"_data_files": names, "_fingerprint": "0" * 16, "_format_columns": None,
             "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
             "_split": split}  # fmt: skip
    (folder / "state.json").write_text(json.dumps(state))


def _saved_dict(root: Path, splits: dict[str, list[str]]) -> Path:
    root.mkdir()
    (root / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
    for name, texts in splits.items():
        _save_split(root / name, name, texts, shards=2)
    return root


def _ingest(*args: str) -> dict:
    out = run_cli("ingest", *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _rows(uri: str) -> list[dict]:
    data = Table.open(uri).dataset.to_table(columns=["id", "text", "source", "meta"])
    return [{**r, "meta": json.loads(r["meta"])} for r in data.sort_by("id").to_pylist()]


def test_a_save_to_disk_folder_is_read_split_by_split(tmp_path, paragraphs):
    saved = _saved_dict(
        tmp_path / "wiki_saved", {"train": paragraphs[:10], "test": paragraphs[10:14]}
    )
    uri = str(tmp_path / "t.lance")
    res = _ingest(str(saved), "--table", uri, "--split", "train")
    assert res["rows_written"] == 10 and res["rejected"] == {}
    rows = _rows(uri)
    assert [r["text"] for r in rows] == paragraphs[:10]
    assert {r["source"] for r in rows} == {"wiki_saved"}
    assert rows[6]["meta"] == {
        "label": 1, "_file": "train/data-00001-of-00002.arrow", "_row": 1, "_split": "train",
    }  # fmt: skip
    # hf:// names the same folder; the test split is new, the train files are known already
    res = _ingest(f"hf://{saved}", "--table", uri)
    assert res["rows_written"] == 4 and len(res["skipped_files"]) == 2
    assert [r["meta"]["_split"] for r in _rows(uri)] == ["train"] * 10 + ["test"] * 4


def test_a_hub_folder_takes_splits_from_file_names(tmp_path, paragraphs):
    hub = tmp_path / "hub_copy"
    (hub / "data").mkdir(parents=True)
    (hub / ".cache" / "huggingface").mkdir(parents=True)
    (hub / ".cache" / "huggingface" / "x.parquet").write_bytes(b"not read")
    (hub / "README.md").write_text("---\nconfigs: []\n---\n")
    for name, texts in (
        ("train-00000-of-00002", paragraphs[:4]),
        ("train-00001-of-00002", paragraphs[4:7]),
        ("validation-00000-of-00001", paragraphs[7:9]),
    ):
        pq.write_table(
            pa.table({"doc": [{"text": t} for t in texts]}), hub / "data" / f"{name}.parquet"
        )
    (hub / "test.jsonl").write_text(
        "".join(json.dumps({"doc": {"text": t}}) + "\n" for t in paragraphs[9:11])
    )
    (hub / "extra.csv").write_text("text\nnot read\n")
    uri = str(tmp_path / "t.lance")
    res = _ingest(f"hf://{hub}", "--table", uri, "--text-field", "doc.text")
    assert res["rows_written"] == 11
    assert res["rejected"] == {"unsupported_format": 1}  # the csv, counted, never dropped silently
    rows = _rows(uri)
    assert [r["text"] for r in rows] == paragraphs[:11]
    assert [r["meta"]["_split"] for r in rows] == ["train"] * 7 + ["validation"] * 2 + ["test"] * 2
    assert rows[9]["meta"]["_file"] == "test.jsonl" and rows[0]["source"] == "hub_copy"


def test_a_missing_split_or_folder_is_a_counted_failure(tmp_path, paragraphs):
    saved = _saved_dict(tmp_path / "saved", {"train": paragraphs[:3]})
    uri = str(tmp_path / "t.lance")
    out = run_cli("ingest", str(saved), "--table", uri, "--split", "validation")
    assert out.returncode == 1 and "missing_split=1" in out.stderr
    logged = [json.loads(line) for line in open(next((tmp_path / "t.lance.rejects").iterdir()))]
    assert "no split 'validation' (splits: train)" in logged[0]["detail"]
    out = run_cli("ingest", f"hf://{tmp_path}/absent", "--table", uri)
    assert out.returncode == 1 and "unreadable_file=1" in out.stderr
    assert not Table.exists(uri)
