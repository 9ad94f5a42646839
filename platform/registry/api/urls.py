from __future__ import annotations

from core.api.routers import Router
from registry.api.views import ServedModelViewSet

router = Router()
router.register("models", ServedModelViewSet, basename="servedmodel")
urlpatterns = router.urls
