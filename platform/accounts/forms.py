"""The password change form, with its old-password check under the failed sign-in limits.

Django's PasswordChangeForm checks the old password with ``user.check_password`` directly, past the
authentication backend and so past accounts/login_limits.py: whoever held a signed-in session (a
browser left open, a stolen cookie) could guess the account's password there without limit, and
once found, change it and lock the owner out. Here each check is a sign-in attempt of the user's
username from the client's address, counted in the same budgets as the sign-in pages' and the token
endpoint's: a wrong old password is a failed sign-in, and a locked budget refuses the form before the
password is checked, with the sign-in pages' message. The admin's own password change page
(/admin/password_change/, Django's AdminPasswordChangeForm) had the same hole and gets the same form.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.forms import PasswordChangeForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from accounts import login_limits


class LimitedPasswordChangeForm(PasswordChangeForm):
    """PasswordChangeForm whose old-password check counts as a sign-in (``request``: its address)."""

    def __init__(self, user: Any, *args: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
        super().__init__(user, *args, **kwargs)
        self.request = request

    def clean_old_password(self) -> str:
        old_password: str = self.cleaned_data["old_password"]
        # Raises SignInLocked (a ValidationError: the field's error) while a budget is locked.
        attempt = login_limits.begin_attempt(self.request, self.user.get_username())
        right = False
        try:
            right = self.user.check_password(old_password)
        finally:
            if right:
                attempt.succeeded()
            else:
                attempt.failed()
        if not right:
            raise ValidationError(self.error_messages["password_incorrect"], code="password_incorrect")
        return old_password


class LimitedAdminPasswordChangeForm(LimitedPasswordChangeForm):
    """The admin's password change form (Django's AdminPasswordChangeForm), limited the same way."""

    required_css_class = "required"
