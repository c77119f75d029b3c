"""tokenloom's GPT-2 as a ``transformers`` GPT-2 folder, and back.

The layouts differ only in names and in the attention and MLP matrices: ``transformers``'
GPT-2 keeps them as ``Conv1D`` weights, ``(in, out)``, where ``nn.Linear`` keeps ``(out, in)``,
so they are transposed on the way out and back. Everything else is the same model: pre-LayerNorm
blocks with biases, epsilon 1e-5, GELU with the tanh approximation (``gelu_new``), learned
positions, tied input and output embeddings. Document-isolated attention does not change the
weights; a single document attends the same under plain causal attention, which is what
``transformers`` runs.

An export folder holds ``config.json``, ``model.safetensors`` (the tied output matrix stored
once, as ``transformers`` saves it), the tokenizer files when the token column's tokenizer has a
Hugging Face form (:mod:`tokenloom.tokenize.portable`), and ``tokenloom.json``: the run it came
from and the tokenizer identity, which ``--init-from`` checks when the folder has no tokenizer
files. Writing and reading need ``safetensors`` and torch only, not ``transformers``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from tokenloom.errors import TokenloomError
from tokenloom.train.config import TrainError
from tokenloom.train.model import PRESETS

__all__ = [
    "ACTIVATIONS",
    "PROVENANCE_FILE",
    "export_hf",
    "hf_config",
    "is_hf_folder",
    "read_hf_folder",
    "check_hf_tokenizer",
    "to_hf_state",
    "from_hf_state",
]

ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")
"""``activation_function`` values that are tokenloom's GELU (the tanh approximation)."""
PROVENANCE_FILE = "tokenloom.json"
"""What an export came from: the run, its step and the tokenizer identity."""
_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_BLOCK = {  # tokenloom name in a block -> transformers name in a block
    "ln_1.weight": "ln_1.weight",
    "ln_1.bias": "ln_1.bias",
    "attn.c_attn.weight": "attn.c_attn.weight",
    "attn.c_attn.bias": "attn.c_attn.bias",
    "attn.c_proj.weight": "attn.c_proj.weight",
    "attn.c_proj.bias": "attn.c_proj.bias",
    "ln_2.weight": "ln_2.weight",
    "ln_2.bias": "ln_2.bias",
    "mlp.0.weight": "mlp.c_fc.weight",
    "mlp.0.bias": "mlp.c_fc.bias",
    "mlp.2.weight": "mlp.c_proj.weight",
    "mlp.2.bias": "mlp.c_proj.bias",
}
_TOP = {"wte.weight": "wte.weight", "wpe.weight": "wpe.weight"}
_TOP |= {"ln_f.weight": "ln_f.weight", "ln_f.bias": "ln_f.bias"}
_HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def hf_config(weights: dict[str, torch.Tensor], *, model: str, tokenizer: dict[str, Any]) -> dict:
    """The ``config.json`` of a ``transformers`` GPT-2 with tokenloom's weights' sizes."""
    n_layer = len({k.split(".")[1] for k in weights if k.startswith("blocks.")})
    vocab, n_embd = weights["wte.weight"].shape
    eos = tokenizer.get("eos_id")
    bos = tokenizer.get("bos_id")
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": int(vocab),
        "n_positions": int(weights["wpe.weight"].shape[0]),
        "n_embd": int(n_embd),
        "n_layer": n_layer,
        "n_head": PRESETS[model]["n_head"],
        "n_inner": None,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": bos if bos is not None else eos,
        "eos_token_id": eos,
        "dtype": "float32",
    }


