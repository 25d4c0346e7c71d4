"""Benchmark harness shipped with pylimiter.

``python -m pylimiter.bench`` runs the trial grid on Spark (extra
``pylimiter-pulsar[spark]``); :mod:`pylimiter.bench.scenarios` holds the trials
themselves and needs nothing beyond pylimiter.
"""
