"""The FastAPI, Flask and Django examples of docs/guides/web-apps.md, as written, tested with the
``timers_test`` fixture the way the testing guide says an app's tests do: the
FastAPI app makes its own ``AsyncTimers()`` in its lifespan, the Flask app uses the
module-level ``timers.schedule``; both land on the test's in-memory server. In process:
the apps run under their frameworks' test clients, no server is started."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT
from timers.testing import TimersTest

NOWHERE = "redis://nowhere.invalid:1/0"  # an example that reached a real server would fail


PAGE = "docs/guides/web-apps.md"


def page_block(heading: str) -> str:
    """The first Python block after ``heading`` in the page."""
    section = (ROOT / PAGE).read_text().split(f"\n{heading}", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, heading
    return found.group(1)


def load(code: str, name: str, where: Path) -> ModuleType:
    """``code`` imported as module ``name`` from a file in ``where``."""
    path = where / f"{name}.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


@pytest.fixture(autouse=True)
def no_real_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMERS_REDIS_URL", NOWHERE)


def test_the_fastapi_example_as_written(timers_test: TimersTest, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    code = page_block("## FastAPI (or any ASGI app): make the client in the lifespan")
    assert code.startswith("# app.py\n") and "AsyncTimers()" in code
    app = load(code, "docs_fastapi_app", tmp_path).app
    with TestClient(app) as client:  # runs the lifespan: it makes AsyncTimers() itself
        reply = client.post("/signup/42")
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"timer": "welcome-sms-42"}
    (pending,) = timers_test.pending()
    assert (pending.task, pending.args) == ("reminders.sms", {"user_id": 42})
    timers_test.advance(hours=23)
    assert timers_test.run_due() == []
    timers_test.advance(hours=1)
    (run,) = timers_test.run_due()
    assert run.timer_id == "welcome-sms-42" and run.outcome.ok


def test_the_flask_example_as_written(timers_test: TimersTest, tmp_path: Path) -> None:
    code = page_block("## Flask, gunicorn (threads)")
    assert code.startswith("# app.py\n") and "timers.schedule(" in code
    app = load(code, "docs_flask_app", tmp_path).app
    reply = app.test_client().post("/signup/7")
    assert reply.status_code == 200, reply.get_data(as_text=True)
    assert reply.get_json() == {"timer": "welcome-sms-7"}
    timers_test.advance(days=1)
    (run,) = timers_test.run_due()
    assert (run.task, run.timer_id, run.outcome.ok) == ("reminders.sms", "welcome-sms-7", True)


def test_the_django_views_as_written(timers_test: TimersTest, tmp_path: Path) -> None:
    """The guide's Django views (a sync view, and an async view through sync_to_async),
    called with Django's request factory: both timers land on the test's server."""
    pytest.importorskip("django", reason="Django is in the dev extra: pip install -e '.[dev]'")
    import asyncio

    import django
    from django.conf import settings
    from django.test import RequestFactory

    if not settings.configured:
        settings.configure(ALLOWED_HOSTS=["*"], USE_TZ=True)
        django.setup()
    code = page_block("**Async views.**")
    assert code.startswith("# notes/views.py\n") and "sync_to_async(timers.schedule)" in code
    views = load(code, "docs_django_views", tmp_path)
    request = RequestFactory().get("/")
    assert views.sync_view(request, 1).status_code == 200
    assert asyncio.run(views.async_view(request, 2)).status_code == 200
    pending = sorted((p.id, p.task, p.args) for p in timers_test.pending())
    assert pending == [("async-2", "notes.add", ["async-2"]), ("sync-1", "notes.add", ["sync-1"])]
