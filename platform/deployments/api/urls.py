from __future__ import annotations

from rest_framework.routers import SimpleRouter

from deployments.api.views import DeploymentViewSet

router = SimpleRouter()
router.register("deployments", DeploymentViewSet, basename="deployment")
urlpatterns = router.urls
