"""The docs hold together: the site builds with strict link checking, README's links resolve.

``mkdocs build --strict`` fails on a broken link or anchor between pages (``validation`` in
``mkdocs.yml``) and, through ``scripts/docs_repo_links.py``, on a link to a repository file that
does not exist. README.md is not part of the site (it is the landing page on the repository), so
its relative links and anchors are checked here, the way the repository's viewer resolves them.
Each check is also shown to fail on a planted broken link.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
HOOK = REPO / "scripts" / "docs_repo_links.py"

LINK = re.compile(r"(?<!!)\[(?P<text>[^\[\]]*)\]\((?P<target>[^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(?P<title>.+?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# `tests/x.py`, `python scripts/y.py`, `tests/x.py::test_name`: a repository path, maybe a test in it
REPO_PATH = re.compile(
    r"^(?:python (?:-m )?)?(?P<path>(?:\.ci|benchmarks|configs|examples|exporters|gym_artifacts|scripts|tests)"
    r"(?:/[\w.-]+)*/?)(?:::(?P<test>\w+))?$"
)
# `gym_artifacts.a.b`, `gym_artifacts.a(...)`, `python -m gym_artifacts.a`, `from gym_artifacts.a import *`
CODE_NAME = re.compile(
    r"^(?P<form>python -m |from )?(?P<name>gym_artifacts(?:\.\w+)+)(?P<call>\(.*\))?(?: import .*)?$"
)
UNRENDERED_FENCE = re.compile(r"<code>(?:bash|json|python|toml|yaml)?\n")


def _prose_lines(markdown: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, in_fence = [], False
    for line in markdown.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            lines.append(line)
    return lines


def _plain(title: str) -> str:
    """A heading's text as rendered: links to their text, no code or emphasis marks."""
    return re.sub(r"[`*]", "", LINK.sub(lambda m: m.group("text"), title))


def github_slug(title: str) -> str:
    """The anchor the repository's viewer gives a heading (GitHub's rule)."""
    text = _plain(title).strip().lower()
    return re.sub(r" ", "-", re.sub(r"[^\w\- ]", "", text))


def mkdocs_slug(title: str) -> str:
    """The anchor MkDocs gives a heading (Python-Markdown's ``toc.slugify``)."""
    text = unicodedata.normalize("NFKD", _plain(title)).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(markdown_file: Path) -> set[str]:
    """The anchors of a Markdown file's headings that both renderers agree on."""
    found = set()
    for line in _prose_lines(markdown_file.read_text()):
        match = HEADING.match(line)
        if match and github_slug(match["title"]) == mkdocs_slug(match["title"]):
            found.add(github_slug(match["title"]))
    return found


