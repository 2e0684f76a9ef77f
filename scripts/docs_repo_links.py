"""MkDocs hook: links from a docs page to repository files outside ``docs/`` are checked too.

MkDocs checks links between pages (and their anchors) itself, but knows nothing outside its
``docs_dir``: a link such as ``../examples/ledger_plugin`` or ``../BENCHMARKS.md`` would be "not
found" even when the file exists. This hook resolves each such link against the repository (the
folder holding ``mkdocs.yml``): a missing target is a warning, which ``mkdocs build --strict``
turns into a failed build; an existing one becomes a link to the file on ``repo_url`` when the
config sets one, else its link text with the path, so the site has no dead link either way.
The Markdown source keeps its relative links, which work where the repository is browsed.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.repo_links")

# [text](target) or [text](target "title"), not an image; the text holds no brackets.
LINK = re.compile(r"(?<!!)\[(?P<text>[^\[\]]*)\]\((?P<target>[^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^#|^/")


def _outside_docs_link(match: re.Match[str], page_dir: Path, docs: Path, repo: Path,
                       repo_url: str | None, page: str) -> str:
    """The replacement for one link: unchanged inside docs/, checked and rewritten outside it."""
    target = match.group("target")
    if EXTERNAL.match(target):
        return match.group(0)
    path = target.split("#", 1)[0]
    resolved = (page_dir / path).resolve()
    if resolved == docs or docs in resolved.parents:
        return match.group(0)  # a page or file of the site: MkDocs checks it
    if resolved != repo and repo not in resolved.parents:
        log.warning("Doc file '%s' links to '%s', which leaves the repository", page, target)
        return match.group(0)
    if not resolved.exists():
        log.warning("Doc file '%s' links to '%s', but the repository has no such file", page, target)
        return match.group(0)
    relative = resolved.relative_to(repo).as_posix() or "."
    text = match.group("text")
    if repo_url:
        kind = "tree" if resolved.is_dir() else "blob"
        return f"[{text}]({repo_url.rstrip('/')}/{kind}/HEAD/{relative})"
    return text if relative in text else f"{text} (`{relative}`)"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Check and rewrite the page's links to repository files outside ``docs_dir``."""
    docs = Path(config["docs_dir"]).resolve()
    repo = Path(config["config_file_path"]).resolve().parent
    page_dir = (docs / page.file.src_uri).parent
    repo_url = config.get("repo_url")
    out: list[str] = []
    in_fence = False
    for line in markdown.splitlines(keepends=True):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            line = LINK.sub(
                lambda m: _outside_docs_link(m, page_dir, docs, repo, repo_url, page.file.src_uri),
                line,
            )
        out.append(line)
    return "".join(out)
