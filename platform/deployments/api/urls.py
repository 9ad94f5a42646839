from __future__ import annotations

from core.api.routers import Router
from deployments.api.views import DeploymentViewSet

router = Router()
router.register("deployments", DeploymentViewSet, basename="deployment")
urlpatterns = router.urls
