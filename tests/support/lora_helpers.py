"""PEFT LoRA adapters of the tiny test models (``save_pretrained``, safetensors) and the
transformers + peft fp32 reference outputs for them (tests/engine/test_lora*.py).

PEFT initializes B to zeros (an adapter that changes nothing); here every LoRA matrix (and a
saved score head) is drawn at random, large enough that each adapter moves the log-probs by
a good fraction of a nat, so a wrong slot, layout or scaling cannot hide.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def randomize_lora_(model: Any, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                param.copy_(noise / param.shape[-1] ** 0.5)


def save_adapter(
    base: Path,
    directory: Path,
    *,
    seed: int,
    r: int,
    lora_alpha: float,
    target_modules: list[str] | str,
    seq_cls: bool = False,
    **extra: Any,
) -> Path:
    """A random LoRA adapter of the base at ``base``, saved by peft into ``directory``.
    ``seq_cls``: the base is a seq-cls model and the adapter saves its ``score`` head."""
    import torch
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    auto = AutoModelForSequenceClassification if seq_cls else AutoModelForCausalLM
    model = auto.from_pretrained(str(base), dtype=torch.float32)
    task = TaskType.SEQ_CLS if seq_cls else TaskType.CAUSAL_LM
    config = LoraConfig(
        task_type=task, r=r, lora_alpha=lora_alpha, target_modules=target_modules, **extra
    )
    peft_model = get_peft_model(model, config)
    randomize_lora_(peft_model, seed)
    peft_model.save_pretrained(str(directory), safe_serialization=True)
    return directory


def save_embedding_adapter(
    base: Path, directory: Path, *, seed: int, r: int, lora_alpha: float, target_modules: list[str]
) -> Path:
    """A random LoRA adapter of the bare transformer (``AutoModel``: Qwen3Model, ...) of an
    embedding model at ``base``, saved by peft into ``directory`` (a FEATURE_EXTRACTION
    adapter, as sentence-transformers' ``add_adapter`` trains one)."""
    import torch
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModel

    torch.manual_seed(seed)
    model = AutoModel.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(
        task_type=TaskType.FEATURE_EXTRACTION, r=r, lora_alpha=lora_alpha,
        target_modules=target_modules,
    )  # fmt: skip
    peft_model = get_peft_model(model, config)
    randomize_lora_(peft_model, seed)
    peft_model.save_pretrained(str(directory), safe_serialization=True)
    return directory


def peft_model(
    base: Path, adapter: Path | None, seq_cls: bool = False, merged: bool = False
) -> Any:
    """transformers fp32 base with the adapter applied (None: the base alone)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if seq_cls else AutoModelForCausalLM
    model = auto.from_pretrained(str(base), dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
        if merged:
            model = model.merge_and_unload()
    return model.eval()


def reference_logprobs(model: Any, rows: list[list[int]]) -> list[np.ndarray]:
    """Each row's full-vocabulary log-softmax ``[len(row), V]``, one row at a time."""
    import torch

    out = []
    with torch.no_grad():
        for row in rows:
            logits = model(input_ids=torch.tensor([row])).logits[0]
            out.append(torch.log_softmax(logits.float(), dim=-1).numpy())
    return out


def reference_scores(model: Any, rows: list[list[int]], labels: list[int]) -> np.ndarray:
    """``[rows, labels]``: each row's next-token log-probs of ``labels`` (semantics 1)."""
    return np.stack([lp[-1, labels] for lp in reference_logprobs(model, rows)])


def reference_head(model: Any, rows: list[list[int]]) -> np.ndarray:
    """A seq-cls model's outputs ``[rows, L]`` at each row's last token, one row at a time."""
    import torch

    with torch.no_grad():
        return np.stack([model(input_ids=torch.tensor([row])).logits[0].numpy() for row in rows])


def lora_settings(max_loras: int, max_lora_rank: int) -> dict[str, Any]:
    """ReplicaSettings fields of the LoRA tests: the tiny models' small buckets, no
    background compiles, adapter slots of the given size."""
    return {
        "token_buckets": (16, 32),
        "item_token_buckets": (16, 32),
        "background_compile": False,
        "multi_item_scoring_delimiter": 0,
        "max_loras": max_loras,
        "max_lora_rank": max_lora_rank,
    }
