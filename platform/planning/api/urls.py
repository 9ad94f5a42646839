from __future__ import annotations

from rest_framework.routers import SimpleRouter

from planning.api.views import ModelProfileViewSet, PlacementPlanViewSet

router = SimpleRouter()
router.register("profiles", ModelProfileViewSet, basename="profile")
router.register("plans", PlacementPlanViewSet, basename="plan")
urlpatterns = router.urls
