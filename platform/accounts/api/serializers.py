"""API serializers for tokens and end-user API keys."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from accounts.models import ApiKey, ApiToken
from accounts.roles import is_admin
from accounts.services import PLAYGROUND_KEY_NAME, update_api_key
from core.serializers import IntegerField, StrictModelSerializer
from core.validators import no_control_characters

QUOTA_FIELDS = ("requests_per_minute", "tokens_per_day")


class ApiKeySerializer(StrictModelSerializer):
    """An API key as listed: never its secret. Quotas may be set only by admins."""

    owner = serializers.CharField(source="owner.username", read_only=True)
    # The columns' upper bounds (PositiveIntegerField, PositiveBigIntegerField on PostgreSQL).
    requests_per_minute = IntegerField(min_value=1, max_value=2**31 - 1, required=False)
    tokens_per_day = IntegerField(min_value=1, max_value=2**63 - 1, required=False)

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "name",
            "owner",
            "prefix",
            "requests_per_minute",
            "tokens_per_day",
            "revoked",
            "created_at",
            "last_used_at",
        ]
        read_only_fields = ["id", "owner", "prefix", "revoked", "created_at", "last_used_at"]

    def validate_name(self, value: str) -> str:
        # The playground's keys are known by this name: it replaces the oldest of them when the
        # user is at the key limit, so a key of the user's own under it could be revoked silently.
        unchanged = self.instance is not None and self.instance.name == value
        if value.strip() == PLAYGROUND_KEY_NAME and not unchanged:
            raise serializers.ValidationError(
                f"{PLAYGROUND_KEY_NAME!r} is reserved for the chat playground's own keys; "
                "choose another name."
            )
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        request = self.context.get("request")
        if request is not None and not is_admin(request.user):
            errors = {name: ["Only admins may set quotas."] for name in QUOTA_FIELDS if name in attrs}
            if errors:
                raise serializers.ValidationError(errors)
        return attrs

    def update(self, instance: ApiKey, validated_data: dict[str, Any]) -> ApiKey:
        # Not instance.save(): it would write back a stale `revoked`, and re-insert a deleted key.
        return update_api_key(instance, validated_data)


class IssuedApiKeySerializer(ApiKeySerializer):
    """The response to creating a key: the one time its secret is shown."""

    secret = serializers.CharField(read_only=True)

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "secret"]
        read_only_fields = [*ApiKeySerializer.Meta.read_only_fields, "secret"]


class TokenRequestSerializer(StrictModelSerializer):
    """Credentials exchanged for an operator API token, and the token's name.

    A (strict) model serializer of the token so that an unknown key is a 400 like everywhere else in
    the API: a typo such as ``nmae`` would otherwise issue a token named "api". The view validates it
    before checking the password, so such a request is no sign-in attempt (accounts/login_limits.py).
    It never saves: accounts.services.issue_api_token creates the token.
    """

    username = serializers.CharField()
    password = serializers.CharField(style={"input_type": "password"}, trim_whitespace=False)
    name = serializers.CharField(
        max_length=100, required=False, default="api", validators=[no_control_characters]
    )

    class Meta:
        model = ApiToken
        fields = ["username", "password", "name"]


class TokenResponseSerializer(serializers.Serializer):
    token = serializers.CharField()
    prefix = serializers.CharField()
    username = serializers.CharField()
    role = serializers.CharField()


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField(allow_null=True)
