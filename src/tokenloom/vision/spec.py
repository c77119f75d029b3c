"""``ImageTextSpec``: which stream of packed image+text blocks a loader delivers, defined once.

Like :class:`~tokenloom.rows.RowSpec` and :class:`~tokenloom.loader.LoaderSpec`, a spec names the
table and version, the rows (SQL filter), the global batch and the seed; it adds the columns of a
sample (an image column, the token columns ``tokenloom tokenize`` made from the prompt and the
response, the stored image width and height), the block budget, the image cap, the patch grid,
the packing policy and what a bad image does. It names neither the topology (rank, world size,
workers) nor the cursor: the global stream does not depend on them. Pure: imports neither Lance
nor torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tokenloom.loader.plan.epoch import PlanError
from tokenloom.loader.plan.shuffle import PERMUTATION_ALGORITHM
from tokenloom.loader.plan.stream.spec import StreamSpec, check_int
from tokenloom.vision.packing import PACK_ALGORITHM
from tokenloom.vision.patches import PatchGrid

__all__ = ["ImageTextSpec", "IMAGE_POLICIES", "ON_ERROR", "SPEC_KIND"]

IMAGE_POLICIES = ("knapsack", "greedy")
"""Packing policies a loader trains with (``pad_to_longest`` is measured, never loaded)."""
ON_ERROR = ("raise", "skip")
"""``raise``: stop naming the row; ``skip``: its positions stay padding, counted by reason."""
SPEC_KIND = "image_text"
"""``kind`` of the spec's dict (a run record tells it from a token loader's spec by it)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ImageTextSpec(StreamSpec):
    """Which packed image+text blocks an :class:`~tokenloom.vision.ImageTextDataset` delivers.

    ``table``, ``version``, ``filter``, ``global_batch`` (blocks per global step over all
    ranks), ``seed`` (every epoch packs a fresh permutation of ``(seed, epoch)``) and
    ``drop_last`` (leave out the epoch's last incomplete step instead of completing it with
    blocks of padding only) are the common part
    (:class:`~tokenloom.loader.plan.stream.spec.StreamSpec`).
    """

    image_column: str = "image"
    """Encoded image bytes (a blob or binary column)."""
    prompt_column: str = "prompt_ids"
    """Token column of the prompt (``tokenloom tokenize --text-column prompt --column
    prompt_ids``)."""
    response_column: str = "response_ids"
    """Token column of the response (the loss falls on its tokens and the EOS)."""
    width_column: str = "width"
    """Stored image width, pixels (image tokens are planned from it: no decode)."""
    height_column: str = "height"
    """Stored image height, pixels."""
    budget: int = 256
    """Positions per block (the model's block size)."""
    image_cap: int = 4
    """Most images per block."""
    patch: int = 16
    """Patch side, pixels."""
    max_side: int = 64
    """Longest image side after resizing, pixels (a multiple of ``patch``)."""
    policy: str = "knapsack"
    """``knapsack`` (fullest subset of a window) or ``greedy`` (in order)."""
    window: int = 32
    """Waiting samples the knapsack chooses from."""
    on_error: str = "raise"
    """What an image that does not decode does (:data:`ON_ERROR`)."""

    def __post_init__(self) -> None:
        StreamSpec.__post_init__(self)  # table, version, filter, global_batch, seed, drop_last
        for name, low in (
            ("budget", 2),
            ("image_cap", 1),
            ("patch", 1),
            ("max_side", 1),
            ("window", 1),
        ):
            check_int(name, getattr(self, name), low=low)
        columns = self.columns()
        for name, value in columns.items():
            if not isinstance(value, str) or not value:
                raise PlanError(f"{name} must name a column, got {value!r}")
        if len(set(columns.values())) != len(columns):
            raise PlanError(f"the sample's columns must differ, got {columns}")
        if self.policy not in IMAGE_POLICIES:
            hint = (
                "; pad_to_longest is measured by `tokenloom images pack-stats`, not trained with"
                if self.policy == "pad_to_longest"
                else ""
            )
            raise PlanError(
                f"policy must be one of {', '.join(IMAGE_POLICIES)}, got {self.policy!r}{hint}"
            )
        if self.on_error not in ON_ERROR:
            raise PlanError(f"on_error must be one of {', '.join(ON_ERROR)}, got {self.on_error!r}")
        try:
            PatchGrid(patch=self.patch, max_side=self.max_side)
        except ValueError as exc:
            raise PlanError(str(exc)) from None

    @property
    def grid(self) -> PatchGrid:
        """How images become patches."""
        return PatchGrid(patch=self.patch, max_side=self.max_side)

    @property
    def seq_len(self) -> int:
        """Positions per block (:attr:`budget`; the name a run record's figures use)."""
        return self.budget

    def columns(self) -> dict[str, str]:
        """The sample's columns by role."""
        return {
            "image_column": self.image_column,
            "prompt_column": self.prompt_column,
            "response_column": self.response_column,
            "width_column": self.width_column,
            "height_column": self.height_column,
        }

    @property
    def unit(self) -> str:
        """A global step's items are blocks (``per_rank``: blocks each rank builds per step)."""
        return "blocks"

    def replace(self, **changes: Any) -> ImageTextSpec:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """One line for logs."""
        where = f", filter {self.filter!r}" if self.filter else ""
        return (
            f"image+text blocks of {self.budget} positions ({self.policy}, at most "
            f"{self.image_cap} images, {self.patch}px patches up to {self.max_side}px), columns "
            f"{self.image_column}/{self.prompt_column}/{self.response_column}{where}"
        )

    def fingerprint_inputs(self) -> dict[str, Any]:
        """The named inputs of the stream (the dataset adds the table version)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in ("table", "version"):
            out.pop(key)
        return {
            "kind": SPEC_KIND,
            **self.stream_inputs(),
            **out,
            "permutation": PERMUTATION_ALGORITHM,
            "packing": PACK_ALGORITHM,
        }

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON values, with ``kind`` (a run record stores this)."""
        return {
            "kind": SPEC_KIND,
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImageTextSpec:
        """The spec :meth:`to_dict` wrote (unknown keys refused, naming them)."""
        data = dict(data)
        if data.pop("kind", SPEC_KIND) != SPEC_KIND:
            raise PlanError(f"not an image+text spec: kind {data.get('kind')!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise PlanError(f"unknown image+text spec field(s) {', '.join(unknown)}")
        return cls(**data)
