"""How long a notification may wait to be sent: ``MAX_WAIT``, scheduled or held by a rate limit.

Retention keeps a day of the log whole while it holds a notification that is not final
(``clarion/log_maintenance.py``). A wait without a bound let one tenant keep every day of every
tenant's log: a send a day scheduled for 9999, or a backlog to one user behind a cap of one a
month, spread a slot apart (``workers/throttle.py``) until the last waited years. Thirty days,
the default retention, keeps such a day at most a month longer.

- a ``send_at`` further ahead is refused at accept (``api/models.py``: 422 on ``send_at``);
- a ``delay`` rule's hold that would end further ahead ends the notification ``throttled``
  instead (``workers/throttle.py``), naming the rule.
"""

from __future__ import annotations

from datetime import timedelta

MAX_WAIT = timedelta(days=30)
