"""Signing out: Django's LogoutView (POST), and a page offering it to a GET.

Django's LogoutView serves POST only (a GET that signed out could be triggered by any page linking
to it); it answers a GET with an empty 405, which a browser shows as its own error page, as for a
bookmarked or typed /accounts/logout/. A GET here signs nobody out: a signed-in user gets a page
with the Sign out button, a signed-out one the sign-in page.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.views import LogoutView
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render, resolve_url


class SignOutView(LogoutView):
    http_method_names = ["get", "post", "options"]

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return HttpResponseRedirect(resolve_url(settings.LOGIN_URL))
        return render(request, "registration/sign_out.html")
