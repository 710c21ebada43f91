"""The files of a saved LoRA adapter (peft's format), checked before anything loads them.

Torch-free, so a command can refuse a damaged checkpoint before it loads a model or writes an output folder.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from agentbolt.errors import ConfigError

ADAPTER_CONFIG: Final = "adapter_config.json"
ADAPTER_WEIGHTS: Final = "adapter_model.safetensors"
ADAPTER_FILES: Final = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
"""What ``PeftModel.save_pretrained`` writes for a LoRA adapter (safetensors serialization)."""


@contextlib.contextmanager
def quiet_peft_deprecation() -> Iterator[None]:
    """Hide the ``FutureWarning`` that peft raises while wrapping a model: it asks transformers >= 5 through the
    deprecated ``is_gradient_checkpointing``. The warning is theirs, not the user's."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def check_adapter_files(folder: Path | str) -> None:
    """Check that ``folder`` holds a complete LoRA adapter: both of :data:`ADAPTER_FILES`, a config that is a JSON
    object, and a safetensors file whose header is whole and whose tensors cover the file (``safetensors.safe_open``
    reads the header and checks the offsets; no tensor is loaded).

    Raises:
        ConfigError: a file is missing (the message says to give ``OUT/checkpoints/step-N``), or a file is damaged,
            e.g. cut short by a full disk or a copy that stopped (the message says to use another checkpoint).
    """
    from safetensors import SafetensorError, safe_open

    where = Path(folder)
    missing = [name for name in ADAPTER_FILES if not (where / name).is_file()]
    if missing:
        raise ConfigError(
            f"{where} holds no LoRA adapter ({', '.join(missing)} missing); give a checkpoint folder "
            "OUT/checkpoints/step-N written by agentbolt train"
        )
    try:
        config = json.loads((where / ADAPTER_CONFIG).read_text())
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
        with safe_open(str(where / ADAPTER_WEIGHTS), framework="numpy") as weights:
            if not list(weights.keys()):
                raise ValueError("no tensor")
    except (OSError, ValueError, SafetensorError) as exc:
        raise ConfigError(
            f"the LoRA adapter in {where} is damaged ({short_reason(exc)}); use another checkpoint "
            "(the one before it), or train again"
        ) from None


def untrained_adapter(folder: Path | str) -> bool:
    """Whether the LoRA adapter in ``folder`` is the identity: every ``lora_B`` matrix all zeros, as peft initializes
    it (Hu et al. 2021, "LoRA", section 4.1: B = 0 at the start) and as it stays when no optimizer step touched it.
    Reads the safetensors file with numpy (torch-free); ``False`` when the file has no ``lora_B`` tensor.

    Raises:
        OSError, ValueError, safetensors.SafetensorError: the file cannot be read (call :func:`check_adapter_files`
            first).
    """
    from safetensors import safe_open

    found = False
    with safe_open(str(Path(folder) / ADAPTER_WEIGHTS), framework="numpy") as weights:
        names = list(weights.keys())  # a safetensors handle is not iterable
        for name in names:
            if "lora_B" not in name:
                continue
            found = True
            if weights.get_tensor(name).any():
                return False
    return found


def short_reason(exc: BaseException, *, width: int = 200) -> str:
    """The first non-empty line of ``exc``'s message, cut at ``width`` characters, and how many lines were left out
    (torch's state-dict errors list every mismatched tensor: hundreds of lines for one wrong LoRA rank)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    first = lines[0] if len(lines[0]) <= width else lines[0][: width - 3] + "..."
    return first if len(lines) == 1 else f"{first} ... and {len(lines) - 1} more lines"
