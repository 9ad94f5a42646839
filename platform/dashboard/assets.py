"""plotly.js from the installed ``plotly`` Python package, served by the app (no CDN at run time).

The file's URL carries the package version, so browsers may cache it for a year: a new plotly
release gets a new URL.
"""

from __future__ import annotations

from pathlib import Path

import plotly
from django.http import FileResponse, Http404, HttpRequest, HttpResponseBase
from django.views.decorators.http import require_GET

PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
PLOTLY_VERSION = str(plotly.__version__)
CACHE_SECONDS = 365 * 24 * 3600


@require_GET
def plotly_js(request: HttpRequest, version: str) -> HttpResponseBase:
    """``/dashboard/assets/plotly-<version>.min.js``: the bundled file, cached immutably."""
    if version != PLOTLY_VERSION or not PLOTLY_JS.is_file():
        raise Http404("No such plotly.js version here.")
    response = FileResponse(PLOTLY_JS.open("rb"), content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = f"public, max-age={CACHE_SECONDS}, immutable"
    return response
