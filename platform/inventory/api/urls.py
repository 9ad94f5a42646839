from __future__ import annotations

from rest_framework.routers import SimpleRouter

from inventory.api.views import DeviceViewSet, HostViewSet

router = SimpleRouter()
router.register("hosts", HostViewSet, basename="host")
router.register("devices", DeviceViewSet, basename="device")
urlpatterns = router.urls
