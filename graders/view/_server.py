"""The results browser's web app: the page, its assets, and the JSON API the page and scripts use.

Routes (GET; with --annotate also the labelling routes of ``_annotate``, one of them a POST):
  /                       the page
  /static/<file>          its script and styles (shipped in the wheel; nothing from a CDN)
  /api/summary            counts by status, label and error kind, score histogram, tokens, agreement
  /api/rows               ?offset=&limit=&status=&label=&error_kind=&score_min=&score_max=&q=&disagree=&flipped=&sort=
                          -> {"total": rows matching, "offset", "limit", "rows": [{"index": 0-based position, ...}]}
  /api/rows/{index}       one row, whole
  /api/rows/{index}/prompt  the judge prompt rendered again from --rubric (404 without one)

Every route answers only requests whose ``Host`` names this viewer: ``localhost``, ``127.0.0.1``,
``[::1]``, the address given to ``--host`` or the one the connection reached, with the server's port
(as Jupyter does); anything else is 403. A web page on another site that re-points its own name at
127.0.0.1 (DNS rebinding) then cannot read the graded data, and no CORS header ever grants it either.
A malformed or out-of-range query parameter is 400 naming it.

Handlers are plain functions: Starlette runs them on its thread pool, where DuckDB's blocking
queries belong (each takes its own cursor).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from starlette.types import ASGIApp, Receive, Scope, Send

from ._results import ResultsFile, ViewError, as_filter, page_window
from ._summary import summarise

if TYPE_CHECKING:  # the rubric and its prompt rendering load with --rubric only: the first page does not wait for them
    from gradekit.judge import Rubric

    from ._annotate import Annotator

API_VERSION = 1


def static_text(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def _json(payload: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(payload, status_code=status, headers={"Cache-Control": "no-store"})


def _error(message: str, status: int) -> JSONResponse:
    return _json({"version": API_VERSION, "error": message}, status)


LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def _host_name_and_port(value: str) -> tuple[str, int | None] | None:
    """``Host: name[:port]`` (``[v6]:port`` bracketed) -> (lowercased name, port or None); None when malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, sep, port_text = value.partition(":")
        port_text = port_text if sep else None
    if not name or (port_text is not None and not port_text.isdigit()):
        return None
    return name.rstrip("."), int(port_text) if port_text else None


class HostCheck:
    """403 for a request whose ``Host`` does not name this server (DNS rebinding guard); see the module docstring."""

    def __init__(self, app: ASGIApp, host: str | None = None) -> None:
        self.app = app
        self.names = LOCAL_NAMES | ({host.strip("[]").lower()} if host and host not in ("0.0.0.0", "::") else set())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            value = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
            parsed = _host_name_and_port(value)
            local = scope.get("server") or (None, None)
            port = local[1]
            allowed = parsed is not None and (parsed[0] in self.names or parsed[0] == str(local[0]).lower()) and (
                parsed[1] if parsed[1] is not None else 80) == port
            if not allowed:
                response = _error(f"Host {value!r} is not this viewer's address; open it as http://127.0.0.1:{port} "
                                  "(or the --host it was started with)", 403)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _page(annotator: Annotator | None) -> str:
    """The page; in labelling mode it carries the write token (a page on another site cannot read it: no CORS)."""
    html = static_text("index.html").replace("{{mode}}", "server")
    if annotator is not None:
        html = html.replace('data-annotate=""', f'data-annotate="{"blind" if annotator.blind else "on"}" '
                                                f'data-token="{annotator.token}"')
    return html


def view_app(results: ResultsFile, *, rubric: Rubric | None = None, mapping: Mapping[str, str] | None = None,
             host: str | None = None, annotator: Annotator | None = None) -> ASGIApp:
    """The browser's app over an opened file; ``rubric`` lets the row view show the judge prompt; ``host`` is the
    address it is bound to (a name given there is answered besides the loopback names); ``annotator``: the labelling
    mode (its routes, and with --blind the judge's columns taken out of unlabelled rows everywhere)."""

    def page(request: Request) -> Response:
        return HTMLResponse(_page(annotator))

    def summary(request: Request) -> Response:
        try:
            found = {**summarise(results), "rubric": rubric.name if rubric else None}
        except ViewError as e:
            return _error(str(e), 500)
        if annotator is not None and annotator.blind:
            from ._annotate import blind_summary

            found = blind_summary(annotator, found)
        return _json({"version": API_VERSION, **found})

    def rows(request: Request) -> Response:
        query = request.query_params
        try:
            offset, limit = page_window(query)
            wanted = as_filter(query)
            if annotator is not None:
                from ._annotate import check_blind_filter

                check_blind_filter(annotator, wanted)
            page_ = results.rows(wanted, offset=offset, limit=limit)
        except ViewError as e:
            return _error(str(e), 400)
        if not page_.ready:
            results.index()  # a deferred copy starts once the first page is out, not before: it would compete for the CPU
        if annotator is not None:
            page_.rows = [annotator.present(row) for row in page_.rows]
        return _json({"version": API_VERSION, **page_.model_dump()})

    def _row(request: Request) -> dict[str, Any] | Response:
        try:
            index = int(request.path_params["index"])
        except ValueError:
            return _error(f"index: {request.path_params['index']!r} is not an integer (a row's 0-based position)", 400)
        if index < 0:
            return _error(f"index: {index} is out of range (rows are numbered from 0; the file has {results.total_rows} rows)", 400)
        try:
            found = results.row(index)
        except ViewError as e:
            return _error(str(e), 500)
        results.index()
        if found is None:
            return _error(f"no row {index}: the file has {results.total_rows} rows (0-based)", 404)
        return found

    def one(request: Request) -> Response:
        found = _row(request)
        if isinstance(found, Response):
            return found
        return _json(annotator.present(found) if annotator is not None else found)

    def prompt(request: Request) -> Response:
        if rubric is None:
            return _error("no rubric: start `gradekit view` with --rubric NAME to see the judge prompt", 404)
        found = _row(request)
        if isinstance(found, Response):
            return found
        from ._prompt import render_prompt

        return _json({"version": API_VERSION,
                      **render_prompt(rubric, found, mapping, pairwise=results.kind == "pairwise" and rubric.pairwise is not None)})

    static = resources.files(__package__).joinpath("static")
    labelling: list[Any] = []
    if annotator is not None:
        from ._annotate import annotate_routes

        labelling = annotate_routes(annotator, _row)
    return HostCheck(Starlette(routes=[
        *labelling,
        Route("/", page),
        Route("/api/summary", summary),
        Route("/api/rows", rows),
        Route("/api/rows/{index}", one),
        Route("/api/rows/{index}/prompt", prompt),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Mount("/static", app=StaticFiles(directory=str(static))),
    ]), host)
