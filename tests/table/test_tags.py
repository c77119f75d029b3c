"""Versions a run needs are protected: a run's Lance tag keeps its version (and every file of it)
through Lance's ``cleanup_old_versions`` and ``tokenloom gc``; ``info`` lists the pins; the tag
names are valid and stable; a tag another run holds is never taken over."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import lance
import pytest

from tests.conftest import run_cli, write_jsonl
from tokenloom.ingest import ingest
from tokenloom.table import Table
from tokenloom.table.tags import (
    RUN_KEY,
    TagHeldError,
    pin_version,
    release_run,
    run_tag,
    table_pins,
)


@pytest.fixture
def table(tmp_path, paragraphs) -> str:
    """Two ingests (versions 2 and 3), then a compaction (the latest version) that rewrites both
    fragments into one: versions 2 and 3 read files the latest version does not."""
    uri = str(tmp_path / "t.lance")
    for i in range(2):
        write_jsonl(
            tmp_path / f"{i}.jsonl", [{"text": p} for p in paragraphs[i * 20 : i * 20 + 20]]
        )
        ingest([tmp_path / f"{i}.jsonl"], uri, progress=False)
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=1 << 20)
    assert len(lance.dataset(uri).get_fragments()) == 1
    return uri


def _files(uri: str, version: int) -> set[str]:
    ds = lance.dataset(uri, version=version)
    return {
        os.path.join(uri, "data", f.path)
        for frag in ds.get_fragments()
        for f in frag.metadata.files
    }


@pytest.mark.parametrize(
    "run",
    ["runs/tiny", "runs/a b.c..d", "runs/ünï cødé", "runs/x.lock", "runs/.hidden", "r" * 300, "/"],
)
def test_tag_names_are_valid_lance_refs_and_stable(table, tmp_path, run):
    path = str(tmp_path / run) if run != "/" else "/"
    name = run_tag(path, 2)
    assert name == run_tag(path, 2) and name != run_tag(path + "x", 2) != run_tag(path, 3)
    assert len(name) < 100 and name.endswith("-v2")
    pin = pin_version(table, 2, path)  # Lance accepts the name
    assert pin.tag == name and lance.dataset(table, version=name).version == 2


def test_pinning_is_idempotent_and_a_tag_held_elsewhere_is_refused(table, tmp_path):
    run = str(tmp_path / "runs" / "a")
    first = pin_version(table, 2, run)
    created = lance.dataset(table).tags.list()[first.tag]["created_at"]
    assert pin_version(table, 2, run) == first  # a resume: the same tag, untouched
    assert lance.dataset(table).tags.list()[first.tag]["created_at"] == created
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "last.json").write_text("{}")  # a run lives there
    lance.dataset(table).tags.replace_metadata(first.tag, {RUN_KEY: str(other)})
    with pytest.raises(TagHeldError, match=f"tokenloom runs rm {other}`"):
        pin_version(table, 2, run)
    released, kept = release_run(table, run, tags=[first.tag])
    assert released == [] and [p.run for p in kept] == [str(other)]
    assert first.tag in lance.dataset(table).tags.list()  # another run's tag stays
    (other / "last.json").unlink()  # that run moved away: the tag the record names may go
    released, kept = release_run(table, run, tags=[first.tag])
    assert [p.tag for p in released] == [first.tag] and kept == []
    assert lance.dataset(table).tags.list() == {}


def test_a_fresh_run_in_the_same_directory_releases_the_old_runs_tags(table, tmp_path):
    run = str(tmp_path / "runs" / "a")
    pin_version(table, 2, run)
    pin_version(table, 3, run, fresh=True)  # --overwrite of the run, on another version
    assert [(p.version, p.run) for p in table_pins(Table.open(table))] == [(3, run)]


def test_lance_cleanup_keeps_a_tagged_version_with_all_its_files(table, tmp_path):
    before = lance.dataset(table, version=2).to_table()
    files = _files(table, 2)
    latest = lance.dataset(table).version
    assert files and not files & _files(table, latest)  # v2's files are not the latest's
    pin_version(table, 2, str(tmp_path / "runs" / "a"))
    ds = lance.dataset(table)
    with pytest.raises((OSError, ValueError), match="(?i)tag"):  # the default refuses outright
        ds.cleanup_old_versions(older_than=timedelta(0))
    ds.cleanup_old_versions(older_than=timedelta(0), error_if_tagged_old_versions=False)
    left = [v["version"] for v in lance.dataset(table).versions()]
    assert left == [2, latest]  # the untagged old versions went; the tagged v2 stayed
    assert all(os.path.exists(f) for f in files)
    assert lance.dataset(table, version=2).to_table().equals(before)


def test_gc_keeps_every_file_of_a_tagged_version_and_info_lists_the_pins(table, tmp_path):
    run = str(tmp_path / "runs" / "a")
    tag = pin_version(table, 2, run).tag
    lance.dataset(table).cleanup_old_versions(
        older_than=timedelta(0), error_if_tagged_old_versions=False
    )
    files = _files(table, 2)
    orphan = os.path.join(table, "data", "left-behind.lance")
    with open(orphan, "wb") as fh:
        fh.write(b"x" * 10)
    os.utime(orphan, (0, 0))
    done = run_cli("gc", "--table", table, "--yes")
    assert done.returncode == 0, done.stderr
    assert "2 versions kept (1 pinned by tags: v2)" in done.stdout
    assert not os.path.exists(orphan) and all(os.path.exists(f) for f in files)
    assert len(lance.dataset(table, version=tag).to_table()) == 20
    info = run_cli("info", "--table", table)
    assert info.returncode == 0, info.stderr
    assert f"   2  run {run}  ({tag})" in info.stdout
    pins = json.loads(run_cli("info", "--table", table, "--json").stdout)["pins"]
    assert pins == [{"table": table, "tag": tag, "version": 2, "run": run}]
    gc_json = json.loads(run_cli("gc", "--table", table, "--json").stdout)
    assert gc_json["pins"] == pins and gc_json["items"] == []


def test_a_tag_made_by_hand_on_another_version_is_refused(table, tmp_path):
    run = str(tmp_path / "runs" / "a")
    lance.dataset(table).tags.create(run_tag(run, 2), 3)
    with pytest.raises(TagHeldError, match="keeps version 3 for no tokenloom run"):
        pin_version(table, 2, run)
