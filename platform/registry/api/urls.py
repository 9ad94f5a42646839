from __future__ import annotations

from rest_framework.routers import SimpleRouter

from registry.api.views import ServedModelViewSet

router = SimpleRouter()
router.register("models", ServedModelViewSet, basename="servedmodel")
urlpatterns = router.urls
