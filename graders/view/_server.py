"""The results browser's web app: the page, its assets, and the JSON API the page and scripts use.

Routes (all GET):
  /                       the page
  /static/<file>          its script and styles (shipped in the wheel; nothing from a CDN)
  /api/summary            counts by status, label and error kind, score histogram, tokens, agreement
  /api/rows               ?offset=&limit=&status=&label=&error_kind=&score_min=&score_max=&q=&disagree=&flipped=&sort=
                          -> {"total": rows matching, "offset", "limit", "rows": [{"index": 0-based position, ...}]}
  /api/rows/{index}       one row, whole
  /api/rows/{index}/prompt  the judge prompt rendered again from --rubric (404 without one)

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

from ._results import ResultsFile, ViewError, as_filter
from ._summary import summarise

if TYPE_CHECKING:  # the rubric and its prompt rendering load with --rubric only: the first page does not wait for them
    from judge import Rubric

API_VERSION = 1


def static_text(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def _json(payload: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(payload, status_code=status, headers={"Cache-Control": "no-store"})


def _error(message: str, status: int) -> JSONResponse:
    return _json({"version": API_VERSION, "error": message}, status)


def view_app(results: ResultsFile, *, rubric: Rubric | None = None, mapping: Mapping[str, str] | None = None) -> Starlette:
    """The browser's app over an opened file; ``rubric`` lets the row view show the judge prompt."""

    def page(request: Request) -> Response:
        return HTMLResponse(static_text("index.html").replace("{{mode}}", "server"))

    def summary(request: Request) -> Response:
        try:
            return _json({"version": API_VERSION, **summarise(results), "rubric": rubric.name if rubric else None})
        except ViewError as e:
            return _error(str(e), 500)

    def rows(request: Request) -> Response:
        query = request.query_params
        try:
            offset, limit = int(query.get("offset") or 0), int(query.get("limit") or 50)
        except ValueError:
            return _error("offset and limit must be integers", 400)
        try:
            page_ = results.rows(as_filter(query), offset=offset, limit=limit)
        except ViewError as e:
            return _error(str(e), 400)
        if not page_.ready:
            results.index()  # a deferred copy starts once the first page is out, not before: it would compete for the CPU
        return _json({"version": API_VERSION, **page_.model_dump()})

    def _row(request: Request) -> dict[str, Any] | Response:
        try:
            index = int(request.path_params["index"])
        except ValueError:
            return _error("the row index must be an integer", 400)
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
        return found if isinstance(found, Response) else _json(found)

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
    return Starlette(routes=[
        Route("/", page),
        Route("/api/summary", summary),
        Route("/api/rows", rows),
        Route("/api/rows/{index}", one),
        Route("/api/rows/{index}/prompt", prompt),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Mount("/static", app=StaticFiles(directory=str(static))),
    ])
