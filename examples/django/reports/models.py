from django.db import models


class Beat(models.Model):
    """One run of the heartbeat job: which tick, on which replica."""

    tick = models.DateTimeField()
    replica = models.TextField()
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.tick.isoformat()} on {self.replica}"
