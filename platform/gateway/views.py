"""The dashboard's chat playground: a page, and the session-authenticated key it chats with.

The page talks to /v1 like any client, with an ordinary end-user API key of the logged-in user
named "playground". Key secrets are stored only as digests, so the plaintext issued for the
playground is kept in the user's (server-side) session and reissued when the session has none or
the key was revoked. Its keys count towards the user's live key limit (API_KEYS_PER_USER): see
``accounts.services.issue_playground_key``.
"""

from __future__ import annotations

from accounts.models import ApiKey
from accounts.roles import is_admin
from accounts.services import PLAYGROUND_KEY_NAME, ApiKeyLimitReached, OwnerGone, issue_playground_key
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from core.secrets import digest_secret
from gateway.services import served_model_names, simulated_only_model_names

SESSION_KEY = "gateway_playground_key"


@require_GET
@login_required
def playground(request: HttpRequest) -> HttpResponse:
    models = served_model_names()
    context = {
        "models": models,
        "simulated_only": [] if models else simulated_only_model_names(),
        "is_admin": is_admin(request.user),
    }
    return render(request, "gateway/playground.html", context)


@require_POST
def playground_key(request: HttpRequest) -> JsonResponse:
    """The session's playground key (issued on first use); 401 without a logged-in user, 409 when
    the user's other live keys fill their limit (the page shows the detail)."""
    if not request.user.is_authenticated:
        return JsonResponse({"detail": "Log in to use the playground."}, status=401)
    secret = request.session.get(SESSION_KEY)
    live = (
        isinstance(secret, str)
        and ApiKey.objects.filter(digest=digest_secret(secret), owner=request.user, revoked=False).exists()
    )
    if not live:
        try:
            secret = issue_playground_key(request.user).plaintext
        except OwnerGone:  # deleted by an admin just now
            return JsonResponse({"detail": "Log in to use the playground."}, status=401)
        except ApiKeyLimitReached as full:
            detail = (
                f"The playground needs an API key of its own, and you have {full.live} live API keys, "
                f"the most a user may hold ({full.limit}); revoke one on the API keys page "
                "(/api-keys/) to use the playground."
            )
            return JsonResponse({"detail": detail}, status=409)
        request.session[SESSION_KEY] = secret
    return JsonResponse({"key": secret, "name": PLAYGROUND_KEY_NAME})
