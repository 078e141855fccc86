"""How far one push fans out: to a user's newest active devices, at most ``MAX_ACTIVE_DEVICES``.

Devices come from two places, registration (``POST /v1/users/{external_id}/devices``) and the
``devices`` a send may carry inline, and neither had a bound: a tenant could give one user any
number of tokens, and every push to that user then made a provider call per token on the worker
every tenant shares. Now:

- a registration that leaves a user with more than ``MAX_ACTIVE_DEVICES`` active devices retires
  the oldest (by registration; a retired or dead token registered again counts from then), with
  the reason in ``last_error``, as a
  provider's "unregistered" would (``RETIRE_EXTRA``): app reinstalls leave tokens behind that no
  provider has reported dead yet, so the newest are the ones that reach the user;
- the worker reads at most that many per user, newest first (``REACHED``, in ``workers/recipients.py``), so the
  fan-out stays bounded whatever the table holds (rows from before this rule included);
- a user keeps about ``MAX_INACTIVE_DEVICES`` retired or dead rows (those a registration retires
  are counted by the next one): each registration deletes the rest, rows the cap retired before
  rows a provider reported dead (those stop an inline send from reviving a dead token), the
  oldest first; a row revived meanwhile is not deleted. Before (2026-11-28, a helper's probe), retired rows
  were kept for ever: one user reached 12,200 device rows (309 MB of table), every accept that
  checked that user's devices read them all inside the transaction the API shares between
  tenants (another tenant's accept p99 went from 32 to 396 ms), and the retire step, which walks
  the user's rows per active row, took 700 ms at 22,600.

A token is at most ``MAX_TOKEN_CHARS``: the unique index on (user, token) holds at most 2,704 bytes
a row, and a 2,720-character token was a 500 that failed the shared accept transaction with it.
"""

from __future__ import annotations

MAX_ACTIVE_DEVICES = 50
MAX_INACTIVE_DEVICES = 50
MAX_TOKEN_CHARS = 2048  # real ones: APNs 64 hex, FCM ~160


def _kept(user: str, columns: str) -> str:
    """The devices a push to ``user`` (an SQL expression) reaches: its newest active ones, at most
    ``MAX_ACTIVE_DEVICES``, as ``columns`` of ``devices k``."""
    return (
        f"SELECT {columns} FROM devices k WHERE k.user_id = {user} AND k.active"
        f" ORDER BY k.created_at DESC, k.id DESC LIMIT {MAX_ACTIVE_DEVICES}"
    )


# The devices each of the users $1 (uuid[]) reaches, oldest of them first (workers/recipients.py).
REACHED = f"""
SELECT u.user_id, d.platform, d.token
  FROM unnest($1::uuid[]) AS u(user_id)
 CROSS JOIN LATERAL ({_kept("u.user_id", "k.id, k.created_at, k.platform, k.token")}) d
 ORDER BY u.user_id, d.created_at, d.id
"""

# ``{users}``: the uuid[] of the users who just registered a device, in the caller's driver's
# parameter style. Each user's active devices are read once per registration (at most
# MAX_ACTIVE_DEVICES + the ones just added, and one send carries at most 50). The rows are locked in
# id order, as the accept takes every other lock in a sorted order: two accepts retiring the same
# user's devices at once wait for each other instead of deadlocking.
RETIRE_EXTRA = f"""
WITH extra AS (
    SELECT d.id FROM devices d
     WHERE d.user_id = ANY({{users}}) AND d.active
       AND d.id NOT IN ({_kept("d.user_id", "k.id")})
     ORDER BY d.id
       FOR UPDATE
), retired AS (
    UPDATE devices d
       SET active = false, deactivated_at = now(),
           last_error = 'retired: the user has more than {MAX_ACTIVE_DEVICES} active devices, the newest kept'
      FROM extra
     WHERE d.id = extra.id AND d.active
    RETURNING d.id
), old AS (  -- retired before this statement (its snapshot), past MAX_INACTIVE_DEVICES kept
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY user_id
                                      ORDER BY last_error LIKE 'retired: %' , deactivated_at DESC NULLS LAST, id DESC) AS n
          FROM devices WHERE user_id = ANY({{users}}) AND NOT active
    ) s WHERE n > {MAX_INACTIVE_DEVICES}
), locked AS (  -- in id order, as the rows above
    SELECT d.id FROM devices d WHERE d.id IN (SELECT id FROM old) ORDER BY d.id FOR UPDATE
)
DELETE FROM devices d USING locked WHERE d.id = locked.id AND NOT d.active  -- a revived one stays
"""
