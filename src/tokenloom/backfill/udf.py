"""The UDF API: a function (or a class with lazy per-worker setup) from named input columns to
one or several new columns, declared with its output type and a version string.

```python
@udf(inputs=["text"], output=pa.field("n_words", pa.int32()), version="1")
def n_words(batch: pa.RecordBatch) -> pa.Array:
    return pc.list_value_length(pc.utf8_split_whitespace(batch["text"])).cast(pa.int32())

n_words(table.slice(0, 3))          # still callable directly: a RecordBatch with column n_words

@udf(inputs=["text"], output={"input_ids": pa.list_(pa.uint16())}, version="gpt2-1")
class Tokenize:
    def __init__(self, spec: str = "gpt2"):   # runs once per worker process, lazily
        self.tok = load_tokenizer(spec)
    def __call__(self, batch): ...

Tokenize.bind(spec="gpt2")           # constructor arguments are part of the fingerprint

@udf(inputs=["text"], output=pa.field("emb", pa.list_(pa.float32(), 384)), version="1",
     num_gpus=1, memory=4 << 30, resources={"a100": 1})   # what each Ray task asks for
class Embed: ...
```

A UDF is pickled by reference (module + name) so spawned workers and Ray tasks import it; define
UDFs at module level.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from tokenloom.backfill.resources import Resources
from tokenloom.errors import TokenloomError

__all__ = ["UDF", "udf", "load_udf", "UDFError"]


class UDFError(TokenloomError):
    """A UDF is malformed, or it failed or returned a wrong result on some rows."""


def _as_schema(output: pa.Field | pa.Schema | Mapping[str, pa.DataType] | Sequence) -> pa.Schema:
    if isinstance(output, pa.Schema):
        return output
    if isinstance(output, pa.Field):
        return pa.schema([output])
    if isinstance(output, Mapping):
        return pa.schema([pa.field(k, v) for k, v in output.items()])
    return pa.schema(list(output))


class UDF:
    """A column-computing function with its declared inputs, outputs and version.

    Build one with the :func:`udf` decorator. Calling it on a RecordBatch (or Table, or dict of
    columns) holding the input columns returns a RecordBatch of the output columns.
    """

    def __init__(
        self,
        target: Callable[..., Any] | type,
        *,
        inputs: Sequence[str],
        output: pa.Field | pa.Schema | Mapping[str, pa.DataType],
        version: str,
        name: str | None = None,
        batch_size: int = 1024,
        kwargs: Mapping[str, Any] | None = None,
        resources: Resources | None = None,
    ) -> None:
        if not inputs:
            raise UDFError(f"UDF {name or target!r} declares no input columns")
        if not str(version):
            raise UDFError(f"UDF {name or target!r} needs a non-empty version string")
        self.target = target
        self.inputs = tuple(inputs)
        self.output = _as_schema(output)
        self.version = str(version)
        self.name = name or getattr(target, "__qualname__", repr(target))
        self.batch_size = int(batch_size)
        self.kwargs = dict(kwargs or {})
        self.resources = resources or Resources()
        """What each unit asks of a Ray cluster (not part of the fingerprint)."""
        self.is_class = inspect.isclass(target)
        if self.kwargs and not self.is_class:
            raise UDFError(f"UDF {self.name}: only class UDFs take constructor arguments")
        try:
            json.dumps(self.kwargs, sort_keys=True)
        except TypeError as exc:
            raise UDFError(f"UDF {self.name}: arguments must be JSON-serialisable ({exc})") from exc
        self._ref: tuple[str, str] | None = None
        self._instance: Callable[..., Any] | None = None

    # -- identity -----------------------------------------------------------------------------

    @property
    def columns(self) -> list[str]:
        """Names of the output columns."""
        return list(self.output.names)

    def fingerprint(self) -> str:
        """A stable hash of name, version, inputs, output schema and constructor arguments.

        Checkpointed results are only reused by a UDF with the same fingerprint.
        """
        payload = json.dumps(
            {
                "name": self.name,
                "version": self.version,
                "inputs": list(self.inputs),
                "output": [(f.name, str(f.type)) for f in self.output],
                "kwargs": self.identity_kwargs,
            },
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:24]

    @property
    def identity_kwargs(self) -> dict[str, Any]:
        """Constructor arguments that define the results. Arguments whose name starts with ``_``
        are run-time plumbing (a cache path, a thread count) and are left out of the identity."""
        return {k: v for k, v in self.kwargs.items() if not k.startswith("_")}

    def describe(self) -> dict[str, Any]:
        """The JSON-able identity recorded in commits and field metadata."""
        return {
            "name": self.name,
            "version": self.version,
            "inputs": list(self.inputs),
            "fingerprint": self.fingerprint(),
            **({"kwargs": self.identity_kwargs} if self.identity_kwargs else {}),
            # where to load it again (``tokenloom refresh``); not part of the identity
            **({"ref": f"{self._ref[0]}:{self._ref[1]}"} if self._ref else {}),
        }

    def _copy(self, **changes: Any) -> UDF:
        """A copy with some constructor fields changed, still pickled by reference."""
        fields = {
            "inputs": self.inputs,
            "output": self.output,
            "version": self.version,
            "name": self.name,
            "batch_size": self.batch_size,
            "kwargs": self.kwargs,
            "resources": self.resources,
        }
        copy = UDF(self.target, **{**fields, **changes})
        copy._ref = self._ref
        return copy

    def with_output(self, output: pa.Schema) -> UDF:
        """A copy with another output schema of the same types (e.g. renamed columns)."""
        return self._copy(output=output)

    def with_inputs(self, inputs: Sequence[str]) -> UDF:
        """A copy reading other columns of the same types (e.g. another text column)."""
        return self._copy(inputs=tuple(inputs))

    def bind(self, **kwargs: Any) -> UDF:
        """A copy of a class UDF with constructor arguments (part of the fingerprint)."""
        return self._copy(kwargs={**self.kwargs, **kwargs})

    def with_resources(
        self,
        *,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: int | None = None,
        resources: Mapping[str, float] | None = None,
    ) -> UDF:
        """A copy asking Ray for other resources per unit (``None`` keeps the declared value;
        ``resources`` replaces the custom ones). The fingerprint is unchanged: results computed
        with other resources are reused."""
        return self._copy(
            resources=self.resources.merged(
                num_cpus=num_cpus, num_gpus=num_gpus, memory=memory, custom=resources
            )
        )

    # -- calling ------------------------------------------------------------------------------

    def setup(self) -> None:
        """Build a class UDF's instance now (its setup: loading a tokenizer or a model), so a
        failure there is told apart from a failure on some row."""
        self._callable()

    def _callable(self) -> Callable[..., Any]:
        if self._instance is None:
            self._instance = self.target(**self.kwargs) if self.is_class else self.target
        return self._instance

    def __call__(self, batch: pa.RecordBatch | pa.Table | Mapping[str, Any]) -> pa.RecordBatch:
        """Compute the output columns for ``batch`` (which must hold the input columns)."""
        batch = _as_batch(batch, self.inputs, self.name)
        result = self._callable()(batch.select(list(self.inputs)))
        return self.normalize(result, batch.num_rows)

    def normalize(self, result: Any, n_rows: int) -> pa.RecordBatch:
        """Turn what the function returned into a RecordBatch of the declared output schema."""
        names = self.output.names
        if isinstance(result, pa.Table):
            result = {n: result.column(n) for n in result.schema.names}
        if isinstance(result, pa.RecordBatch):
            missing = [n for n in names if n not in result.schema.names]
            if missing:
                raise UDFError(f"UDF {self.name} did not return column(s) {missing}")
            arrays = [result.column(n) for n in names]
        elif isinstance(result, Mapping):
            missing = [n for n in names if n not in result]
            if missing:
                raise UDFError(f"UDF {self.name} did not return column(s) {missing}")
            arrays = [result[n] for n in names]
        elif len(names) > 1 and isinstance(result, (list, tuple)) and len(result) == len(names):
            arrays = list(result)  # one array per declared output, in order
        else:
            if len(names) != 1:
                raise UDFError(
                    f"UDF {self.name} declares {len(names)} outputs {names}; return a "
                    "RecordBatch, a dict of arrays or one array per output"
                )
            arrays = [result]
        out = []
        for field, arr in zip(self.output, arrays, strict=True):
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            if not isinstance(arr, pa.Array):
                try:
                    arr = pa.array(arr, type=field.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
                    raise UDFError(
                        f"UDF {self.name}: column {field.name!r} is not convertible to "
                        f"{field.type}: {exc}"
                    ) from exc
            if arr.type != field.type:
                try:
                    arr = arr.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise UDFError(
                        f"UDF {self.name}: column {field.name!r} has type {arr.type}, declared "
                        f"{field.type}, and does not cast safely: {exc}"
                    ) from exc
            if len(arr) != n_rows:
                raise UDFError(
                    f"UDF {self.name} returned {len(arr)} values for column {field.name!r} "
                    f"from {n_rows} input rows"
                )
            out.append(arr)
        return pa.record_batch(out, schema=self.output)

    # -- pickling: by reference, so workers import the module that defines the UDF --------------

    def __reduce__(self) -> tuple[Any, ...]:
        if self._ref is not None:
            return (_load_by_ref, (*self._ref, self.kwargs, self.output, self.resources))
        state = {
            "target": self.target,
            "inputs": self.inputs,
            "output": self.output,
            "version": self.version,
            "name": self.name,
            "batch_size": self.batch_size,
            "kwargs": self.kwargs,
            "resources": self.resources,
        }
        return (_rebuild, (state,))

    def __repr__(self) -> str:
        args = f", {self.kwargs}" if self.kwargs else ""
        return f"UDF({self.name} v{self.version}: {list(self.inputs)} -> {self.columns}{args})"


def _rebuild(state: dict[str, Any]) -> UDF:
    target = state.pop("target")
    return UDF(target, **state)


def _load_by_ref(
    module: str,
    qualname: str,
    kwargs: Mapping[str, Any],
    output: pa.Schema | None = None,
    resources: Resources | None = None,
) -> UDF:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, UDF):
        raise UDFError(f"{module}:{qualname} is not a UDF")
    if kwargs:
        obj = obj.bind(**kwargs)
    if output is not None and not output.equals(obj.output, check_metadata=True):
        obj = obj.with_output(output)
    if resources is not None and resources != obj.resources:
        obj = obj._copy(resources=resources)
    return obj


def _as_batch(batch: Any, inputs: Sequence[str], name: str) -> pa.RecordBatch:
    if isinstance(batch, Mapping):
        batch = pa.table(dict(batch))
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks()
        batches = batch.to_batches()
        batch = (
            batches[0]
            if batches
            else pa.record_batch([pa.array([], f.type) for f in batch.schema], schema=batch.schema)
        )
    missing = [c for c in inputs if c not in batch.schema.names]
    if missing:
        raise UDFError(f"UDF {name} needs column(s) {missing}; got {batch.schema.names}")
    return batch


def udf(
    *,
    inputs: Sequence[str],
    output: pa.Field | pa.Schema | Mapping[str, pa.DataType],
    version: str,
    name: str | None = None,
    batch_size: int = 1024,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    memory: int | None = None,
    resources: Mapping[str, float] | None = None,
) -> Callable[[Callable[..., Any] | type], UDF]:
    """Declare a UDF.

    Args:
        inputs: The table columns the function reads.
        output: The output column(s): a field, a schema, or ``{name: type}``. Field metadata is
            stored on the new column (e.g. a tokenizer identity).
        version: Bump it whenever the function's results change; results computed by another
            version are never reused.
        name: Defaults to the function's qualified name.
        batch_size: Rows per call.
        num_cpus: CPUs each work unit reserves on a Ray cluster (default 1).
        num_gpus: GPUs each unit needs on a Ray cluster (fractions allowed).
        memory: Bytes of memory each unit reserves on a Ray cluster.
        resources: Custom Ray resources each unit needs, e.g. ``{"a100": 1}``: its units run
            only on nodes started with them. None of these is part of the fingerprint, and the
            local process pool ignores them.
    """
    request = Resources(num_cpus=num_cpus, num_gpus=num_gpus, memory=memory, custom=resources or {})

    def wrap(target: Callable[..., Any] | type) -> UDF:
        obj = UDF(
            target,
            inputs=inputs,
            output=output,
            version=version,
            name=name or target.__name__,
            batch_size=batch_size,
            resources=request,
        )
        if "<locals>" not in target.__qualname__:
            obj._ref = (target.__module__, target.__qualname__)
        return obj

    return wrap


def load_udf(ref: str, **kwargs: Any) -> UDF:
    """Load a UDF from ``"package.module:name"`` (as the CLI's ``--udf`` takes it)."""
    module, sep, qualname = ref.partition(":")
    if not sep or not module or not qualname:
        raise UDFError(f"--udf must look like 'package.module:name', not {ref!r}")
    try:
        return _load_by_ref(module, qualname, kwargs)
    except (ImportError, AttributeError) as exc:
        raise UDFError(f"cannot load UDF {ref!r}: {exc}") from exc
