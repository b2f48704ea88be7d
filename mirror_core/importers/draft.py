"""What an importer builds: the mirrorflow YAML tree, the comments beside its keys, and its findings.

An importer is pure: it reads the input text and fills a :class:`Draft`. Every input setting ends in
one of three places, so nothing is dropped silently:

- mapped into the tree (with a :meth:`Draft.note` comment where the mapping needs explaining);
- :meth:`Draft.unmapped`: no equivalent or a different meaning; a YAML comment beside the nearest
  output key *and* a :class:`Finding` (one stderr line naming the input key or line);
- :meth:`Draft.secret`: the value is never copied; an ``${ENV}`` placeholder takes its place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from mirror_core.errors import ConfigError, ConfigIssue

Path = tuple[str | int, ...]

_ENV_SAFE = re.compile(r"[^A-Za-z0-9]+")


@dataclass(frozen=True)
class Finding:
    """An input setting with no mirrorflow equivalent (or a different meaning)."""

    where: str  # the input's key (``A->B.tasks.max``, ``:groups[0] :poll-interval``) or ``line N``
    message: str
    file: str | None = None  # the input file, when an import reads more than one

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class Draft:
    """A mirrorflow config being built: ``tree`` (plain dicts/lists in output order), comment lines
    placed before the key at a path (``()`` is the top of the file), findings and placeholders."""

    source: str  # the input's name, used in errors
    tree: dict[str, Any] = field(default_factory=dict)
    comments: dict[Path, list[str]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    env_vars: dict[str, str] = field(default_factory=dict)  # placeholder -> what to put in it
    #: input key -> the file it was read from, when an import reads several; errors and findings about
    #: that key name that file (the importer sets it while it maps what those files hold)
    files: dict[str, str] = field(default_factory=dict)

    def note(self, anchor: Path, text: str) -> None:
        """A comment before the key at ``anchor`` (a mapped setting whose mapping needs a word)."""
        lines = self.comments.setdefault(anchor, [])
        if text not in lines:
            lines.append(text)

    def unmapped(self, where: str, message: str, anchor: Path = (), file: str | None = None) -> None:
        """An input setting with no equivalent: a comment beside ``anchor`` and a finding."""
        file = file or self.files.get(where)
        self.findings.append(Finding(where, message, file))
        # the comment names the file without its directory, so the output does not depend on where it was read
        self.note(anchor, f"{PurePath(file).name + ': ' if file else ''}{where}: {message}")

    def secret(self, name: str, what: str) -> str:
        """An ``${ENV}`` placeholder for a value the input does not hold or must not be copied (a
        password, a file a Kubernetes secret holds). No default: validate and run name the variable
        until it is set, instead of connecting with an empty password."""
        var = env_name(name)
        self.env_vars.setdefault(var, what)
        return f"${{{var}}}"

    def error(self, where: str, message: str) -> ConfigError:
        """Malformed input: one line naming the file, the key or line, and the problem (exit 2)."""
        return ConfigError(ConfigIssue(where, message), self.files.get(where, self.source))


def env_name(*parts: str) -> str:
    """``A``, ``sasl password`` -> ``A_SASL_PASSWORD``."""
    return _ENV_SAFE.sub("_", "_".join(parts)).strip("_").upper()


def safe_alias(text: str) -> str:
    """A mirrorflow cluster alias (letters, digits, '_', '-') made from ``text``."""
    alias = re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-_")
    return alias or "cluster"
