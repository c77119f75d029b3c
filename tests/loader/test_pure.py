"""The pure loader modules import neither torch nor Lance (DESIGN: pure plan, I/O elsewhere)."""

from __future__ import annotations

import subprocess
import sys


def test_pure_modules_import_no_torch_and_no_lance() -> None:
    code = (
        "import sys\n"
        "import tokenloom.loader.plan.shuffle, tokenloom.loader.plan.epoch\n"
        "import tokenloom.loader.plan.spans, tokenloom.loader.plan.pack\n"
        "import tokenloom.loader.plan.state, tokenloom.loader.plan.group\n"
        "print(sorted(m for m in ('torch', 'lance', 'pyarrow') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
