"""``mirrorflow import``: translate the configurations users run today into a mirrorflow YAML.

One module per format (:mod:`.viooh`, :mod:`.mm2`, and for MM2 run as Kafka Connect connectors
:mod:`.connect`, :mod:`.strimzi`, :mod:`.mm1`), each pure: text in,
a :class:`~.draft.Draft` (tree, comments, findings, placeholders) out. :func:`import_config` renders it
(:mod:`.writer`) and checks that the result validates, so the CLI only reads files and prints.
Malformed input raises :class:`~mirror_core.errors.ConfigError` naming the file and the key or line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath

import yaml

from mirror_core.errors import ConfigError, ConfigIssue
from mirror_core.importers.draft import Finding

FORMATS = ("viooh", "mm2", "strimzi", "mm1")


@dataclass(frozen=True)
class Imported:
    """The YAML text, what did not map (one stderr line each) and the placeholders to set."""

    yaml_text: str
    findings: tuple[Finding, ...]
    env_vars: tuple[tuple[str, str], ...]  # (variable, what it holds)


def import_config(fmt: str, text: str, source: str, *, producer_text: str | None = None,
                  producer_source: str | None = None, include: str | None = None,
                  viooh_env: str = "local", more: Sequence[tuple[str, str]] = ()) -> Imported:
    """Translate ``text`` (the input file's content; ``source`` names it in errors) from ``fmt``.

    mm1 also takes the producer.properties (``producer_text``) and the include regex; viooh takes
    the ``ENV`` its consumer group names were derived with. ``more``: further (text, source) inputs,
    which only mm2's Kafka Connect connector configs take (one file per connector).
    """
    from mirror_core.importers import connect, mm1, mm2, strimzi, viooh
    from mirror_core.importers.writer import render

    inputs = [(text, source), *more]
    if fmt == "mm2" and any(connect.is_connector_config(t) for t, _ in inputs):
        draft = connect.import_connectors(inputs)
    elif more:
        what = ("mm2 reads one mm2.properties (several files only when they are connector configs)" if fmt == "mm2"
                else f"{fmt} reads one input file")
        raise ConfigError(ConfigIssue("INPUT", f"{len(inputs)} files given: {what}"), more[0][1])
    elif fmt == "viooh":
        draft = viooh.import_viooh(text, source, env=viooh_env)
    elif fmt == "mm2":
        draft = mm2.import_mm2(text, source)
    elif fmt == "strimzi":
        draft = strimzi.import_strimzi(text, source)
    elif fmt == "mm1":
        draft = mm1.import_mm1(text, source, producer_text, producer_source or "producer.properties", include)
    else:
        raise ConfigError(ConfigIssue("FORMAT", f"unknown format {fmt!r} (one of: {', '.join(FORMATS)})"), source)
    name = ", ".join(PurePath(s).name for _, s in inputs)
    header = [
        f"mirrorflow config imported from {name} ({fmt}) by `mirrorflow import`.",
        "Comments mark what mapped differently or not at all; `mirrorflow plan` shows what it will create.",
    ]
    if draft.env_vars:
        header.append("Set before running: " + ", ".join(sorted(draft.env_vars)))
    text_out = render(draft, header)
    _check(text_out, source, {var: "placeholder" for var in draft.env_vars})
    return Imported(text_out, tuple(draft.findings), tuple(sorted(draft.env_vars.items())))


def _check(text: str, source: str, env: dict[str, str]) -> None:
    """The output must validate once its placeholders are set; a failure names the output path."""
    from mirror_core.config import parse_config

    try:
        parse_config(yaml.safe_load(text), env=env)
    except ConfigError as exc:
        raise ConfigError([ConfigIssue(f"imported config {i.path}", i.message) for i in exc.issues], source) from None
