"""Tokenizer registry: load a tokenizer from one spec string, encode batches to Arrow ids.

``load_tokenizer("gpt2")`` (offline, from the openai-whisper package's BPE file), a
``tokenizer.json`` path or directory, ``tiktoken:NAME`` from tiktoken's cache, or a BPE you train
with ``train_bpe``. ``Tokenizer.encode_batch`` returns ``list<uint16>`` (``list<int32>`` above
65,536 ids) without special tokens; ``Tokenizer.identity()`` is what the table's column metadata
and the checkpoints pin. Heavy libraries (tiktoken, tokenizers) are imported on first use.
"""

from tokenloom.tokenize.base import (
    UINT16_VOCAB_LIMIT,
    EncodeError,
    Tokenizer,
    TokenizerError,
    id_type_for,
    ids_to_list_array,
)
from tokenloom.tokenize.registry import ACCEPTED_SPECS, load_tokenizer
from tokenloom.tokenize.roundtrip import RoundtripFailure, roundtrip_failures
from tokenloom.tokenize.train import train_bpe

__all__ = [
    "ACCEPTED_SPECS",
    "EncodeError",
    "UINT16_VOCAB_LIMIT",
    "RoundtripFailure",
    "Tokenizer",
    "TokenizerError",
    "id_type_for",
    "ids_to_list_array",
    "load_tokenizer",
    "roundtrip_failures",
    "train_bpe",
]
