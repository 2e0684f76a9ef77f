"""The report's markup: one HTML file with its styles and its one small script inline.

A large run's rollout rows are embedded gzip-compressed (base64) and unpacked by the browser's
own DecompressionStream: the page stays one offline file, a fraction of the rows' JSON size.

Every value a page shows passes :func:`shown` (text) or :func:`shown_values` (data) before it is
escaped, drawn or encoded: the secrets of the page's :func:`masking` are masked in the values,
never in the rendered page (whose script, markup and base64 hold any short word), and a path's
undecodable bytes are written as escapes, so the page is always valid UTF-8.
"""

from __future__ import annotations

import base64
import contextlib
import html
import json
import zlib
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import Any

from gym_artifacts.core.jsonio import escape_lone_surrogates, escaped_text
from gym_artifacts.core.secrets import ValueMasker

_MASKER: ContextVar[ValueMasker | None] = ContextVar("page_masker", default=None)


@contextlib.contextmanager
def masking(secrets: Iterable[str]) -> Iterator[None]:
    """While a page is built: :func:`shown` and :func:`shown_values` mask ``secrets`` (and every
    secret known to this process) by value."""
    token = _MASKER.set(ValueMasker(secrets, shapes=False))
    try:
        yield
    finally:
        _MASKER.reset(token)


def shown(value: Any) -> str:
    """A value as a page shows it: its text, secrets masked, lone surrogates escaped."""
    masker = _MASKER.get()
    text = str(value)
    return escaped_text(masker.text(text) if masker is not None else text)


def escape(value: Any) -> str:
    """:func:`shown`, escaped for HTML text and attributes."""
    return html.escape(shown(value))


def shown_values(node: Any) -> Any:
    """A decoded structure as a page carries it (embedded JSON): every string value masked as
    by :func:`shown`; keys (the names the page's script reads) and numbers as they are."""
    masker = _MASKER.get()
    return escape_lone_surrogates(masker.values(node, keys=False) if masker is not None else node)

