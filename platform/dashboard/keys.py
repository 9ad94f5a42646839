"""The dashboard's API keys page: a user lists, creates and revokes their end-user API keys.

Any role may, as through the REST API (``/api/v1/api-keys/``), whose rules apply: the same keys
are visible (a user's own; an admin's, everyone's: ``api_keys_visible_to``), a new key is checked
by the API's serializer (quotas only from admins, the playground's reserved name refused) and
created under the per-user limit of live keys by the same service.

A new key's secret is shown once, in the answer to the POST that created it: it is not kept in the
session (which is stored server side) nor put in a URL, and that answer is not cached.

Each rendering of the form carries a one-time value (``form``), which the session maps to the key
it created, if any: the same form posted again (a reload of that answer, a double click) creates no
second key but leads back to the list, saying which key it made. A form the session did not issue
(or no longer holds: it keeps the newest FORMS_KEPT) is refused, with a fresh one to submit again.
"""

from __future__ import annotations

import secrets
from importlib import import_module
from typing import Any

from accounts import services
from accounts.models import ApiKey
from django.conf import settings
from django.contrib.sessions.backends.base import SessionBase
from django.db import transaction
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
        form = request.POST.get("form", "")
        try:
            with transaction.atomic():
                # The user's row lock orders their key creations: of one form posted twice at once,
                # the second reads (below) the session the first saved with the key it created.
                services.lock_owner(request.user)
                request.session = _reread(request.session)
                issued_forms = request.session.get(FORMS, {})
                if form not in issued_forms:
                    raise _FormExpired
                if issued_forms[form] is not None:
                    return _already_created(request, issued_forms[form])
                issued = services.create_api_key_within_limit(
                    request.user, data["name"], data.get("requests_per_minute"), data.get("tokens_per_day")
                )
                request.session[FORMS] = {**issued_forms, form: issued.record.pk}
                request.session.save()  # in the key's transaction: both or neither
        except services.ApiKeyLimitReached as full:
            errors = {"non_field_errors": [full.advice]}
        except _FormExpired:
            errors = {"non_field_errors": [FORM_EXPIRED]}
        else:
            response = _keys_page(request, created=issued.record, secret=issued.plaintext, status=201)
            add_never_cache_headers(response)  # no copy of the secret in a cache or the history
            return response
    values = {name: request.POST.get(name, "") for name in forms.API_KEY_FIELDS}
    return _keys_page(request, values=values, errors=errors, status=400)


# form value -> None (not yet submitted) or the pk of the key it created; oldest first.
FORMS = "dashboard_key_forms"
FORMS_KEPT = 20  # forms a user may have open at once (tabs); older ones expire
FORM_EXPIRED = (
    "This form has expired (or was not issued to this session); no key was created: submit it again."
)


class _FormExpired(Exception):
    """The posted form's one-time value is not one the session holds."""


def _new_form(request: HttpRequest) -> str:
    """A one-time value for a rendering of the New key form, kept in the session."""
    form = secrets.token_urlsafe(16)
    issued_forms = {**request.session.get(FORMS, {}), form: None}
    request.session[FORMS] = dict(list(issued_forms.items())[-FORMS_KEPT:])
    return form


def _reread(session: SessionBase) -> SessionBase:
    """The session as stored now (``session`` was read when the request began)."""
    engine = import_module(settings.SESSION_ENGINE)
    store: SessionBase = engine.SessionStore(session.session_key)
    return store


def _already_created(request: HttpRequest, pk: int) -> HttpResponse:
    """The answer to a form posted again: back to the list (a GET, which a reload repeats harmlessly)."""
    key = services.api_keys_visible_to(request.user).filter(pk=pk).first()
    made = f"{key.name} ({key.prefix}…)" if key is not None else "a key, deleted since"
    request.session[NOTICE] = (
        f"This form was already submitted and created {made}, whose secret was shown only then; "
        "no second key was created."
    )
    return HttpResponseRedirect(reverse("dashboard:api-keys"), status=303)


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
    context["form"] = _new_form(request)
    return _page(request, "api_keys.html", context, status=status)
