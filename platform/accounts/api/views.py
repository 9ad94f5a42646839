"""Token issuing, the current user, and end-user API keys."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import authenticate
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, Throttled
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer, ValidationError
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from accounts import services
from accounts.api.serializers import (
    ApiKeySerializer,
    IssuedApiKeySerializer,
    MeSerializer,
    TokenRequestSerializer,
    TokenResponseSerializer,
)
from accounts.login_limits import SignInLocked
from accounts.models import ApiKey
from accounts.roles import role_of
from core.permissions import HasRole
from core.serializers import StrictSerializer


class LoginThrottle(AnonRateThrottle):
    rate = "20/min"


class SignInThrottled(Throttled):
    """A locked sign-in: a 429 with the lock's message, and its end as Retry-After."""

    def __init__(self, locked: SignInLocked) -> None:
        super().__init__(detail=locked.message)
        self.wait = locked.retry_after_s


class TokenView(APIView):
    """``POST /api/v1/auth/token/``: exchange username + password for an API token (shown once).

    Beyond the per-address throttle, failed sign-ins are limited like the sign-in page's (per username
    and address, per address, per username: accounts/login_limits.py): a locked one is a 429 with
    Retry-After.
    """

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_classes = [LoginThrottle]

    @extend_schema(request=TokenRequestSerializer, responses={201: TokenResponseSerializer}, auth=[])
    def post(self, request: Request) -> Response:
        serializer = TokenRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            user = authenticate(request, username=data["username"], password=data["password"])
        except SignInLocked as locked:
            raise SignInThrottled(locked) from None
        if user is None or role_of(user) is None:
            raise ValidationError({"non_field_errors": ["Invalid username or password."]})
        issued = services.issue_api_token(user, data["name"])
        body = {"token": issued.plaintext, "prefix": issued.record.prefix, "username": user.username}
        return Response({**body, "role": role_of(user)}, status=status.HTTP_201_CREATED)


class MeView(APIView):
    """``GET /api/v1/auth/me/``: who the credentials belong to."""

    permission_classes = [HasRole]

    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        return Response({"username": request.user.get_username(), "role": role_of(request.user)})


class ApiKeyViewSet(
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """End-user API keys for the chat gateway. Users manage their own keys; admins see all.

    The secret is returned only by ``create``; revoke with ``POST .../revoke/``.
    """

    queryset = ApiKey.objects.none()  # for the schema; requests use get_queryset()
    serializer_class = ApiKeySerializer
    permission_classes = [HasRole]
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self) -> QuerySet[ApiKey]:
        return services.api_keys_visible_to(self.request.user)

    @extend_schema(request=ApiKeySerializer, responses={201: IssuedApiKeySerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            issued = services.create_api_key_within_limit(
                request.user, data["name"], data.get("requests_per_minute"), data.get("tokens_per_day")
            )
        except services.ApiKeyLimitReached as full:
            raise ValidationError({"non_field_errors": [full.advice]}) from None
        issued.record.secret = issued.plaintext
        return Response(IssuedApiKeySerializer(issued.record).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=None,
        responses={200: ApiKeySerializer, 400: None},
        description="Revoke the key for good. It takes no body fields: any (a typo of something it "
        "does not take) is a 400 naming it, nothing revoked.",
    )
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        # An empty body (or {}); a field is no option it has, so it is refused, not ignored.
        StrictSerializer(data=request.data).is_valid(raise_exception=True)
        try:
            key = services.revoke_api_key(self.get_object())
        except ApiKey.DoesNotExist:  # deleted (with its owner) since get_object() read it
            raise NotFound("No ApiKey matches the given query.") from None
        return Response(ApiKeySerializer(key, context=self.get_serializer_context()).data)

    def get_serializer(self, *args: Any, **kwargs: Any) -> BaseSerializer[Any]:
        if self.action in ("update", "partial_update"):
            kwargs["partial"] = True
        return super().get_serializer(*args, **kwargs)

    def perform_update(self, serializer: BaseSerializer[ApiKey]) -> None:
        try:
            serializer.save()
        except ApiKey.DoesNotExist:  # deleted (with its owner) since get_object() read it
            raise NotFound("No ApiKey matches the given query.") from None
