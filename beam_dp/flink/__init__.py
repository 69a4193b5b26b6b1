"""Native Apache Flink adapter (PyFlink): the same mechanisms as the Beam adapter, in a
``KeyedProcessFunction`` with ``ValueState`` and event-time timers.

PyFlink pins apache-beam <= 2.61 and pyarrow < 21, so this package lives in its own environment
(``make flink-test`` creates ``.venv-flink``); nothing in the main package imports it, and this
``__init__`` imports nothing from PyFlink. Use :mod:`beam_dp.flink.job`.
"""
