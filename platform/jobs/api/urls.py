from __future__ import annotations

from core.api.routers import Router
from jobs.api.views import JobViewSet

router = Router()
router.register("jobs", JobViewSet, basename="job")
urlpatterns = router.urls
