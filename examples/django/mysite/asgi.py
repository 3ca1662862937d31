"""ASGI entry point: the scheduler runs for the server's lifetime (lifespan startup to
shutdown) in each worker process, e.g. `uvicorn mysite.asgi:application`."""

import os

from django.core.asgi import get_asgi_application

from replicron.contrib.django.runtime import ReplicronLifespan

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
application = ReplicronLifespan(get_asgi_application())
