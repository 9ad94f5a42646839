"""Failures DRF leaves to Django's HTML pages, and input the database would mangle, answer 4xx
JSON with what went wrong, and write nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from accounts.models import ApiKey, Role, User
from accounts.services import issue_api_token
from deployments.models import Deployment
from django.test import Client, override_settings
from inventory.models import Device, Host
from jobs.models import Job
from registry.models import ServedModel
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db
NESTED = ("[" * 5000 + "]" * 5000).encode()


@pytest.fixture
def deployed(model_payload: dict[str, Any]) -> dict[str, Any]:
    """A TP-2 model running on two devices of one host, and a spare device."""
    model = ServedModel.objects.create(**model_payload)
    host = Host.objects.create(name="host-a")
    devices = [
        Device.objects.create(host=host, index=i, uuid=f"gpu-{i}", name="L4", memory_total_bytes=24 << 30)
        for i in range(3)
    ]
    deployment = Deployment.objects.create(model=model, host=host)
    deployment.devices.set(devices[:2])
    return {"model": model, "host": host, "devices": devices, "deployment": deployment}


def test_json_nested_too_deeply_is_a_400(admin_client: APIClient, anon_client: APIClient) -> None:
    for client, url in ((admin_client, "/api/v1/models/"), (anon_client, "/api/v1/auth/token/")):
        response = client.post(url, NESTED, content_type="application/json")
        assert response.status_code == 400
        assert "nested too deeply" in response.json()["detail"]
    assert not ServedModel.objects.exists()


# Half of a UTF-16 pair, as JSON escapes it (no UTF-8 text holds one): PostgreSQL refused to
# store it in engine options (jsonb), and a field error naming it (an unknown field or engine
# option, a choice) could not be encoded in the response, on SQLite too: 500s.
LONE_SURROGATES = [
    ("engine_options", '{"extra_args": ["--x", "\\ud800"]}'),
    ("engine_options", '{"aqua_options": {"\\udfff": 1}}'),
    ("engine_options", '{"\\ud800": 1}'),
    ("dtype", '"\\udbff"'),
    ("\\ud800", "1"),
]


@pytest.mark.parametrize(("key", "value"), LONE_SURROGATES)
def test_a_lone_surrogate_in_a_body_is_a_400_naming_its_escape(
    admin_client: APIClient, model_payload: dict[str, Any], key: str, value: str
) -> None:
    fields = {k: v for k, v in model_payload.items() if k != key}
    body = '{"' + key + '": ' + value + ", " + json.dumps(fields)[1:]
    response = admin_client.post("/api/v1/models/", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert "lone surrogate" in response.json()["detail"]
    assert not ServedModel.objects.exists()
    # A pair stands for one character, which is stored and answered as it is.
    others = {k: v for k, v in model_payload.items() if k != "engine_options"}
    pair = admin_client.post(
        "/api/v1/models/",
        '{"engine_options": {"extra_args": ["\\ud83d\\ude00"]}, ' + json.dumps(others)[1:],
        content_type="application/json",
    )
    assert pair.status_code == 201, pair.content
    assert pair.json()["engine_options"] == {"extra_args": ["\U0001f600"]}
    assert ServedModel.objects.get().engine_options == {"extra_args": ["\U0001f600"]}


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_a_body_over_the_upload_limit_is_a_413_naming_it(
    admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    response = admin_client.post("/api/v1/models/", {**model_payload, "source": "x" * 2000}, format="json")
    assert response.status_code == 413
    assert "1000 bytes" in response.json()["detail"]
    assert not ServedModel.objects.exists()


def test_deleting_a_model_that_deployments_use_is_a_409_naming_them(
    admin_client: APIClient, deployed: dict[str, Any]
) -> None:
    model, deployment = deployed["model"], deployed["deployment"]
    response = admin_client.delete(f"/api/v1/models/{model.pk}/")
    assert response.status_code == 409
    assert f"deployments {deployment.pk}" in response.json()["detail"]
    assert ServedModel.objects.filter(pk=model.pk).exists()


def test_the_tp_size_of_a_model_with_running_deployments_cannot_change(
    admin_client: APIClient, deployed: dict[str, Any]
) -> None:
    model, deployment = deployed["model"], deployed["deployment"]
    url = f"/api/v1/models/{model.pk}/"
    refused = admin_client.patch(url, {"tensor_parallel_size": 4}, format="json")
    assert refused.status_code == 400
    assert f"Deployment(s) {deployment.pk}" in refused.json()["tensor_parallel_size"][0]
    model.refresh_from_db()
    assert model.tensor_parallel_size == 2
    assert admin_client.patch(url, {"slo_ttft_p99_ms": 400.0}, format="json").status_code == 200
    deployment.desired_state = "stopped"
    deployment.save()
    assert admin_client.patch(url, {"tensor_parallel_size": 4}, format="json").status_code == 200


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seed": "abc"}, "seed must be an integer from 0 to 4294967295"),
        ({"seed": 2**32}, "seed must be an integer from 0 to 4294967295"),  # numpy's seed range
        ({"kv_cache_bytes": 2**70}, "kv_cache_bytes must be an integer from 1 to 9223372036854775807"),
        ({"extra_args": "--x"}, "extra_args must be a list of strings"),
        # Flags the agent sets from the deployment: the gateway could no longer reach or use it.
        ({"extra_args": ["--api-key", "k"]}, "extra_args must be a list of strings without --api-key"),
        ({"extra_args": ["--port=9"]}, "without --port (the agent sets those"),
        ({"extra_args": ["--served_model_name", "x"]}, "without --served-model-name"),
        # ... or abbreviated (vLLM's parser takes --api-k for --api-key), or set from a file.
        ({"extra_args": ["--api-k", "k"]}, "without --api-key"),
        ({"extra_args": ["--tensor-parallel", "2"]}, "without --tensor-parallel-size"),
        ({"extra_args": ["-tp=2"]}, "without -tp"),
        ({"extra_args": ["-t", "2"]}, "without -tp"),
        ({"extra_args": ["--config", "f.yaml"]}, "without --config"),
        ({"aqua_options": 5}, "aqua_options must be a JSON object"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be a number in (0, 1]"),
        ({"enforce_eager": "yes"}, "enforce_eager must be true or false"),
        ({"max_num_seqs": 0}, "max_num_seqs must be an integer from 1 to"),
        ({"gpu_mem_util": 0.9}, "Unknown engine option(s): gpu_mem_util"),
        # The simulated agent's bound (its engine failed at start, out of memory, for 1e9).
        ({"sim_rate": 1e9}, "sim_rate must be a positive number of requests/s up to 1000"),
        ({"sim_rate": 0}, "sim_rate must be a positive number of requests/s up to 1000"),
    ],
)
def test_engine_options_are_checked_by_name_and_type(
    admin_client: APIClient, model_payload: dict[str, Any], options: dict[str, Any], message: str
) -> None:
    response = admin_client.post(
        "/api/v1/models/", {**model_payload, "engine_options": options}, format="json"
    )
    assert response.status_code == 400
    assert message in response.json()["engine_options"][0]
    assert not ServedModel.objects.exists()


def test_engine_options_the_agent_reads_are_accepted(
    admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    options = {
        "seed": 0,
        "enforce_eager": True,
        "max_num_seqs": 8,
        "kv_cache_bytes": 1 << 30,
        "cpu_kvcache_space_gib": 1,
        "aqua": True,
        "aqua_options": {"lent_bytes": 1 << 20},
        "extra_args": ["--enable-log-requests"],
        "sim_rate": 2.5,
    }
    response = admin_client.post(
        "/api/v1/models/", {**model_payload, "engine_options": options}, format="json"
    )
    assert response.status_code == 201, response.json()


@pytest.mark.parametrize(
    "quota", [{"requests_per_minute": 2**31}, {"tokens_per_day": 2**63}, {"tokens_per_day": 10**30}]
)
def test_api_key_quotas_beyond_their_columns_are_400s(admin_client: APIClient, quota: dict[str, int]) -> None:
    response = admin_client.post("/api/v1/api-keys/", {"name": "k", **quota}, format="json")
    assert response.status_code == 400
    assert set(response.json()) == set(quota)
    assert not ApiKey.objects.exists()


def test_a_since_before_the_earliest_utc_instant_is_a_400(
    viewer_client: APIClient, deployed: dict[str, Any]
) -> None:
    url = f"/api/v1/hosts/{deployed['host'].pk}/telemetry/?since=0001-01-01T00:00:00%2B14:00"
    response = viewer_client.get(url)
    assert response.status_code == 400
    assert "since" in response.json()


def test_non_ascii_digits_in_a_plan_id_are_a_404(admin_client: APIClient) -> None:
    assert admin_client.post("/api/v1/plans/%C2%B2/apply/").status_code == 404


@pytest.mark.parametrize("job_id", [str(2**63), "99999999999999999999", str(2**63 - 1), "abc", "-1"])
def test_plan_ids_beyond_the_id_column_are_json_404s(
    admin_client: APIClient, viewer_client: APIClient, job_id: str
) -> None:
    for response in (
        viewer_client.get(f"/api/v1/plans/{job_id}/"),
        admin_client.post(f"/api/v1/plans/{job_id}/apply/"),
    ):
        assert response.status_code == 404
        assert response["Content-Type"] == "application/json"
        assert "detail" in response.json()
    assert not Job.objects.exists()


def test_device_ids_must_be_integers(admin_client: APIClient, deployed: dict[str, Any]) -> None:
    deployed["deployment"].delete()
    a, b, _ = deployed["devices"]
    body = {"model": deployed["model"].name, "host": "host-a", "devices": [a.pk + 0.7, b.pk]}
    response = admin_client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 400
    assert "devices" in response.json()
    assert not Deployment.objects.exists()


def test_a_place_job_for_unknown_models_is_refused_before_it_queues(admin_client: APIClient) -> None:
    body = {"kind": "place", "params": {"models": ["nope"]}}
    response = admin_client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400
    assert "No served model named 'nope'" in str(response.json())
    assert not Job.objects.exists()


def test_the_admin_lists_keys_and_tokens_but_cannot_add_them() -> None:
    root = User.objects.create_superuser("root", password="root-pw-9f2k", role=Role.ADMIN)
    client = Client()
    client.force_login(root)
    for name in ("apikey", "apitoken"):
        assert client.get(f"/admin/accounts/{name}/").status_code == 200
        assert client.get(f"/admin/accounts/{name}/add/").status_code == 403


def test_unknown_api_paths_are_json_404s_and_a_missing_slash_is_named(admin_client: APIClient) -> None:
    unknown = admin_client.get("/api/v1/nothing-here/")
    assert unknown.status_code == 404 and unknown.json() == {"detail": "Not found."}
    no_slash = admin_client.post("/api/v1/models", {"name": "x"}, format="json")
    assert no_slash.status_code == 404
    assert "Use /api/v1/models/ (with a trailing slash)" in no_slash.json()["detail"]
    assert not ServedModel.objects.exists()
    assert admin_client.get("/api/v1/models/").status_code == 200  # real routes still resolve first
    strict = Client(enforce_csrf_checks=True)  # as a script with a token: no CSRF cookie
    token = f"Token {issue_api_token(User.objects.get(username='alice'), 'script').plaintext}"
    answer = strict.post("/api/v1/models", {}, content_type="application/json", HTTP_AUTHORIZATION=token)
    assert answer.status_code == 404 and "trailing slash" in answer.json()["detail"]


def test_a_missing_slash_is_named_under_a_url_prefix(admin_client: APIClient) -> None:
    # Under a prefix (SCRIPT_NAME=/llm) the hint looked the full path up in the URLconf, whose
    # paths are below the prefix: never found, no hint. It names the path as the client sends it.
    no_slash = admin_client.get("/api/v1/models", SCRIPT_NAME="/llm")
    assert no_slash.status_code == 404
    assert no_slash.json()["detail"] == "Not found. Use /llm/api/v1/models/ (with a trailing slash)."


def test_a_page_visit_refused_under_a_url_prefix_named_api_is_the_405_page(alice: User) -> None:
    # The page's 405 was left bare for any path starting /api/, the prefix included: a deployment
    # under SCRIPT_NAME=/api answered a visit of /jobs/start/ with an empty body.
    client = Client()
    client.force_login(alice)
    page = client.get("/jobs/start/", SCRIPT_NAME="/api")
    assert page.status_code == 405 and page["Content-Type"].startswith("text/html")
    assert 'id="not-allowed-reason"' in page.content.decode()


def test_the_api_base_url_make_run_prints_lists_the_collections(
    viewer_client: APIClient, anon_client: APIClient
) -> None:
    # `make run` prints "API http://127.0.0.1:8000/api/v1/" and the README names it; it was a 404.
    index = viewer_client.get("/api/v1/")
    assert index.status_code == 200
    links = index.json()
    assert links["models"] == "http://testserver/api/v1/models/"
    for name, link in links.items():  # each one a route a viewer may read (the token's: POST only)
        assert viewer_client.get(link).status_code == (405 if name == "auth-token" else 200), link
    assert anon_client.get("/api/v1/").status_code == 401


def test_job_filters_with_unknown_values_are_400s(admin_client: APIClient) -> None:
    response = admin_client.get("/api/v1/jobs/?status=runing&kind=noop")
    assert response.status_code == 400
    assert set(response.json()) == {"status"}
    assert admin_client.get("/api/v1/jobs/?status=running&kind=noop").status_code == 200


def test_clients_choose_the_page_size_up_to_a_limit(admin_client: APIClient) -> None:
    for i in range(3):
        Job.objects.create(kind="noop", celery_id=f"c{i}")
    page = admin_client.get("/api/v1/jobs/?page_size=2").json()
    assert page["count"] == 3 and len(page["results"]) == 2 and page["next"] is not None


@pytest.fixture
def api_root_and_login_page_fail(admin_client: APIClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API root and the login page raise; admin_client answers a 500 instead of raising."""
    from django.contrib.auth.views import LoginView

    from core.api.root import ApiRootView

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(ApiRootView, "get", fail)
    monkeypatch.setattr(LoginView, "get", fail)
    admin_client.raise_request_exception = False


