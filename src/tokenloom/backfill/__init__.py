"""The backfill engine: add a column computed by a UDF, in parallel, resumable, rewriting nothing.

```python
from tokenloom.backfill import udf, add_column

@udf(inputs=["text"], output=pa.field("n_words", pa.int32()), version="1")
def n_words(batch): ...

add_column("corpus.lance", "n_words", n_words, workers=4)   # one new table version
```
"""

from tokenloom.backfill.checkpoint import JobStatus, default_checkpoint_root, list_jobs
from tokenloom.backfill.engine import UDF_META_KEY, BackfillError, BackfillResult, add_column
from tokenloom.backfill.udf import UDF, UDFError, load_udf, udf

__all__ = [
    "UDF",
    "UDF_META_KEY",
    "BackfillError",
    "BackfillResult",
    "JobStatus",
    "UDFError",
    "add_column",
    "default_checkpoint_root",
    "list_jobs",
    "load_udf",
    "udf",
]
