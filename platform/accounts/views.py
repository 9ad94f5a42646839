"""Signing out: Django's LogoutView (POST), and a page offering it to a GET; the password change page.

Django's LogoutView serves POST only (a GET that signed out could be triggered by any page linking
to it); it answers a GET with an empty 405, which a browser shows as its own error page, as for a
bookmarked or typed /accounts/logout/. A GET here signs nobody out: a signed-in user gets a page
with the Sign out button, a signed-out one the sign-in page.

The password change page is Django's, but for its old-password check, which counts as a sign-in
under the failed sign-in limits (accounts/forms.py).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin
from django.contrib.auth.views import LogoutView, PasswordChangeView
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import render, resolve_url
from django.urls import reverse

from accounts.forms import LimitedAdminPasswordChangeForm, LimitedPasswordChangeForm


class SignOutView(LogoutView):
    http_method_names = ["get", "post", "options"]

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return HttpResponseRedirect(resolve_url(settings.LOGIN_URL))
        return render(request, "registration/sign_out.html")


class LimitedPasswordChangeView(PasswordChangeView):
    """Django's password change page, its old-password check counted as a sign-in (accounts/forms.py)."""

    form_class = LimitedPasswordChangeForm
    template_name = "accounts/password_change_form.html"

    def get_form_kwargs(self) -> dict[str, Any]:
        return {**super().get_form_kwargs(), "request": self.request}


def _admin_password_change(request: HttpRequest) -> HttpResponseBase:
    """``/admin/password_change/``: the admin site's own page (AdminSite.password_change: its
    template, context and done page), with the limited form."""
    view = LimitedPasswordChangeView.as_view(
        form_class=LimitedAdminPasswordChangeForm,
        template_name="registration/password_change_form.html",  # the admin's
        success_url=reverse("admin:password_change_done", current_app=admin.site.name),
        extra_context=admin.site.each_context(request),
    )
    request.current_app = admin.site.name
    return view(request)


# Staff only, CSRF-protected and never cached, as the admin's own views (admin_view).
admin_password_change = admin.site.admin_view(_admin_password_change)