@pytest.mark.usefixtures("api_root_and_login_page_fail")
def test_an_unhandled_exception_is_json_in_the_api_and_a_page_elsewhere(admin_client: APIClient) -> None:
    # Django's own 500 was "<h1>Server Error (500)</h1>" under /api/ too, where clients parse JSON.
    api = admin_client.get("/api/v1/")
    assert api.status_code == 500 and api["Content-Type"] == "application/json"
    assert "server's log" in api.json()["detail"]
    page = Client(raise_request_exception=False).get("/accounts/login/")
    assert page.status_code == 500 and page["Content-Type"].startswith("text/html")
    body = page.content.decode()
    assert "<h1>Server error</h1>" in body and '<link rel="icon" href="data:,">' in body


@pytest.mark.usefixtures("api_root_and_login_page_fail")
def test_an_unhandled_exception_is_json_in_the_api_under_a_url_prefix(admin_client: APIClient) -> None:
    # Served under a prefix (SCRIPT_NAME=/llm), request.path is /llm/api/v1/: the API's 500 was
    # the HTML page. What is under /api/ is decided on the path below the prefix.
    api = admin_client.get("/api/v1/", SCRIPT_NAME="/llm")
    assert api.status_code == 500 and api["Content-Type"] == "application/json"
    assert "server's log" in api.json()["detail"]
    page = Client(raise_request_exception=False).get("/accounts/login/", SCRIPT_NAME="/api")
    assert page.status_code == 500 and page["Content-Type"].startswith("text/html")