PACK_ABOVE_BYTES = 256 << 10  # rows JSON larger than this is embedded compressed

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #111827; background: #f9fafb; }
header { background: #111827; color: #f9fafb; padding: 12px 24px; }
header h1 { font-size: 18px; margin: 0; }
nav a { color: #93c5fd; margin-right: 14px; text-decoration: none; font-size: 13px; }
main { padding: 8px 24px 48px; max-width: 1400px; }
section { background: #fff; border: 1px solid #e5e7eb; border-radius: 8px; padding: 12px 18px; margin: 16px 0; }
h2 { font-size: 16px; margin: 4px 0 10px; } h3 { font-size: 14px; margin: 14px 0 6px; }
table { border-collapse: collapse; font-size: 12.5px; margin: 6px 0; }
th, td { border-bottom: 1px solid #e5e7eb; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f4f6; position: sticky; top: 0; }
#rollout-table th { cursor: pointer; user-select: none; }
#rollout-table td:last-child { font-family: ui-monospace, monospace; font-size: 11.5px; max-width: 640px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
pre.config { background: #f3f4f6; padding: 8px; max-height: 360px; overflow: auto; }
.missing { color: #92400e; background: #fffbeb; border: 1px solid #fde68a; padding: 6px 10px; border-radius: 6px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
div.chart { background: #fff; border: 1px solid #e5e7eb; border-radius: 6px; }
div.chart svg { display: block; font-family: system-ui, sans-serif; }
.table-controls { margin: 8px 0; } .table-controls input { padding: 4px 8px; width: 320px; }
.scroll { overflow-x: auto; max-width: 100%; } pre { overflow-x: auto; }
table.level:not(.all-columns) .extra { display: none; }
video { background: #000; border-radius: 6px; max-width: 100%; height: auto; } .note { color: #6b7280; font-size: 12px; }
"""

SCRIPT = r"""
(function () {
  "use strict";
  // A level table's hidden columns are in the page: its note's button shows or hides them.
  document.querySelectorAll("button[data-show-columns]").forEach(function (button) {
    button.addEventListener("click", function () {
      var table = document.getElementById("level-" + button.dataset.showColumns);
      var all = table.classList.toggle("all-columns");
      button.textContent = all ? "show fewer columns" : button.dataset.label;
    });
  });
  var video = document.getElementById("recording-video");
  if (video) {
    var sized = function () {  // play at the recording's own size, not a stretched box
      if (!video.videoWidth) return;
      video.width = video.videoWidth;
      video.height = video.videoHeight;
      var size = document.getElementById("recording-size");
      if (size) size.textContent = video.videoWidth + " x " + video.videoHeight + " px, " +
        (isFinite(video.duration) ? video.duration.toFixed(1) + " s" : "");
    };
    video.addEventListener("loadedmetadata", sized);
    sized();
  }
  var PAGE = 50;
  // Rows come as JSON, or (large runs) as gzip in base64, unpacked here without any request.
  function loadRows() {
    var packed = document.getElementById("rollout-data-gz");
    if (!packed) {
      var source = document.getElementById("rollout-data");
      return Promise.resolve(source ? JSON.parse(source.textContent) : null);
    }
    var text = atob(packed.textContent.trim()), bytes = new Uint8Array(text.length);
    for (var i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text().then(JSON.parse);
  }
  loadRows().then(function (data) {
  var table = document.getElementById("rollout-table");
  if (data && table) {
    var rows = data.rows, columns = data.columns, order = rows.map(function (_, i) { return i; });
    var view = order, page = 0, sortColumn = -1, ascending = true, haystack = null;
    var thead = table.tHead, tbody = table.tBodies[0];
    var headRow = thead.insertRow();
    columns.forEach(function (name, c) {
      var th = document.createElement("th");
      th.textContent = name;
      th.addEventListener("click", function () { sortBy(c); });
      headRow.appendChild(th);
    });
    function cellText(value) { return value === null || value === undefined ? "" : String(value); }
    function render() {
      var pages = Math.max(1, Math.ceil(view.length / PAGE));
      page = Math.min(page, pages - 1);
      var fragment = document.createDocumentFragment();
      view.slice(page * PAGE, page * PAGE + PAGE).forEach(function (index) {
        var tr = document.createElement("tr");
        rows[index].forEach(function (value) {
          var td = document.createElement("td");
          td.textContent = cellText(value);
          tr.appendChild(td);
        });
        fragment.appendChild(tr);
      });
      tbody.replaceChildren(fragment);
      document.getElementById("page-info").textContent =
        "page " + (page + 1) + " of " + pages + " (" + view.length.toLocaleString() + " rows)";
    }
    function compare(a, b) {
      var x = rows[a][sortColumn], y = rows[b][sortColumn];
      if (x === y) return a - b;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      var r = (typeof x === "number" && typeof y === "number") ? x - y : String(x).localeCompare(String(y));
      return ascending ? r : -r;
    }
    function sortBy(c) {
      ascending = sortColumn === c ? !ascending : true;
      sortColumn = c;
      view = view.slice().sort(compare);
      page = 0;
      render();
    }
    document.getElementById("rollout-search").addEventListener("input", function (event) {
      var needle = event.target.value.trim().toLowerCase();
      if (!haystack) haystack = rows.map(function (r) { return r.map(cellText).join("\u0001").toLowerCase(); });
      view = needle ? order.filter(function (i) { return haystack[i].indexOf(needle) >= 0; }) : order;
      if (sortColumn >= 0) view = view.slice().sort(compare);
      page = 0;
      render();
    });
    document.getElementById("prev-page").addEventListener("click", function () { if (page > 0) { page--; render(); } });
    document.getElementById("next-page").addEventListener("click", function () { page++; render(); });
    render();
  }
  window.__reportReadyMs = performance.now();
  document.body.dataset.ready = "1";
  }).catch(function (error) {
    console.error("rollout rows could not be read: " + error);
    document.body.dataset.ready = "1";
  });
})();
"""


ROWS_PER_CHUNK = 1000  # rows written (or compressed) at a time


def rollout_data_element(columns: list[str], rows: Iterable[list[Any]]) -> str:
    """The ``<script>`` element carrying the rollout table's rows, written chunk by chunk.

    Small tables are plain JSON; past ``PACK_ABOVE_BYTES`` the text goes through a gzip stream
    (the page unpacks it with the browser's ``DecompressionStream``) and is base64-embedded, so
    the rows are never held whole. Each row is masked (:func:`shown_values`) before it is encoded.
    """
    plain: list[str] = []
    size = 0
    packer: Any = None
    packed: list[bytes] = []

    def emit(text: str) -> None:
        nonlocal size, packer
        # No "<" at all inside the element (JSON's own escape, valid only in strings, where any
        # "<" is): "</script", "<!--" and "<script" alike can never end the element or move the
        # HTML parser into its escaped script states.
        text = text.replace("<", "\\u003c")
        if packer is None:
            plain.append(text)
            size += len(text)
            if size <= PACK_ABOVE_BYTES:
                return
            packer = zlib.compressobj(6, zlib.DEFLATED, 31)  # 31: the gzip format
            text = "".join(plain)
            plain.clear()
        packed.append(packer.compress(text.encode("utf-8")))

    emit(json.dumps({"columns": shown_values(columns), "rows": []}, ensure_ascii=False)[:-2])
    chunk: list[str] = []
    first = True
    for row in rows:
        chunk.append(
            ("" if first else ",")
            + json.dumps(shown_values(row), ensure_ascii=False, allow_nan=False, default=shown)
        )
        first = False
        if len(chunk) == ROWS_PER_CHUNK:
            emit("".join(chunk))
            chunk.clear()
    emit("".join(chunk) + "]}")
    if packer is None:
        return f'<script type="application/json" id="rollout-data">{"".join(plain)}</script>'
    packed.append(packer.flush())
    data = base64.b64encode(b"".join(packed)).decode()
    return f'<script type="application/octet-stream" id="rollout-data-gz">{data}</script>'


def render_page(
    *,
    title: str,
    sections: list[tuple[str, str, str]],
    rollout_data: str,
    script: str = SCRIPT,
    extra_style: str = "",
) -> str:
    """The whole page: no external resource of any kind. ``rollout_data``: the element from
    :func:`rollout_data_element` ("" when there is no table), or another page's data element
    with its own ``script`` and ``extra_style`` (the compare page)."""
    nav = "".join(f'<a href="#{sid}">{escape(name)}</a>' for sid, name, _ in sections)
    body = "".join(
        f'<section id="{sid}"><h2>{escape(name)}</h2>{content}</section>' for sid, name, content in sections
    )
    data = rollout_data
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:; media-src data: file: 'self'\">"
        f"<title>{escape(title)}</title><style>{STYLE}{extra_style}</style></head>"
        f"<body><header><h1>{escape(title)}</h1><nav>{nav}</nav></header><main>{body}</main>"
        f"{data}<script>{script}</script></body></html>\n"
    )
