from __future__ import annotations

from core.api.routers import Router
from inventory.api.views import DeviceViewSet, HostViewSet

router = Router()
router.register("hosts", HostViewSet, basename="host")
router.register("devices", DeviceViewSet, basename="device")
urlpatterns = router.urls
