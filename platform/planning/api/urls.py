from __future__ import annotations

from core.api.routers import Router
from planning.api.views import ModelProfileViewSet, PlacementPlanViewSet

router = Router()
router.register("profiles", ModelProfileViewSet, basename="profile")
router.register("plans", PlacementPlanViewSet, basename="plan")
urlpatterns = router.urls
