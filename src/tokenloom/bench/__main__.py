"""``python -m tokenloom.bench ingest`` — the same as ``tokenloom bench ingest``."""

import sys

from tokenloom.cli.main import main

if __name__ == "__main__":
    main(["bench", *sys.argv[1:]])
