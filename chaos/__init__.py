"""Proof under fire: chaos, load and abuse scenarios against Clarion's real processes.

Every scenario starts its own private PostgreSQL, Redis, Tansu broker and provider fakes, runs
``clarion api``, ``clarion worker <channel>`` (two replicas for one channel) and ``clarion relay``
as separate OS processes, drives load from a separate process (``chaos.load``), injects a fault,
then reconciles the notification log with what the providers actually received
(``chaos.reconcile``). ``python -m chaos`` runs them and writes the summary table.
"""
