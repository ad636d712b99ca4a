"""Blueque's web dashboard, an ASGI application: ``blueque dashboard`` serves it with uvicorn,
and any Starlette or FastAPI service can mount it::

    from blueque.web import create_app
    app.mount("/blueque", create_app("redis://redis.internal:6379/0", token=secret))

Needs the ``web`` extra (``pip install -e '.[web]'`` in Blueque's checkout: starlette,
uvicorn, jinja2).
"""

from blueque.web.app import create_app

__all__ = ["create_app"]
