"""``python -m replicas.checkpoints.convert_pt DIRECTORY``: BGE-M3's heads as shipped
(``colbert_linear.pt``, ``sparse_linear.pt``: torch pickles) rewritten beside them as
``colbert_linear.safetensors`` and ``sparse_linear.safetensors``, read with torch's
weights-only loader (tensors only, no code runs). The server never opens a pickle; it reads
the safetensors this writes. Needs torch (``pip install torch``), which the server does not.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from replicas.model.retrieval_config import HYBRID_HEADS


def convert(directory: Path) -> list[Path]:
    """Each ``<head>.pt`` in ``directory`` as ``<head>.safetensors``; the files written."""
    import torch
    from safetensors.torch import save_file

    written = []
    for name in HYBRID_HEADS:
        source = directory / f"{name}.pt"
        if not source.is_file():
            raise FileNotFoundError(f"{source}: not found (BGE-M3 ships {name}.pt)")
        state = torch.load(source, map_location="cpu", weights_only=True)
        tensors = {key: value.contiguous() for key, value in state.items()}
        if set(tensors) - {"weight", "bias"} or "weight" not in tensors:
            raise ValueError(
                f"{source}: expected a Linear's weight and bias, got {sorted(tensors)}"
            )
        target = directory / f"{name}.safetensors"
        save_file(tensors, str(target))
        written.append(target)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="the BGE-M3 model's directory")
    args = parser.parse_args(argv)
    for path in convert(args.directory):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