def test_a_page_500_is_answered_when_the_template_engine_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # A template engine that cannot load (a template tag library failing to import, no file
    # handle left to read a template) failed every page; a 500 page rendered through it failed
    # too, and Django let that second exception out of the handler: no page of ours.
    from django.contrib.auth.views import LoginView
    from django.core.exceptions import ImproperlyConfigured
    from django.template import loader

    def fail(*args: object, **kwargs: object) -> None:
        raise ImproperlyConfigured("templates: a tag library failed to import")

    monkeypatch.setattr(LoginView, "get", fail)
    monkeypatch.setattr(loader, "get_template", fail)
    monkeypatch.setattr(loader, "render_to_string", fail)
    page = Client(raise_request_exception=False).get("/accounts/login/")
    assert page.status_code == 500 and page["Content-Type"].startswith("text/html")
    body = page.content.decode()
    assert "<h1>Server error</h1>" in body and '<link rel="icon" href="data:,">' in body


def test_a_name_in_the_path_with_a_nul_character_is_not_found(
    admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    # /api/v1/profiles/<model name>/: PostgreSQL refused to look a NUL up (a 500).
    ServedModel.objects.create(**model_payload)
    answer = admin_client.get("/api/v1/profiles/llama%00-3-8b/")
    assert answer.status_code == 404 and answer.json() == {"detail": "Not found."}
