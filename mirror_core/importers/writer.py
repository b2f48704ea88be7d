"""Render a :class:`~mirror_core.importers.draft.Draft` as YAML with its comments (ruamel.yaml).

The output is stable: the same draft gives the same bytes (keys keep the order the importer
built them in; nothing depends on dict hashing, time or the environment).
"""

from __future__ import annotations

import io
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from mirror_core.importers.draft import Draft, Path

_MAP_INDENT = 2
_SEQ_ITEM_INDENT = 4  # "  - key: ..." puts an item's keys 4 columns in from its parent key


def render(draft: Draft, header: list[str]) -> str:
    """The YAML text: ``header`` and the top-level comments first, then the tree."""
    root = _build(draft.tree, (), 0, draft.comments)
    assert isinstance(root, CommentedMap)
    top = list(header) + draft.comments.get((), [])
    if top:
        root.yaml_set_start_comment("\n".join(top))
    y = YAML()
    y.indent(mapping=_MAP_INDENT, sequence=_SEQ_ITEM_INDENT, offset=2)
    y.width = 4096  # never fold a long regex or comment
    buf = io.StringIO()
    y.dump(root, buf)
    return buf.getvalue()


def _build(node: Any, path: Path, col: int, comments: dict[Path, list[str]]) -> Any:
    if isinstance(node, dict):
        m = CommentedMap()
        for key, value in node.items():
            m[key] = _build(value, path + (key,), col + _MAP_INDENT, comments)
        for key in node:
            lines = comments.get(path + (key,))
            if lines:
                m.yaml_set_comment_before_after_key(key, before="\n".join(lines), indent=col)
        return m
    if isinstance(node, list):
        s = CommentedSeq()
        for i, item in enumerate(node):
            item_col = col + _SEQ_ITEM_INDENT - _MAP_INDENT
            built = _build(item, path + (i,), item_col, comments)
            lines = comments.get(path + (i,))
            if lines and isinstance(built, CommentedMap) and built:
                first = next(iter(built))
                before = lines + comments.get(path + (i, first), [])
                built.yaml_set_comment_before_after_key(first, before="\n".join(before), indent=item_col)
            s.append(built)
        return s
    return node
