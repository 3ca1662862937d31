"""Drives the example project's admin through Django's test client, logged in as a
superuser, and prints what it saw as one JSON line. Run from examples/django with the
project's environment: ``admin_client.py pages``, ``admin_client.py text PATH`` or
``admin_client.py action NAME JOB``."""

from __future__ import annotations

import json
import sys

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.contrib.messages import get_messages  # noqa: E402
from django.test import Client  # noqa: E402

BASE = "/admin/replicron"


def main(argv: list[str]) -> dict[str, object]:
    user, _ = get_user_model().objects.get_or_create(
        username="admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    if argv[0] == "pages":
        run_id, replica = argv[1], argv[2]
        seen: dict[str, object] = {}
        for path in (
            f"{BASE}/registeredjob/",
            f"{BASE}/registeredjob/heartbeat/change/",
            f"{BASE}/run/",
            f"{BASE}/run/{run_id}/change/",
            f"{BASE}/replica/",
            f"{BASE}/replica/{replica}/change/",
        ):
            response = client.get(path)
            seen[path] = {"status": response.status_code, "text": response.content.decode()}
        return seen
    if argv[0] == "get":  # one request, as a web process serves it
        return {"status": client.get(argv[1]).status_code}
    if argv[0] == "text":  # one page, with what it says
        response = client.get(argv[1])
        return {"status": response.status_code, "text": response.content.decode()}
    if argv[0] == "action":
        name, job = argv[1], argv[2]
        response = client.post(
            f"{BASE}/registeredjob/", {"action": name, "_selected_action": [job]}
        )
        said = [str(message) for message in get_messages(response.wsgi_request)]
        return {"status": response.status_code, "messages": said}
    raise SystemExit(f"unknown: {argv}")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
