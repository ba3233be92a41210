"""A built recipe folder copied with one launch bind rewritten: what the bind sweeps
(bench/attention_sections.py, bench/gemm_raster.py) time, the cubins the same bytes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def rebound_copy(folder: Path, copy: Path, bind: str, texts: dict[str, str]) -> Path:
    """`folder` copied to `copy`, where each kernel.json named in `texts` (its path in
    the folder) binds `bind` to the given expression; every other byte is the built
    one's. A kernel.json without the bind is refused: there is nothing to sweep."""
    shutil.copytree(folder, copy)
    for name, text in texts.items():
        path = copy / name
        meta = json.loads(path.read_text())
        if bind not in meta["launch"]["bind"]:
            raise SystemExit(f"{path}: no {bind} bind to sweep")
        meta["launch"]["bind"][bind] = text
        path.write_text(json.dumps(meta, indent=1))
    return copy
