"""Responses that several views declare to drf-spectacular alike.

An answer the view does not return itself (a 409 raised as `core.api.errors.Conflict`, or a
ProtectedError the exception handler turns into one) is not in the document unless the view
declares it; clients generated from the document then take it for an undocumented failure.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class ConflictSerializer(serializers.Serializer):
    """The body of a 409: why the request cannot be done as things are now."""

    detail = serializers.CharField()


def conflict(description: str) -> OpenApiResponse:
    """A 409 response with its ``detail`` body, and when it is answered."""
    return OpenApiResponse(ConflictSerializer, description)
