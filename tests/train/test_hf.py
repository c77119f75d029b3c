"""``tokenloom export --format hf``, ``train --init-from`` a transformers folder, ``eval-task``
and ``lm_eval`` on an exported model, through the real CLI."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # training, export and lm_eval processes

from tests.conftest import invoke, real_paragraphs, run_cli  # noqa: E402
from tests.verify.tables import gpt2_table  # noqa: E402
from tokenloom.train.checkpoint import load_run_model  # noqa: E402

PROMPT = "The table holds the corpus, and the loader reads it straight into training."
TRAIN = ["--seq-len", "32", "--global-batch-size", "2", "--log-every", "1"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny gpt2-tokenized table, a 2-step run on it and its export."""
    tmp = tmp_path_factory.mktemp("hf")
    uri = gpt2_table(tmp, real_paragraphs(40))
    run, out = str(tmp / "run"), str(tmp / "hf")
    invoke("train", "--table", uri, "--out", run, "--steps", "2", *TRAIN)
    report = json.loads(invoke("export", "--checkpoint", run, "--format", "hf", "--out", out,
                               "--json"))  # fmt: skip
    return {"tmp": tmp, "table": uri, "run": run, "hf": out, "report": report}


def _ids(folder: str) -> torch.Tensor:
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return torch.tensor([tok.encode(PROMPT)])


def _hf_logits(folder: str, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits


def _our_logits(run: str, ids: torch.Tensor) -> torch.Tensor:
    model, _ = load_run_model(run)
    with torch.no_grad():  # one document: document attention is causal attention
        return model(ids, doc_ids=torch.zeros_like(ids))[0]


def test_export_loads_in_transformers_with_the_same_logits_and_generates(exported):
    report = exported["report"]
    assert report["tokenizer_files"] is True
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenloom.json"} <= set(
        report["files"]
    )
    ids = _ids(exported["hf"])
    from tokenloom.tokenize import load_tokenizer

    assert ids[0].tolist() == load_tokenizer("gpt2").encode(PROMPT)  # the column's ids
    ours, theirs = _our_logits(exported["run"], ids), _hf_logits(exported["hf"], ids)
    assert ours.shape == theirs.shape == (1, ids.shape[1], 50257)
    assert (ours - theirs).abs().max().item() <= 1e-4
    model = transformers.AutoModelForCausalLM.from_pretrained(exported["hf"]).eval()
    out = model.generate(ids[:, :8], max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 12) and out[0, :8].tolist() == ids[0, :8].tolist()
    greedy = _our_logits(exported["run"], ids[:, :8])[0, -1].argmax().item()
    assert out[0, 8].item() == greedy  # transformers' first greedy token is tokenloom's


