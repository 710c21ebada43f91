"""The trained agent out: merge a checkpoint's LoRA adapter into its base model and write a plain model folder.

:func:`export_merged_model` reads a checkpoint folder (``OUT/checkpoints/step-N/``: ``checkpoint.json`` plus the
adapter in peft's format) and writes a Hugging Face folder that plain ``transformers`` loads, with no agentbolt and
no peft installed:

- ``model.safetensors`` + ``config.json`` (+ ``generation_config.json``): the merged weights, bf16;
- the tokenizer files and the chat template, saved from the base model's tokenizer;
- ``agentbolt-export.json``: where it came from (the checkpoint, the model, the base directory);
- with ``gguf=True``, also ``model.gguf`` (:data:`GGUF_FILE`) for llama.cpp and Ollama.

The merge is the one the training gateway served: the base model in bf16 (the embedded backend's dtype), and for
every LoRA layer ``W = W0 + scaling * (B @ A)`` computed in float32 and cast to bf16
(:func:`~agentbolt.algorithms.rl.weight_sync.apply_adapter`, which ``serve --adapter`` uses too, over
:func:`~agentbolt.algorithms.rl.weight_sync.merged_lora_weights`, the function the trainer calls after each update).
So the exported model generates what the agent saw during training, token for token, for a run trained on a
CPU (on a GPU, the float32 matmul may round the last bit differently).

The GGUF keeps the model's own GGUF metadata: for an embedded model (``smollm2-135m``, ``qwen2.5-0.5b``...), every
key/value of the GGUF it ships (architecture, hyper-parameters, tokenizer, chat template) is copied, with
``general.file_type`` set to F16 or BF16, and every tensor of that GGUF is written from the merged weights under the
same name, in the same order and layout: 2-D weights in f16 or bf16, 1-D tensors (norms, biases) in float32, as
llama.cpp's converter writes them. llama.cpp's ``llama`` architecture keeps each head's rotary dimensions as
interleaved pairs where Hugging Face keeps two halves, so ``attn_q``/``attn_k`` of ``llama`` models (SmolLM2) are
permuted back (the inverse of what transformers' GGUF loader does on load); ``qwen2`` needs no permutation. A model
given as a directory has no source GGUF: ``gguf=True`` is refused for it (convert the exported folder with
llama.cpp's ``convert_hf_to_gguf.py`` instead).

Writes are atomic: everything goes into a temporary sibling folder (``.tmp-<name>-*``), renamed into place at the end.
torch, transformers, peft and gguf are imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from agentbolt.algorithms.rl.adapter_files import check_adapter_files
from agentbolt.errors import ConfigError
from agentbolt.trainer.checkpoint import CHECKPOINTS_DIR, make_readable, read_checkpoint

if TYPE_CHECKING:
    import numpy as np
    import torch

    from agentbolt.inference.model_files import ModelSpec

logger = logging.getLogger(__name__)

GgufDtype = Literal["f16", "bf16"]
"""Storage type of the GGUF's 2-D weights: ``f16`` (every llama.cpp build and Ollama; bf16 values beyond f16's range
or below its normal range, |w| < 6.1e-5, are rounded) or ``bf16`` (bit-exact copy of the merged weights)."""

GGUF_FILE: Final = "model.gguf"
"""The GGUF's name inside the exported folder."""

EXPORT_INFO_FILE: Final = "agentbolt-export.json"
"""Provenance of an exported folder: ``{"checkpoint", "model", "base_model_dir", "merged_tensors", "gguf",
"gguf_dtype", "created_at"}``."""

_TMP_PREFIX: Final = ".tmp-"
"""Prefix of the work folder beside ``--out`` (``.tmp-NAME-PID-RANDOM``), renamed to ``--out`` when complete."""

_SUPPORTED_GGUF_ARCHS: Final = ("llama", "qwen2")
"""GGUF architectures whose tensor layout is handled (the embedded models')."""

_PERMUTED_ARCHS: Final = frozenset({"llama"})
"""Architectures whose q/k projections llama.cpp stores with interleaved rotary pairs."""

