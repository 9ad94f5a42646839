from __future__ import annotations

from django.urls import path

from dashboard import assets, deploy_views, keys, views

app_name = "dashboard"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("models/", views.model_list, name="models"),
    path("models/new/", views.model_create, name="model-create"),
    path("models/<int:pk>/", views.model_detail, name="model-detail"),
    path("models/<int:pk>/edit/", views.model_edit, name="model-edit"),
    path("models/<int:pk>/deploy/", deploy_views.deploy, name="model-deploy"),
    path("models/<int:pk>/delete/", deploy_views.model_delete, name="model-delete"),
    path("jobs/", views.job_list, name="jobs"),
    path("jobs/start/", views.job_start, name="job-start"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("jobs/<int:pk>/cancel/", views.job_cancel, name="job-cancel"),
    path("jobs/<int:pk>/apply/", views.plan_apply, name="plan-apply"),
    path("api-keys/", keys.key_list, name="api-keys"),
    path("api-keys/new/", keys.key_create, name="api-key-create"),
    path("api-keys/<int:pk>/revoke/", keys.key_revoke, name="api-key-revoke"),
    path("deployments/<int:pk>/logs/", views.deployment_logs, name="deployment-logs"),
    path("deployments/<int:pk>/stop/", deploy_views.deployment_stop, name="deployment-stop"),
    path("deployments/<int:pk>/start/", deploy_views.deployment_start, name="deployment-start"),
    path("deployments/<int:pk>/delete/", deploy_views.deployment_delete, name="deployment-delete"),
    path("assets/plotly-<str:version>.min.js", assets.plotly_js, name="plotly-js"),
]
