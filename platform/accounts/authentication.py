"""REST authentication by hashed operator API token: ``Authorization: Token <secret>``.

``Bearer`` is accepted as a synonym. Anonymous requests get 401 with ``WWW-Authenticate: Token``, and so
do expired tokens (API_TOKEN_IDLE_DAYS, API_TOKEN_MAX_AGE_DAYS; see accounts/services.py).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from accounts.models import ApiToken
from accounts.services import authenticate_api_token

KEYWORDS = (b"token", b"bearer")


class ApiTokenAuthentication(BaseAuthentication):
    """Look the token's digest up; reject revoked and expired tokens and inactive users."""

    keyword = "Token"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() not in KEYWORDS:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Invalid token header: expected 'Token <secret>'.")
        try:
            secret = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid token header: non-ASCII characters.") from None
        token = authenticate_api_token(secret)
        if token is None:
            raise exceptions.AuthenticationFailed(
                "Invalid, revoked or expired token; POST /api/v1/auth/token/ issues a new one."
            )
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """Describes the token scheme in the OpenAPI schema (Swagger UI's Authorize button)."""

    target_class = "accounts.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "Value: `Token <secret>` (POST /api/v1/auth/token/ issues one).",
        }
