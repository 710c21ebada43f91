"""The prompts that ask the optimizer LLM, as readable Markdown files shipped in the package.

Files (``agentbolt/algorithms/apo/templates/``) and the placeholders each must contain:
    * ``critique.md`` (APO, the textual gradient): ``{prompt}``, ``{traces}``; optional ``{outcomes}`` (one line per
      task of the batch);
    * ``edit.md`` (APO, applying the gradient): ``{prompt}``, ``{critique}``; optional ``{traces}`` and
      ``{outcomes}`` (the ones the critique was given), ``{placeholders}``, ``{variant}``, ``{variants}``;
    * ``reflect.md`` (GEPA, reflective mutation of one named prompt): ``{prompt}``, ``{traces}``; optional
      ``{prompt_name}``, ``{placeholders}``, ``{outcomes}`` (one line per task of the minibatch).

Substitution is one pass of ``{name}`` -> value for the names given to :meth:`TemplateSet.render`; any other text in
braces (``{braces}``, JSON examples) is left as written, and the inserted values are never parsed again, so traces
full of braces are safe. A config overrides a template by path or by text (:class:`TemplateOverride`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

from agentbolt.errors import ConfigError

REQUIRED_PLACEHOLDERS: dict[str, frozenset[str]] = {
    "critique": frozenset({"prompt", "traces"}),
    "edit": frozenset({"prompt", "critique"}),
    "reflect": frozenset({"prompt", "traces"}),
}
"""Template name -> placeholders it must contain; the keys are the known template names."""

_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class TemplateOverride(BaseModel):
    """Replace one shipped template: give exactly one of ``path`` (a UTF-8 file) or ``text``.

    YAML example::

        templates:
          critique: {path: prompts/my_critique.md}
          edit: {text: "Rewrite {prompt} following {critique}. Reply between <prompt> and </prompt>."}
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str | None = None
    text: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> TemplateOverride:
        if (self.path is None) == (self.text is None):
            raise ValueError("a template override needs exactly one of 'path' or 'text'")
        return self


@dataclass(frozen=True)
class TemplateSet:
    """The optimizer templates in use: name -> text (see the module docstring for the names)."""

    texts: Mapping[str, str]

    def render(self, name: str, **values: str) -> str:
        """Fill template ``name``: each ``{key}`` of ``values`` is replaced, other braces stay.

        Raises:
            ConfigError: ``name`` is not a known template.
        """
        if name not in self.texts:
            raise ConfigError(f"unknown optimizer template {name!r}; known: {', '.join(sorted(self.texts))}")

        def substitute(match: re.Match[str]) -> str:
            key = match.group(1)
            return values[key] if key in values else match.group(0)

        return _PLACEHOLDER_RE.sub(substitute, self.texts[name])


def default_template(name: str) -> str:
    """The shipped text of template ``name`` (read with importlib.resources). Raises ConfigError if unknown."""
    if name not in REQUIRED_PLACEHOLDERS:
        raise ConfigError(f"unknown optimizer template {name!r}; known: {', '.join(sorted(REQUIRED_PLACEHOLDERS))}")
    return resources.files("agentbolt.algorithms.apo").joinpath("templates", f"{name}.md").read_text(encoding="utf-8")


def load_templates(
    overrides: Mapping[str, TemplateOverride] | None = None, *, base_dir: Path | None = None
) -> TemplateSet:
    """The shipped templates with ``overrides`` applied.

    Args:
        overrides: template name -> replacement; a relative ``path`` is resolved against ``base_dir`` (the config
            file's folder) when given, else the working directory.
        base_dir: folder for relative override paths.

    Raises:
        ConfigError: an unknown template name, an unreadable file, or a template missing one of its required
            placeholders (the message names them).
    """
    texts = {name: default_template(name) for name in REQUIRED_PLACEHOLDERS}
    for name, override in (overrides or {}).items():
        if name not in REQUIRED_PLACEHOLDERS:
            raise ConfigError(
                f"unknown optimizer template {name!r} in the config; known: {', '.join(sorted(REQUIRED_PLACEHOLDERS))}"
            )
        if override.text is not None:
            texts[name] = override.text
        else:
            path = Path(override.path or "")
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            try:
                texts[name] = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"cannot read the {name!r} template override {str(path)!r}: {exc}") from exc
        missing = REQUIRED_PLACEHOLDERS[name] - set(_PLACEHOLDER_RE.findall(texts[name]))
        if missing:
            raise ConfigError(
                f"the {name!r} template override lacks the placeholder(s) "
                f"{', '.join('{' + key + '}' for key in sorted(missing))}; the optimizer needs them to see the prompt"
            )
    return TemplateSet(texts)
