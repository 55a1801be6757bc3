"""A real Django project under gunicorn (WSGI), written to a temporary folder as
docs/guides/web-apps.md sets one up: a sync view and an async view schedule timers through
the process's one client, and a listener started with ``--setup`` (``django.setup()``
before the tasks package is imported) runs tasks that write rows with the ORM."""

from __future__ import annotations

import os
import sqlite3
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import Processes, settled
from timers import Timers
from timers.dev.server import free_port

pytest.importorskip("django", reason="Django is in the dev extra: pip install -e '.[dev]'")
pytest.importorskip("gunicorn", reason="gunicorn is in the dev extra: pip install -e '.[dev]'")

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

REQUESTS = 100

FILES = {
    "djproj/__init__.py": "",
    "djproj/settings.py": """
        from pathlib import Path
        BASE_DIR = Path(__file__).resolve().parent.parent
        SECRET_KEY = "test-only"
        DEBUG = False
        ALLOWED_HOSTS = ["127.0.0.1"]
        INSTALLED_APPS = ["notes.apps.NotesConfig"]
        DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
        ROOT_URLCONF = "djproj.urls"
        DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                                 "NAME": BASE_DIR / "db.sqlite3"}}
        USE_TZ = True
    """,
    "djproj/urls.py": """
        from django.urls import path
        from notes import views
        urlpatterns = [path("sync/<int:n>", views.sync_view),
                       path("async/<int:n>", views.async_view)]
    """,
    "djproj/wsgi.py": """
        import os
        from django.core.wsgi import get_wsgi_application
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproj.settings")
        application = get_wsgi_application()
    """,
    # the guide's listener setup: django.setup() before the tasks package is imported
    "djproj/timers_setup.py": """
        import os
        import django

        def setup() -> None:
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproj.settings")
            django.setup()
    """,
    "notes/__init__.py": "",
    "notes/apps.py": """
        from django.apps import AppConfig

        class NotesConfig(AppConfig):
            name = "notes"
    """,
    "notes/models.py": """
        from django.db import models

        class Note(models.Model):
            text = models.CharField(max_length=100)
    """,
    # the guide's views: the sync API, in an async view through sync_to_async
    "notes/views.py": """
        from asgiref.sync import sync_to_async
        from django.http import HttpResponse
        import timers

        def sync_view(request, n):
            timers.schedule("notes.add", [f"sync-{n}"], in_=0, id=f"sync-{n}")
            return HttpResponse("ok")

        async def async_view(request, n):
            await sync_to_async(timers.schedule)("notes.add", [f"async-{n}"], in_=0,
                                                 id=f"async-{n}")
            return HttpResponse("ok")
    """,
    "djtasks/__init__.py": "",
    # a task module that imports a model at its top: only importable after django.setup()
    "djtasks/notes.py": """
        from notes.models import Note

        def add(text: str) -> None:
            Note.objects.create(text=text)
    """,
}


def write_project(root: Path) -> None:
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())


def rows(db: Path) -> set[str]:
    if not db.exists():
        return set()
    with sqlite3.connect(db) as conn:
        return {text for (text,) in conn.execute("SELECT text FROM notes_note")}


def test_a_django_project_under_gunicorn_schedules_and_its_orm_tasks_run(
        tmp_path: Path, r: redis.Redis, redis_url: str, processes: Processes) -> None:
    write_project(tmp_path)
    env = processes.env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    env["DJANGO_SETTINGS_MODULE"] = "djproj.settings"
    env["TIMERS_REDIS_URL"] = redis_url  # the default client of each gunicorn worker
    migrate = processes.spawn(sys.executable, "-m", "django", "migrate", "--run-syncdb",
                              "-v", "0", env=env)
    assert migrate.wait(60) == 0, processes.output(migrate)
    port = free_port()
    gunicorn = processes.spawn(sys.executable, "-m", "gunicorn", "djproj.wsgi:application",
                               "-b", f"127.0.0.1:{port}", "-w", "2", "--threads", "4",
                               env=env)
    listen_env = dict(env)
    del listen_env["DJANGO_SETTINGS_MODULE"]  # set by the setup function itself
    listener = processes.spawn(str(Path(sys.executable).parent / "timers"), "listen",
                               "--url", redis_url, "--tasks", "djtasks",
                               "--setup", "djproj.timers_setup:setup",
                               env=listen_env)

    def get(path: str) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return int(reply.status)

    def serving() -> bool:
        assert gunicorn.poll() is None, processes.output(gunicorn)
        try:
            return get("/sync/0") == 200
        except OSError:
            return False

    wait_until(serving, 30, message="gunicorn to serve")
    clients_before = len(r.client_list())
    for n in range(REQUESTS):
        assert get(f"/sync/{n}") == 200
        assert get(f"/async/{n}") == 200
    # one client per process, not one per request: 2 workers, a few connections each
    assert len(r.client_list()) - clients_before <= 8
    expected = {f"{kind}-{n}" for kind in ("sync", "async") for n in range(REQUESTS)}

    def all_rows() -> bool:
        assert listener.poll() is None, processes.output(listener)
        return rows(tmp_path / "db.sqlite3") >= expected

    wait_until(all_rows, 60, message="every task to write its row through the ORM")
    with Timers(redis_url) as t:
        wait_until(lambda: settled(t), 20, message="nothing pending or running")
        assert t.stats().failed == 0