_SKIPPED_GGUF_KEYS: Final = frozenset({"general.architecture", "general.quantization_version"})
"""Source keys not copied: the writer adds the architecture itself; the export is not quantized."""


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_merged_model` wrote.

    Attributes:
        out_dir: the exported folder (absolute).
        checkpoint_dir: the checkpoint it came from (absolute).
        model: the model as ``checkpoint.json`` names it (an embedded name or a directory).
        base_model_dir: the bf16 Hugging Face directory the adapter was merged into.
        merged_tensors: how many weight matrices got a LoRA update (layers x target modules, e.g. 30 x 7 = 210 for
            SmolLM2-135M with every projection adapted).
        files: the file names in ``out_dir``, sorted.
        size_bytes: total size of those files.
        gguf_file: the GGUF's path, or ``None`` when none was asked for.
        gguf_dtype: the GGUF's weight type, or ``None``.
        duration_s: wall time of the export.
    """

    out_dir: Path
    checkpoint_dir: Path
    model: str
    base_model_dir: Path
    merged_tensors: int
    files: tuple[str, ...]
    size_bytes: int
    gguf_file: Path | None
    gguf_dtype: GgufDtype | None
    duration_s: float


def export_merged_model(
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    *,
    gguf: bool = False,
    gguf_dtype: GgufDtype = "f16",
    overwrite: bool = False,
) -> ExportResult:
    """Merge a checkpoint's LoRA adapter into its base model and write a Hugging Face folder (and a GGUF).

    Loads the base model in bf16 on the CPU, applies the adapter as the training gateway served it (see the module
    docstring), and writes ``out_dir`` atomically. Measured with ``gguf=True`` on 2 CPU cores: SmolLM2-135M 19-64 s,
    1.2 GB peak RSS, 0.54 GB written; Qwen2.5-0.5B 114 s, 3.3 GB peak RSS, 2.5 GB written.

    Args:
        checkpoint_dir: a complete checkpoint folder (``OUT/checkpoints/step-N``), holding ``checkpoint.json``,
            ``adapter_config.json`` and ``adapter_model.safetensors``; other files are ignored.
        out_dir: the folder to write; created with its parents. It must not exist or be empty, unless
            ``overwrite``.
        gguf: also write :data:`GGUF_FILE` (only for a model whose GGUF agentbolt knows: an embedded model).
        gguf_dtype: the GGUF's weight type, ``f16`` or ``bf16`` (see :data:`GgufDtype`).
        overwrite: replace an existing non-empty ``out_dir`` (the old one is removed only once the new one is
            complete).

    Returns:
        What was written.

    Raises:
        ConfigError: ``checkpoint_dir`` is not a complete checkpoint (no ``checkpoint.json``, or no adapter), its
            base model cannot be found, the adapter does not fit the base model, ``out_dir`` exists and is not
            empty (without ``overwrite``) or would replace the checkpoint or the base model, ``gguf`` for a model
            without a source GGUF, an unknown ``gguf_dtype``, or a weight that f16 cannot hold.
        BackendError: an embedded model's package is missing or corrupt (the message gives the pip command).
    """
    started_s = time.monotonic()
    if gguf_dtype not in ("f16", "bf16"):
        raise ConfigError(f"gguf_dtype (--gguf-dtype) must be 'f16' or 'bf16', got {gguf_dtype!r}")
    checkpoint = Path(checkpoint_dir).expanduser().resolve()
    model, base_dir = _read_checkpoint(checkpoint)
    out = Path(out_dir).expanduser().resolve()
    run_checkpoints = (checkpoint.parent,) if checkpoint.parent.name == CHECKPOINTS_DIR else ()
    _check_out_dir(out, overwrite=overwrite, sources=(checkpoint, *run_checkpoints, base_dir))
    source_spec = _gguf_source_spec(model, base_dir) if gguf else None
    if gguf and source_spec is None:
        raise ConfigError(
            f"--gguf needs the model's source GGUF, and {model!r} is a model directory, not an embedded model; "
            "export without --gguf, then convert the folder with llama.cpp's convert_hf_to_gguf.py"
        )

    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_work_folders(out)
    work = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{out.name}-{os.getpid()}-", dir=out.parent))
    try:
        staged = work / "model"
        staged.mkdir()
        state, config, merged_count = _write_hf_folder(checkpoint, base_dir, staged)
        if source_spec is not None:
            source = _source_gguf_path(source_spec, work)
            _write_gguf(state, config, source, staged / GGUF_FILE, gguf_dtype)
        info = {
            "checkpoint": str(checkpoint),
            "model": model,
            "base_model_dir": str(base_dir),
            "merged_tensors": merged_count,
            "gguf": GGUF_FILE if gguf else None,
            "gguf_dtype": gguf_dtype if gguf else None,
            "created_at": time.time(),
        }
        (staged / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        make_readable(staged)
        replaced = work / "replaced"
        if out.exists():  # empty, or overwrite: move it aside, removed with the temporary folder
            out.rename(replaced)
        try:
            staged.rename(out)
        except OSError:
            if replaced.exists():  # put the old folder back before the temporary folder goes
                replaced.rename(out)
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)

    files = tuple(sorted(p.name for p in out.iterdir() if p.is_file()))
    result = ExportResult(
        out_dir=out,
        checkpoint_dir=checkpoint,
        model=model,
        base_model_dir=base_dir,
        merged_tensors=merged_count,
        files=files,
        size_bytes=sum((out / name).stat().st_size for name in files),
        gguf_file=out / GGUF_FILE if gguf else None,
        gguf_dtype=gguf_dtype if gguf else None,
        duration_s=time.monotonic() - started_s,
    )
    logger.info("exported %s to %s in %.1f s", checkpoint, out, result.duration_s)
    return result


def _read_checkpoint(checkpoint: Path) -> tuple[str, Path]:
    """``(model, base_model_dir)`` of a complete checkpoint folder (``read_checkpoint``) with a whole adapter
    (``check_adapter_files``); the base directory is checked to exist.

    When the recorded base directory is gone (the checkpoint was copied to another machine, or the cache cleared),
    an embedded model is prepared again (the same conversion, so the same weights) and a model directory named by
    ``model`` is used if it exists.
    """
    info = read_checkpoint(checkpoint)
    check_adapter_files(checkpoint)
    model, recorded = info.model, info.base_model_dir
    base_dir = Path(recorded).expanduser()
    if (base_dir / "config.json").is_file():
        return model, base_dir.resolve()

    from agentbolt.inference.model_files import MODEL_SPECS, prepare_model

    if model in MODEL_SPECS:
        logger.warning("the trained base directory %s is gone; preparing %s again", recorded, model)
        return model, prepare_model(model).resolve()
    if (Path(model).expanduser() / "config.json").is_file():
        logger.warning("the trained base directory %s is gone; using the model directory %s", recorded, model)
        return model, Path(model).expanduser().resolve()
    raise ConfigError(
        f"the base model of {checkpoint} is gone: neither {recorded} nor {model} is a model directory; put the "
        f"model that was trained back at {recorded}"
    )


def _remove_dead_work_folders(out: Path) -> list[Path]:
    """Delete the temporary folders that exports into ``out`` killed before they finished left beside it
    (``.tmp-NAME-PID-*`` whose process is gone); return them."""
    import psutil

    removed = []
    for folder in out.parent.glob(f"{_TMP_PREFIX}{out.name}-*"):
        pid = folder.name[len(f"{_TMP_PREFIX}{out.name}-") :].split("-", 1)[0]
        if folder.is_dir() and pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _check_out_dir(out: Path, *, overwrite: bool, sources: tuple[Path, ...]) -> None:
    """Refuse an output folder that holds something (unless ``overwrite``) or that would replace a source."""
    for source in sources:
        if out == source or out in source.parents:
            raise ConfigError(f"--out {out} would replace {source}, which the export reads; choose another folder")
        if source in out.parents:
            raise ConfigError(
                f"--out {out} is inside {source}, which the run may delete (checkpoints are pruned) or the export "
                "reads; choose a folder outside it, e.g. OUT/model"
            )
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"--out {out} is a file; choose a folder")
    if any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{out} exists and is not empty; pass --overwrite to replace it")


def _write_hf_folder(checkpoint: Path, base_dir: Path, target: Path) -> tuple[dict[str, torch.Tensor], Any, int]:
    """Merge the adapter into the bf16 base model and save model, generation config and tokenizer into ``target``.

    Returns:
        ``(state_dict, config, merged_count)``: the merged model's tensors (bf16, tied ones included), its
        transformers config, and how many weight matrices got a LoRA update.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentbolt.algorithms.rl.weight_sync import apply_adapter

    # bf16: the dtype the embedded backend serves (EmbeddedBackend.load), so the merge rounds as the gateway's did
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    merged_count = apply_adapter(model, checkpoint)  # the serving path's merge (serve --adapter uses it too)
    if merged_count == 0:
        raise ConfigError(f"the adapter in {checkpoint} adapts no layer of {base_dir}; nothing to merge")
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    return model.state_dict(), model.config, merged_count


def _gguf_source_spec(model: str, base_dir: Path) -> ModelSpec | None:
    """The embedded model whose GGUF the export copies its metadata from: ``model`` itself, or the model whose
    conversion ``base_dir`` is (its ``prepare_model`` marker); ``None`` for any other model directory."""
    from agentbolt.inference.model_files import MARKER_FILE, MODEL_SPECS, is_prepared

    if model in MODEL_SPECS:
        return MODEL_SPECS[model]
    try:
        name = json.loads((base_dir / MARKER_FILE).read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    spec = MODEL_SPECS.get(name) if isinstance(name, str) else None
    return spec if spec is not None and is_prepared(base_dir, spec) else None


def _source_gguf_path(spec: ModelSpec, work: Path) -> Path:
    """The embedded model's GGUF, checked (sizes and sha256); a multi-part one is concatenated into ``work``."""
    from agentbolt.inference.model_files import locate_parts, verify_parts

    paths = locate_parts(spec)
    if len(paths) == 1:
        verify_parts(spec, paths)
        return paths[0]
    joined = work / "source.gguf"
    verify_parts(spec, paths, concat_to=joined)
    return joined


def interleave_rotary_halves(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder a q or k projection from Hugging Face's rotary layout to llama.cpp's ``llama`` layout.

    Hugging Face's Llama rotates the two halves of each head's dimensions (``rotate_half``); llama.cpp's ``llama``
    architecture rotates adjacent pairs. Row ``h * d + i`` (head ``h`` of size ``d``, ``i < d / 2``) moves to
    ``h * d + 2 * i`` and row ``h * d + d / 2 + i`` to ``h * d + 2 * i + 1``. transformers' GGUF loader applies the
    inverse when it reads a ``llama`` GGUF.

    Args:
        weight: ``(n_heads * d, ...)``, a projection weight ``(n_heads * d, hidden)`` or its bias ``(n_heads * d,)``;
            for ``k_proj`` pass the number of key/value heads.
        n_heads: the number of heads the first axis holds.

    Returns:
        A tensor of the same shape and dtype.

    Raises:
        ValueError: the first axis is not ``n_heads`` times an even head size.
    """
    rows = weight.shape[0]
    if n_heads <= 0 or rows % n_heads or (rows // n_heads) % 2:
        raise ValueError(f"{rows} rows are not {n_heads} heads of an even size")
    half = rows // n_heads // 2
    return weight.reshape(n_heads, 2, half, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def _write_gguf(state: dict[str, torch.Tensor], config: Any, source: Path, path: Path, dtype: GgufDtype) -> None:
    """Write the merged tensors as a GGUF at ``path`` with ``source``'s metadata, tensor names, order and shapes."""
    import gguf as gg
    import numpy as np
    import torch

    reader = gg.GGUFReader(source)
    arch_name = _field_value(reader, "general.architecture")
    if arch_name not in _SUPPORTED_GGUF_ARCHS:
        raise ConfigError(
            f"GGUF export supports the architectures {', '.join(_SUPPORTED_GGUF_ARCHS)}, not {arch_name!r}; export "
            "without --gguf and convert the folder with llama.cpp's convert_hf_to_gguf.py"
        )
    arch = next(key for key, value in gg.MODEL_ARCH_NAMES.items() if value == arch_name)
    name_map = gg.get_tensor_name_map(arch, int(config.num_hidden_layers))
    by_gguf_name: dict[str, torch.Tensor] = {}
    for hf_name, tensor in state.items():
        stem, _, suffix = hf_name.rpartition(".")
        gguf_stem = name_map.get_name(stem)
        if gguf_stem is not None:
            by_gguf_name[f"{gguf_stem}.{suffix}"] = tensor
    source_names = [t.name for t in reader.tensors]
    missing = [name for name in source_names if name not in by_gguf_name]
    if missing:
        raise ConfigError(f"the merged model has no tensor for {missing[:5]} of {source.name}; is it the same model?")
    tied = bool(getattr(config, "tie_word_embeddings", False))
    dropped = [n for n in by_gguf_name if n not in set(source_names) and not (tied and n == "output.weight")]
    if dropped:
        raise ConfigError(f"the GGUF of this model has no place for {dropped[:5]}; export without --gguf")

    n_heads = int(_field_value(reader, f"{arch_name}.attention.head_count"))
    n_kv_heads = int(_field_value(reader, f"{arch_name}.attention.head_count_kv", default=n_heads))
    file_type = gg.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gg.LlamaFileType.MOSTLY_BF16

    def layout(name: str) -> tuple[gg.GGMLQuantizationType, np.dtype]:
        """How a tensor is stored: 1-D tensors and norms in float32 (llama.cpp wants them so), others in ``dtype``."""
        if by_gguf_name[name].dim() <= 1 or name.endswith("_norm.weight"):
            return gg.GGMLQuantizationType.F32, np.dtype(np.float32)
        if dtype == "f16":
            return gg.GGMLQuantizationType.F16, np.dtype(np.float16)
        return gg.GGMLQuantizationType.BF16, np.dtype(np.uint16)  # numpy has no bf16: its bits, as uint16

    def stored(name: str) -> np.ndarray:
        tensor = by_gguf_name[name].detach().cpu()
        if arch_name in _PERMUTED_ARCHS and ".attn_q." in name:
            tensor = interleave_rotary_halves(tensor, n_heads)
        elif arch_name in _PERMUTED_ARCHS and ".attn_k." in name:
            tensor = interleave_rotary_halves(tensor, n_kv_heads)
        kind, _ = layout(name)
        if kind == gg.GGMLQuantizationType.F32:
            return tensor.float().contiguous().numpy()
        if kind == gg.GGMLQuantizationType.BF16:
            return tensor.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)
        if tensor.float().abs().amax() > torch.finfo(torch.float16).max:
            raise ConfigError(f"{name} has values beyond float16's range; export with --gguf-dtype bf16")
        return tensor.to(torch.float16).contiguous().numpy()

    writer = gg.GGUFWriter(path, arch_name)
    try:
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key in _SKIPPED_GGUF_KEYS:
                continue
            if key == "general.file_type":
                writer.add_uint32(key, int(file_type))
                continue
            main_type = field.types[0]
            sub_type = field.types[-1] if main_type == gg.GGUFValueType.ARRAY else None
            if main_type == gg.GGUFValueType.ARRAY and len(field.types) != 2:
                raise ConfigError(f"{source.name}: metadata {key!r} is a nested array, which the export cannot copy")
            writer.add_key_value(key, field.contents(), main_type, sub_type=sub_type)
        if "general.file_type" not in reader.fields:
            writer.add_file_type(int(file_type))
        for source_tensor in reader.tensors:
            name = source_tensor.name
            shape = tuple(by_gguf_name[name].shape)
            if list(reversed(shape)) != [int(n) for n in source_tensor.shape]:
                raise ConfigError(f"{name}: merged shape {shape} does not match {source.name}; is it the same model?")
            kind, np_dtype = layout(name)
            nbytes = int(by_gguf_name[name].numel()) * np_dtype.itemsize
            writer.add_tensor_info(name, shape, np_dtype, nbytes, raw_dtype=kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for source_tensor in reader.tensors:  # one tensor in memory at a time
            writer.write_tensor_data(stored(source_tensor.name))
    finally:
        writer.close()


def _field_value(reader: Any, key: str, default: Any = None) -> Any:
    """A scalar or string metadata value of a GGUF; ``default`` when the key is absent (or ConfigError if none)."""
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ConfigError(f"the source GGUF has no {key!r}; it cannot be exported as GGUF")
        return default
    return field.contents()