def broken_links(markdown_file: Path, root: Path) -> list[str]:
    """Each relative link of ``markdown_file`` that names no file under ``root``, or no heading."""
    problems = []
    for line in _prose_lines(markdown_file.read_text()):
        for match in LINK.finditer(line):
            target = match["target"]
            if EXTERNAL.match(target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (markdown_file.parent / path).resolve() if path else markdown_file.resolve()
            if resolved != root and root not in resolved.parents:
                problems.append(f"{target}: leaves the repository")
            elif not resolved.exists():
                problems.append(f"{target}: no such file")
            elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
                problems.append(f"{target}: no heading with anchor #{anchor}")
    return problems


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config`` into ``site``, bounded in time."""
    return run_bounded(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True, text=True, timeout=120, cwd=config.parent,
    )


def nav_pages(nav: list) -> list[str]:
    """Every page file named in an MkDocs nav, nested sections included."""
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_the_docs_build_with_strict_link_checking(tmp_path: Path) -> None:
    done = mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    built = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    pages = nav_pages(config["nav"])
    # every page is in the nav (notes waiting to be folded in excepted), and was built
    assert {p for p in built if not p.startswith("notes-issue-")} == set(pages)
    for page in pages:
        stem = page.removesuffix(".md")
        html = tmp_path / "site" / ("index.html" if stem == "index" else f"{stem}/index.html")
        assert html.is_file(), page
        # a fence MkDocs did not take as one (indented under a list item) renders as inline code
        assert not UNRENDERED_FENCE.search(html.read_text()), page


def _planted_site(tmp_path: Path, link: str) -> Path:
    """A small project with the real mkdocs.yml's checks and hook, one page holding ``link``."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    config.update(
        nav=[{"Home": "index.md"}, {"Other": "other.md"}],
        hooks=[str(HOOK)],
        site_dir=str(tmp_path / "site"),
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(f"# Home\n\nSee {link}.\n")
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## A section\n\nText.\n")
    (tmp_path / "NOTES.md").write_text("# Notes\n")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    return tmp_path / "mkdocs.yml"


@pytest.mark.parametrize(
    ("link", "message"),
    [
        ("[a page](missing.md)", "'missing.md', but the target is not found"),
        ("[an anchor](other.md#no-such-section)", "does not contain an anchor '#no-such-section'"),
        ("[a repository file](../MISSING.md)", "'../MISSING.md', but the repository has no such file"),
        ("[outside](../../../elsewhere.md)", "which leaves the repository"),
    ],
    ids=["page", "anchor", "repository-file", "outside-the-repository"],
)
def test_a_planted_broken_link_fails_the_build(tmp_path: Path, link: str, message: str) -> None:
    done = mkdocs_build(_planted_site(tmp_path, link), tmp_path / "site")
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_the_planted_site_builds_when_its_links_are_sound(tmp_path: Path) -> None:
    """The control of the planted cases: the same project with good links builds."""
    link = "[a page](other.md), [an anchor](other.md#a-section), [a repository file](../NOTES.md)"
    done = mkdocs_build(_planted_site(tmp_path, link), tmp_path / "site")
    assert done.returncode == 0, done.stderr
    # a repository file outside docs/ is named in the site, not linked to a page that is not there
    assert "NOTES.md" in (tmp_path / "site" / "index.html").read_text()


def test_readme_links_resolve_to_files_and_anchors() -> None:
    assert broken_links(README, REPO) == []


def test_the_readme_link_check_catches_a_broken_link_or_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Precedence: one rule for the CLI\n")
    planted = tmp_path / "README.md"
    planted.write_text(
        "[good](docs/page.md#precedence-one-rule-for-the-cli) [file](docs/gone.md) "
        "[anchor](docs/page.md#gone)\n\n```\n[in code](not/checked.md)\n```\n[up](../x.md)\n"
    )
    assert broken_links(planted, tmp_path) == [
        "docs/gone.md: no such file",
        "docs/page.md#gone: no heading with anchor #gone",
        "../x.md: leaves the repository",
    ]


def test_readme_is_a_landing_page_that_links_every_reference_page() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 200
    assert [n for n, line in enumerate(lines, 1) if len(line) > 200] == []
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    linked = {m["target"].partition("#")[0] for line in _prose_lines(text) for m in LINK.finditer(line)}
    pages = {f"docs/{page}" for page in nav_pages(config["nav"]) if page != "index.md"}
    assert pages - linked == set()


def test_every_docs_page_is_linked_from_the_index_and_the_nav() -> None:
    """A page not linked from ``docs/index.md`` (nor in the site's nav) is a page nobody finds."""
    index = REPO / "docs" / "index.md"
    linked = {
        (index.parent / m["target"].partition("#")[0]).resolve()
        for line in _prose_lines(index.read_text()) for m in LINK.finditer(line)
    }  # fmt: skip
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    in_nav = {(REPO / "docs" / page).resolve() for page in nav_pages(config["nav"])}
    pages = {p.resolve() for p in doc_files() if p != README and p != index}
    assert sorted(p.relative_to(REPO).as_posix() for p in pages - linked) == []
    assert sorted(p.relative_to(REPO).as_posix() for p in pages - in_nav) == []


# A sentence stating how long the test suite runs: the suite (or the test script) and a duration.
SUITE_TIME = re.compile(
    r"(?i)(suite|scripts/test\.sh|what CI runs).*\b\d+ ?(minutes?|min|hours?)\b"
    r"|\b\d+ ?(minutes?|min|hours?)\b.*(suite|scripts/test\.sh)"
)


def test_the_suite_s_running_time_is_stated_on_one_page_only() -> None:
    """docs/development.md says how long the suite takes; a second figure elsewhere drifts from it."""
    stating = [
        f"{path.relative_to(REPO)}:{n}"
        for path in doc_files() for n, line in enumerate(path.read_text().splitlines(), 1)
        if SUITE_TIME.search(line)
    ]  # fmt: skip
    assert stating and all(place.startswith("docs/development.md:") for place in stating), stating


def doc_files() -> list[Path]:
    """README and every docs page (notes waiting to be folded in excepted)."""
    pages = sorted(p for p in (REPO / "docs").rglob("*.md") if not p.name.startswith("notes-issue-"))
    return [README, *pages]


def stale_names(markdown_file: Path) -> list[str]:
    """Each code span naming a repository path, a test or a Python name that does not exist.

    A dotted name counts as code when it is called, run with ``python -m``, imported from, or
    has a module and an attribute (``gym_artifacts.core.config.build_export_config``); two-part names
    such as the MLflow tag ``gym_artifacts.partial`` are left alone.
    """
    problems = []
    for line in _prose_lines(markdown_file.read_text()):
        for span in re.findall(r"`([^`]+)`", line):
            if match := REPO_PATH.match(span):
                path = REPO / match["path"]
                if not path.exists():
                    problems.append(f"{span}: no such path")
                elif match["test"] and not re.search(rf"^def {match['test']}\(", path.read_text(), re.M):
                    problems.append(f"{span}: no such test")
            elif (match := CODE_NAME.match(span)) and _is_code(match) and not _resolves(match["name"]):
                problems.append(f"{span}: no such module or attribute")
            elif MODULE_TAIL.match(span) and not _module_tail_exists(span):
                problems.append(f"{span}: no such module")
    return problems


# `run/artifacts.py`, `fanout.py`: a module named by its tail inside the package or the backends.
MODULE_TAIL = re.compile(r"^(?:\w+/)*\w+\.py$")


def _module_tail_exists(tail: str) -> bool:
    """Whether some module of the repository's code ends with ``tail`` (``live/fanout.py``)."""
    roots = ("gym_artifacts", "exporters", "tests", "scripts", "benchmarks", "examples")
    return any(p.as_posix().endswith(f"/{tail}") for root in roots for p in (REPO / root).rglob("*.py"))


def _is_code(match: re.Match[str]) -> bool:
    """Whether a dotted name is code: called, run, imported from, or a module and an attribute."""
    return bool(match["form"] or match["call"] or match["name"].count(".") >= 2)


def _resolves(dotted: str) -> bool:
    """Whether ``a.b.c`` is a module, or an attribute path under the longest importable module."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("markdown_file", doc_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_paths_tests_and_python_names_in_the_docs_exist(markdown_file: Path) -> None:
    """A module moved or a test renamed makes the page that names it fail, not silently drift."""
    assert stale_names(markdown_file) == []


def test_the_name_check_catches_a_moved_module_a_renamed_test_and_a_missing_file(tmp_path: Path) -> None:
    planted = tmp_path / "page.md"
    planted.write_text(
        "`gym_artifacts.core.config.build_export_config` `gym_artifacts.partial` `python -m gym_artifacts.testing`\n"
        "`gym_artifacts.core.config.no_such_function` `gym_artifacts.no_such_module.thing` "
        "`tests/test_docs.py::no_such_test` `scripts/no_such_script.py` `gym_artifacts.export_runs(...)`\n"
        "`live/fanout.py` `payload.py` `run/old_name.py`\n"
    )
    assert stale_names(planted) == [
        "gym_artifacts.core.config.no_such_function: no such module or attribute",
        "gym_artifacts.no_such_module.thing: no such module or attribute",
        "tests/test_docs.py::no_such_test: no such test",
        "scripts/no_such_script.py: no such path",
        "payload.py: no such module",
        "run/old_name.py: no such module",
    ]


PYTHON_BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```\n(?P<after>(?:.*\n){0,3})", re.M | re.S)
EXAMPLE_LINK = re.compile(r"\]\((?:\.\./)*(?P<path>examples/[\w/]+\.py)\)")


def _top_level_names(tree: ast.Module) -> set[str]:
    """The names a module or a code block binds: imports, defs, classes, assignments, loop and
    ``with`` targets (anywhere in it: a block's later lines may use them)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _importable(module: str, name: str) -> bool:
    """``from module import name`` works: an attribute, or a submodule."""
    if hasattr(importlib.import_module(module), name):
        return True
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return False
    return True


def missing_code_names(markdown: str) -> list[str]:
    """Each name a ``python`` block of ``markdown`` calls or imports from gym_artifacts that does not
    exist: a called name must be a builtin, bound in the block, or defined in the example file the
    lines after the block link to (the block is an excerpt of it); ``from gym_artifacts.X import Y``
    must import."""
    problems = []
    for block in PYTHON_BLOCK.finditer(markdown):
        tree = ast.parse(block["code"])
        known = _top_level_names(tree) | set(dir(builtins))
        for example in EXAMPLE_LINK.finditer(block["after"]):
            known |= _top_level_names(ast.parse((REPO / example["path"]).read_text()))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in known:
                problems.append(f"{node.func.id}(): not defined")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gym_artifacts"):
                problems += [f"{node.module}.{a.name}: no such name" for a in node.names if not _importable(node.module, a.name)]
    return problems


@pytest.mark.parametrize("markdown_file", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_the_code_blocks_call_only_names_that_exist(markdown_file: Path) -> None:
    assert missing_code_names(markdown_file.read_text()) == []


def test_the_code_block_check_catches_an_invented_function_and_import() -> None:
    markdown = (
        "```python\nfrom gym_artifacts.live import live_run, live_everything\n"
        "with live_run({}, 'o.jsonl') as live:\n    write_aggregate_metrics('a.json')\n"
        "    write_aggregate(out, rows)\n```\nAn excerpt of [the example](examples/live_eval.py).\n"
    )
    assert missing_code_names(markdown) == [
        "gym_artifacts.live.live_everything: no such name",
        "write_aggregate_metrics(): not defined",
    ]
