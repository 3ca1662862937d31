"""A minimal Django project whose jobs run exactly once across its replicas.

The database comes from DATABASE_URL (postgresql://user:password@host:5432/name); replicron
coordinates through the same database, with no second URL to keep in step.
"""

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "replicron.contrib.django",
    "reports",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "mysite.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

_url = urlsplit(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/mysite"))
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "",
        "PORT": _url.port or "",
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

REPLICRON = {
    "database": "default",  # coordinate through DATABASES["default"]
    "namespace": "mysite/",
    "coordination": os.environ.get("REPLICRON_COORDINATION", "advisory"),
    "run_in_web_process": os.environ.get("REPLICRON_IN_WEB_PROCESS", "") == "1",
    "scheduler": {"stop_timeout": 20.0},
    "backend_options": {"heartbeat_interval": 2.0},
}