def to_hf_state(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """tokenloom's state dict as ``GPT2LMHeadModel``'s (``transformer.*``; lm_head tied)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        if name == "lm_head.weight":
            continue  # tied to wte: transformers stores it once
        if name in _TOP:
            hf = _TOP[name]
        else:
            _, i, rest = name.split(".", 2)
            hf = f"h.{i}.{_BLOCK[rest]}"
        tensor = tensor.detach().to("cpu", torch.float32)
        if hf.endswith(_TRANSPOSED):
            tensor = tensor.t()
        out[f"transformer.{hf}"] = tensor.contiguous()
    return out


def from_hf_state(hf: dict[str, torch.Tensor], n_layer: int) -> dict[str, torch.Tensor]:
    """``GPT2LMHeadModel``'s (or ``GPT2Model``'s) state dict as tokenloom's.

    Raises:
        TrainError: A weight tokenloom's GPT-2 needs is missing.
    """
    names = {k.removeprefix("transformer."): v for k, v in hf.items()}
    wanted = dict(_TOP) | {
        f"blocks.{i}.{ours}": f"h.{i}.{theirs}"
        for i in range(n_layer)
        for ours, theirs in _BLOCK.items()
    }
    missing = [theirs for theirs in wanted.values() if theirs not in names]
    if missing:
        raise TrainError(
            f"the Hugging Face weights lack {', '.join(missing[:3])}"
            f"{' …' if len(missing) > 3 else ''}: not a GPT-2 with biases"
        )
    out = {}
    for ours, theirs in wanted.items():
        tensor = names[theirs].to(torch.float32)
        if theirs.endswith(_TRANSPOSED):
            tensor = tensor.t()
        out[ours] = tensor.contiguous()
    out["lm_head.weight"] = out["wte.weight"]
    return out


def export_hf(run: str, out: str, *, overwrite: bool = False) -> dict[str, Any]:
    """Write checkpoint ``run`` (``RUN``: its latest, or ``RUN/step-N``) as a ``transformers``
    GPT-2 folder ``out``.

    Returns:
        What was written: ``out``, ``files``, ``tokenizer_files`` (bool) and, when the tokenizer
        could not be written, ``tokenizer_note``.

    Raises:
        TrainError: ``out`` exists and is not empty (without ``overwrite``).
    """
    from safetensors.torch import save_file

    from tokenloom.tokenize import load_tokenizer
    from tokenloom.tokenize.portable import hf_tokenizer_files
    from tokenloom.train.checkpoint import load_checkpoint

    state = load_checkpoint(run)  # RUN or RUN/step-N
    record, weights = state.record, state.model
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        if not overwrite:
            raise TrainError(
                f"{out} already exists and is not empty; pick another --out or pass --overwrite"
            )
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    config = hf_config(weights, model=record.config["model"], tokenizer=record.tokenizer)
    files: dict[str, str] = {}
    try:  # the weights are exported even when the tokenizer cannot be
        tok = load_tokenizer(record.tokenizer["name"])
    except TokenloomError as exc:
        note: str | None = f"the run's tokenizer does not load here ({exc})"
    else:
        if tok.vocab_hash != record.tokenizer.get("vocab_hash"):
            note = f"tokenizer {tok.name!r} loads here with another vocabulary than the run's"
        else:
            files, note = hf_tokenizer_files(tok, max_length=config["n_positions"])
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(to_hf_state(weights), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (tmp / "generation_config.json").write_text(
        json.dumps(
            {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
            indent=1,
        )
        + "\n"
    )
    for name, text in files.items():
        (tmp / name).write_text(text, encoding="utf-8")
    provenance = {
        "run": record.out,
        "step": record.step,
        "model": record.config["model"],
        "table": record.loader.table,
        "table_version": record.loader.version,
        "tokenizer": record.tokenizer,
    }
    (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=1) + "\n")
    mask = os.umask(0)
    os.umask(mask)
    for path in tmp.iterdir():  # safetensors writes its file private (0600): as any other file
        path.chmod(0o666 & ~mask)
    if target.exists():
        target.rmdir()  # an empty directory given as --out
    os.replace(tmp, target)  # a killed export leaves no half-written folder under --out
    written = sorted(p.name for p in target.iterdir())
    result: dict[str, Any] = {"out": str(target.resolve()), "files": written}
    result["tokenizer_files"] = bool(files)
    if note:
        result["tokenizer_note"] = note
    return result


def is_hf_folder(path: str) -> bool:
    """``path`` is a directory with a ``config.json`` (a ``transformers`` model folder)."""
    return os.path.isfile(os.path.join(path, "config.json"))


def read_hf_folder(path: str, *, model: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """tokenloom weights and the provenance of a ``transformers`` GPT-2 folder.

    Args:
        path: The folder (``config.json`` and ``model.safetensors``, a sharded
            ``model.safetensors.index.json`` or ``pytorch_model.bin``).
        model: The preset the new run asks for; the folder must have its shape.

    Returns:
        ``(weights, parent)``: a state dict for :class:`~tokenloom.train.model.GPT`, and the
        ``parent`` entry of the new run's record.

    Raises:
        TrainError: Not a GPT-2 that tokenloom's model computes exactly (another architecture,
            activation, epsilon, untied output matrix), another shape than ``model``, or no
            readable weights.
    """
    config = _read_json(os.path.join(path, "config.json"))
    where = f"--init-from {path}"
    if config.get("model_type") != "gpt2":
        raise TrainError(
            f"{where}: config.json has model_type {config.get('model_type')!r}; only a "
            "transformers GPT-2 ('gpt2') folder or a tokenloom run directory can be started from"
        )
    rules = {
        "activation_function": (config.get("activation_function", "gelu_new"), ACTIVATIONS),
        "layer_norm_epsilon": (config.get("layer_norm_epsilon", 1e-5), (1e-5,)),
        "n_inner": (config.get("n_inner"), (None, 4 * int(config.get("n_embd", 768)))),
        "tie_word_embeddings": (config.get("tie_word_embeddings", True), (True,)),
        "scale_attn_by_inverse_layer_idx": (
            config.get("scale_attn_by_inverse_layer_idx", False),
            (False,),
        ),
        "add_cross_attention": (config.get("add_cross_attention", False), (False,)),
    }
    for key, (value, allowed) in rules.items():
        if value not in allowed:
            raise TrainError(
                f"{where}: config.json has {key}={value!r}; tokenloom's GPT-2 computes "
                f"{' or '.join(repr(a) for a in allowed)} only, so these weights would give "
                "other outputs here"
            )
    defaults = (("n_layer", 12), ("n_head", 12), ("n_embd", 768))
    shape = {key: int(config.get(key, default)) for key, default in defaults}
    if shape != PRESETS[model]:
        fits = [name for name, preset in PRESETS.items() if preset == shape]
        fix = f"pass --model {fits[0]}" if fits else "no tokenloom model has that shape"
        raise TrainError(f"{where}: the folder holds a GPT-2 of {shape}, not {model!r}; {fix}")
    weights = from_hf_state(_read_weights(path), shape["n_layer"])
    provenance = _provenance(path)
    parent = {
        "out": os.path.abspath(path),
        "format": "hf",
        "step": provenance.get("step") if provenance else None,
        "loader": None,
        "tokenizer": provenance.get("tokenizer") if provenance else None,
    }
    if provenance:
        parent["run"] = provenance.get("run")
    return weights, parent


def check_hf_tokenizer(path: str, column: dict[str, Any]) -> None:
    """Refuse a ``transformers`` folder whose tokenizer gives other ids than the column's.

    The folder's own tokenizer files decide (``tokenizer.json``, or what ``transformers`` makes
    of ``vocab.json`` + ``merges.txt``); a folder without any is checked against the identity
    in its ``tokenloom.json``; a folder with neither is refused (nothing to check).

    Raises:
        TrainError: The tokenizers differ (both named, with the first difference), or the
            folder's tokenizer cannot be known.
    """
    from tokenloom.tokenize import load_tokenizer
    from tokenloom.tokenize.portable import tokenizer_difference

    name = column.get("name")
    theirs = _folder_tokenizer(path)
    if theirs is None:
        provenance = _provenance(path) or {}
        saved = provenance.get("tokenizer") or {}
        if not saved:
            raise TrainError(
                f"--init-from {path} holds no tokenizer files (tokenizer.json, or vocab.json + "
                f"merges.txt) and no {PROVENANCE_FILE}: nothing says its ids are those of the "
                f"column's tokenizer {name!r}; save the model's tokenizer into it "
                "(`tokenizer.save_pretrained(DIR)`)"
            )
        if saved.get("vocab_hash") == column.get("vocab_hash"):
            return
        raise TrainError(
            f"--init-from {path} was trained on tokenizer {saved.get('name')!r} "
            f"({saved.get('vocab_size')} ids, vocab_hash {str(saved.get('vocab_hash'))[:12]}…); "
            f"the column holds {name!r} ({column.get('vocab_size')} ids, vocab_hash "
            f"{str(column.get('vocab_hash'))[:12]}…); train on a column tokenized with the "
            "folder's tokenizer"
        )
    ours = load_tokenizer(name)
    why = tokenizer_difference(ours, theirs)
    if why is not None:
        raise TrainError(
            f"--init-from {path}: the folder's tokenizer ({theirs.vocab_size} ids, EOS "
            f"{theirs.eos_id}) is not the column's tokenizer {name!r} ({ours.vocab_size} ids, "
            f"EOS {ours.eos_id}): {why}; tokenize the table with the folder's tokenizer "
            f"(`tokenloom tokenize --tokenizer {path}`) and train on that column"
        )


def _folder_tokenizer(path: str) -> Any:
    """The folder's tokenizer as a tokenloom tokenizer, or ``None`` when it has none."""
    from tokenloom.tokenize import load_tokenizer
    from tokenloom.tokenize.hf import HFTokenizer, read_roles

    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        return load_tokenizer(path)
    if not os.path.isfile(os.path.join(path, "vocab.json")):
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise TrainError(
            f"--init-from {path} has vocab.json + merges.txt but no tokenizer.json; reading "
            "them needs transformers (`pip install transformers`)"
        ) from exc
    fast = AutoTokenizer.from_pretrained(path, local_files_only=True)
    backend = getattr(fast, "backend_tokenizer", None)
    if backend is None:
        raise TrainError(f"--init-from {path}: its tokenizer has no fast (tokenizers) form")
    return HFTokenizer(
        name=os.path.abspath(path), json_text=backend.to_str(), roles=read_roles(Path(path))
    )


def _read_weights(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(single):
        return load_file(single)
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        out: dict[str, torch.Tensor] = {}
        for shard in shards:
            out.update(load_file(os.path.join(path, shard)))
        return out
    legacy = os.path.join(path, "pytorch_model.bin")
    if os.path.isfile(legacy):  # weights_only: a pickle that would run code is refused
        return torch.load(legacy, map_location="cpu", weights_only=True)
    raise TrainError(
        f"--init-from {path} has config.json but no weights ({', '.join(_HF_WEIGHT_FILES)})"
    )


def _provenance(path: str) -> dict[str, Any] | None:
    file = os.path.join(path, PROVENANCE_FILE)
    return _read_json(file) if os.path.isfile(file) else None


def _read_json(file: str) -> dict[str, Any]:
    try:
        with open(file, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise TrainError(f"{file} cannot be read as JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise TrainError(f"{file} is not a JSON object")
    return data