def test_export_refuses_a_missing_run_and_a_nonempty_out(exported, tmp_path):
    done = run_cli("export", "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and "--checkpoint" in done.stderr, done.stderr
    done = run_cli("export", "--checkpoint", exported["run"], "--out", exported["hf"])
    assert done.returncode == 1, done.stderr
    assert "already exists" in done.stderr and "--overwrite" in done.stderr


def test_round_trip_through_transformers_and_init_from_keeps_the_logits(exported):
    """tokenloom -> HF -> ``train --init-from DIR`` (lr 1e-12: the weights stay, up to float
    noise) -> tokenloom -> HF."""
    tmp = exported["tmp"]
    run2, hf2 = str(tmp / "run2"), str(tmp / "hf2")
    said = invoke(
        "train", "--table", exported["table"], "--out", run2, "--steps", "1", "--lr", "1e-12",
        "--init-from", exported["hf"], *TRAIN,
    )  # fmt: skip
    assert f"weights from {exported['hf']} (step 2)" in said
    parent = json.loads((tmp / "run2" / "last.json").read_text())["parent"]
    assert parent["out"] == exported["hf"] and parent["format"] == "hf"
    assert parent["run"] == exported["run"]
    ids = _ids(exported["hf"])
    first = _our_logits(exported["run"], ids)
    assert (_our_logits(run2, ids) - first).abs().max().item() <= 1e-4
    invoke("export", "--checkpoint", run2, "--out", hf2)
    assert (_hf_logits(hf2, ids) - first).abs().max().item() <= 1e-4


def test_init_from_refuses_a_folder_whose_tokenizer_differs(exported, tmp_path):
    """Two ids swapped in tokenizer.json: same size, same EOS, other ids: refused, both named."""
    bad = tmp_path / "swapped"
    shutil.copytree(exported["hf"], bad)
    spec = json.loads((bad / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = "Ġthe", "Ġtable"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (bad / "tokenizer.json").write_text(json.dumps(spec))
    args = ["train", "--table", exported["table"], "--steps", "1", *TRAIN]
    done = run_cli(*args, "--out", str(tmp_path / "r1"), "--init-from", str(bad))
    assert done.returncode == 1, done.stderr
    assert "not the column's tokenizer 'gpt2'" in done.stderr and str(bad) in done.stderr
    assert "decodes to" in done.stderr  # the first difference, shown
    assert not (tmp_path / "r1" / "last.json").exists()
    assert not list((tmp_path / "r1").glob("step-*"))
    bare = tmp_path / "bare"  # no tokenizer files and no tokenloom.json: nothing to check
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(exported["hf"], name), bare / name)
    done = run_cli(*args, "--out", str(tmp_path / "r2"), "--init-from", str(bare))
    assert done.returncode == 1 and "holds no tokenizer files" in done.stderr, done.stderr


def test_a_folder_tokenloom_cannot_compute_exactly_is_refused(exported, tmp_path):
    from tokenloom.train.config import TrainError
    from tokenloom.train.hf import read_hf_folder

    weights, parent = read_hf_folder(exported["hf"], model="tiny")
    assert parent["step"] == 2 and weights["wte.weight"] is weights["lm_head.weight"]
    with pytest.raises(TrainError, match="not 'small'; pass --model tiny"):
        read_hf_folder(exported["hf"], model="small")
    for key, value in (("activation_function", "gelu"), ("layer_norm_epsilon", 1e-6)):
        bad = tmp_path / key
        shutil.copytree(exported["hf"], bad)
        config = json.loads((bad / "config.json").read_text()) | {key: value}
        (bad / "config.json").write_text(json.dumps(config))
        with pytest.raises(TrainError, match=f"{key}={value!r}"):
            read_hf_folder(str(bad), model="tiny")


def test_lm_eval_runs_offline_on_an_exported_model(exported, tmp_path):
    pytest.importorskip("lm_eval")
    tasks = tmp_path / "tasks"
    task = json.loads(invoke(
        "eval-task", "--table", exported["table"], "--filter", "id % 10 = 0",
        "--out", str(tasks), "--limit", "3", "--json",
    ))  # fmt: skip
    assert task["rows"] == 3 and os.path.isfile(task["yaml"])
    from tokenloom.train.evaltask import OFFLINE, lm_eval_argv, lm_eval_command

    assert task["command"] == lm_eval_command("MODEL_DIR", str(tasks))  # what is printed
    argv = lm_eval_argv(exported["hf"], str(tasks))
    argv[0] = os.path.join(os.path.dirname(sys.executable), "lm_eval")
    results = tmp_path / "results"
    run = subprocess.run(
        [*argv, "--output_path", str(results)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **OFFLINE, "HF_HOME": str(tmp_path / "hf_home")},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = [os.path.join(d, f) for d, _, fs in os.walk(results) for f in fs if f.endswith(".json")]
    scores = json.loads(open(found[0]).read())["results"]["tokenloom_heldout"]
    assert math.isfinite(scores["bits_per_byte,none"]) and scores["bits_per_byte,none"] > 0
    assert scores["byte_perplexity,none"] > 1


def test_eval_task_refuses_an_empty_selection(exported, tmp_path):
    done = run_cli(
        "eval-task", "--table", exported["table"], "--filter", "id < 0", "--out", str(tmp_path)
    )
    assert done.returncode == 1 and "no non-empty text under filter 'id < 0'" in done.stderr
    done = run_cli("eval-task", "--table", exported["table"], "--filter", "id = 1; --")
    assert done.returncode == 2 and "--filter" in done.stderr


def test_a_folder_saved_by_transformers_itself_is_read(exported, tmp_path):
    """What ``save_pretrained`` writes (its own config keys, its tokenizer files) starts a run
    with the same weights, and its tokenizer counts as the column's (gpt2)."""
    from tokenloom.tokenize import load_tokenizer
    from tokenloom.train.hf import check_hf_tokenizer, read_hf_folder
    from tokenloom.train.model import GPT, PRESETS, GPTConfig

    saved = tmp_path / "saved"
    model = transformers.AutoModelForCausalLM.from_pretrained(exported["hf"])
    model.save_pretrained(saved)
    transformers.AutoTokenizer.from_pretrained(exported["hf"]).save_pretrained(saved)
    assert not (saved / "tokenloom.json").exists()
    weights, parent = read_hf_folder(str(saved), model="tiny")
    assert parent["step"] is None and parent["out"] == str(saved)
    check_hf_tokenizer(str(saved), load_tokenizer("gpt2").identity())  # no error: the same ids
    ours = GPT(GPTConfig(**PRESETS["tiny"], vocab_size=50257, block_size=32))
    ours.load_state_dict(weights)
    ids = _ids(exported["hf"])
    with torch.no_grad():
        got = ours.eval()(ids, attention="causal")[0]
    assert (got - _our_logits(exported["run"], ids)).abs().max().item() <= 1e-6
