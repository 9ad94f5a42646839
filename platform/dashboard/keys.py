"""The dashboard's API keys page: a user lists, creates and revokes their end-user API keys.

Any role may, as through the REST API (``/api/v1/api-keys/``), whose rules apply: the same keys
are visible (a user's own; an admin's, everyone's: ``api_keys_visible_to``), a new key is checked
by the API's serializer (quotas only from admins, the playground's reserved name refused) and
created under the per-user limit of live keys by the same service.

A new key's secret is shown once, in the answer to the POST that created it: it is not kept in the
session (which is stored server side) nor put in a URL, and that answer is not cached.
"""

from __future__ import annotations

from typing import Any

from accounts import services
from accounts.models import ApiKey
from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_POST, require_safe

from dashboard import forms
from dashboard.views import _page, role_required

NOTICE = "dashboard_notice"


@require_safe
@role_required
def key_list(request: HttpRequest) -> HttpResponse:
    return _keys_page(request, notice=request.session.pop(NOTICE, None))


@require_POST
@role_required
def key_create(request: HttpRequest) -> HttpResponse:
    serializer, errors = forms.api_key_serializer(request.POST, request)
    if not errors:
        data = serializer.validated_data
        try:
            issued = services.create_api_key_within_limit(
                request.user, data["name"], data.get("requests_per_minute"), data.get("tokens_per_day")
            )
        except services.ApiKeyLimitReached as full:
            errors = {"non_field_errors": [full.advice]}
        else:
            response = _keys_page(request, created=issued.record, secret=issued.plaintext, status=201)
            add_never_cache_headers(response)  # no copy of the secret in a cache or the history
            return response
    values = {name: request.POST.get(name, "") for name in forms.API_KEY_FIELDS}
    return _keys_page(request, values=values, errors=errors, status=400)


@require_POST
@role_required
def key_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    key = get_object_or_404(services.api_keys_visible_to(request.user), pk=pk)  # others': 404
    try:
        services.revoke_api_key(key)
    except ApiKey.DoesNotExist:  # deleted (with its owner) since it was read
        raise Http404("No such API key.") from None
    request.session[NOTICE] = f"Revoked {key.name} ({key.prefix}…)."
    return HttpResponseRedirect(reverse("dashboard:api-keys"))


def _keys_page(request: HttpRequest, status: int = 200, **context: Any) -> HttpResponse:
    context.setdefault("values", {})
    context.setdefault("errors", {})
    context["keys"] = services.api_keys_visible_to(request.user)
    context["live"] = services.live_api_keys(request.user)
    context["limit"] = settings.API_KEYS_PER_USER
    context["default_rpm"] = settings.API_KEY_DEFAULT_REQUESTS_PER_MINUTE
    context["default_tpd"] = settings.API_KEY_DEFAULT_TOKENS_PER_DAY
    context["playground_name"] = services.PLAYGROUND_KEY_NAME
    return _page(request, "api_keys.html", context, status=status)
