"""Page-number pagination with a client-chosen page size (``?page_size=``, at most 500).

``?page=`` and ``?page_size=`` take ASCII digits only (core.serializers): ``int()`` read
``page_size=\\uff15`` (full-width 5) as 5. Such a value is a 400 naming the parameter; other
values keep DRF's answers (a page size it cannot read: the default; a page it cannot read: 404).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import QuerySet
from rest_framework import pagination
from rest_framework.request import Request
from rest_framework.views import APIView

from core.serializers import refuse_non_ascii_digits


class PageNumberPagination(pagination.PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500

    def paginate_queryset(
        self, queryset: QuerySet[Any, Any] | Sequence[Any], request: Request, view: APIView | None = None
    ) -> list[Any] | None:
        for name in (self.page_query_param, self.page_size_query_param):
            refuse_non_ascii_digits(request.query_params.get(name), name)
        return super().paginate_queryset(queryset, request, view)
