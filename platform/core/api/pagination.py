"""Page-number pagination with a client-chosen page size (``?page_size=``, at most 500)."""

from __future__ import annotations

from rest_framework import pagination


class PageNumberPagination(pagination.PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500
