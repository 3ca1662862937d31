"""Time arithmetic under the triggers: zones, wall-clock schedules, cron, calendars and
intervals. Pure functions and values; nothing here knows about jobs or runs (internal)."""

__all__: list[str] = []
