"""``timers web``: a dashboard of a keyspace, served with Starlette and uvicorn, pages
rendered on the server (Jinja2, everything escaped). ``pip install 'redis-timers[web]'``."""
